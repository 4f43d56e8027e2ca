"""The error band on every prediction (placer/cost/band.py): the shipped residual table stays
in step with the leave-one-out fit, the band's arithmetic, and the band in plans and on the
command line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.cli import main
from placer.cost.band import Residual, ResidualTable, Tags, band, load_table
from placer.cost.factor_ranges import load_ranges
from placer.solve.planfile import load_plan
from workflows.loo import LooReport

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "tiny-moe.yaml")
H100 = Tags("H100-SXM", "dense", "colocate")


def _table(errors: list[float], tags: list[Tags]) -> ResidualTable:
    return ResidualTable(tuple(Residual(f"row{i}", e, t)
                               for i, (e, t) in enumerate(zip(errors, tags, strict=True))), "test")


@pytest.fixture(scope="module")
def fresh_loo(published_loo: LooReport) -> LooReport:
    return published_loo  # tests/conftest.py: computed once, shared with tests/test_loo.py


def test_shipped_table_equals_a_fresh_leave_one_out_computation(fresh_loo: LooReport) -> None:
    # A regression guard: the file is this computation's output (python -m workflows.published
    # --loo --write-band); it fails when the cost model moves and the file was not rewritten.
    fresh, shipped = fresh_loo.table, load_table()
    assert [(r.name, r.tags) for r in shipped.rows] == [(r.name, r.tags) for r in fresh.rows]
    for s, f in zip(shipped.rows, fresh.rows, strict=True):
        assert s.error == pytest.approx(f.error, rel=1e-9, abs=1e-12), s.name
    assert shipped.source == fresh.source


def test_shipped_factor_ranges_equal_a_fresh_leave_one_out_computation(
        fresh_loo: LooReport) -> None:
    # A regression guard like the table's: the ranges `plan --robust --explain` re-prices at are
    # the leave-one-out fits' spread, written by the same command.
    from workflows.loo import ROW_FACTORS

    fresh, shipped = fresh_loo.ranges, load_ranges()
    assert list(shipped.ranges) == [f.name for f in ROW_FACTORS] == list(fresh.ranges)
    for name, (lo, hi) in shipped.ranges.items():
        assert 0 < lo <= hi
        assert (lo, hi) == pytest.approx(fresh.ranges[name], rel=1e-9), name
    assert shipped.source == fresh.source


def test_band_contains_the_prediction_when_residuals_straddle_zero() -> None:
    t = _table([-0.2, 0.1, 0.05, -0.05, 0.3], [H100] * 5)
    b = band(100.0, H100, t)
    assert b.widen == 0 and b.lo < 100.0 < b.hi
    assert b.lo == pytest.approx(100 / 1.3) and b.hi == pytest.approx(100 / 0.8)
    # all residuals above zero (the model over-predicts): truth lies below the prediction
    over = band(100.0, H100, _table([0.1, 0.2, 0.3, 0.15, 0.25], [H100] * 5))
    assert over.hi < 100.0


def test_band_widens_with_dissimilarity() -> None:
    errors = [-0.2, 0.1, 0.05, -0.05, 0.3]
    alike = band(100.0, H100, _table(errors, [H100] * 5))
    one_off = band(100.0, H100, _table(errors, [Tags("H20", "dense", "colocate")] * 5))
    all_off = band(100.0, H100, _table(errors, [Tags("H20", "moe", "async")] * 5))
    assert alike.hi - alike.lo < one_off.hi - one_off.lo < all_off.hi - all_off.lo
    assert all_off.lo < one_off.lo < alike.lo and alike.hi < one_off.hi < all_off.hi


def test_band_takes_the_most_similar_rows() -> None:
    tags = [Tags("H20", "moe", "async")] * 5 + [H100, H100]
    b = band(100.0, H100, _table([0.5] * 5 + [0.0, 0.01], tags), k=2)
    assert [n for n, _, _ in b.rows] == ["row5", "row6"] and b.widen == 0


def test_plan_json_has_the_band_and_where_it_came_from(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", TINY, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    lo, hi = doc["predicted_iteration_s_band"]
    assert lo < doc["predicted_iteration_s"] < hi
    src = doc["band_source"]
    assert src["tags"]["model"] == "moe" and set(src["tags"]) == {"device", "model", "mode"}
    assert len(src["rows"]) == 5 and src["table"].startswith("python -m workflows.published")


def test_plan_written_before_bands_loads_and_writes_back_unchanged(tmp_path: Path) -> None:
    # a plan file as it was written before plans carried a band: a golden plan without one
    doc = json.loads((ROOT / "traces" / "golden" / "tiny-moe.plan.json").read_text())
    assert doc.pop("predicted_iteration_s_band") and doc.pop("band_source")
    path = tmp_path / "old.plan.json"
    path.write_text(json.dumps(doc, indent=2))
    plan = load_plan(path)
    assert plan.predicted_iteration_s_band is None and plan.band_source is None
    assert json.loads(plan.to_json()) == doc


def test_plan_compare_and_sweep_show_the_band(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", TINY]) == 0
    assert "\nband " in capsys.readouterr().out
    assert main(["compare", TINY]) == 0
    out = capsys.readouterr().out
    assert "band s" in out.splitlines()[1]
    assert main(["compare", TINY, "--json"]) == 0
    ilp = json.loads(capsys.readouterr().out)["plans"]["ilp"]
    assert len(ilp["predicted_iteration_s_band"]) == 2
    assert main(["sweep", TINY, "--vary", "batch.prompts=4,8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "band s" in lines[0] and all("-" in ln.split()[2] for ln in lines[1:3])
