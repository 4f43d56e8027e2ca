"""The generative judge as the executor runs it (executors/judge.py): its verdict parsing and
request building as pure functions, and `examples/judge-tiny-cpu.yaml` planned and executed end
to end on Ray: every judge replica where the plan put it, the executed layout the plan's, the
judge's verdict generation in the trace, and the trace calibrated as other traces are.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from executors import rl
from executors.judge import (
    judge_calls,
    parse_verdict,
    rubric_ids,
    sample_key,
    spans_of,
    verdict_budgets,
    verdict_reward,
    yes_probability,
)
from executors.model import CharCodec
from placer.spec.judge import RewardModel
from placer.spec.load import load_job

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "judge-tiny-cpu.yaml"
STEPS = 2


@pytest.mark.parametrize("text, want", [
    ("the sum is right, score 7/10", 0.7), ("3 / 4 then 1/2", 0.5), ("12/10", 1.0),
    ("0.25/1", 0.25), ("looks fine. yes", 1.0), ("Wrong", 0.0), ("n", 0.0),
    ("hmm 5/0 maybe", None), ("no idea why", None), ("", None)])
def test_parse_verdict(text: str, want: float | None) -> None:
    assert parse_verdict(text) == (pytest.approx(want) if want is not None else None)


def test_reward_is_the_stated_score_else_the_yes_probability() -> None:
    assert verdict_reward("ok 2/4", 0.9) == 0.5
    assert verdict_reward("x7 q", 0.9) == pytest.approx(0.9)
    logits = torch.full((2, 8), -5.0)
    logits[0, 3], logits[1, 4] = 2.0, 2.0  # row 0 favours "yes" (id 3), row 1 "no" (id 4)
    p = yes_probability(logits, 3, 4)
    assert p[0] > 0.99 and p[1] < 0.01
    assert yes_probability(torch.zeros(1, 8), 3, 4).item() == pytest.approx(0.5)


def test_verdict_budgets_follow_the_distribution_and_the_sample() -> None:
    spec = load_job(EXAMPLE).reward_model
    assert spec is not None and spec.verdict is not None
    ids = [f"s0p{i}.{j}" for i in range(50) for j in range(4)]
    b = verdict_budgets(spec, 0, ids)
    assert b == verdict_budgets(spec, 0, ids)  # seeded: the same on every replica and re-run
    assert verdict_budgets(spec, 0, ids[::-1]) == b[::-1]  # a sample's own, whatever the order
    assert verdict_budgets(spec, 1, ids) != b  # the job's seed moves it
    assert min(b) >= 1 and max(b) <= spec.verdict.cap
    assert abs(sum(b) / len(b) - spec.verdict.mean_value()) < 0.3
    assert sample_key(0, "a") == 140742745180244919  # stable across processes (not `hash`)


def test_rubric_has_the_jobs_length() -> None:
    codec = CharCodec(64)
    assert rubric_ids(codec, 0) == []
    assert len(rubric_ids(codec, 6)) == 6 and len(rubric_ids(codec, 200)) == 200
    assert RewardModel(kind="generative", rubric_tokens=6,
                       verdict={"kind": "fixed", "value": 3}).generative


def test_judge_calls_deal_contiguous_shares_in_order() -> None:
    s = rl.Samples([f"s{i}" for i in range(7)], [[1]] * 7, [[2]] * 7, [[0.0]] * 7, 0,
                   [f"p{i // 2}" for i in range(7)])
    calls = judge_calls(["a", "b", "c"], s, [{"i": i} for i in range(7)], list(range(7)))
    assert [m for m, _, _ in calls] == ["a", "b", "c"]
    assert [i for _, _, (part, _, _) in calls for i in part.ids] == s.ids
    assert [len(part.ids) for _, _, (part, _, _) in calls] == [2, 2, 3]
    assert [r["i"] for _, _, (_, res, _) in calls for r in res] == list(range(7))
    assert judge_calls(["a", "b"], s.take([0]), [{}], [0])[0][0] == "b"  # no empty call


def test_spans_of_a_plain_call_is_the_call() -> None:
    timing = {"t0": 1.0, "dur": 2.0, "tokens": 5, "reasons": {"s0": "x"}}
    assert spans_of(timing, "reward") == [("reward", 1.0, 2.0, {"tokens": 5,
                                                                  "reasons": {"s0": "x"}})]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from exec_util import run_module  # lazy: Ray and torch only for the run

    import placer
    plan = placer.plan(str(EXAMPLE))
    result = run_module(plan, STEPS, tmp_path_factory.mktemp("judge"))
    return plan, result


@pytest.mark.ray
def test_judge_runs_where_the_plan_put_it(run) -> None:
    plan, r = run
    judge = plan.roles["reward"]
    rows = [p for p in r.placement if p["role"] == "reward"]
    assert len(rows) == judge.dp >= 2  # one engine per replica of the plan's layout
    assert all(p["on_plan_node"] and p["in_bundle"] for p in r.placement), r.placement
    want = {role: {"dp": plan.roles[role].dp, "tp": plan.roles[role].tp,
                   "pp": plan.roles[role].pp} for role in ("rollout", "reward")}
    got = r.trace.metadata["executed_layout"]
    assert {k: got[k] for k in want} == want
    assert r.ledger_ok and len(r.stats) == STEPS
    assert all(0.0 <= s.rl["reward_min"] <= s.rl["reward_max"] <= 1.0 for s in r.stats)


@pytest.mark.ray
def test_trace_holds_the_judges_verdicts_and_calibrates(run) -> None:
    from placer.calibrate.fit import fit_trace  # lazy: with the run
    plan, r = run
    judge = plan.roles["reward"]
    spec = plan.resolved().job.judge
    gens = [e for e in r.trace.events if e.cat == "generate" and e.args.get("role") == "reward"]
    assert len(gens) == judge.dp * STEPS  # one batched generation per replica and step
    assert {d.split(":")[0] for e in gens for d in e.args["devices"]} == {judge.pool}
    verdicts = [v for e in gens for v in e.args["response_tokens"]]
    assert len(verdicts) == 32 * STEPS and max(verdicts) <= spec.verdict.cap
    # each request is the sample's text and the rubric: longer than the rubric alone
    assert min(v for e in gens for v in e.args["prompt_tokens"]) > spec.rubric_tokens
    fit = fit_trace(r.trace, plan)
    device = plan.resolved().device_of(judge.pool).name
    assert fit.counts[f"generate@{device}"] == judge.dp * STEPS
    assert f"{device}/inference" in fit.groups
