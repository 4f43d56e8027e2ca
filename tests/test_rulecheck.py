"""Rule rewards priced by their kind of check (placer/cost/rulecheck.py) and fitted per kind
(placer/calibrate/fit_rule.py); no switch or offload on a device whose memory is host RAM."""
from __future__ import annotations

from dataclasses import replace

import pytest
from specdata import base

from placer.calibrate.fit_rule import fit_rule_factors
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.pricer import Pricer
from placer.cost.rulecheck import rule_reward_time, uses_sandbox
from placer.cost.timing import Placed
from placer.solve.baselines import colocated
from placer.solve.planner import build_problem, plan_assignment, plan_job
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from placer.spec.localdata import Dataset
from traces.schema import Trace, TraceEvent

EFF = Efficiency(rule_reward_s=0.01, sandbox_batch_s=0.1, sandbox_sample_s=0.002)
CODE_ENV = {"kind": "code", "turns": 1, "tool_latency_s": {"kind": "fixed", "value": 0.05}}


def _job(env: dict | None = None, reward: str | None = None):
    job = job_from_dict(base(**({"environment": env} if env else {})))
    if reward is not None:  # the file is never read by the planner
        job = job.model_copy(update={"data": Dataset(path="x.jsonl", reward=reward)})
    return job


def test_each_kind_is_priced_by_its_own_factors() -> None:
    n, cores = 32, 2
    math_only = _job(reward="math")  # sympy in process: no sandbox at all
    assert not uses_sandbox(math_only)
    assert rule_reward_time(math_only, n, 1, cores, EFF) == pytest.approx(16 * 0.01)
    # answers verified in one sandbox per environment worker (their runs in turn), then checked
    verify = _job(CODE_ENV)
    assert uses_sandbox(verify)
    assert rule_reward_time(verify, n, 1, cores, EFF) == pytest.approx(
        16 * 0.01 + 0.1 + 32 * 0.002)
    assert rule_reward_time(verify, n, 2, cores, EFF) == pytest.approx(
        16 * 0.01 + 0.1 + 16 * 0.002)  # two sandboxes share the answers
    # code: one sandbox per answer, `cores` at a time; the in-process figure is not used
    code = _job(CODE_ENV, reward="code")
    assert rule_reward_time(code, n, 1, cores, EFF) == pytest.approx(16 * (0.1 + 0.002))
    assert rule_reward_time(code, n, 1, cores, EFF.override({"rule_reward_s": 5.0})) == \
        rule_reward_time(code, n, 1, cores, EFF)


def _trace(reward_s: list[float], verify: list[list[tuple[float, float]]]) -> Trace:
    events = []
    for step, dur in enumerate(reward_s):
        events.append(TraceEvent("reward", "reward", 10.0 * step, dur, "cpu:0", "reward0",
                                 {"step": step, "sample_ids": [f"s{i}" for i in range(8)]}))
    for step, batch in enumerate(verify):
        for ts, dur in batch:
            events.append(TraceEvent("tool", "tool", 10.0 * step + ts, dur, "cpu:0", "env0",
                                     {"step": step, "call": "verify"}))
    return Trace(events=events)


def _plan(job):
    return plan_job(Pricer(resolve(job), Calibration()))


def test_fit_per_kind_medians() -> None:
    # reward events: 8 samples on 2 cores = 4 rounds; the first pays a one-off import
    reward = [0.6, 0.04, 0.044, 0.036]
    # verify batches of 3 answers: first start to last end over the answers
    verify = [[(0.0, 0.002), (0.003, 0.002), (0.006, 0.003)]] * 3
    fits = {name: (dev, v, n) for dev, name, v, n, _ in
            fit_rule_factors(_trace(reward, verify), _plan(_job(CODE_ENV)), 3)}
    assert fits["rule_reward_s"][0] == "laptop-cpu"
    assert fits["rule_reward_s"][1] == pytest.approx(0.042 / 4)
    assert fits["sandbox_sample_s"][1:] == (pytest.approx(0.009 / 3), 3)
    # a math job without an environment runs no sandbox: only its in-process figure is fitted
    fits = {f[1] for f in fit_rule_factors(_trace(reward, verify), _plan(_job(reward="math")), 3)}
    assert fits == {"rule_reward_s"}
    # a code job's reward events are whole sandbox runs: nothing fitted per sample here
    assert fit_rule_factors(_trace(reward, verify), _plan(_job(CODE_ENV, "code")), 3) == []
    # too few events of a kind: not fitted
    assert fit_rule_factors(_trace(reward[:2], []), _plan(_job(reward="math")), 3) == []


def test_no_switch_where_device_memory_is_host_ram() -> None:
    """The colocate-all slot is over the emulated GPU's memory: its roles switch, which moves
    nothing there (its memory is host RAM); on a real GPU of that size the onload is priced."""
    res = resolve(job_from_dict(base()))
    problem = build_problem(Pricer(res, Calibration()))
    plan = plan_assignment(problem, colocated(problem), "colocated")
    slot = next(s for s in plan.slots if s.pool == "gpu" and len(s.roles) > 1)
    placed = [Placed(slot.name, next(c.est for c in problem.cands[r] if c.pool == "gpu"
                                     and c.est.par.devices == plan.roles[r].devices))
              for r in slot.roles]
    assert sum(p.est.memory.total for p in placed) > 16  # over the device's memory
    assert res.device_of("gpu").host_backed
    assert Pricer(res, Calibration()).slot_switch(placed) == {}
    gpu = res.devices["emu-gpu"].model_copy(update={"memory_is_host": False})
    real = replace(res, devices={**res.devices, "emu-gpu": gpu})
    assert Pricer(real, Calibration()).slot_switch(placed)[slot.name] > 0
