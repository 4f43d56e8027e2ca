"""The generative judge's stage: its decode queue over the step's kept samples.

After the policy's responses, every kept sample goes to the judge (`placer.spec.judge`) with
the rubric; the judge's engine replicas prefill sample + rubric and decode a verdict drawn from
the judge's length distribution, admitting by KV as the rollout's engines do. Samples are dealt
round-robin over the replicas and each replica's queue is replayed sample by sample with the one
scheduling loop (`placer.cost.judge.judge_queue_s`, on `placer.cost.admission`); the stage is
the busiest replica's span. Verdicts are drawn from their own stream of (seed, iteration), so
the draws of prompts and responses stay as they were; with lengths at their means every verdict
is the mean, and the replay is the planner's.
"""
from __future__ import annotations

from placer.base.roles import Role
from placer.cost.context import PriceContext
from placer.cost.judge import judge_queue_s, judge_replicas
from placer.solve.planfile import Plan
from placer.spec.sampling import draw_lengths, rng
from simulator.workload import Samples

STREAM_VERDICT = 4  # after the prompt, response and tool streams of `simulator.workload`


def verdict_tokens(px: PriceContext, n: int, seed: int, iteration: int, mean: bool) -> list[int]:
    """The verdicts the judge decodes for `n` samples: drawn, or all at the mean."""
    spec = px.res.job.judge
    assert spec is not None and spec.verdict is not None, "a generative judge's job"
    if mean:
        return [max(int(round(spec.verdict.mean_value())), 1)] * n
    drawn: list[int] = draw_lengths(spec.verdict, rng(seed, iteration, STREAM_VERDICT), n).tolist()
    return drawn


def judge_stage_s(px: PriceContext, plan: Plan, smp: Samples, verdicts: list[int]) -> float:
    """Seconds of the judge's queue over `smp` (kept samples) with their `verdicts`."""
    res = px.res
    spec = res.job.judge
    assert spec is not None, "a generative judge's job"
    rp = plan.roles[Role.REWARD]
    m = res.arch_of(Role.REWARD)
    dev = res.device_of(rp.pool)
    eff = px.calib.for_device(dev)
    st = px.step_terms(m, dev, rp.par, eff)
    return judge_queue_s(st, judge_replicas(m, dev, rp.par, eff), smp.context_tokens(),
                         verdicts[:smp.n], spec.rubric_tokens)
