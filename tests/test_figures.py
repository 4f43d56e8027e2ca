"""Every figure kind the project draws, rendered from the cheapest examples and checked on the
drawn figure (tests/figcheck.py): each colour's legend label, legends clear of every point, bar,
label and tick, axis labels and titles set. No Ray; simulations of one or two iterations."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from figcheck import check_figure, rgb
from matplotlib.figure import Figure

from placer import plots as plan_plots
from placer.base.palette import kind_colour
from placer.cost.calibration import load_calibration
from placer.cost.pricer import Pricer
from placer.cost.rulecheck import rule_reward_time
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from simulator import plots as sim_plots
from simulator.api import simulate_plan
from workflows import plots as report_plots
from workflows import whatif

ROOT = Path(__file__).resolve().parent.parent
GUIDES = {"k": "dotted"}  # step or iteration ends: explained in the title or axis label


def plan_of(name: str) -> Plan:
    job = ROOT / "examples" / f"{name}.yaml"
    return plan_job(Pricer(resolve(load_job(job), str(job)), load_calibration(None)))


def captured(monkeypatch: pytest.MonkeyPatch, module: Any, draw: Callable[[], Any]
             ) -> dict[str, Figure]:
    """The figures `draw` would save through `module.save`, by file name, kept open (a saved
    figure is closed) and not written."""
    figs: dict[str, Figure] = {}

    def keep(fig: Figure, path: Any) -> Path:
        figs[Path(path).name] = fig
        return Path(path)

    monkeypatch.setattr(module, "save", keep)
    draw()
    return figs


@pytest.mark.parametrize("example", ["tiny-cpu", "hetero-split", "large-1k-nodes"])
def test_placement_figure(example: str) -> None:
    plan = plan_of(example)
    fig = plan_plots.placement(plan)
    entries = check_figure(fig)
    assert entries.get(rgb("0.85"), "idle") == "idle"  # unused devices, where drawn
    if example == "large-1k-nodes":  # a slot only on nodes past the first twelve: named above
        assert "on nodes not drawn" in fig.axes[0].get_title()


@pytest.mark.parametrize("example", ["tiny-cpu", "tiny-agent"])
def test_simulator_figures(example: str, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    result = simulate_plan(plan_of(example), iterations=2, seed=0)
    figs = captured(monkeypatch, sim_plots, lambda: sim_plots.write_plots(result, tmp_path))
    assert set(figs) == {"timeline.png", "utilization.png", "response_vs_completion.png"}
    entries = check_figure(figs["timeline.png"], GUIDES)
    # the sandbox (a verify, and tiny-agent's tool calls) is the environment's work
    assert "environment" in entries[rgb(kind_colour("tool"))]
    check_figure(figs["utilization.png"])
    check_figure(figs["response_vs_completion.png"])


def test_a_simulated_verify_is_traced_as_environment_work() -> None:
    """tiny-cpu's answers run in the sandbox before the rule reward checks them: the verify is a
    `tool` event of the environment, the reward's event only its checks; together the rule
    reward's time (a regression guard: both sides come from `placer.cost.rulecheck`)."""
    plan = plan_of("tiny-cpu")
    trace = simulate_plan(plan, iterations=1, seed=0).trace
    [verify] = [e for e in trace.events if e.cat == "tool"]
    [reward] = [e for e in trace.events if e.cat == "reward"]
    assert verify.args["call"] == "verify" and verify.args["role"] == "environment"
    assert verify.end_s == pytest.approx(reward.ts_s)  # the checks read the verify's results
    res = plan.resolved()
    rp = plan.roles["reward"]
    dev = res.device_of(rp.pool)
    assert verify.dur_s + reward.dur_s == pytest.approx(rule_reward_time(
        res.job, res.job.batch.samples, rp.par.devices, rp.par.devices * dev.cores,
        load_calibration(None).for_device(dev)))


def test_fidelity_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_fidelity import executed

    from workflows.fidelity import fidelity, write_figures

    plan = plan_of("tiny-cpu")
    trace = executed(plan)
    report, sim = fidelity(plan, trace)
    figs = captured(monkeypatch, report_plots, lambda: write_figures(report, sim, trace, tmp_path))
    entries = check_figure(figs["fidelity_timelines.png"], GUIDES)
    check_figure(figs["fidelity_steps.png"])
    check_figure(figs["fidelity_lengths.png"])
    # the simulated verify's bar (found by its times) is labelled environment work, not reward
    [verify] = [e for e in sim.trace.events if e.cat == "tool" and e.args.get("step") == 1]
    simulated = figs["fidelity_timelines.png"].axes[1]
    bars = [c for c in simulated.collections
            if any(abs(p.vertices[:, 0].min() - verify.ts_s) < 1e-9
                   and abs(p.vertices[:, 0].max() - verify.end_s) < 1e-9 for p in c.get_paths())]
    assert bars
    label = entries[rgb(bars[0].get_facecolor()[0])]
    assert "environment" in label and "reward" not in label


def test_sweep_figure_of_a_grid() -> None:
    job = load_job(ROOT / "examples" / "tiny-cpu.yaml")
    rows = whatif.grid(job, [whatif.parse_vary("batch.prompts=4,8"),
                             whatif.parse_vary("cpu.nodes=1,2")], time_limit_s=1.0)
    check_figure(report_plots.sweep(rows))
    points = [{"cost_per_sample": r["booked_cost_per_sample"], "samples_per_s": r["samples_per_s"],
               "label": r["value"]} for r in rows]
    fig = report_plots.pareto(points)  # long labels: numbers and a key beside the axes
    check_figure(fig)
    _labels_inside(fig)


def test_pareto_legend_clears_every_label() -> None:
    """A sweep of h20.nodes: the last point is the dearest and the fastest, so its label sat
    past the axes' top right corner, where the legend was."""
    pts = [{"cost_per_sample": c, "samples_per_s": t, "label": f"h20.nodes={n}"}
           for n, c, t in ((1, 0.000894, 21.0), (2, 0.001062, 20.2), (3, 0.001019, 23.6),
                           (4, 0.001063, 25.9))]
    fig = report_plots.pareto(pts, title="sweep: every point, the frontier joined")
    check_figure(fig)
    _labels_inside(fig)
    assert {t.get_text() for t in fig.axes[0].texts} == {p["label"] for p in pts}


def _labels_inside(fig: Figure) -> None:
    ax = fig.axes[0]
    r = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    box = ax.get_window_extent(r)
    for t in ax.texts:
        if t.get_transform() is ax.transAxes:  # the key: beside the axes on purpose
            continue
        e = t.get_window_extent(r)
        assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, \
            t.get_text()
