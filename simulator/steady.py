"""Steady-state iteration time and throughput, with a 95% confidence interval, from enough
iterations to be stable (what `placer simulate` and `placer compare --simulate` report).

Why: a short run misleads. An async pipeline with staleness s fills over its first s + 1 steps
(the first commit waits for a whole rollout; the next ones come faster while the rollouts run
ahead) and drains over its last s (no rollout is left to compete for the slots), and a colocated
async plan alternates a long and a short step: two iterations of one ranked the colocated
baseline first at a fifth of its real step time. Long-tailed lengths make single steps vary by
+-30%, so one or two iterations cannot tell two plans 10% apart either.

Method.
  * Window. Iterations [warmup, n - drain) are measured: async warmup = s + 1, drain = s (commit
    i only depends on rollouts up to i + s, so the measured prefix is the same whatever n is);
    sync: no drain, and one warm-up step under partial rollouts (the first step has no carried
    rows). Iteration time is the time between consecutive training commits (async) or a step's
    wall time (sync), as in `simulator.metrics`.
  * Batch means. The window is cut into batches of `period` consecutive iterations (s + 1 in
    async: the pipeline's cycle, so an alternating long/short pattern averages out inside a
    batch; 1 in sync) and the interval is Student's t over the batch means (`batches - 1` degrees
    of freedom). The mean is the time-average over the whole window (total time / iterations).
  * Throughput. Committed samples over the window's time, times the run's goodput; its interval is
    the ratio estimator's (delta method over the batches' samples and times).
  * Stopping. `simulate_steady` starts from warmup + drain + MIN_BATCHES periods and re-runs with
    more iterations (the same seed, so the first ones repeat exactly) until the interval's half
    width is within `rel_ci` of the mean, or a cap: `max_iterations`, and a sample-turn budget
    (large jobs cost seconds per iteration). Whether it converged is reported, never hidden.

Deterministic: every run draws from (seed, iteration) streams, so the same seed gives the same
window, the same interval and the same stopping point.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from placer.base.errors import SpecError
from placer.cost.efficiency import Calibration
from placer.solve.planfile import Plan, load_plan
from simulator.api import MAX_SAMPLE_TURNS, simulate_plan
from simulator.config import SimConfig
from simulator.metrics import iteration_durations, steady
from simulator.result import SimResult

MIN_BATCHES = 8  # batches of the first run: enough to size the next one from
REL_CI = 0.05  # default target: the 95% interval's half width within 5% of the mean
MAX_ITERATIONS = 100
BUDGET_SAMPLE_TURNS = 400_000  # default work cap of one adaptive simulation (sample-turns)
MAX_ROUNDS = 4  # runs, each with more iterations, before giving up on the target

# Student's t, two-sided 95%, for 1..10 degrees of freedom; beyond, a series in 1/df.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t95(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (series error < 1e-3)."""
    if df < 1:
        raise ValueError(f"t95: df must be >= 1 (got {df})")
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.959964
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


@dataclass(frozen=True)
class Window:
    """Which iterations of a run are the steady state, and the batch size of the interval."""

    warmup: int
    drain: int
    period: int

    def minimum(self) -> int:
        """Iterations of the first adaptive run."""
        return self.warmup + self.drain + MIN_BATCHES * self.period


def window_of(plan: Plan) -> Window:
    job = plan.spec
    if plan.pipeline.overlaps_steps:
        s = plan.pipeline.staleness
        return Window(s + 1, s, s + 1)
    return Window(1 if job.tail_policy.mechanism.carries_over else 0, 0, 1)


@dataclass(frozen=True)
class SteadyState:
    """Steady-state figures of one simulated run."""

    iterations: int  # simulated
    warmup: int  # excluded at the start
    drain: int  # excluded at the end
    measured: int  # iterations in the window
    batches: int
    batch_size: int
    iteration_s: float  # time-average over the window
    ci95_s: tuple[float, float] | None  # None with fewer than two batches
    rel_half_width: float | None
    samples_per_s: float
    samples_per_s_ci95: tuple[float, float] | None
    converged: bool  # the interval met the target
    target_rel: float
    warmup_excluded: bool  # False: too few iterations for the window; first/last dropped only

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("ci95_s", "samples_per_s_ci95"):
            d[k] = None if d[k] is None else list(d[k])
        return d

    def describe(self) -> str:
        """One line: mean, interval, window."""
        ci = (f"95% CI {self.ci95_s[0]:.3f}..{self.ci95_s[1]:.3f} s "
              f"(+-{self.rel_half_width:.1%})" if self.ci95_s and self.rel_half_width is not None
              else "no CI (fewer than two batches)")
        window = (f"iterations {self.warmup + 1}..{self.warmup + self.measured} of "
                  f"{self.iterations}" if self.warmup_excluded else
                  f"{self.measured} of {self.iterations} iterations, warm-up NOT excluded "
                  f"(needs at least {self.warmup + self.drain + 1})")
        flag = "" if self.converged else f"; target +-{self.target_rel:.0%} not reached"
        return f"{self.iteration_s:.3f} s, {ci}; {window}{flag}"


def steady_state(result: SimResult, target_rel: float = REL_CI) -> SteadyState:
    """The steady-state window of a finished run and its interval (see the module doc)."""
    plan, run = result.plan, result.run
    w = window_of(plan)
    durs = iteration_durations(run, plan.pipeline)
    done = [run.committed.get(i, run.samples[i]).n for i in range(len(durs))]
    n = len(durs)
    if n >= w.warmup + w.drain + 1:
        lo, hi, excluded = w.warmup, n - w.drain, True
    else:  # too short for the window: fall back to the metrics' own steady part
        kept = len(steady(durs, plan.pipeline))
        lo = 1 if plan.pipeline.overlaps_steps and n >= 2 else 0
        hi, excluded = lo + kept, w.warmup == 0 and w.drain == 0
    t = np.asarray(durs[lo:hi], dtype=float)
    c = np.asarray(done[lo:hi], dtype=float)
    size = w.period if len(t) >= 2 * w.period else 1
    batches = len(t) // size
    goodput = result.timeline.goodput if result.timeline.goodput > 0 else 0.0
    tb = t[:batches * size].reshape(batches, size).sum(axis=1)
    cb = c[:batches * size].reshape(batches, size).sum(axis=1)
    mean = float(t.sum() / len(t))
    rate = float(c.sum() / t.sum()) * goodput
    ci = rate_ci = rel = None
    if batches >= 2:
        q = t95(batches - 1)
        hw = q * float(np.std(tb / size, ddof=1)) / math.sqrt(batches)
        ci, rel = (mean - hw, mean + hw), hw / mean
        r = float(cb.sum() / tb.sum())
        resid = cb - r * tb  # ratio estimator: var(R) ~ var(c - R t) / (B * mean(t)^2)
        rhw = q * float(np.std(resid, ddof=1)) / (math.sqrt(batches) * float(tb.mean())) * goodput
        rate_ci = (rate - rhw, rate + rhw)
    return SteadyState(n, lo, n - hi, len(t), batches, size, mean, ci, rel, rate, rate_ci,
                       rel is not None and rel <= target_rel, target_rel, excluded)


def cap_iterations(plan: Plan, max_iterations: int = MAX_ITERATIONS,
                   budget_sample_turns: int = BUDGET_SAMPLE_TURNS) -> int:
    """Most iterations an adaptive run may simulate: the cap, the work budget (but never below
    the smallest window with an interval: two batches) and the simulator's size bound."""
    job = plan.spec
    per = job.batch.samples * job.environment.turns
    w = window_of(plan)
    budget = max(budget_sample_turns // per, w.warmup + w.drain + 2 * w.period)
    return max(min(max_iterations, budget, MAX_SAMPLE_TURNS // per), 1)


def first_run(plan: Plan, max_iterations: int = MAX_ITERATIONS,
              budget_sample_turns: int = BUDGET_SAMPLE_TURNS) -> int:
    """Iterations of an adaptive run's first simulation: the smallest window, within the cap."""
    return min(window_of(plan).minimum(), cap_iterations(plan, max_iterations, budget_sample_turns))


def simulate_steady(plan: Plan | str | Path, seed: int = 0, config: SimConfig | None = None,
                    calibration: Calibration | None = None, workload: str | Path | None = None,
                    rel_ci: float = REL_CI, max_iterations: int = MAX_ITERATIONS,
                    budget_sample_turns: int = BUDGET_SAMPLE_TURNS,
                    on_iteration: Callable[[int, int], None] | None = None,
                    ) -> tuple[SimResult, SteadyState]:
    """Simulate until the steady-state mean's 95% interval is within `rel_ci` (or a cap).

    `on_iteration(done, of)` follows each run; a longer re-run starts again from 1 (of more)."""
    if not (math.isfinite(rel_ci) and 0 < rel_ci < 1):
        raise SpecError(f"--ci: must be a fraction in (0, 1), e.g. 0.05 (got {rel_ci!r})")
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
    cap = cap_iterations(plan, max_iterations, budget_sample_turns)
    w = window_of(plan)
    n = first_run(plan, max_iterations, budget_sample_turns)
    for _ in range(MAX_ROUNDS):
        result = simulate_plan(plan, iterations=n, seed=seed, config=config,
                               calibration=calibration, workload=workload,
                               on_iteration=on_iteration)
        st = steady_state(result, rel_ci)
        if st.converged or n >= cap or st.rel_half_width is None:
            break
        # batches needed at the variance seen so far (25% margin: that variance is itself an
        # estimate, and a third run costs more than a longer second one), at least 1.5x now and
        # at most 4x (a few long-tailed iterations can inflate the first estimate many times)
        need = math.ceil(st.batches * (st.rel_half_width / rel_ci) ** 2 * 1.25)
        n = min(cap, max(w.warmup + w.drain + need * w.period, math.ceil(n * 1.5)), 4 * n)
    return result, st
