"""The typed contracts between the parts: trace event args (`traces.schema.EventArgs`), the plan's
job (`Plan.spec`, validated once and cached) and the simulator's settings (`SimConfig`)."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from simplans import example_names, hand_plan

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.calibrate.synthetic import cost_model_trace
from placer.cost.calibration import calibration_from_dict
from placer.solve.planfile import Plan
from placer.spec.job import Job
from placer.spec.load import dump_job
from simulator.config import Failures, SimConfig, Stragglers, config_from_dict, describe
from traces.schema import STRICT_ENV, EventArgs, Trace, TraceError, TraceEvent, read_trace


# ------------------------------------------------------------------------------ trace event args
@pytest.mark.parametrize("name", [n for n in example_names() if n != "large-1k-nodes"])
def test_every_simulated_event_follows_the_schema(name: str, golden_runs) -> None:
    """The simulation of the example's plan as written (the stored golden plan, which
    tests/test_sim_golden.py simulates too: one run serves both)."""
    trace = golden_runs(name).trace
    trace.check()  # strict in the test suite: an unknown key is an error
    assert {e.fields.role for e in trace.events if e.fields.role is not None} <= set(Role)


def test_synthetic_traces_follow_the_schema() -> None:
    trace = cost_model_trace(hand_plan("tiny-cpu"), calibration_from_dict({}), per_kind=3)
    trace.check()
    # per_kind events of every kind the fit prices, for each role that does that work
    kinds = Counter((e.cat, e.fields.role) for e in trace.events if e.cat != "tool")
    assert set(kinds.values()) == {3}, kinds
    assert {cat for cat, _ in kinds} == {"prefill", "decode", "forward", "train", "transfer"}


def test_fields_are_typed_and_args_stay_as_written() -> None:
    ev = TraceEvent("decode", "decode", 0.0, 1.0, "gpu:0", "slot0",
                    {"role": "rollout", "step": 3, "tokens": 96, "batch": 4,
                     "sample_ids": [1, "s2"], "devices": ["gpu:0:0"]})
    assert ev.fields.role is Role.ROLLOUT and ev.fields.step == 3
    assert ev.fields.tokens == 96.0 and ev.fields.sample_ids == [1, "s2"]
    assert ev.args["tokens"] == 96  # the file keeps what the writer wrote
    assert ev.to_chrome()["args"] == ev.args


def test_a_wrong_type_names_the_event_and_key() -> None:
    ev = TraceEvent("train", "train", 0.0, 1.0, "gpu:0", "s0", {"step": "three"})
    with pytest.raises(TraceError, match=r"event train 'train': args\.step: .*valid integer"):
        ev.fields  # noqa: B018 - the access validates


def test_an_unknown_key_is_an_error_when_strict_and_kept_otherwise(monkeypatch) -> None:
    args = {"role": "actor", "colour": "red"}
    assert EventArgs.__pydantic_fields__.keys().isdisjoint({"colour"})
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(TraceError, match="unknown keys colour"):
        TraceEvent("x", "train", 0.0, 1.0, "p", "t", args).fields  # noqa: B018 - the access validates
    monkeypatch.setenv(STRICT_ENV, "0")
    lenient = TraceEvent("x", "train", 0.0, 1.0, "p", "t", args).fields
    assert lenient.unknown() == ["colour"] and lenient.role is Role.ACTOR


def test_write_checks_the_schema(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(STRICT_ENV, "1")
    bad = Trace({}, [TraceEvent("x", "train", 0.0, 1.0, "p", "t", {"colour": 1})])
    with pytest.raises(TraceError):
        bad.write(tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()
    good = Trace({"source": "test"}, [TraceEvent("x", "train", 0.0, 1.0, "p", "t", {"step": 0})])
    good.write(tmp_path / "t.json")
    assert read_trace(tmp_path / "t.json").events[0].fields.step == 0


# ------------------------------------------------------------------------------ the plan's job
def test_plan_spec_is_the_validated_job_cached_and_the_file_unchanged(tmp_path) -> None:
    plan = hand_plan("tiny-cpu")
    assert isinstance(plan.spec, Job) and plan.spec is plan.spec
    assert plan.resolved() is plan.resolved() and plan.resolved().job is plan.spec
    assert dump_job(plan.spec) == plan.job  # the job as written (defaults of new keys left out)
    again = Plan.model_validate(json.loads(plan.to_json()))
    assert again == plan and json.loads(again.to_json()) == json.loads(plan.to_json())
    renamed = plan.model_copy(update={"job": {**plan.job, "name": "other"}})
    assert renamed.spec.name == "other" and plan.spec.name == "tiny-cpu"


# ------------------------------------------------------------------------------ SimConfig
def test_sim_config_reads_its_yaml_shape_and_names_bad_keys() -> None:
    cfg = config_from_dict({"stragglers": {"fraction": 0.1}, "failures": {"mtbf_hours": {"gpu": 5}},
                            "record_tools": False})
    assert cfg == SimConfig(stragglers=Stragglers(fraction=0.1),
                            failures=Failures(mtbf_hours={"gpu": 5.0}), record_tools=False)
    for data, needle in [({"stragglers": {"fraction": 2}}, "config.stragglers.fraction"),
                         ({"stragglers": {"persistent": 1}}, "config.stragglers.persistent"),
                         ({"failures": {"checkpoint_every": True}},
                          "config.failures.checkpoint_every"),
                         ({"network": {"link_factors": {"send": 0}}},
                          "config.network.link_factors.send"),
                         ({"colour": 1}, "config.colour: unknown key")]:
        with pytest.raises(SpecError, match=needle.replace(".", r"\.")):
            config_from_dict(data)


def test_sim_config_is_frozen_with_help_for_every_knob() -> None:
    cfg = SimConfig()
    with pytest.raises(ValueError):
        cfg.record_tools = False  # type: ignore[misc]
    knobs = dict(describe())
    assert "stragglers.fraction" in knobs and all(knobs.values())
    assert SimConfig.no_variance().workload.lengths == "mean"
