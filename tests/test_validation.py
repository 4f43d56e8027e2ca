"""Periodic validation inside the step (`Job.validation`, `placer.cost.validation`)."""
from __future__ import annotations

import pytest
import yaml
from specdata import ROOT, h100_job

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.cost.timing import Breakdown, Placed, onload_time
from placer.cost.validation import validation_rollout_s
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict, load_job

CAL = Calibration()


def _job(validation: dict[str, int] | None = None) -> dict:
    job = h100_job("val", framework="verl")
    job["lengths"]["response"] = {"kind": "lognormal", "median": 200, "sigma": 1.0, "cap": 2048}
    if validation is not None:
        job["validation"] = validation
    return job


def _priced(job: dict) -> tuple[Pricer, list[Placed], Breakdown]:
    """The job colocated on the 8 H100s: actor DP8, rollout TP2 x 4, rule reward on the CPU."""
    px = Pricer(resolve(job_from_dict(job)), CAL)
    h, cpu = px.res.cluster.pool("h"), px.res.cluster.pool("cpu")
    placed = [Placed("h", px.estimate(Role.ACTOR, h, Parallel(dp=8))),
              Placed("h", px.estimate(Role.ROLLOUT, h, Parallel(tp=2, dp=4))),
              Placed("cpu", px.estimate(Role.REWARD, cpu, Parallel(dp=1)))]
    return px, placed, px.iteration_time(placed)


def test_no_validation_prices_no_stage() -> None:
    _, _, bd = _priced(_job())
    assert "validate" not in bd.stage_s


def test_step_carries_one_validation_per_every_steps() -> None:
    """The step grows by (the validation batch's rollout + the refit + the engines' sleep and
    wake) / every, on the rollout's slot, and nothing else moves."""
    _, _, plain = _priced(_job())
    px, placed, bd = _priced(_job({"every": 10, "samples": 24}))
    rollout = placed[1].est
    gen = validation_rollout_s(px, rollout)
    dev = px.res.device_of("h")
    swap = onload_time(Role.ROLLOUT, rollout.memory, dev, px.calib.for_device(dev),
                       px.res.job.sleep_level)
    want = (gen + bd.sync_s + swap) / 10
    assert gen > 0 and swap > 0
    assert bd.stage_s["validate"] == pytest.approx(want)
    assert bd.iteration_s == pytest.approx(plain.iteration_s + want)
    assert {k: v for k, v in bd.stage_s.items() if k != "validate"} == pytest.approx(
        plain.stage_s)
    _, _, half = _priced(_job({"every": 5, "samples": 24}))
    assert half.stage_s["validate"] == pytest.approx(2 * want)


def test_validation_tail_is_its_own_batch() -> None:
    """A validation of few sequences draws its own longest one: it takes less than the
    training rollout of the step's 32 sequences, more than nothing, and more sequences never
    take less."""
    px, placed, _ = _priced(_job({"every": 1, "samples": 4}))
    rollout = placed[1].est
    small = validation_rollout_s(px, rollout)
    px_big, placed_big, _ = _priced(_job({"every": 1, "samples": 64}))
    big = validation_rollout_s(px_big, placed_big[1].est)
    assert 0 < small <= big
    assert small < rollout.stage_s["rollout"]


def test_engines_alone_pay_no_swap() -> None:
    """An engine on devices of its own neither sleeps nor wakes for the validation."""
    job = _job({"every": 2, "samples": 8})
    job["cluster"]["pools"][0]["nodes"] = 2
    px = Pricer(resolve(job_from_dict(job)), CAL)
    h, cpu = px.res.cluster.pool("h"), px.res.cluster.pool("cpu")
    placed = [Placed("a", px.estimate(Role.ACTOR, h, Parallel(dp=8))),
              Placed("r", px.estimate(Role.ROLLOUT, h, Parallel(tp=2, dp=4))),
              Placed("cpu", px.estimate(Role.REWARD, cpu, Parallel(dp=1)))]
    bd = px.iteration_time(placed)
    gen = validation_rollout_s(px, placed[1].est)
    assert bd.stage_s["validate"] == pytest.approx((gen + bd.sync_s) / 2)


@pytest.mark.parametrize("bad, needle", [
    ({"every": 0, "samples": 8}, "validation.every"),
    ({"every": 10}, "validation.samples"),
    ({"every": 10, "samples": 8, "size": 3}, "validation.size"),
])
def test_bad_validation_names_its_field(bad: dict, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        job_from_dict(_job(bad))


def test_validation_refused_for_agent_jobs() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "multiagent-tiny-cpu.yaml").read_text())
    doc["validation"] = {"every": 10, "samples": 8}
    with pytest.raises(SpecError, match="validation: not priced for a multi-agent job"):
        job_from_dict(doc)
    assert load_job(ROOT / "examples" / "multiagent-tiny-cpu.yaml").validation is None


def test_validation_waits_for_its_whole_set() -> None:
    """The job's tail policy cuts the training generation, not a validation's: over-provisioning
    leaves the validation's generation as it was."""
    job = _job({"every": 4, "samples": 16})
    px, placed, _ = _priced(job)
    over = _job({"every": 4, "samples": 16})
    over["tail_policy"] = {"kind": "overprovision", "fraction": 0.5}
    px_over, placed_over, _ = _priced(over)
    assert validation_rollout_s(px_over, placed_over[1].est) == pytest.approx(
        validation_rollout_s(px, placed[1].est))


# --------------------------------------------------------------------------- the simulator
def _sim_plan(validation: dict[str, int] | None, mode: str = "sync"):
    """The small colocated job (tests/simplans.py) placed by hand, with `validation`."""
    from simplans import SMALL_PLACEMENT, small_job

    from simulator.handplans import place
    job = small_job(pipeline={"mode": mode, "max_staleness": int(mode == "async")})
    if validation is not None:
        job["validation"] = validation
    return place(resolve(job_from_dict(job), "small"), SMALL_PLACEMENT, CAL)


def test_simulator_validates_the_steps_test_freq_picks() -> None:
    """Every `every`-th step (verl's global_steps % test_freq == 0) runs one pass after its
    train: its events carry the marker, its generation runs `samples` sequences of its own
    draws, and the steps' own samples do not move."""
    from simulator.api import simulate_plan
    from simulator.validation import validates
    plan = _sim_plan({"every": 3, "samples": 24})
    r = simulate_plan(plan, iterations=6, seed=7)
    base = simulate_plan(_sim_plan(None), iterations=6, seed=7)
    its = r.run.iterations
    assert [validates(plan.spec, i) for i in range(6)] == [False, False, True] * 2
    assert ["validate" in it.stages for it in its] == [False, False, True] * 2
    for it in its:
        if "validate" in it.stages:
            assert it.stages["validate"][0] >= it.stages["train"][1]
            assert it.stages["validate"][1] == pytest.approx(it.end)
    assert r.run.samples[0] == base.run.samples[0]
    assert [it.end - it.start for it in base.run.iterations][:2] == pytest.approx(
        [it.end - it.start for it in its][:2])
    events = r.trace.events
    stages = [e for e in events if e.cat == "stage" and e.name == "validate"]
    assert [e.fields.step for e in stages] == [2, 5]
    assert all(e.fields.validation and e.fields.batch == 24 for e in stages)
    marked = [e for e in events if e.args.get("validation")]
    assert {e.cat for e in marked} >= {"stage", "prefill", "decode", "transfer"}
    assert not any(e.args.get("validation") for e in base.trace.events)
    # the metrics' stage table carries the passes' share of a step, as the plan prices it
    spans = [it.stages["validate"][1] - it.stages["validate"][0] for it in its[2::3]]
    assert r.metrics.stage_s.validation == pytest.approx(sum(spans) / 6)
    assert base.metrics.stage_s.validation is None
    assert "validation" not in base.metrics.stage_s.model_dump()


def test_simulated_validation_draws_from_the_seed() -> None:
    """The validation set is drawn from the run's seed: the same seed runs the same pass,
    another seed another one."""
    from simulator.api import simulate_plan
    plan = _sim_plan({"every": 1, "samples": 24})

    def validate_s(seed: int) -> float:
        it = simulate_plan(plan, iterations=1, seed=seed).run.iterations[0]
        return it.stages["validate"][1] - it.stages["validate"][0]
    assert validate_s(3) == validate_s(3)
    assert validate_s(3) != validate_s(4)


def test_async_step_waits_for_its_validation() -> None:
    """In async mode the validating step commits after its pass."""
    from simulator.api import simulate_plan
    r = simulate_plan(_sim_plan({"every": 2, "samples": 16}, "async"), iterations=4, seed=0)
    for i, it in enumerate(r.run.iterations):
        assert ("validate" in it.stages) == (i % 2 == 1)
        if "validate" in it.stages:
            assert it.stages["validate"][1] == pytest.approx(it.end)
