"""Long-tail policies (`tail_policy`: overprovision, partial, reissue): each moves the metric it
targets the right way on a long-tailed job, by a measured amount; with every source of variance off
the simulator still reproduces the placer's prediction with a policy on; the ranking is seeded."""
from __future__ import annotations

import json
import math

import pytest
from simplans import EXAMPLES, SMALL_PLACEMENT, example_names, small_job, small_plan

from placer.base.errors import SpecError
from placer.cli import main
from placer.cost.efficiency import Calibration
from placer.cost.tail_samples import at_means
from placer.solve.assemble import reprice
from placer.solve.planfile import save_plan
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict, load_job
from placer.spec.tailpolicy import TailPolicy
from simulator import tails
from simulator.api import simulate_plan
from simulator.config import SimConfig
from simulator.handplans import place, plan_for
from simulator.policies import compare_policies, with_policy
from simulator.steady import steady_state

LONG_RESPONSES = {"lengths__response": {"kind": "lognormal", "median": 256, "sigma": 1.2,
                                        "cap": 8192}}
# short responses, long-tailed tool calls: the environment is on the critical path
SLOW_TOOLS = {"lengths__response": {"kind": "fixed", "value": 64}, "environment__turns": 3,
              "environment__tool_latency_s": {"kind": "lognormal", "median": 1.0, "sigma": 1.5,
                                              "cap": 120}}


def _sim(plan, policy: TailPolicy | None, iterations: int = 3):
    p = plan if policy is None else with_policy(plan, policy)
    return simulate_plan(p, iterations=iterations, seed=4).metrics


def test_overprovision_cuts_the_tail() -> None:
    plan = small_plan(**LONG_RESPONSES)
    base = _sim(plan, None)
    over = _sim(plan, TailPolicy(kind="overprovision", fraction=0.1))
    tp = over.tail_policy
    assert tp.generated_per_iteration == 141 and tp.committed_per_iteration == 128
    shrink = 1 - over.stage_s.rollout / base.stage_s.rollout
    assert shrink > 0.2, f"rollout only {shrink:.0%} shorter"  # measured (seed 4): 58%
    assert over.why.long_tail_s < 0.5 * base.why.long_tail_s
    assert over.samples_per_s > base.samples_per_s


def test_overprovision_aborts_engine_work_at_the_stage_end() -> None:
    r = simulate_plan(with_policy(small_plan(**LONG_RESPONSES),
                                  TailPolicy(kind="overprovision", fraction=0.1)), 2, seed=4)
    for rec in r.run.iterations:
        end = rec.stages["rollout"][1]
        late = [e for e in r.trace.events if e.cat in ("prefill", "decode")
                and e.args["step"] == rec.index and e.ts_s + e.dur_s > end + 1e-9]
        assert not late and rec.committed == 128 and rec.generated == 141


def test_partial_rollout_cuts_and_carries() -> None:
    plan = small_plan(**LONG_RESPONSES)
    base = _sim(plan, None, iterations=4)
    part = _sim(plan, TailPolicy(kind="partial", token_budget=1500), iterations=4)
    tp = part.tail_policy
    assert tp.carried_tokens_per_iteration > 0
    # carried rows run first, fresh ones fill up to 128 in whole groups of 4
    assert 128 - 3 <= tp.generated_per_iteration <= 128
    shrink = 1 - part.stage_s.rollout / base.stage_s.rollout
    assert shrink > 0.2, f"rollout only {shrink:.0%} shorter"  # measured (seed 4): 68%
    assert part.iteration_s.mean < base.iteration_s.mean


def test_partial_rollout_trains_whole_grpo_groups() -> None:
    r = simulate_plan(with_policy(small_plan(**LONG_RESPONSES),
                                  TailPolicy(kind="partial", token_budget=1500)), 4, seed=4)
    committed = [rec.committed for rec in r.run.iterations]
    assert all(c % 4 == 0 for c in committed) and sum(committed) > 0


def test_partial_holds_finished_rows_until_their_group_is_complete() -> None:
    """Two groups of two rows, budget 5: group 0 has a 9-token row (cut), group 1 finishes.
    Step 0 trains group 1 only and holds group 0's short row; step 1 resumes the cut row (its
    first 5 tokens prefilled) and trains both of group 0's rows."""
    part = tails.Partial(group_size=2)
    fresh = tails.from_rows([(10, [9], []), (10, [3], []), (10, [4], []), (10, [2], [])], 0)
    rows = part.rows_for(0, fresh, 4)
    c = tails.cut(tails.rows_of(rows), 5, 0)
    assert c.finished == [1, 2, 3] and c.carry == [(15, [4], [])]
    assert part.settle(0, c) == [(10, [4], []), (10, [2], [])]
    assert part.held == [((10, [3], []), 0)]
    rows = part.rows_for(1, tails.from_rows([(10, [1], [])] * 4, 0), 4)
    assert tails.rows_of(rows)[0] == (15, [4], []) and rows.n == 3  # 1 carried + 1 whole group
    trained = part.settle(1, tails.cut(tails.rows_of(rows), 5, 0))
    assert (15, [4], []) in trained and (10, [3], []) in trained and len(trained) == 4


def test_reissue_shortens_tool_bound_steps() -> None:
    plan = small_plan(**SLOW_TOOLS)
    base = _sim(plan, None)
    again = _sim(plan, TailPolicy(kind="reissue", deadline_s=4.0))
    tp = again.tail_policy
    assert tp.reissued_calls > 0 and tp.reissue_saved_s > 0
    gain = 1 - again.iteration_s.mean / base.iteration_s.mean
    assert gain > 0.1, f"steps only {gain:.0%} shorter"  # measured (seed 4): 68%


def test_cut_row_conserves_tokens_and_calls() -> None:
    row = (100, [50, 300, 20], [1.5, 2.5])
    now, rest = tails.cut_row(row, 120, tool_output=10)
    assert now == (100, [50, 70], [1.5]) and rest == (100 + 50 + 10 + 70, [230, 20], [2.5])
    assert tails.cut_row(row, 370, 10) == (row, None)
    # the budget spent exactly at a turn's end: the next turn still makes one token
    now, rest = tails.cut_row(row, 350, 10)
    assert now[1] == [50, 300, 1] and rest[1] == [19] and rest[2] == []


def _policy_cases() -> list[tuple[str, str]]:
    """(example, policy) pairs; reissue only where the job has tool calls to re-issue."""
    out = []
    for name in example_names():
        if name == "large-1k-nodes":
            continue
        job = load_job(EXAMPLES / f"{name}.yaml")
        env = job.environment
        for policy in ("overprovision", "partial", "reissue"):
            if job.agents is not None and policy != "overprovision":
                continue  # a multi-agent job refuses the others (test_agents.py)
            if policy != "reissue" or (env.kind != "none" and env.turns >= 2):
                out.append((name, policy))
    return out


@pytest.mark.parametrize("name, policy", _policy_cases())
def test_no_variance_agreement_with_policy(name: str, policy: str) -> None:
    job = load_job(EXAMPLES / f"{name}.yaml")
    env, resp = job.environment, job.lengths.response.mean_value()
    tp = {"overprovision": TailPolicy(kind="overprovision", fraction=0.25),
          # the tightest settings the spec allows: a budget of the mean, a deadline of the mean
          "partial": TailPolicy(kind="partial", token_budget=env.turns * math.ceil(resp)),
          "reissue": TailPolicy(kind="reissue",
                                deadline_s=env.tool_latency_s.mean_value())}[policy]
    res = resolve(job.model_copy(update={"tail_policy": tp}), name)
    plan = plan_for(res, Calibration())
    r = simulate_plan(plan, iterations=5 if plan.mode == "async" else 1, seed=0,
                      config=SimConfig.no_variance())
    # the plan is priced with the job's tails; a no-variance run is its placement at the means
    pred = reprice(plan, at_means(plan.spec), Calibration()).iteration_s
    # async: the steady state's time-average over whole pipeline cycles (`simulator.steady`),
    # not the short run's mean, which still holds the drain (agentic-code overprovision: 55.96 s
    # over 5 iterations, 57.61 s steady, 57.62 s priced)
    sim = (steady_state(r).iteration_s if plan.mode == "async"
           else r.metrics.iteration_s.mean)
    assert abs(sim - pred) <= 0.02 * pred, f"simulated {sim:.3f} s vs predicted {pred:.3f} s"


def test_overprovision_is_priced_by_the_placer() -> None:
    """At the means, more samples generated grow the estimate's rollout (bigger batch or more
    waves); with the long tail, the step no longer waits for the longest samples, so it shrinks,
    as `test_overprovision_cuts_the_tail` measures in the simulator."""
    plain = small_plan(**LONG_RESPONSES)
    job = job_from_dict(small_job(**LONG_RESPONSES, tail_policy={"kind": "overprovision",
                                                                 "fraction": 1.0}))
    over = place(resolve(job), SMALL_PLACEMENT, Calibration())
    cal = Calibration()
    assert (reprice(over, at_means(over.spec), cal).iteration_s
            > reprice(plain, at_means(plain.spec), cal).iteration_s)
    assert over.breakdown.stage_s["rollout"] < plain.breakdown.stage_s["rollout"]


@pytest.mark.parametrize("policy,needle", [
    ({"kind": "overprovision"}, "needs fraction"),
    ({"kind": "partial", "token_budget": 10, "fraction": 0.1}, "fraction does not apply"),
    ({"kind": "overprovision", "fraction": 0}, "tail_policy.fraction"),
    ({"kind": "slowest"}, "tail_policy.kind"),
    ({"kind": "partial", "token_budget": 100}, "tail_policy.token_budget"),  # below the mean
    ({"kind": "reissue", "deadline_s": 0.5}, "tail_policy.deadline_s"),  # below the mean
])
def test_bad_policy_names_the_field(policy: dict, needle: str) -> None:
    with pytest.raises(SpecError, match=needle.replace(".", r"\.")):
        job_from_dict(small_job(**LONG_RESPONSES, tail_policy=policy))


def test_ranking_is_seeded_and_beats_none_on_a_long_tail() -> None:
    plan = small_plan(**LONG_RESPONSES)
    a = compare_policies(plan, iterations=2, seed=1)
    b = compare_policies(plan, iterations=2, seed=1)
    assert a == b
    assert [r["rank"] for r in a] == [1, 2, 3, 4]
    rates = [r["samples_per_s"] for r in a]
    assert rates == sorted(rates, reverse=True)
    assert a[0]["kind"] != "none" and all(r["why"] for r in a)


def test_compare_policies_cli(tmp_path, capsys) -> None:
    path = tmp_path / "plan.json"
    save_plan(small_plan(**LONG_RESPONSES), path)
    assert main(["simulate", str(path), "--compare-policies", "--iterations", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["kind"] for r in doc["ranking"]} == {"none", "overprovision", "partial", "reissue"}
    assert main(["simulate", str(path), "--compare-policies", "--trace", "x.json"]) == 2
    assert "--trace" in capsys.readouterr().err


def test_overprovision_trains_the_shortest_kept_samples() -> None:
    """Over-provisioned, the trained samples are priced at the mean below the kept quantile:
    for a normal response N(1000, 100) keeping 80%, E[X | X < q_0.8] = 1000 - 100 phi(z) / 0.8
    (z = 0.8416: 965.0); no over-provisioning, or fixed lengths, keep the full mean."""
    from placer.cost.estimate import mean_context, trained_context

    normal = {"kind": "normal", "mean": 1000, "std": 100, "min": 0}
    over = {"kind": "overprovision", "fraction": 0.25}

    def job(**kw):
        return resolve(job_from_dict(small_job(environment__turns=1, **kw)))

    res = job(lengths__response=normal, tail_policy=over)
    assert res.job.batch.samples == 128  # ceil(128 * 1.25) = 160 generated: keeps 0.8
    z = 0.8416212335729143
    phi = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    want = mean_context(res) - 1000 + (1000 - 100 * phi / 0.8)
    assert trained_context(res) == pytest.approx(want, abs=0.5)
    plain = job(lengths__response=normal)
    assert trained_context(plain) == mean_context(plain)
    fixed = job(lengths__response={"kind": "fixed", "value": 256}, tail_policy=over)
    assert trained_context(fixed) == mean_context(fixed)
    # two turns: the selection is on a sample's total, so it trims less per turn
    two = resolve(job_from_dict(small_job(lengths__response=normal, tail_policy=over)))
    per_turn_cut = (mean_context(two) - trained_context(two)) / 2
    assert 0 < per_turn_cut < 1000 - (1000 - 100 * phi / 0.8)
