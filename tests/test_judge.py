"""Generative judges: a reward model that decodes a verdict, priced and simulated as a decode
queue (`placer.cost.judge`, `simulator.judge`), placed by the ILP and explained."""
from __future__ import annotations

import pytest
from specdata import ROOT, base

from placer.base.inputs import SpecErrors
from placer.base.roles import Role
from placer.commands.validate import describe
from placer.cost.estimate import estimate, pass_dispatch, trained_context
from placer.cost.judge import JUDGE_LEVELS, judge_cost, judge_queue_s, verdict_rows
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.solve.explain import explain, render
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.distributions import Distribution
from placer.spec.load import dump_job, job_from_dict, load_job

JUDGE = {"kind": "generative", "rubric_tokens": 16, "verdict": {"kind": "fixed", "value": 24}}


def judge_job(verdict: dict | None = None, **over):
    spec = dict(JUDGE, verdict=verdict or JUDGE["verdict"])
    data = base(models={"policy": "tiny-llama", "reward": "tiny-llama"}, reward_model=spec,
                **over)
    return resolve(job_from_dict(data), "t")


def test_jobs_without_a_judge_dump_as_before() -> None:
    # Regression guard: the plan embeds the dumped job, so rule and scalar jobs must not grow a
    # `reward_model: null` key (their plan JSON stays byte-identical).
    for data in (base(), base(models={"policy": "tiny-llama", "reward": "tiny-llama"})):
        assert "reward_model" not in dump_job(job_from_dict(data))
    assert dump_job(judge_job().job)["reward_model"]["kind"] == "generative"


def test_verdict_rows_cover_every_request() -> None:
    assert verdict_rows(Distribution(kind="fixed", value=40), 7) == ([40], [7])
    tail = Distribution(kind="lognormal", median=100, sigma=0.8)
    v, w = verdict_rows(tail, 10)
    assert w == [1] * 10 and v == sorted(v) and v[-1] > 2 * v[0]
    v, w = verdict_rows(tail, 1000)
    assert len(v) == JUDGE_LEVELS and sum(w) == 1000
    # the busiest of 8 replicas (10 requests each) holds the step's longest of 80 verdicts,
    # and every one of its rows is longer than a lone replica's of 10
    busiest, _ = verdict_rows(tail, 10, replicas=8)
    assert busiest[-1] == verdict_rows(tail, 80)[0][-1]
    assert all(b > a for a, b in zip(verdict_rows(tail, 10)[0], busiest))


def test_a_judge_is_priced_as_a_decode_queue() -> None:
    res = judge_job()
    px = Pricer(res)
    pool = res.cluster.pool("gpu")
    short = estimate(px, Role.REWARD, pool, Parallel(dp=1))
    long = estimate(Pricer(judge_job({"kind": "fixed", "value": 96})), Role.REWARD, pool,
                    Parallel(dp=1))
    scalar = estimate(Pricer(resolve(job_from_dict(base(models={
        "policy": "tiny-llama", "reward": "tiny-llama"})), "t")), Role.REWARD, pool,
        Parallel(dp=1))
    assert short.feasible and long.feasible
    # a verdict four times longer costs more decode steps; one forward pass costs less still
    assert long.time_s > short.time_s > scalar.time_s
    assert short.memory.kv_cache > 0 and short.concurrency >= 1


def test_planner_and_simulator_run_the_same_replay_without_variance() -> None:
    res = judge_job()
    px = Pricer(res)
    pool = res.cluster.pool("gpu")
    par = Parallel(dp=2)
    m = res.arch_of(Role.REWARD)
    dev = res.device_of(pool)
    eff = px.calib.for_device(dev)
    est = estimate(px, Role.REWARD, pool, par)
    ctx = trained_context(res)
    n = res.job.batch.samples
    sim = judge_queue_s(px.step_terms(m, dev, par, eff), 2, [round(ctx)] * n, [24] * n, 16)
    assert est.time_s - pass_dispatch(res, eff) == pytest.approx(sim, rel=1e-12)
    direct = judge_cost(px.step_terms(m, dev, par, eff), m, dev, par, eff, res.job.judge, n, ctx,
                        res.job.max_context)
    assert direct.seconds == pytest.approx(sim, rel=1e-12)


def test_judge_that_cannot_hold_one_request_is_infeasible_with_its_reason() -> None:
    res = judge_job({"kind": "fixed", "value": 60_000_000})  # 256 B of KV a token: 15 GB
    est = estimate(Pricer(res), Role.REWARD, res.cluster.pool("gpu"), Parallel(dp=1))
    assert not est.feasible and "judge request" in est.reason


def test_judge_example_plans_and_explains_where_the_judge_goes() -> None:
    res = resolve(load_job(ROOT / "examples" / "judge-72b-h100-l40s.yaml"), "judge")
    px = Pricer(res)
    plan = plan_job(px, time_limit_s=10, workers=1)
    rp = plan.roles[Role.REWARD]
    assert res.device_of(rp.pool).kind == "gpu" and rp.stage_s.get("score", 0) > 0
    ex = explain(plan, px, time_limit_s=5)
    assert ex.judge is not None and ex.judge.pool == rp.pool
    assert {o.pool for o in ex.judge.options} == {"h100", "l40s"}
    # the chosen pool's option is the plan itself (same objective, re-solved)
    best = min(o.iteration_s for o in ex.judge.options if o.iteration_s is not None)
    assert best == pytest.approx(plan.predicted_iteration_s, rel=1e-3)
    assert "judge (Qwen2.5-72B, generative)" in render(ex)


def test_a_verdict_beyond_the_context_limit_is_one_line() -> None:
    with pytest.raises(SpecErrors) as e:
        judge_job({"kind": "fixed", "value": 1e9})
    assert len(e.value.lines) == 1 and "reward_model.verdict" in e.value.lines[0]


def test_validate_says_what_the_judge_needs() -> None:
    res = resolve(load_job(ROOT / "examples" / "judge-72b-h100-l40s.yaml"), "judge")
    judge = describe(res, None)["roles"][Role.REWARD]["judge"]
    # a request is the longest sample (1024 + 4096), the rubric (384) and the verdict's cap
    assert judge == {"rubric_tokens": 384, "verdict_mean_tokens": pytest.approx(181.3, abs=0.1),
                     "longest_request_tokens": 1024 + 4096 + 384 + 1024}
