"""Steady-state figures (`simulator.steady`): warm-up and drain left out, a 95% interval from
batch means, iterations added until it is tight, the same result for the same seed."""
from __future__ import annotations

import math

import numpy as np
import pytest
from simplans import small_plan

from placer.base.errors import SpecError
from placer.spec.pipeline import Async
from simulator.api import simulate_plan
from simulator.metrics import iteration_durations
from simulator.steady import MIN_BATCHES, cap_iterations, simulate_steady, steady_state, t95, window_of

COLOCATED = {"actor": ("h100", 8, "all"), "reference": ("h100", 8, "all"),
             "rollout": ("h100", 8, "all"), "reward": ("cpu", 1, "verify"),
             "environment": ("cpu", 1, "env")}


def _async(placement=None, staleness: int = 1):
    return small_plan(placement, pipeline={"mode": "async", "max_staleness": staleness})


def test_t95_matches_the_tables():
    # two-sided 95% quantiles of Student's t (printed tables, three decimals)
    for df, q in [(1, 12.706), (4, 2.776), (10, 2.228), (11, 2.201), (15, 2.131), (20, 2.086),
                  (30, 2.042), (60, 2.000), (120, 1.980)]:
        assert t95(df) == pytest.approx(q, abs=1.5e-3), df
    with pytest.raises(ValueError):
        t95(0)


def test_window_follows_the_pipeline():
    w = window_of(small_plan())
    assert (w.warmup, w.drain, w.period) == (0, 0, 1)
    w = window_of(_async(staleness=2))
    assert (w.warmup, w.drain, w.period) == (3, 2, 3)
    partial = small_plan(tail_policy={"kind": "partial", "token_budget": 1024})
    assert window_of(partial).warmup == 1  # the first step has no carried rows


def test_window_leaves_out_fill_and_drain_and_averages_the_rest():
    plan = _async(COLOCATED)
    r = simulate_plan(plan, iterations=12, seed=4)
    st = steady_state(r)
    durs = iteration_durations(r.run, Async(1))
    assert (st.warmup, st.drain, st.measured) == (2, 1, 9) and st.warmup_excluded
    assert st.iteration_s == pytest.approx(sum(durs[2:11]) / 9, rel=1e-12)
    assert st.batch_size == 2 and st.batches == 4  # cycles of staleness + 1 steps
    means = np.asarray(durs[2:10]).reshape(4, 2).mean(axis=1)
    hw = t95(3) * means.std(ddof=1) / math.sqrt(4)
    assert st.ci95_s == pytest.approx((st.iteration_s - hw, st.iteration_s + hw), rel=1e-12)
    samples = sum(r.run.committed[i].n for i in range(2, 11))
    assert st.samples_per_s == pytest.approx(samples / sum(durs[2:11]), rel=1e-12)
    lo, hi = st.samples_per_s_ci95
    assert lo < st.samples_per_s < hi


def test_the_measured_prefix_does_not_depend_on_the_run_length():
    """Commit i depends on rollouts up to i + staleness only: a longer run repeats the window."""
    plan = _async(COLOCATED)
    short = iteration_durations(simulate_plan(plan, iterations=8, seed=2).run, Async(1))
    long = iteration_durations(simulate_plan(plan, iterations=14, seed=2).run, Async(1))
    assert short[:7] == long[:7]  # bit for bit, drain (the last one) aside


def test_too_short_a_run_says_so():
    st = steady_state(simulate_plan(_async(), iterations=2, seed=0))
    assert not st.warmup_excluded and st.ci95_s is None and not st.converged
    assert "NOT excluded" in st.describe()


def test_adds_iterations_until_the_interval_is_tight():
    plan = _async(COLOCATED)
    loose_r, loose = simulate_steady(plan, seed=1, rel_ci=0.9)
    assert loose.iterations == window_of(plan).minimum() and loose.converged
    assert loose.batches == MIN_BATCHES
    tight_r, tight = simulate_steady(plan, seed=1, rel_ci=0.002, max_iterations=60)
    assert tight.iterations > loose.iterations
    assert tight.converged or tight.iterations == cap_iterations(plan, 60)
    if tight.converged:
        assert tight.rel_half_width <= 0.002


def test_same_seed_same_steady_state():
    plan = _async(COLOCATED)
    a = simulate_steady(plan, seed=5, rel_ci=0.02, max_iterations=40)[1].to_dict()
    b = simulate_steady(plan, seed=5, rel_ci=0.02, max_iterations=40)[1].to_dict()
    assert a == b
    assert simulate_steady(plan, seed=6, rel_ci=0.02, max_iterations=40)[1].to_dict() != a


def test_budget_caps_large_jobs_but_never_below_two_batches():
    plan = _async()
    per = plan.spec.batch.samples * plan.spec.environment.turns
    assert cap_iterations(plan, 100, budget_sample_turns=per * 3) == 2 + 1 + 2 * 2
    assert cap_iterations(plan, 100, budget_sample_turns=per * 11) == 11
    _, st = simulate_steady(plan, seed=0, rel_ci=0.001, budget_sample_turns=per * 3)
    assert st.iterations == 7 and st.batches == 2 and st.ci95_s is not None
    assert cap_iterations(plan, 7, budget_sample_turns=10**9) == 7


def test_bad_target_is_a_spec_error():
    for bad in (0.0, 1.0, float("nan"), -0.1):
        with pytest.raises(SpecError, match="--ci"):
            simulate_steady(small_plan(), rel_ci=bad)


def test_two_iterations_misrank_async_plans_the_steady_state_does_not():
    """The issue's trap: with two iterations a colocated async plan looks fastest (its second
    commit comes right after the first); measured in steady state it is the slower one, as a long
    run says."""
    co, sp = _async(COLOCATED), _async()

    def short(plan):
        return simulate_plan(plan, iterations=2, seed=0).metrics.iteration_s.mean

    def long_run(plan):
        durs = iteration_durations(simulate_plan(plan, iterations=41, seed=0).run, Async(1))
        return sum(durs[2:40]) / 38

    assert short(co) < short(sp)  # the old default's ranking
    st_co, st_sp = simulate_steady(co)[1], simulate_steady(sp)[1]
    assert st_co.iteration_s > st_sp.iteration_s
    for plan, st in ((co, st_co), (sp, st_sp)):
        assert st.iteration_s == pytest.approx(long_run(plan), rel=0.05)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_on_iteration_is_called_once_per_iteration_in_order(mode):
    """The progress callback: (1, n), (2, n), ..., (n, n), as each iteration's train step ends
    (async steps overlap, but train in order); the run itself is the same without it."""
    plan = small_plan() if mode == "sync" else _async(staleness=2)
    calls: list[tuple[int, int]] = []
    with_cb = simulate_plan(plan, iterations=5, seed=3, on_iteration=lambda d, n: calls.append((d, n)))
    assert calls == [(i, 5) for i in range(1, 6)]
    plain = simulate_plan(plan, iterations=5, seed=3)
    assert (iteration_durations(with_cb.run, plan.pipeline)
            == iteration_durations(plain.run, plan.pipeline))


def test_steady_runs_report_every_iteration_of_every_run():
    """simulate_steady passes the callback to each of its runs: each counts 1..n of its own n,
    and the last run's count is the result's iteration count."""
    calls: list[tuple[int, int]] = []
    result, _ = simulate_steady(_async(), seed=0, on_iteration=lambda d, n: calls.append((d, n)))
    runs: list[list[tuple[int, int]]] = []
    for d, n in calls:
        if d == 1:
            runs.append([])
        runs[-1].append((d, n))
    assert all(r == [(i, r[0][1]) for i in range(1, r[0][1] + 1)] for r in runs)
    assert runs[-1][-1] == (result.metrics.iterations,) * 2
