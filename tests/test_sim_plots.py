"""The simulator's figures: binned work equals the brute-force overlap, and a timeline draws a
bounded number of bars whatever the number of events (one bar per pixel, not per event)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PolyCollection

from placer.cost.calibration import load_calibration
from placer.cost.pricer import Pricer
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from simulator import plots
from simulator.api import simulate_plan

ROOT = Path(__file__).resolve().parent.parent


def _brute(starts: np.ndarray, durs: np.ndarray, edges: np.ndarray, w: np.ndarray) -> np.ndarray:
    out = np.zeros(len(edges) - 1)
    for s, d, wi in zip(starts, durs, w):
        for b in range(len(edges) - 1):
            out[b] += wi * max(0.0, min(s + d, edges[b + 1]) - max(s, edges[b]))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_binned_work_equals_the_overlap_of_every_interval(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    starts, durs = rng.uniform(0, 10, n), rng.exponential(1.0, n)
    w = rng.integers(1, 5, n).astype(float)
    edges = np.linspace(0, 12, 37)
    assert np.allclose(plots.covered(starts, durs, edges, w), _brute(starts, durs, edges, w))
    assert np.allclose(plots.covered(starts, durs, edges), _brute(starts, durs, edges, np.ones(n)))


def test_no_intervals_cover_nothing() -> None:
    assert not plots.covered(np.array([]), np.array([]), np.linspace(0, 1, 5)).any()


def test_timeline_bars_are_bounded_by_pixels_not_events(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    job = ROOT / "examples" / "agentic-code.yaml"
    plan = plan_job(Pricer(resolve(load_job(job), str(job)), load_calibration(None)))
    result = simulate_plan(plan, iterations=2, seed=0)
    drawn: list[int] = []
    real = plots.save

    def count(fig, path):  # type: ignore[no-untyped-def]
        drawn.extend(len(c.get_paths()) for ax in fig.axes for c in ax.collections
                     if isinstance(c, PolyCollection))
        return real(fig, path)

    monkeypatch.setattr(plots, "save", count)
    plots.timeline(result, tmp_path / "timeline.png")
    events = len(result.trace.events)
    assert (tmp_path / "timeline.png").stat().st_size > 0
    assert drawn and max(drawn) <= plots.PIXELS  # one collection per row and kind
    assert sum(drawn) < events  # fewer bars than events: the binning did its work


def test_a_split_rollout_gets_one_timeline_row_per_part() -> None:
    from matplotlib.colors import to_rgba
    from simplans import hetero_split_plans

    from placer.base.palette import KIND_COLOURS

    plan = hetero_split_plans()[0]
    split = next(s for s in plan.slots if s.parts)
    parts = split.parts
    assert len({q.pool for q in parts}) == len(parts) >= 2
    result = simulate_plan(plan, iterations=1, seed=0)
    fig = plots.timeline_figure(result)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    want = [lab for s in plan.slots
            for lab in ([f"{s.name} @ {q.pool}" for q in s.parts] if s.parts else [s.name])]
    assert labels == want and len(labels) == len(plan.slots) + len(parts) - 1
    # each part's row carries the decode steps its own engines ran (events land by their pool)
    decode = to_rgba(KIND_COLOURS["decode"])[:3]
    rows_with_decode = {round(c.get_paths()[0].vertices[:, 1].min() + 0.4)
                        for c in ax.collections if isinstance(c, PolyCollection)
                        and tuple(c.get_facecolor()[0][:3]) == decode}
    assert {labels[r] for r in rows_with_decode} == {f"{split.name} @ {q.pool}" for q in parts}
