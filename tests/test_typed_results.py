"""Typed results and their JSON forms: the simulator's metrics, the plan's explanation, the
fidelity, held-out and published-runs reports, and the calibration profile (one type wherever it
travels). Each JSON form reads back to an equal result; profiles and plans written before the
profile was typed (tests/data/calibration/, written by `placer calibrate -o` and `placer plan
-o`) read to the same factors and write back to the same bytes."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from simplans import example_plan, small_plan

from placer.base.errors import SpecError
from placer.cost.calibration import (
    calibration_from_dict,
    load_calibration,
    write_calibration,
)
from placer.cost.efficiency import Calibration, Efficiency, FitReport, StageReport
from placer.cost.pricer import Pricer
from placer.solve.explain import Explanation, explain
from placer.solve.planfile import Plan, calibration_of, load_plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from placer.spec.tailpolicy import TailPolicy
from simulator.api import simulate_plan
from simulator.config import Failures, SimConfig
from simulator.metrics import SimMetrics
from simulator.policies import with_policy
from workflows.fidelity_heldout import Row
from workflows.published import Comparison, PublishedReport, Result, Versus
from workflows.report import LengthRelation, Lengths, Pair, ReplayInputs, Report

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "calibration"
TINY = ROOT / "examples" / "tiny-cpu.yaml"


# ------------------------------------------------------------------ simulator metrics
@pytest.mark.parametrize("case", ["sync", "async with failures", "partial rollouts"])
def test_metrics_json_reads_back_equal(case: str) -> None:
    if case == "sync":
        plan, cfg = small_plan(), None
    elif case == "async with failures":
        plan = small_plan(pipeline={"mode": "async", "max_staleness": 1})
        cfg = SimConfig(failures=Failures(mtbf_hours={"gpu": 0.05}, restart_s=5.0,
                                          checkpoint_every=1, checkpoint_s=1.0))
    else:
        plan = with_policy(small_plan(), TailPolicy(kind="partial", token_budget=600))
        cfg = None
    m = simulate_plan(plan, iterations=3, seed=1, config=cfg).metrics
    doc = json.loads(m.to_json())
    assert doc == m.to_dict() and list(doc) == list(SimMetrics.model_fields)
    assert SimMetrics.from_json(m.to_json()) == m
    if case == "sync":
        assert list(doc["stage_s"]) == ["sync", "rollout", "score", "train"]
    if case == "async with failures":
        assert doc["stage_s"] == {} and m.stage_s.rollout is None
        assert m.restart_s == (5.0 if m.failures else 0.0) and m.checkpoints > 0
    if case == "partial rollouts":  # the policy's own fields lead the section
        assert list(doc["tail_policy"])[:2] == ["kind", "token_budget"]
        assert m.tail_policy.policy == TailPolicy(kind="partial", token_budget=600)


# ------------------------------------------------------------------ the plan's explanation
def test_explanation_json_reads_back_equal() -> None:
    plan = example_plan("hetero-split")  # a split role, host memory rows, releases
    ex = explain(plan, Pricer(plan.resolved(), Calibration()), time_limit_s=2.0)
    assert any(r.parts for r in ex.roles.values()) and ex.split
    doc = json.loads(ex.to_json())
    assert doc == ex.to_dict()
    assert Explanation.from_json(ex.to_json()) == ex
    one_pool = [role for role, r in ex.roles.items() if not r.parts]
    assert one_pool and all("parts" not in doc["roles"][role] for role in one_pool)


# ------------------------------------------------------------------ fidelity reports
def _report() -> Report:
    """A report whose numbers are at its JSON form's precision (seconds to 6 decimals)."""
    rel = LengthRelation(0.12, 0.000231, 2, ((1, 40.0, 0.05), (1, 90.0, 0.12)))
    return Report("tiny-cpu", 0.271234, {0: Pair(0.5, 0.31), 1: Pair(0.3125, 0.29)}, [1],
                  {"rollout": Pair(0.1, 0.09), "train": Pair(0.05, 0.0)},
                  {"actor": Pair(0.04, 0.05), "dispatch": Pair(0.0, 0.001)},
                  Lengths(rel, LengthRelation(0.0, 0.0, 0)),
                  ReplayInputs(8, 2, ("a note",), "given"))


def test_fidelity_report_json_reads_back_equal() -> None:
    rep = _report()
    doc = json.loads(rep.to_json())
    assert doc["roles"]["dispatch"]["error"] is None  # nothing measured: no error
    assert "points" not in doc["lengths"]["simulated"]
    assert Report.from_json(rep.to_json()) == rep
    bare = Report("j", 1.0, {0: Pair(1.0, 1.0)}, [0], {}, {}, rep.lengths)
    assert json.loads(bare.to_json())["inputs"] == {}
    assert Report.from_dict(bare.to_dict()) == bare


def test_heldout_row_json_reads_back_equal() -> None:
    row = Row("tp 2", "actor pinned to TP 2", 0.5, 0.45, 0.52, 0.4,
              {"rollout": Pair(0.2, 0.19)}, 0.03, 0.6)
    doc = row.to_dict()
    assert (doc["error_event"], doc["error_stage"]) == (-0.1, 0.04)
    assert Row.from_dict(json.loads(json.dumps(doc))) == row


def test_published_report_json_reads_back_equal() -> None:
    rep = PublishedReport(
        [Result("r01", 790.1, 700.0, {"rollout": Versus(357.4, 300.0)}),
         Result("r02", 365.3, 400.0, {}, fits=False, note="actor: out of memory")],
        [Comparison("sync a", 0.12, 0.1), Comparison("sync b", 15.8, 16.0)],
        [Comparison("decode", 6.5e-3, 6.4e-3)])
    doc = json.loads(rep.to_json())
    assert doc["median_abs_error"] == rep.median_abs_error and "stages" not in doc["sync"][0]
    assert PublishedReport.from_json(rep.to_json()) == rep


# ------------------------------------------------------------------ calibration: one type
def _changed(e: Efficiency) -> dict[str, float]:
    base = Efficiency()
    return {f.name: getattr(e, f.name) for f in fields(e)
            if getattr(e, f.name) != getattr(base, f.name)}


def _factors(c: Calibration) -> dict[str, Any]:
    return {"default": _changed(c.default),
            "per_device": {k: _changed(v) for k, v in c.per_device.items()}}


EXPECTED = json.loads((DATA / "calibrations.json").read_text())  # what the old reader gave


@pytest.mark.parametrize("name", ["events.yaml", "stages.json", "hand.yaml"])
def test_old_profiles_read_the_same_and_write_back_the_same(name: str, tmp_path: Path) -> None:
    """events.yaml and stages.json: `placer calibrate -o` (an event fit; an executed run's, with
    its stage fit); hand.yaml: written by hand (its flow style is not kept, its document is)."""
    calib = load_calibration(DATA / name)
    assert _factors(calib) == EXPECTED[name]
    write_calibration(calib, tmp_path / name)
    if name == "hand.yaml":
        doc = yaml.safe_load((DATA / name).read_text())
        assert json.dumps(calib.to_dict()) == json.dumps(doc)
    else:
        assert (tmp_path / name).read_text() == (DATA / name).read_text()
    assert calibration_from_dict(calib.to_dict()) == calib


@pytest.mark.parametrize("name", ["plan-stages.json", "plan-hand.json"])
def test_old_plans_read_the_same_calibration_and_write_back_the_same(name: str) -> None:
    plan = load_plan(DATA / name)
    assert isinstance(plan.calibration, Calibration)
    assert _factors(calibration_of(plan)) == EXPECTED[name]
    assert plan.to_json() == (DATA / name).read_text()
    assert Plan.model_validate_json(plan.to_json()) == plan


def test_a_profile_keeps_its_spelling() -> None:
    """Integers stay integers, sections keep their order and their nulls, other keys of the
    fit report are kept: writing a profile back gives the document it was read from."""
    doc = {"devices": {"H100-SXM": {"max_num_seqs": 256}, "L40S": None},
           "default": {"mfu_train": 0.35}, "fit": {"note": "by hand", "counts": {"x@y": 3}}}
    calib = calibration_from_dict(doc)
    assert json.dumps(calib.to_dict()) == json.dumps(doc)
    assert calib.per_device["H100-SXM"].max_num_seqs == 256.0
    assert calib.per_device["L40S"] == calib.default
    assert calib.fit is not None and calib.fit.counts == {"x@y": 3}


def test_a_calibration_set_in_code_has_a_document_too() -> None:
    calib = Calibration(default=Efficiency(mfu_train=0.5),
                        per_device={"H100-SXM": Efficiency(mfu_train=0.5, link_eff=0.7)})
    assert calib.to_dict() == {"default": {"mfu_train": 0.5},
                               "devices": {"H100-SXM": {"link_eff": 0.7}}}
    assert calibration_from_dict(calib.to_dict()) == calib
    assert Calibration().is_default and not calib.is_default
    assert not calibration_from_dict({}).is_default  # an (empty) profile was given


def test_the_stage_fit_report_reads_back() -> None:
    fit = FitReport.from_dict({"trace": "run.json", "counts": {"train@gpu": 3}})
    with_stages = fit.with_stages({"gpu.sync_latency_s": StageReport(
        stage="sync", value=0.05, measured_s=0.1, simulated_s=0.1)})
    doc = with_stages.to_dict()
    assert list(doc) == ["trace", "counts", "stages"]
    assert FitReport.from_dict(json.loads(json.dumps(doc))) == with_stages
    calib = Calibration().with_fit(with_stages).with_factor("gpu", "sync_latency_s", 0.05)
    assert calib.to_dict()["devices"] == {"gpu": {"sync_latency_s": 0.05}}
    assert calibration_from_dict(calib.to_dict()) == calib


def test_a_plan_records_the_profile_it_was_priced_with() -> None:
    res = resolve(load_job(TINY))
    calib = load_calibration(DATA / "hand.yaml")
    plan = plan_job(Pricer(res, calib), time_limit_s=5, workers=1)
    assert plan.calibration == calib
    assert json.loads(plan.to_json())["calibration"] == calib.to_dict()
    assert plan_job(Pricer(res, Calibration()), time_limit_s=5, workers=1).calibration is None


def test_a_plan_with_a_bad_profile_is_refused_naming_the_factor(tmp_path: Path) -> None:
    doc = json.loads((DATA / "plan-hand.json").read_text())
    doc["calibration"]["default"]["mfu_trian"] = 0.5
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"calibration: .*mfu_trian"):
        load_plan(tmp_path / "plan.json")
    doc["calibration"] = {"default": {"link_eff": 0}}
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"calibration: default\.link_eff: must be at least"):
        load_plan(tmp_path / "plan.json")
