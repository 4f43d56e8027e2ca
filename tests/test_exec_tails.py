"""Tail policies in the executor (the job's `tail_policy`), on the one-process runtime (no Ray).

overprovision  ceil(n (1 + f)) samples are generated, the first n to finish are trained: with one
               rollout worker (one lockstep decode) a sample is done when it emits EOS, so the
               kept ones are the shortest; the ledger lists the rest as dropped and balances.
reissue        sets the environment's per-call deadline (re-issue itself: test_exec_stragglers).
partial        a policy whose response lengths spread from 1 to the 24-token cap
               (`exec_util.spread_lengths`) under a 12-token budget: no call generates more than
               12 tokens for a sample, cut samples resume next step and train there, GRPO groups
               train whole, the ledger follows each sample across steps and balances, and a
               trainer lost mid-run rolls back to a checkpoint whose carry is restored: the run
               trains exactly what an undisturbed run trains.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from exec_util import GRPO_LAYOUT, VirtualRuntime, hand_plan, job_dict, spread_lengths

from executors import rl
from executors.context import LoopConfig
from executors.ledger import Ledger
from executors.loop import Loop
from executors.model import EOS, build_policy
from executors.roles import run_config
from executors.run import execute, prepare_model, tail_deadlines
from executors.runplan import resolve_plan
from executors.runtime import LocalRuntime, Outcome
from executors.tails import carry_steps, overprovision_extra
from placer.cost.sharding import Parallel
from placer.spec.load import job_from_dict
from traces.schema import Trace

STEPS = 2
N = 8 * 4  # prompts x samples per prompt in examples/tiny-cpu.yaml


@pytest.fixture(scope="module")
def over(tmp_path_factory):
    plan = hand_plan(GRPO_LAYOUT, job_dict(tail_policy={"kind": "overprovision", "fraction": 0.25}))
    return execute(plan, STEPS, tmp_path_factory.mktemp("tails"), local=True)


def test_overprovision_generates_more_and_trains_first_n(over) -> None:
    assert over.ledger_ok, over.ledger_problems
    for e in over.ledger.steps.values():
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
    assert tail_deadlines(job.tail_policy) == {"environment": 0.5}
    assert tail_deadlines(job_from_dict(job_dict()).tail_policy) == {}


def test_overprovision_abandons_the_slow_shard(tmp_path) -> None:
    layout = {**GRPO_LAYOUT, "actor": ("gpu", Parallel(dp=1), "train"),
              "rollout": ("lpu", Parallel(dp=2), "gen")}
    plan = hand_plan(layout, job_dict(tail_policy={"kind": "overprovision", "fraction": 1.0}))
    run = resolve_plan(plan)
    cfg = run_config(run, model_dir=prepare_model(run.job, tmp_path))
    rt = VirtualRuntime(run, cfg, {("rollout", 0): 5.0})  # rank 0's shard is the straggler
    loop = Loop(run, rt, cfg, LoopConfig(steps=1, out_dir=tmp_path), Trace())
    loop.run()
    e = loop.ledger.steps[0]
    assert len(e.planned) == 2 * N and sum(e.trained.values()) == N
    assert e.dropped == e.planned[:N]  # rank 0's half, abandoned unread
    assert loop.ledger.balanced(1) and len(rt.cancelled) == 1
    assert [ev.tid for ev in loop.trace.of("generate")] == ["rollout1"]


# ---------------------------------------------------------------------------- partial rollouts
BUDGET, CAP, PARTIAL_STEPS = 12, 24, 5
PARTIAL_JOB = job_dict(lengths={"prompt": {"kind": "fixed", "value": 12},
                                "response": {"kind": "lognormal", "median": 10, "sigma": 0.5,
                                             "cap": CAP}},
                       tail_policy={"kind": "partial", "token_budget": BUDGET})


def _partial_loop(out, rt_class=None, checkpoint_every: int = 1):
    plan = hand_plan(GRPO_LAYOUT, PARTIAL_JOB)
    spread_lengths(plan, out)
    run = resolve_plan(plan)
    cfg = run_config(run, model_dir=str(out / "model-v0"))
    rt = (rt_class or LocalRuntime)(run, cfg)
    loop = Loop(run, rt, cfg, LoopConfig(steps=PARTIAL_STEPS, out_dir=out,
                                         checkpoint_every=checkpoint_every), Trace())
    loop.run()
    return loop


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    return _partial_loop(tmp_path_factory.mktemp("partial"))


def _planned_step(sid: str) -> int:
    return int(sid[1:].split("p")[0])  # "s3p5.2" was planned by step 3


def test_partial_never_generates_past_the_budget_in_a_call(partial) -> None:
    gens = partial.trace.of("generate")
    assert gens and all(0 < t <= BUDGET for e in gens for t in e.args["response_tokens"])
    # and some samples really were cut: resumed with their response so far prefilled
    assert any(p > 12 + 1 for e in gens for p in e.args["prompt_tokens"])


def test_partial_carries_samples_into_later_steps_and_balances(partial) -> None:
    led = partial.ledger
    assert led.balanced(PARTIAL_STEPS), led.problems(PARTIAL_STEPS)
    trained = Counter(i for e in led.steps.values() for i in e.trained.elements())
    assert set(trained.values()) == {1}  # nobody twice, across steps
    planned = {i for e in led.steps.values() for i in e.planned}
    in_flight = set(led.steps[PARTIAL_STEPS - 1].carried_out)
    assert set(trained) | in_flight == planned and not set(trained) & in_flight
    late = [(s, i) for s, e in led.steps.items() for i in e.trained if _planned_step(i) < s]
    assert len(late) >= 10  # trained after the step that planned them
    bound = carry_steps(job_from_dict(PARTIAL_JOB).tail_policy, CAP)
    assert bound == 1 and all(s - _planned_step(i) <= bound for s, i in late)
    # a step that resumes samples plans fewer fresh ones: n in all, in whole groups of 4
    for e in led.steps.values():
        resumed = [i for i in e.carried_in if i in e.generated]
        assert len(e.planned) % 4 == 0 and len(e.planned) + len(resumed) <= N


def test_partial_trains_whole_grpo_groups_and_responses_within_the_cap(partial) -> None:
    for ev in partial.trace.of("train"):
        if ev.args.get("role") != "actor":
            continue
        groups = Counter(i.split(".")[0] for i in ev.args["sample_ids"])
        assert groups  # every step trains something (a step with no whole group runs again)
    for s, e in partial.ledger.steps.items():
        groups = Counter(i.split(".")[0] for i in e.trained)
        assert set(groups.values()) == {4}, (s, groups)
    versions = {st.step: st.versions for st in partial.stats}
    assert any(len(v) > 1 or v[0] < s for s, v in versions.items())  # spans older versions


def test_partial_rollback_restores_the_carry(tmp_path, partial) -> None:
    """The trainer fails once at step 3; checkpoints every 2 steps: the loop rolls back to the
    step-1 checkpoint (weights and carry) and trains exactly what the undisturbed run trained."""
    class FailOnce(LocalRuntime):
        calls = 0

        def call(self, m, method, *args):
            if m.role == "actor" and method == "train":
                FailOnce.calls += 1
                if FailOnce.calls == 4:  # step 3's training
                    return Outcome(False, error="RayActorError: trainer died")
            return super().call(m, method, *args)

    loop = _partial_loop(tmp_path, FailOnce, checkpoint_every=2)
    assert loop.ledger.rolled_back == [2, 3] and loop.ledger.balanced(PARTIAL_STEPS)
    assert [st.reward for st in loop.stats] == pytest.approx([st.reward for st in partial.stats])
    for s in range(PARTIAL_STEPS):
        assert loop.ledger.steps[s].trained == partial.ledger.steps[s].trained


def test_samples_mask_tool_output_out_of_the_loss() -> None:
    """A two-turn sample: turn 1 (3 tokens), tool output (2), turn 2 (2): the answer is turn 2,
    and pack's response mask leaves the tool tokens out (attended to, not trained on)."""
    s = rl.Samples(["a"], [[1, 9]], [[5, 6, EOS, 7, 7, 8, EOS]], [[0.0] * 7], 0, ["g"], [0],
                   [[1, 1, 1, 0, 0, 1, 1]])
    assert s.answer(0) == [8, EOS] and s.generated_tokens() == 5
    _, mask, rmask = rl.pack(s)
    assert rmask.tolist() == [[1, 1, 1, 0, 0, 1, 1]] and mask.tolist() == [[1] * 9]
    assert rl.Samples(["b"], [[1]], [[5, EOS]], [[0.0, 0.0]], 0).answer(0) == [5, EOS]


def test_gae_carries_across_tool_tokens() -> None:
    """GAE over a response with a tool segment equals GAE over the same response with the tool
    tokens cut out: they neither add TD terms nor break the bootstrap chain."""
    r = torch.tensor([[0.0, 0.1, 0.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.3, 9.0, 9.0, 0.4, 0.5]])
    m = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
    adv, ret = rl.gae(r, v, m, gamma=0.9, lam=0.8)
    keep = [0, 1, 4, 5]
    ref_adv, ref_ret = rl.gae(r[:, keep], v[:, keep], torch.ones(1, 4), gamma=0.9, lam=0.8)
    assert adv[0, keep].tolist() == pytest.approx(ref_adv[0].tolist())
    assert ret[0, keep].tolist() == pytest.approx(ref_ret[0].tolist())
    assert adv[0, 2].item() == 0.0 and adv[0, 3].item() == 0.0


def test_generate_stops_each_row_at_its_limit() -> None:
    plan = hand_plan(GRPO_LAYOUT)
    model = build_policy(plan.resolved().model_of("actor"), 0)
    full, _ = rl.generate(model, [[1, 5, 6]] * 2, 10, [7, 8])
    cut, _ = rl.generate(model, [[1, 5, 6]] * 2, 10, [7, 8], limits=[3, 10])
    assert cut[0] == full[0][:3] and cut[1] == full[1]  # a row's own draws, whatever the limit


def test_ledger_catches_a_broken_carry_chain() -> None:
    led = Ledger()
    led.plan(0, ["a", "b"])
    led.generated(0, ["a", "b"])
    led.carried_out(0, ["b"])
    led.trained(0, ["a"])
    led.commit(0)
    led.plan(1, ["c"])
    led.carried_in(1, [])  # "b" vanished between steps
    led.generated(1, ["c"])
    led.trained(1, ["c"])
    led.commit(1)
    assert any("carried in 0 sample(s), the step before carried out 1" in p
               for p in led.problems(2))
