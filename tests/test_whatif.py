"""What-if sweeps (workflows/whatif.py) and the plan figures (placer/plots.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.colors import to_rgba

from placer import plots
from placer.base.errors import SpecError
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from simulator.api import simulate_plan
from simulator.steady import simulate_steady, steady_state
from workflows import whatif

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "tiny-cpu.yaml"


def row(name: str, thr: float, cost: float) -> dict:
    return {"knob": "k", "value": name, "samples_per_s": thr, "cost_per_sample": cost}


def test_pareto_keeps_only_undominated_points_once():
    rows = [row("a", 10, 1.0), row("b", 12, 2.0), row("c", 9, 1.5), row("d", 12, 2.0),
            {"knob": "k", "value": "e", "infeasible": "no"}]
    front = whatif.pareto(rows)
    assert [r["value"] for r in front] == ["a", "b"]  # c is dominated by a; d repeats b


def test_pool_sweep_replans_and_reports_infeasible_points():
    job = load_job(TINY)
    rows = whatif.pool_nodes(job, "gpu", [0, 1], iterations=1)
    assert "infeasible" in rows[0]  # no training-capable pool left
    ok = rows[1]
    assert ok["simulated_s"] > 0 and ok["samples_per_s"] > 0 and "@gpu" in ok["placement"]
    assert ok["cost_per_sample"] == pytest.approx(ok["usd_per_hour"] / 3600 / ok["samples_per_s"],
                                                  rel=0.01)
    text = whatif.format_rows(rows)
    assert text.splitlines()[0] == "gpu nodes" and len(text.splitlines()) == 4


def test_sweeps_name_bad_knobs():
    job = load_job(TINY)
    with pytest.raises(SpecError, match="no pool 'tpu'"):
        whatif.pool_nodes(job, "tpu", [1])
    with pytest.raises(SpecError, match="lengths.response.kind"):
        whatif.response_tail(job, [0.5])  # tiny-cpu's responses are fixed


def test_staleness_sweep_switches_the_pipeline_mode():
    rows = whatif.staleness(load_job(TINY), [0, 1], iterations=2)
    assert rows[0]["plan"].mode == "sync" and rows[1]["plan"].mode == "async"


def test_placement_figure_colours_every_placed_device():
    plan = plan_job(Pricer(resolve(load_job(TINY)), Calibration()))
    fig = plots.placement(plan)
    grey = to_rgba("0.85")
    cells = [p for p in fig.axes[0].patches if p.get_fill() and p.get_width() == 1.0]
    placed = sum(len(b.devices) for b in plan.bundles)
    assert sum(1 for c in cells if c.get_facecolor() != grey) == placed
    pools = plan.resolved().job.cluster.pools
    assert len(cells) == sum(p.devices_per_node * p.nodes for p in pools)
    assert plots.png(fig)[:4] == b"\x89PNG"


def test_rows_carry_booked_cost_and_planned_only_points():
    job = load_job(TINY)
    res = resolve(job)
    row = whatif.evaluate(res, "k", 1, simulate=False)
    plan = row["plan"]
    assert "simulated_s" not in row
    assert row["samples_per_s"] == pytest.approx(plan.throughput_samples_s, rel=1e-3)
    assert row["booked_usd_per_hour"] == pytest.approx(plan.booked_usd_per_hour, abs=0.01)
    assert row["booked_cost_per_sample"] >= row["cost_per_sample"] > 0
    grid = whatif.grid(job, [whatif.parse_vary("gpu.nodes=1..2")])
    assert [r["point"] for r in grid] == [{"gpu.nodes": 1}, {"gpu.nodes": 2}]
    # a second GPU node doubles that pool's share of the booking, whatever the plan uses
    gpu = 2 * res.device_of("gpu").price_per_hour
    assert grid[1]["booked_usd_per_hour"] == pytest.approx(grid[0]["booked_usd_per_hour"] + gpu,
                                                           abs=0.01)


def test_simulated_rows_are_the_steady_state_not_the_first_iterations():
    """An async plan's first iterations fill the pipeline: a row reports the steady state (as
    `placer simulate` and `placer compare`), by default until its interval is tight, with N
    iterations over their steady window (warm-up and drain left out)."""
    from simplans import small_job

    from placer.spec.load import job_from_dict
    job = job_from_dict(small_job(pipeline={"mode": "async", "max_staleness": 1}))
    res = resolve(job)
    row = whatif.evaluate(res, "k", "async")
    _, st = simulate_steady(row["plan"], seed=job.seed)
    assert row["simulated_s"] == round(st.iteration_s, 3) and row["iterations"] == st.iterations
    assert row["samples_per_s"] == round(st.samples_per_s, 3) and row["converged"]
    assert row["ci95_s"][0] <= row["simulated_s"] <= row["ci95_s"][1]
    six = whatif.evaluate(res, "k", "async", iterations=6)
    sim = simulate_plan(six["plan"], iterations=6, seed=job.seed)
    assert six["iterations"] == 6 and six["simulated_s"] == round(steady_state(sim).iteration_s, 3)
    assert six["simulated_s"] != round(sim.metrics.iteration_s.mean, 3)  # warm-up left out
