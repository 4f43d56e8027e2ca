"""The robust choice (placer/solve/robust.py): `plan --robust` picks the plan with the smallest
band upper end, records it, `compare` ranks by predicted time and by the band's ends, and
`--explain` names the inputs whose range flips the choice against the runner-up."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.cli import main
from placer.cost.band import Residual, ResidualTable, Tags
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.pricer import Pricer
from placer.solve import robust as rb
from placer.solve.planfile import Plan, load_plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "tiny-cpu.yaml")
QWEN7B = str(ROOT / "examples" / "grpo-qwen7b-h100.yaml")


def _alternatives(path: str) -> dict[str, Plan | None]:
    px = Pricer(resolve(load_job(path), path), Calibration())
    return rb.alternatives(px, plan_job(px, time_limit_s=5.0))


@pytest.fixture(scope="module")
def qwen7b() -> dict[str, Plan | None]:
    return _alternatives(QWEN7B)


def _tags(mode: str) -> Tags:
    return Tags("emu-gpu", "dense", mode)  # tiny-cpu's actor device and policy class


@pytest.fixture
def colocate_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hand residual table: the cost model was far off on colocated runs like tiny-cpu's and
    right on split ones, so the colocated ILP plan's band is wide and the split plan's narrow."""
    rows = [Residual(f"c{i}", e, _tags("colocate")) for i, e in enumerate([-0.6, 0.0, 0.1, 0, 0])]
    rows += [Residual(f"s{i}", e, _tags("split")) for i, e in enumerate([-0.02, 0.02, 0, 0, 0])]
    table = ResidualTable(tuple(rows), "hand table")
    monkeypatch.setattr("placer.solve.assemble.load_table", lambda: table)


def test_robust_picks_the_smallest_upper_end_over_the_fastest_prediction(
        colocate_wide: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", TINY, "--robust", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    c = doc["choice"]
    assert c["rule"] == "robust" and c["chosen"] == "split" and c["plain"] == "ilp"
    assert doc["solver"]["name"] == "split"
    # the split plan predicts slower but its worst case is better
    assert doc["predicted_iteration_s"] > c["plain_predicted_s"]
    assert doc["predicted_iteration_s_band"][1] < c["plain_band"][1]
    assert set(c["candidates"]) >= {"ilp", "colocated", "split"}
    assert main(["plan", TINY, "--robust"]) == 0
    out = capsys.readouterr().out
    assert "robust choice: split" in out and "predicted-time choice would be ilp" in out


def test_compare_ranks_by_prediction_and_by_each_end_of_the_band(
        colocate_wide: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", TINY, "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    # three plans share the ILP's placement (predicted rank 1 each); split is slower on the
    # prediction but has the smallest upper end
    assert plans["ilp"]["rank"] == {"predicted": 1, "lo": 1, "hi": 2}
    assert plans["split"]["rank"] == {"predicted": 4, "lo": 4, "hi": 1}
    assert all("rank" not in r for r in plans.values() if not r["applicable"])
    assert main(["compare", TINY]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "rank p/lo/hi" in lines[1]
    assert next(ln for ln in lines if ln.startswith("split ")).split()[3] == "4/4/1"


def test_ranks_share_equal_figures() -> None:
    plans = _alternatives(TINY)
    figs = {n: rb._figures(p) for n, p in plans.items() if p is not None}
    rk = rb.ranks(plans)
    for n, f in figs.items():
        for k in rb.RANK_KEYS:
            assert rk[n][k] == 1 + sum(g[k] < f[k] for g in figs.values())
    assert rk["ilp"] == rk["colocated"]  # the same placement, the same figures


def test_plain_and_robust_agree_on_the_shipped_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", TINY, "--robust", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "robust choice: ilp" in out and "the predicted-time choice is the same plan" in out
    assert "sensitivity of the choice (ilp against " in out


def test_explain_json_carries_the_choice_and_its_flips(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", TINY, "--robust", "--explain", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["choice"]["chosen"] == doc["robust"]["chosen"] == "ilp"
    assert doc["robust"]["runner_up"] in doc["plan"]["choice"]["candidates"]
    assert doc["robust"]["flips"] == []  # the ILP's plan is no slower anywhere on tiny-cpu


def test_choice_round_trips_and_old_plans_write_back_unchanged(tmp_path: Path) -> None:
    golden = ROOT / "traces" / "golden" / "tiny-moe.plan.json"
    doc = json.loads(golden.read_text())
    assert "choice" not in doc
    plan = load_plan(golden)
    assert plan.choice is None and json.loads(plan.to_json()) == doc
    _, chosen = rb.robust_choice({"ilp": plan})
    path = tmp_path / "chosen.plan.json"
    path.write_text(chosen.to_json())
    back = load_plan(path)
    assert back.choice is not None and back.choice.rule == "robust" and back == chosen
    assert json.loads(back.to_json())["choice"]["plain"] == "ilp"


def test_sensitivity_names_a_factor_that_flips_the_choice(
        qwen7b: dict[str, Plan | None]) -> None:
    # colocated (the ILP's plan) against split: colocation pays the engine's sleep on every
    # iteration, split never does, so a slow enough sleep makes split the faster
    ilp, split = qwen7b["ilp"], qwen7b["split"]
    assert ilp is not None and split is not None
    assert ilp.predicted_iteration_s < split.predicted_iteration_s
    nominal = Efficiency().engine_sleep_s
    flips = rb.sensitivity(ilp, split, Calibration(),
                           {"engine_sleep_s": (nominal / 2, nominal * 10)})
    assert [(f.input, f.value) for f in flips] == [("efficiency.engine_sleep_s", nominal * 10)]
    assert flips[0].chosen_s > flips[0].other_s and flips[0].nominal == nominal


def test_sensitivity_reports_nothing_when_no_range_flips(qwen7b: dict[str, Plan | None]) -> None:
    ilp, split = qwen7b["ilp"], qwen7b["split"]
    assert ilp is not None and split is not None
    nominal = Efficiency().engine_sleep_s
    assert rb.sensitivity(ilp, split, Calibration(),
                          {"engine_sleep_s": (nominal / 2, nominal * 2)}) == []


def test_length_inputs_cover_each_parameter() -> None:
    job = load_job(QWEN7B)
    got = rb.length_inputs(job)
    assert all(lo == pytest.approx(v * 0.75) and hi == pytest.approx(v * 1.25)
               for v, lo, hi in got.values())
    assert set(got) == {"lengths.prompt.mean", "lengths.prompt.std",
                        "lengths.response.median", "lengths.response.sigma"}
    assert got["lengths.response.median"][0] == job.lengths.response.median


@pytest.mark.parametrize("extra, field", [(["--sweep"], "--robust"),
                                          (["--objective", "cost"], "--robust")])
def test_robust_refuses_what_it_cannot_choose(extra: list[str], field: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", TINY, "--robust", *extra]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err
