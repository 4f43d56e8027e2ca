"""The tail-aware rollout model (`placer.cost.rollout_tail`, `placer.cost.batching`) and the async chain rule:
cases checkable by hand, its reduction to lockstep waves, and the directions it must move in."""
from __future__ import annotations

import numpy as np
import pytest
from simplans import small_job

from placer.base.roles import Role
from placer.cost.admission import run_replica
from placer.cost.batching import KvBudget, StepTerms, step_terms
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.generation import decode_step_time, prefill_time
from placer.cost.pricer import Pricer
from placer.cost.rollout_tail import Replicas, makespan
from placer.cost.rolloutcost import rollout_shape, wave_time
from placer.cost.sharding import Parallel
from placer.cost.tail_samples import at_means, has_variance, quantile
from placer.cost.timing import Placed
from placer.spec.catalog import resolve
from placer.spec.distributions import Distribution
from placer.spec.load import job_from_dict

EFF = Efficiency()
PAR = Parallel(tp=1)
_BIG = 10**12  # KV tokens: admission bounded by max_num_seqs alone


def _res(**over):
    return resolve(job_from_dict(small_job(**over)))


def _steps(res) -> StepTerms:
    return StepTerms(res.arch_of(Role.ROLLOUT), res.device_of("h100"), PAR, EFF)


def test_identical_sequences_are_lockstep_waves() -> None:
    """20 identical 2-turn sequences, at most 8 at once (`max_num_seqs`, KV ample): waves of 8,
    8 and 4, each prefilling, decoding, waiting out its tool call together - `rolloutcost.wave_time`
    exactly."""
    res = resolve(at_means(job_from_dict(small_job(
        lengths__response={"kind": "fixed", "value": 300}))))
    st, dev = _steps(res), res.device_of("h100")
    done = run_replica(st, [256] * 20, [[300, 300]] * 20, [[1.5]] * 20, [1] * 20, 64, KvBudget(_BIG, 8))
    waves = 2 * wave_time(res, dev, PAR, EFF, 8, None)[0] + wave_time(res, dev, PAR, EFF, 4, None)[0]
    assert max(t for t, _ in done) == pytest.approx(waves + 3 * 1.5, rel=1e-9)
    # a row of weight w is w identical sequences: the same schedule from 3 rows
    grouped = run_replica(st, [256] * 3, [[300, 300]] * 3, [[1.5]] * 3, [8, 8, 4], 64, KvBudget(_BIG, 8))
    assert max(t for t, _ in grouped) == pytest.approx(waves + 3 * 1.5, rel=1e-9)


def test_two_lengths_by_hand() -> None:
    """A 10-token and a 30-token response, prompts of 1 token, side by side: one prefill of 2
    tokens, 10 steps at batch 2, then the long one alone for 20 steps."""
    res = _res()
    m, dev = res.arch_of(Role.ROLLOUT), res.device_of("h100")
    done = run_replica(_steps(res), [1, 1], [[10], [30]], [[], []], [1, 1], 0, KvBudget(_BIG, 2))
    t_pre = prefill_time(m, dev, PAR, 2, 1, EFF)
    t_both = sum(decode_step_time(m, dev, PAR, 2, 2 + 2 * i, EFF) for i in range(10))
    t_one = sum(decode_step_time(m, dev, PAR, 1, 11 + j, EFF) for j in range(20))
    assert [t for t, _ in done] == pytest.approx([t_pre + t_both, t_pre + t_both + t_one],
                                                 rel=1e-9)


def test_tool_return_cuts_a_decode_run() -> None:
    """A tool call returning mid-run is admitted at the next step boundary: the makespan is the
    same whether the other sequence's run is summed in one piece or cut."""
    res = _res()
    st = _steps(res)
    alone = run_replica(st, [8], [[50, 5]], [[0.01]], [1], 4, KvBudget(_BIG, 2))
    pair = run_replica(st, [8, 8], [[50, 5], [2000]], [[0.01], []], [1, 1], 4, KvBudget(_BIG, 2))
    assert max(t for t, _ in pair) > max(t for t, _ in alone)
    assert sorted(w for _, w in pair) == [1, 1]


def test_fixed_lengths_have_no_variance_and_tails_do() -> None:
    assert not has_variance(at_means(job_from_dict(small_job())))
    assert has_variance(job_from_dict(small_job()))
    means = at_means(job_from_dict(small_job()))
    assert means.max_context == job_from_dict(small_job()).max_context  # same KV reservation


def test_quantiles_are_the_clipped_distribution() -> None:
    d = Distribution(kind="lognormal", median=100, sigma=1.0, cap=300)
    q = quantile(d, np.array([0.5, 0.99, 0.999999]))
    assert q[0] == pytest.approx(100) and q[1] == 300 and q[2] == 300


def _span(cap: float, replicas: int = 4, samples: int = 128, over: int = 0, **kw) -> float:
    res = _res(lengths__response={"kind": "lognormal", "median": 256, "sigma": 1.0, "cap": cap},
               **kw)
    dev = res.device_of("h100")
    shape = rollout_shape(Pricer(res), dev, Parallel(dp=replicas), EFF)
    gen = samples + over
    per = -(-gen // replicas)
    st = step_terms(res.arch_of(Role.ROLLOUT), dev, Parallel(dp=replicas), EFF)
    return makespan(res.job, st, EFF, Replicas(replicas, per, min(per, shape.concurrency), gen, samples))


def test_makespan_grows_with_the_cap() -> None:
    spans = [_span(cap) for cap in (512, 1024, 2048, 4096)]
    assert spans == sorted(spans) and spans[-1] > 1.5 * spans[0]


def test_more_replicas_are_never_slower() -> None:
    spans = [_span(2048, replicas=r) for r in (1, 2, 4, 8)]
    assert spans == sorted(spans, reverse=True)


def test_over_provisioning_drops_the_tail() -> None:
    assert _span(4096, over=32) < _span(4096)


def test_partial_rollouts_bound_the_tail() -> None:
    """A token budget cuts the longest samples (their rest runs next step, beside fresh rows)."""
    budget = {"tail_policy": {"kind": "partial", "token_budget": 1024}}
    assert _span(8192, **budget) < 0.7 * _span(8192)


def test_long_tail_costs_more_than_mean_waves_in_one_wave() -> None:
    """All samples fit one wave: the step waits for the longest, far beyond the mean's wave."""
    res = _res(lengths__response={"kind": "lognormal", "median": 256, "sigma": 1.0, "cap": 4096})
    pool = res.cluster.pool("h100")
    tail = Pricer(res, Calibration()).estimate(Role.ROLLOUT, pool, Parallel(dp=4))
    mean = Pricer(resolve(at_means(res.job)), Calibration()).estimate(Role.ROLLOUT, pool, Parallel(dp=4))
    assert tail.stage_s["rollout"] > 2 * mean.stage_s["rollout"]


@pytest.mark.parametrize("staleness", [1, 2, 4])
def test_async_chain_fits_in_staleness_plus_one_cycles(staleness: int) -> None:
    """Async: T = max(busiest slot, (sync + rollout + score + train) / (s + 1))."""
    res = _res(pipeline={"mode": "async", "max_staleness": staleness})
    cal = Calibration()
    h100, cpu = res.cluster.pool("h100"), res.cluster.pool("cpu")
    placed = [Placed("train", Pricer(res, cal).estimate(Role.ACTOR, h100, Parallel(dp=2))),
              Placed("ref", Pricer(res, cal).estimate(Role.REFERENCE, h100, Parallel(dp=1))),
              Placed("gen", Pricer(res, cal).estimate(Role.ROLLOUT, h100, Parallel(dp=4))),
              Placed("cpu", Pricer(res, cal).estimate(Role.REWARD, cpu, Parallel(dp=1))),
              Placed("cpu", Pricer(res, cal).estimate(Role.ENVIRONMENT, cpu, Parallel(dp=1)))]
    bd = Pricer(res, cal).iteration_time(placed)
    chain = sum(bd.stage_s.values())
    assert bd.iteration_s == pytest.approx(max(max(bd.slot_busy_s.values()),
                                               chain / (staleness + 1)))
    if staleness == 1:  # the reference's own slot: scoring is on the chain, not on a busy slot
        assert chain / 2 > max(bd.slot_busy_s.values())
