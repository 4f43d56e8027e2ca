"""Tail-aware rollout time: the expected makespan of one engine replica under continuous batching.

RL response lengths are long-tailed and a step waits for its longest samples, which decode alone
at batch 1-2 long after the batch emptied; lockstep waves of mean-length sequences
(`rolloutcost.wave_time`) miss that tail. This module replays a deterministic miniature of the
simulator's engine (`placer.cost.admission.engine`, the loop `simulator.engine` runs too) on a few
representative rows of one critical replica, the one holding the batch's longest sample
(`placer.cost.tail_samples`), and prices the tail policies as the simulator runs them
(over-provisioning, partial rollouts). A replica with many samples is priced at two counts and
extrapolated (`reduced_count`). With every distribution fixed the replay reduces exactly to the
lockstep waves (tests/test_rollout_tail.py).

Method, assumptions and measured error: docs/cost-model.md, "Tails".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from placer.cost.admission import run_replica
from placer.cost.batching import KvBudget, StepTerms
from placer.cost.efficiency import Efficiency
from placer.cost.tail_samples import (
    MAX_STRATA,
    Rows,
    at_means,
    cut,
    has_variance,
    insert,
    longest,
    quantile,
    strata,
    tail,
    tokens,
    varies,
)
from placer.spec.job import Job

# re-exported: the representative samples live in placer.cost.tail_samples
__all__ = ["MAX_STRATA", "Rows", "at_means", "cut", "has_variance", "insert", "longest", "quantile",
           "strata", "tail", "tokens", "varies"]

POSITIONS = (1 / 6, 1 / 2, 5 / 6)  # queue positions of the longest sample, averaged
# a replica with more than REDUCE x its throughput-bound count (`reduced_count`) is priced by
# extrapolation; 2 keeps the solver benchmark's candidate table near HEAD's time (4 doubles it)
REDUCE = 2
# `identical_span` replays a replica's identical samples exactly up to this many (the simulator's
# variance-off run; the replay costs ~50 us per sample, measured on ppo-llama8b-hetero's LPU
# replica), and extends a line beyond: its spans are a sawtooth in the sample count (which wave
# the last samples fall in), so a line through a few waves misses it by up to one wave
IDENTICAL_EXACT = 1024


# ------------------------------------------------------------------------------------ makespan
@dataclass(frozen=True)
class Replicas:
    """How the rollout's samples meet its engines (`rolloutcost.RolloutShape`'s counts)."""

    replicas: int
    per_replica: int  # samples of the busiest replica
    concurrency: int
    generated: int  # samples generated over all replicas
    kept: int  # samples the step waits for
    # samples of the whole step the batch's longest sample is drawn from (0: `generated`); a
    # split role's part runs a share of the step's batch, and its busiest replica is priced
    # with the longest of the step's draws, as one pool's busiest replica is
    # (`placer.cost.split`)
    step_draws: int = 0

    @property
    def draws(self) -> int:
        return self.step_draws or self.generated


def makespan(job: Job, st: StepTerms, eff: Efficiency, shape: Replicas) -> float:
    """Expected rollout stage seconds (generation and un-queued tool waits) of the job on
    `shape.replicas` replicas of `st`'s layout (module docstring: method and assumptions)."""
    env, budget = job.environment, job.tail_policy.mechanism.token_budget
    tools = env.kind != "none" and env.turns > 1
    out_tokens = env.tool_output_tokens if tools else 0
    over = shape.generated > shape.kept > 0
    per = shape.per_replica

    def run(rows: Rows) -> list[tuple[float, int]]:
        if budget is not None:
            rows = cut(rows, budget, out_tokens)
        return run_replica(st, rows.prompt, rows.response, rows.tool_s, rows.weight, out_tokens)

    n2 = reduced_count(job, st, shape, eff.tool_overhead_s)
    n1 = n2 // 2
    if per <= n2:  # from n1 on, throughput-bound: the longest sample's position matters little
        return _replica_s(job, per, shape, eff, st, run, over, reduced=per >= n1)
    # many waves: the replica's middle is a steady state, so time grows linearly in samples;
    # price n2 and n2 / 2 samples, both throughput-bound, and extend the line (bounds the work)
    t1, t2 = (_replica_s(job, n, shape, eff, st, run, over, reduced=True) for n in (n1, n2))
    return t2 + (t2 - t1) / (n2 - n1) * (per - n2)


def reduced_count(job: Job, st: StepTerms, shape: Replicas, tool_overhead_s: float) -> int:
    """Samples per replica past which `makespan` extends a line (through this many and n / 2).
    Both points must be throughput-bound: past the start-up (a first wave admitted on its
    prompts' KV, then preempted down to the steady concurrency `shape.concurrency`) and past the
    longest sample's span (a replica drains about `concurrency` mean samples per mean sample's
    solo duration, so the longest one dominates up to `concurrency` x its duration ratio).
    So n / REDUCE is the larger of the two."""
    env, lengths = job.environment, job.lengths
    calls = env.turns - 1 if env.kind != "none" and env.turns > 1 else 0
    ctx = lengths.prompt.mean_value() + lengths.response.mean_value()
    step_s = st.step(1, ctx)
    top = _longest(job, st, shape.draws, tool_overhead_s)
    solo_top = sum(top.response[0]) * step_s + sum(top.tool_s[0])
    solo_mean = (env.turns * lengths.response.mean_value() * step_s
                 + calls * (env.tool_latency_s.mean_value() + tool_overhead_s))
    ratio = math.ceil(solo_top / solo_mean) if solo_mean > 0 else 1
    kv = st.kv
    prompt = max(int(round(lengths.prompt.mean_value())), 1)
    first = min(kv.max_seqs, max(kv.tokens // (prompt + 1 + kv.seq), 1))
    return REDUCE * max(shape.concurrency * max(ratio, 1), first)




def _job_key(job: Job, tool_overhead_s: float) -> tuple[str, str, str, float]:
    """What a replay on one `StepTerms` depends on, by value: the job's lengths, environment and
    tail policy (`StepTerms.remember` keeps it per replica layout)."""
    return (job.lengths.model_dump_json(), job.environment.model_dump_json(),
            job.tail_policy.model_dump_json(), tool_overhead_s)



def _longest(job: Job, st: StepTerms, draws: int, tool_overhead_s: float) -> Rows:
    """`longest` of `draws` samples at this replica's solo decode step (a mean sample's mean
    context), kept by value on `st`: every count a split role's parts are priced at, and
    every candidate of the layout, draws from the same step."""
    def compute() -> Rows:
        ctx = job.lengths.prompt.mean_value() + job.lengths.response.mean_value()
        return longest(job, draws, tool_overhead_s, st.step(1, ctx))
    return st.remember(("longest", *_job_key(job, tool_overhead_s), draws), compute)


def _replica_s(job: Job, per: int, shape: Replicas, eff: Efficiency, st: StepTerms,
               run: Callable[[Rows], list[tuple[float, int]]], over: bool,
               reduced: bool = False) -> float:
    """Seconds until the critical replica holding `per` samples is done (over-provisioned: until
    the kept share of all samples is). Candidates that differ only in their replica count share
    the reduced replicas' runs, so results are kept per (job, replica layout, counts). A reduced
    replica (`reduced_count`) is throughput-bound: the longest sample's queue position no longer
    decides its end, so it is placed mid-queue only.

    The key holds what the replay reads: without over-provisioning, the replica's own samples,
    the step's draws (its longest sample) and the steady concurrency (where that sample sits),
    not the step's generated and kept counts, so the parts of a split role at counts with the
    same busiest replica (`placer.cost.split`: n samples on dp replicas, ceil(n / dp) each)
    share one replay; over-provisioned, also the counts and replicas its kept share reads."""
    counts = ((shape.generated, shape.kept, shape.replicas if per == shape.per_replica else 0)
              if over else ())
    key = (*_job_key(job, eff.tool_overhead_s), per, shape.concurrency, shape.draws, over,
           *counts, reduced)
    return st.remember(key, lambda: _replica_uncached(job, per, shape, eff, st, run, over,
                                                      reduced))


def _replica_uncached(job: Job, per: int, shape: Replicas, eff: Efficiency, st: StepTerms,
                      run: Callable[[Rows], list[tuple[float, int]]], over: bool,
                      reduced: bool) -> float:
    if over:  # the stage ends when `kept` samples are done over all replicas
        done = run(strata(job, per, eff.tool_overhead_s))
        if per == shape.per_replica:
            return _kept_done(done, shape)
        need, count = per * shape.kept / shape.generated, 0  # a reduced replica: kept share
        for t, w in sorted(done):
            count += w
            if count >= need:
                return t
        return max(t for t, _ in done)
    base = strata(job, per - 1, eff.tool_overhead_s)
    top = _longest(job, st, shape.draws, eff.tool_overhead_s)
    spots = (0.5,) if reduced else POSITIONS if per > shape.concurrency else (0.0,)
    return sum(max(t for t, _ in run(insert(base, top, f))) for f in spots) / len(spots)


def final_context(job: Job) -> int:
    """A mean sample's context at its last token (the tokens variance-off samples draw)."""
    env, lengths = job.environment, job.lengths
    out = env.tool_output_tokens if env.kind != "none" and env.turns > 1 else 0
    r = max(int(round(lengths.response.mean_value())), 1)
    p = max(int(round(lengths.prompt.mean_value())), 1)
    return p + env.turns * r + (env.turns - 1) * out


def fits_lockstep(job: Job, kv: KvBudget, wave: int) -> bool:
    """Whether `wave` identical mean samples (variance off) keep their KV within the replica's
    until their last token: then no sequence is preempted and the replica runs lockstep waves
    (`rolloutcost.wave_time`); else `identical_span` replays it."""
    return wave * (final_context(job) + kv.seq) <= kv.tokens


def steady_concurrency(job: Job, kv: KvBudget, first_wave: int) -> int:
    """Sequences a replica runs at once in its steady state: its first wave, or as many mean
    samples as its KV holds at their last token when fewer (`REDUCE`'s unit)."""
    return max(min(first_wave, kv.tokens // (final_context(job) + kv.seq)), 1 if first_wave else 0)


def identical_span(job: Job, st: StepTerms, shape: Replicas, tool_overhead_s: float) -> float:
    """Rollout seconds of a job at its means (variance off) whose waves outgrow the replica's KV:
    the engine loop on identical samples (preemption and recompute included), the busiest
    replica's `per` samples; over-provisioned, until `kept` samples are done over all replicas
    (the `big` replicas holding `per` and the rest holding `per - 1`, each replayed)."""
    per = shape.per_replica
    if per <= max(REDUCE * shape.concurrency, IDENTICAL_EXACT):
        return _identical_s(job, st, shape, tool_overhead_s, per)
    # many samples: extend the line through IDENTICAL_EXACT / 2 and IDENTICAL_EXACT samples,
    # both past the start (a first wave admitted on its prompts' KV, then preempted down to the
    # steady concurrency), whose extra cost a line through a few steady waves would extend
    n2 = IDENTICAL_EXACT
    n1 = n2 // 2
    t1, t2 = (_identical_s(job, st, shape, tool_overhead_s, n) for n in (n1, n2))
    return t2 + (t2 - t1) / (n2 - n1) * (per - n2)


def _identical_s(job: Job, st: StepTerms, shape: Replicas, tool_overhead_s: float,
                 per: int) -> float:
    """`identical_span` of a replica holding `per` samples (fewer than the busiest's: a reduced
    replica, over-provisioned until its kept share is done)."""
    reps, full = shape.replicas, per == shape.per_replica
    done = _identical_done(job, st, tool_overhead_s, per)
    span = max(t for t, _ in done)
    if shape.generated > shape.kept > 0:
        big = shape.generated - (per - 1) * reps if full else reps
        need = shape.kept if full else per * reps * shape.kept / shape.generated
        events = [(t, w * big) for t, w in done]
        if reps > big:
            events += [(t, w * (reps - big))
                       for t, w in _identical_done(job, st, tool_overhead_s, per - 1)]
        events.sort()
        count = 0
        for t, w in events:
            count += w
            if count >= need:
                span = t
                break
    return span


def _identical_done(job: Job, st: StepTerms, tool_overhead_s: float, n: int
                    ) -> list[tuple[float, int]]:
    """The engine loop on `n` identical mean samples: (finish time, sequences). Kept by value
    (terms, the sample's lengths and waits, n), so every candidate and sample share with this
    replica layout and count (`placer.cost.split` prices shares of the batch) replays it once."""
    env = job.environment
    out = env.tool_output_tokens if env.kind != "none" and env.turns > 1 else 0
    row = strata(job, 1, tool_overhead_s)
    if n <= 0:
        return []
    key = ("identical", row.prompt[0], tuple(row.response[0]), tuple(row.tool_s[0]), out, n)
    return st.remember(key, lambda: run_replica(st, row.prompt, row.response, row.tool_s, [n],
                                                out))


def _kept_done(done: list[tuple[float, int]], shape: Replicas) -> float:
    """When `kept` samples are done over all replicas: `big` replicas hold `per` samples and
    finish them at the times of `done`, the rest hold `per - 1` (their first per - 1 finishes)."""
    per, reps = shape.per_replica, shape.replicas
    big = shape.generated - (per - 1) * reps
    count = 0
    for t, w in sorted(done):
        count += w
        if big * count + (reps - big) * min(count, per - 1) >= shape.kept:
            return t
    return max(t for t, _ in done)
