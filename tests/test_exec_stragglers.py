"""Stragglers: per-call deadlines for rollout and environment calls, re-issue to another worker,
the slow worker reported in the trace, and a ledger that counts every sample once.

Two rollout workers (emulated LPU) and two sandboxed environment workers (CPU), deadline 2 s per
call. Injected (test-only `Delay`): rollout rank 1's second generate call (step 1) and
environment rank 0's third execute call (step 2) first sleep 8 s. Each is re-issued after 2 s to
the other worker of its role; the copy finishes first and is taken; the slow worker, still busy
with its abandoned call, gets no new work until that call ends.
"""
from __future__ import annotations

from collections import Counter

import pytest
from exec_util import VirtualRuntime, hand_plan, job_dict, run_module

from executors.context import LoopConfig
from executors.loop import Loop
from executors.roles import Delay, run_config
from executors.run import prepare_model
from executors.runplan import resolve_plan
from placer.cost.sharding import Parallel
from traces.schema import Trace

STEPS = 4
DEADLINE_S, DELAY_S = 2.0, 8.0
POOLS = [{"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": 1},
         {"name": "lpu", "device": "emu-lpu", "devices_per_node": 4, "nodes": 1},
         {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 2}]
LAYOUT = {"actor": ("gpu", Parallel(dp=1), "train"),
          "reference": ("gpu", Parallel(dp=1), "train"),
          "rollout": ("lpu", Parallel(dp=2), "gen"),
          "reward": ("cpu", Parallel(), "cpu"),
          "environment": ("cpu", Parallel(dp=2), "cpu")}
DELAYS = [Delay("rollout", 1, 1, DELAY_S), Delay("environment", 0, 2, DELAY_S)]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    plan = hand_plan(LAYOUT, job_dict(cluster={"pools": POOLS}))
    r = run_module(plan, STEPS, tmp_path_factory.mktemp("stragglers"), delays=DELAYS,
                   deadlines={"rollout": DEADLINE_S, "environment": DEADLINE_S})
    print("step times (s):", [round(s.step_s, 2) for s in r.stats])
    print("re-issued:", r.stragglers)
    return r


def _injected(r, role: str):
    slow = {"rollout": "rollout1", "environment": "environment0"}[role]
    return [s for s in r.stragglers if s["slow_worker"] == slow]


@pytest.mark.ray
def test_run_completes_and_ledger_counts_once(result) -> None:
    assert [s.step for s in result.stats] == list(range(STEPS))
    assert result.ledger_ok, result.ledger_problems
    assert [s.versions for s in result.stats] == [[s] for s in range(STEPS)]
    for e in result.ledger.steps.values():  # re-issued samples are generated (counted) once
        assert set(e.generated.values()) == {1} and set(e.trained.values()) == {1}


@pytest.mark.ray
def test_slow_rollout_reissued_and_reported(result) -> None:
    rep = [s for s in _injected(result, "rollout") if s["step"] == 1]
    assert rep and rep[0]["reissued_to"] == "rollout0" and rep[0]["winner"] == "reissue"
    reissued = result.ledger.steps[1].reissued
    assert len(reissued) == 16 and Counter(result.ledger.steps[1].generated)[reissued[0]] == 1
    ev = [e for e in result.trace.of("straggler") if e.tid == "rollout1" and e.args["step"] == 1]
    assert ev and ev[0].args["straggler"] and ev[0].args["deadline_s"] == DEADLINE_S
    assert ev[0].pid == "lpu:0" and sorted(ev[0].args["sample_ids"]) == sorted(reissued)
    # the generate event of the re-issued shard is on the worker whose copy was taken
    gen = [e for e in result.trace.of("generate") if e.args["step"] == 1]
    assert {e.tid for e in gen} == {"rollout0"}


@pytest.mark.ray
def test_slow_environment_reissued_and_reported(result) -> None:
    rep = [s for s in _injected(result, "environment") if s["step"] == 2]
    assert rep and rep[0]["reissued_to"] == "environment1" and rep[0]["winner"] == "reissue"
    ev = [e for e in result.trace.of("straggler")
          if e.tid == "environment0" and e.args["step"] == 2]
    assert ev and ev[0].args["slow_worker"] == "environment0"
    tools = [e for e in result.trace.of("tool") if e.args["step"] == 2]
    assert len(tools) == 32 and {e.tid for e in tools} == {"environment1"}


@pytest.mark.ray
def test_busy_worker_gets_no_new_work(result) -> None:
    # step 2 starts while rollout1 still sleeps in its abandoned step-1 call
    gen = [e for e in result.trace.of("generate") if e.args["step"] == 2]
    assert sum(len(e.args["sample_ids"]) for e in gen) == 32
    assert "rollout1" not in {e.tid for e in gen}


def test_reissue_logic_without_ray(tmp_path) -> None:
    """The same deadline path on in-process workers with virtual durations (no Ray, no timing):
    rollout rank 1 takes 5 s against a 1 s deadline; rank 0's copy wins; samples counted once."""
    plan = hand_plan({**LAYOUT, "environment": ("cpu", Parallel(dp=1), "cpu")},
                     job_dict(cluster={"pools": POOLS}))
    run = resolve_plan(plan)
    cfg = run_config(run, model_dir=prepare_model(run.job, tmp_path))
    rt = VirtualRuntime(run, cfg, {("rollout", 1): 5.0})
    loop = Loop(run, rt, cfg, LoopConfig(steps=1, out_dir=tmp_path, deadlines={"rollout": 1.0}),
                Trace())
    loop.run()
    assert loop.stragglers == [{"step": 0, "role": "rollout", "slow_worker": "rollout1",
                                "reissued_to": "rollout0", "deadline_s": 1.0, "winner": "reissue"}]
    e = loop.ledger.steps[0]
    assert len(e.reissued) == 16 and set(e.generated.values()) == {1}
    assert loop.ledger.balanced(1) and len(rt.cancelled) == 1
    assert [ev.tid for ev in loop.trace.of("generate")] == ["rollout0", "rollout0"]
