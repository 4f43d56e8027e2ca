"""Multi-turn rollouts in the executor (`executors.rollouts`), on the one-process runtime.

The tiny job with examples/tiny-agent.yaml's environment (2 turns, 6 tool-output tokens; the
lengths of a policy that ends its turns at spread lengths): the policy writes code, the environment
runs it in the sandbox, the printed value (`=<value>`, or `!<status>`) joins the context, the
policy writes its final answer, and the verifier runs that. Checked: the tool output in every
trajectory is exactly what the sandbox printed for the first turn; tool tokens are masked out of
training; GRPO and PPO (GAE across the tool segment) train with a balanced ledger; a slow
environment worker's tool calls are re-issued to the other one (`reissue`); over-provisioning
and partial rollouts work across turns.
"""
from __future__ import annotations

from collections import Counter

import pytest
import yaml
from exec_util import GRPO_LAYOUT, PPO_LAYOUT, ROOT, VirtualRuntime, hand_plan, job_dict, spread_lengths

from executors.context import LoopConfig
from executors.loop import Loop
from executors.model import EOS, decode, encode
from executors.roles import run_config
from executors.rollouts import tool_text
from executors.runplan import resolve_plan
from executors.runtime import LocalRuntime
from placer.cost.sharding import Parallel
from traces.schema import Trace

AGENT = yaml.safe_load((ROOT / "examples" / "tiny-agent.yaml").read_text())
ENV = AGENT["environment"]  # two turns, 6 tool-output tokens
TOOL_TOKENS = ENV["tool_output_tokens"]
N = 8 * 4


def _loop(out, layout=GRPO_LAYOUT, steps: int = 2, runtime=None, deadlines=None, **job):
    plan = hand_plan(layout, job_dict(environment=ENV, **job))
    spread_lengths(plan, out)
    run = resolve_plan(plan)
    cfg = run_config(run, model_dir=str(out / "model-v0"))
    rt = runtime(run, cfg) if runtime else LocalRuntime(run, cfg)
    return Loop(run, rt, cfg, LoopConfig(steps=steps, out_dir=out,
                                         deadlines=deadlines or {}), Trace())


@pytest.fixture(scope="module")
def first_step(tmp_path_factory):
    """Step 0's rollout, collected by hand: the trajectories themselves."""
    loop = _loop(tmp_path_factory.mktemp("turns"))
    loop.sync_weights(0)
    return loop, loop.collect_rollout(loop.launch_rollout(0))


def test_tool_output_is_what_the_sandbox_printed(first_step) -> None:
    loop, s = first_step
    vocab = loop.cfg.arch["vocab"]
    env = loop.by_role["environment"][0].handle
    assert len(s.ids) == N and all(len(m) == len(r) for m, r in zip(s.gen_mask, s.responses))
    for i in range(len(s.ids)):
        mask, resp = s.gen_mask[i], s.responses[i]
        tool = [k for k, g in enumerate(mask) if not g]
        turn1 = resp[:tool[0]] if tool else resp[:mask.index(1, 0) + 1]
        assert turn1[-1] == EOS or len(turn1) == loop.cfg.max_new_tokens
        (res,), _ = env.execute([s.ids[i]], [decode(turn1, vocab)])
        want = encode(tool_text(res), vocab)[:TOOL_TOKENS]
        assert [resp[k] for k in tool] == want and tool == list(range(len(turn1),
                                                                      len(turn1) + len(want)))
        assert s.answer(i) == resp[len(turn1) + len(want):] and s.answer(i)
        assert all(lp == 0.0 for k, lp in enumerate(s.logprobs[i]) if not mask[k])


def test_turns_are_traced(first_step) -> None:
    loop, _ = first_step
    gens = loop.trace.of("generate")
    assert sorted({e.args["round"] for e in gens}) == [0, 1]
    tools = [e for e in loop.trace.of("tool") if e.args.get("call") == "tool call"]
    assert len(tools) == N and {e.args["turn"] for e in tools} == {0}
    # round 1 prefills prompt + turn 1 + tool output
    r1 = [p for e in gens if e.args["round"] == 1 for p in e.args["prompt_tokens"]]
    assert len(r1) == N and min(r1) > 6


@pytest.mark.parametrize("layout", [GRPO_LAYOUT, PPO_LAYOUT], ids=["grpo", "ppo"])
def test_multiturn_run_trains_with_balanced_ledger(tmp_path, layout) -> None:
    job = {} if layout is GRPO_LAYOUT else {"algorithm": "ppo",
                                            "models": {"policy": "tiny-llama", "reward": "rule",
                                                       "critic": "tiny-llama"}}
    loop = _loop(tmp_path, layout, steps=2, **job)
    stats = loop.run()
    assert loop.ledger.balanced(2), loop.ledger.problems(2)
    assert [s.step for s in stats] == [0, 1] and all(s.loss == s.loss for s in stats)
    verify = [e for e in loop.trace.of("tool") if e.args.get("call") == "verify"]
    assert len(verify) == 2 * N


def test_slow_environment_worker_tool_calls_are_reissued(tmp_path) -> None:
    # one trainer rank: the virtual runtime runs every rank in this process
    layout = {**GRPO_LAYOUT, "actor": ("gpu", Parallel(dp=1), "train"),
              "environment": ("cpu", Parallel(dp=2), "cpu")}
    pools = [{"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": 1},
             {"name": "lpu", "device": "emu-lpu", "devices_per_node": 4, "nodes": 1},
             {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 2}]
    loop = _loop(tmp_path, layout, steps=1, cluster={"pools": pools},
                 runtime=lambda run, cfg: VirtualRuntime(run, cfg, {("environment", 0): 5.0}),
                 deadlines={"environment": 1.0})
    loop.run()
    assert loop.ledger.balanced(1), loop.ledger.problems(1)
    slow = [r for r in loop.stragglers if r["slow_worker"] == "environment0"]
    assert len(slow) == 1 and slow[0]["reissued_to"] == "environment1"  # turn 1's tool calls
    # every tool call's result came from environment1; environment0, still busy with its
    # abandoned call, got none of the verification
    tools = loop.trace.of("tool")
    assert {e.tid for e in tools} == {"environment1"} and len(tools) == 2 * N


def test_overprovision_across_turns(tmp_path) -> None:
    loop = _loop(tmp_path, steps=1, tail_policy={"kind": "overprovision", "fraction": 0.25})
    loop.run()
    e = loop.ledger.steps[0]
    assert loop.ledger.balanced(1) and len(e.planned) == 40 and sum(e.trained.values()) == N
    assert len(e.dropped) == 8 and not set(e.dropped) & set(e.trained)


def test_partial_rollouts_across_turns(tmp_path) -> None:
    """A 10-token budget over two turns of up to 24 tokens: samples are cut in either turn and
    resume where they were, tool output included, in a later step."""
    loop = _loop(tmp_path, steps=4, tail_policy={"kind": "partial", "token_budget": 10},
                 lengths={"prompt": {"kind": "fixed", "value": 12},
                          "response": {"kind": "lognormal", "median": 3, "sigma": 0.5,
                                       "cap": 24}})
    loop.run()
    assert loop.ledger.balanced(4), loop.ledger.problems(4)
    gens = loop.trace.of("generate")
    assert all(t <= 10 for e in gens for t in e.args["response_tokens"])
    carried = Counter(i for e in loop.ledger.steps.values() for i in e.carried_out)
    assert carried  # some samples crossed a step
    late_tools = [e for e in loop.trace.of("tool") if e.args.get("call") == "tool call"
                  and int(e.args["sample_ids"][0][1:].split("p")[0]) < e.args["step"]]
    assert late_tools  # a sample cut in turn 1 made its tool call in a later step
