"""Goodput over days of training: failures, restarts and checkpoints composed over simulated steps.

Simulating every token of a multi-day run is neither possible nor needed. A failure stops the
whole job (synchronous collectives; the async pipeline restarts from its checkpoint too), so the
run is a sequence of *segments*: K steps of work followed by a checkpoint. Method:

1. Per-step times. `simulate_plan` runs the plan for a few iterations with failures off; their
   durations d_1..d_m are the step-time distribution (async: without the pipeline fill and the
   drain, `metrics.steady`; simulate five or more). Steps of the long run are iid draws from it.
2. Failures. A Poisson process of rate lambda = sum over the plan's devices of 1 / MTBF of the
   device's type (`faults.failure_rate_per_s`). A failure loses the segment's progress (the
   partial step, every step since the checkpoint, and a checkpoint in progress), costs `restart_s`
   (during which nothing fails) and the segment starts again with the same work.
3. Exact renewal-reward formula. A segment of failure-free length T = W + C (W work, C the
   checkpoint) takes in expectation E[T_seg] = (e^{lambda T} - 1) (1/lambda + R). With the step
   times iid, E[e^{lambda W}] = M(lambda)^K where M is the empirical moment generating function of
   one step, so E[segment] = (M^K e^{lambda C} - 1)(1/lambda + R) and goodput = K E[d] / E[segment]
   exactly (renewal-reward: segments are iid). The expected time to finish N steps is the sum of
   its segments' expectations. Exact for the model stated: Poisson failures, memoryless, a
   failure-free restart, steps iid from the simulated distribution.
4. Monte Carlo (`monte_carlo`), seeded: draws the same process segment by segment (attempts are
   geometric, each lost attempt a truncated exponential) and gives the spread (p10/p90) the
   formula does not. It agrees with the formula within its sampling error (tests check this) and
   with `simulator.faults.compose`, the step-by-step walk the simulator uses for short runs.
5. Best interval. Goodput(K) is unimodal in K; `best_interval` scans K on the exact formula.
   Young/Daly's first-order optimum is W* = sqrt(2 C MTBF) (MTBF = 1/lambda); it holds when
   C << MTBF and steps are short against W*. The restart cost R scales E[segment] by a constant
   factor, so it does not move the optimum in this model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from placer.base.errors import SpecError
from placer.solve.planfile import Plan
from placer.spec.sampling import rng
from simulator.api import simulate_plan
from simulator.config import Failures, SimConfig
from simulator.faults import failure_rate_per_s
from simulator.metrics import iteration_durations, steady

STREAM_LONGRUN = 300
HOUR = 3600.0

# Per-GPU MTBF implied by the failure facts (REFERENCES.md): a job of n GPUs with job MTBF m fails
# at rate n/m, so one GPU's MTBF is n*m (failures assumed independent and evenly spread).
FAILURE_FACTS = {
    "Meta HPCA'25, 1,024-GPU jobs, job MTTF 7.9 h": 1024 * 7.9,  # 8,090 GPU-hours
    "Llama 3, 16,384 H100, 419 interruptions in 54 days": 16384 * 54 * 24 / 419,  # 50,677
    "Meta HPCA'25, 16,384-GPU jobs, job MTTF 1.8 h": 16384 * 1.8,  # 29,491
}


@dataclass(frozen=True)
class Costs:
    """What a failure and a checkpoint cost (seconds)."""

    restart_s: float = 300.0
    checkpoint_s: float = 30.0

    def check(self) -> Costs:
        for name in ("restart_s", "checkpoint_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise SpecError(f"{name}: must be a finite number >= 0 seconds (got {v!r})")
        return self


@dataclass(frozen=True)
class Estimate:
    """Goodput and time to finish of one checkpoint interval (K steps per segment)."""

    every: int  # steps between checkpoints
    interval_s: float  # K * mean step: failure-free work between checkpoints
    goodput: float  # useful step time / wall time
    steps: int
    expected_s: float  # expected wall time to finish `steps`


def step_durations(plan: Plan, iterations: int = 8, seed: int = 0,
                   config: SimConfig | None = None) -> list[float]:
    """Per-step times of `plan` with failures off (a few simulated iterations)."""
    cfg = (config or SimConfig()).model_copy(update={"failures": Failures()})
    r = simulate_plan(plan, iterations=iterations, seed=seed, config=cfg)
    return steady(iteration_durations(r.run, plan.pipeline), plan.pipeline)


def job_failure_rate(plan: Plan, mtbf_hours: dict[str, float]) -> float:
    """Failures per second of the whole job (`mtbf_hours`: one device's MTBF per type or kind)."""
    res = plan.resolved()
    known = set()
    for slot in plan.slots:
        for pool, _ in slot.pool_devices():
            dev = res.device_of(pool)
            known |= {dev.name, dev.kind.value}
    for k, v in mtbf_hours.items():
        if not (math.isfinite(v) and v > 0):
            raise SpecError(f"--mtbf {k}: must be > 0 hours (got {v!r})")
        if k not in known:
            raise SpecError(f"--mtbf {k}: no device of that type or kind in the plan (has: "
                            f"{', '.join(sorted(known))})")
    return failure_rate_per_s(res, plan, Failures(mtbf_hours=dict(mtbf_hours)))


def _log_mgf(durations: np.ndarray, rate: float) -> float:
    """log E[e^{rate d}] over the empirical distribution (log-sum-exp: no overflow)."""
    x = rate * durations
    top = float(x.max())
    return top + math.log(float(np.mean(np.exp(x - top))))


def segment_s(durations: np.ndarray, every: int, rate: float, costs: Costs) -> float:
    """Expected wall time of one segment: `every` iid steps and a checkpoint, under failures."""
    if every == 0:
        return 0.0
    if rate <= 0:
        return every * float(durations.mean()) + costs.checkpoint_s
    exponent = every * _log_mgf(durations, rate) + rate * costs.checkpoint_s
    if exponent > 700:  # e^700: the segment essentially never completes
        return math.inf
    return math.expm1(exponent) * (1 / rate + costs.restart_s)


def expected(durations: list[float], every: int, rate: float, costs: Costs,
             steps: int) -> Estimate:
    """The exact renewal-reward goodput and expected time to finish `steps` (see module doc)."""
    if every < 1:
        raise SpecError(f"checkpoint interval: must be at least one step (got {every})")
    if steps < 1:
        raise SpecError(f"steps: must be at least 1 (got {steps})")
    d = np.asarray(durations, dtype=float)
    mean = float(d.mean())
    full, rest = divmod(steps, every)
    seg = segment_s(d, every, rate, costs)
    total = full * seg + segment_s(d, rest, rate, costs)
    good = every * mean / seg if math.isfinite(seg) and seg > 0 else 0.0
    return Estimate(every, every * mean, good, steps, total)


def best_interval(durations: list[float], rate: float, costs: Costs,
                  max_every: int = 1_000_000) -> int:
    """The K (steps per checkpoint) that maximises goodput: E[segment]/K is unimodal in K."""
    d = np.asarray(durations, dtype=float)
    if rate <= 0 or costs.checkpoint_s <= 0:
        return max_every if rate <= 0 else 1

    def cost(k: int) -> float:
        return segment_s(d, k, rate, costs) / k

    lo, hi = 1, max_every
    while hi - lo > 2:  # ternary search on integers
        m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if cost(m1) <= cost(m2):
            hi = m2
        else:
            lo = m1
    return min(range(lo, hi + 1), key=cost)


def young_daly_s(rate: float, checkpoint_s: float) -> float:
    """Young/Daly's first-order optimal work between checkpoints: sqrt(2 C MTBF)."""
    return math.sqrt(2 * checkpoint_s / rate) if rate > 0 else math.inf


@dataclass(frozen=True)
class MonteCarlo:
    trials: int
    mean_s: float
    p10_s: float
    p90_s: float
    goodput: float  # sum of useful step time / sum of wall time, over all trials
    failures: float  # mean failures per trial


def monte_carlo(durations: list[float], every: int, rate: float, costs: Costs, steps: int,
                trials: int = 100, seed: int = 0) -> MonteCarlo:
    """Seeded draws of the time to finish `steps` (same model as `expected`)."""
    if trials < 1:
        raise SpecError(f"trials: must be at least 1 (got {trials})")
    g = rng(seed, STREAM_LONGRUN)
    d = np.asarray(durations, dtype=float)
    full, rest = divmod(steps, every)
    sizes = np.array([every] * full + ([rest] if rest else []))
    walls, useful, fails = np.empty(trials), np.empty(trials), np.empty(trials)
    for t in range(trials):
        work = np.add.reduceat(g.choice(d, steps), np.concatenate([[0], np.cumsum(sizes)[:-1]]))
        length = work + costs.checkpoint_s
        if rate > 0:
            ok = np.exp(-rate * length)
            if np.any(ok < 1e-12):
                raise SpecError("failures: the job's MTBF is far below its checkpoint interval; "
                                "it would essentially never finish")
            lost_n = g.geometric(ok) - 1  # failed attempts before the one that completes
            n = int(lost_n.sum())
            seg_of = np.repeat(np.arange(len(length)), lost_n)
            u = g.random(n)
            # a failed attempt's length: an exponential conditioned on falling before the end
            lost = -np.log1p(-u * -np.expm1(-rate * length[seg_of])) / rate
            extra = float(lost.sum()) + n * costs.restart_s
        else:
            n, extra = 0, 0.0
        walls[t] = float(length.sum()) + extra
        useful[t] = float(work.sum())
        fails[t] = n
    return MonteCarlo(trials, float(walls.mean()), float(np.percentile(walls, 10)),
                      float(np.percentile(walls, 90)), float(useful.sum() / walls.sum()),
                      float(fails.mean()))


def steps_for_hours(durations: list[float], hours: float) -> int:
    """Steps that `hours` of failure-free training would run."""
    if not (math.isfinite(hours) and hours > 0):
        raise SpecError(f"--hours: must be > 0 (got {hours!r})")
    return max(1, round(hours * HOUR / float(np.mean(durations))))


def every_for_interval(durations: list[float], interval_s: float) -> int:
    """Steps per checkpoint closest to `interval_s` seconds of work (at least one)."""
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise SpecError(f"--checkpoint-interval: must be > 0 seconds (got {interval_s!r})")
    return max(1, round(interval_s / float(np.mean(durations))))
