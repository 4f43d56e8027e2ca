"""What-if sweeps (workflows/whatif.py) and the plan figures (placer/plots.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.colors import to_rgba

from placer import plots
from placer.catalog import resolve
from placer.costmodel import Calibration
from placer.planner import plan_job
from placer.spec import SpecError, load_job
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
    plan = plan_job(resolve(load_job(TINY)), Calibration())
    fig = plots.placement(plan)
    grey = to_rgba("0.85")
    cells = [p for p in fig.axes[0].patches if p.get_fill() and p.get_width() == 1.0]
    placed = sum(len(b.devices) for b in plan.bundles)
    assert sum(1 for c in cells if c.get_facecolor() != grey) == placed
    pools = plan.resolved().job.cluster.pools
    assert len(cells) == sum(p.devices_per_node * p.nodes for p in pools)
    assert plots.png(fig)[:4] == b"\x89PNG"
