"""Tail policies in the executor (the job's `tail_policy`), on the one-process runtime (no Ray).

overprovision  ceil(n (1 + f)) samples are generated, the first n to finish are trained: with one
               rollout worker (one lockstep decode) a sample is done when it emits EOS, so the
               kept ones are the shortest; the ledger lists the rest as dropped and balances.
reissue        sets the environment's per-call deadline (re-issue itself: test_exec_stragglers).
partial        not run by the executor: `execute` refuses it with a clear message.
"""
from __future__ import annotations

import pytest

from exec_util import GRPO_LAYOUT, VirtualRuntime, hand_plan, job_dict
from executors.run import execute, tail_deadlines
from executors.tails import overprovision_extra
from placer.spec import SpecError, job_from_dict

STEPS = 2
N = 8 * 4  # prompts x samples per prompt in examples/tiny-cpu.yaml


@pytest.fixture(scope="module")
def over(tmp_path_factory):
    plan = hand_plan(GRPO_LAYOUT, job_dict(tail_policy={"kind": "overprovision", "fraction": 0.25}))
    return execute(plan, STEPS, tmp_path_factory.mktemp("tails"), local=True)


def test_overprovision_generates_more_and_trains_first_n(over) -> None:
    assert over.ledger_ok, over.ledger_problems
    for step, e in over.ledger.steps.items():
        assert len(e.planned) == 40 and len(e.dropped) == 8 and sum(e.trained.values()) == N
        assert not set(e.dropped) & set(e.trained)
    gen = [e for e in over.trace.of("generate") if e.args["step"] == 0][0]
    length = dict(zip(gen.args["sample_ids"], gen.args["response_tokens"]))
    dropped = over.ledger.steps[0].dropped
    kept = [i for i in length if i not in dropped]
    assert max(length[i] for i in kept) <= min(length[i] for i in dropped)
    train = [e for e in over.trace.of("train") if e.args["step"] == 0]
    assert sum(len(e.args["sample_ids"]) for e in train) == N


def test_overprovision_count() -> None:
    tp = job_from_dict(job_dict(tail_policy={"kind": "overprovision", "fraction": 0.1})).tail_policy
    assert overprovision_extra(tp, 32) == 4  # ceil(35.2) - 32
    assert overprovision_extra(job_from_dict(job_dict()).tail_policy, 32) == 0


def test_reissue_sets_environment_deadline() -> None:
    job = job_from_dict(job_dict(environment={"kind": "code", "turns": 2,
                                              "tool_latency_s": {"kind": "fixed", "value": 0.05}},
                                 tail_policy={"kind": "reissue", "deadline_s": 0.5}))
    assert tail_deadlines(job) == {"environment": 0.5}
    assert tail_deadlines(job_from_dict(job_dict())) == {}


def test_partial_is_refused(tmp_path) -> None:
    plan = hand_plan(GRPO_LAYOUT, job_dict(tail_policy={"kind": "partial", "token_budget": 8}))
    with pytest.raises(SpecError, match="tail_policy.kind: .*got .partial"):
        execute(plan, 1, tmp_path, local=True)


def test_overprovision_abandons_the_slow_shard(tmp_path) -> None:
    from executors.loop import Loop, LoopConfig
    from executors.run import prepare_model, run_config
    from placer.costmodel import Parallel
    from traces.schema import Trace
    layout = {**GRPO_LAYOUT, "actor": ("gpu", Parallel(dp=1), "train"),
              "rollout": ("lpu", Parallel(dp=2), "gen")}
    plan = hand_plan(layout, job_dict(tail_policy={"kind": "overprovision", "fraction": 1.0}))
    cfg = run_config(plan, model_dir=prepare_model(plan, tmp_path))
    rt = VirtualRuntime(plan, cfg, {("rollout", 0): 5.0})  # rank 0's shard is the straggler
    loop = Loop(plan, rt, cfg, LoopConfig(steps=1, out_dir=tmp_path), Trace())
    loop.run()
    e = loop.ledger.steps[0]
    assert len(e.planned) == 2 * N and sum(e.trained.values()) == N
    assert e.dropped == e.planned[:N]  # rank 0's half, abandoned unread
    assert loop.ledger.balanced(1) and len(rt.cancelled) == 1
    assert [ev.tid for ev in loop.trace.of("generate")] == ["rollout1"]
