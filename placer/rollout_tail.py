"""Tail-aware rollout time: the expected makespan of one engine replica under continuous batching.

Why. RL response lengths are long-tailed (GRPO/DAPO reasoning: a lognormal with a hard cap), and a
step waits for its longest samples: the last few sequences decode alone, at batch 1-2, long after
the batch emptied. Pricing lockstep waves of *mean*-length sequences (`estimate.wave_time`) misses
that tail entirely (published DAPO/GRPO rollouts are 2-9x the mean-length estimate).

Method. A deterministic miniature of the simulator's engine (`simulator.engine`, which the placer
may not import: it is layer 1) run on a few representative sequences of one *critical* replica:
  * samples: the rollout deals samples round-robin, so each replica holds `per` i.i.d. draws. The
    critical replica is the one holding the batch's longest sample. Its other `per - 1` samples
    are stratified quantiles of the job's clipped distributions (`placer.distributions`; the
    normal and lognormal by their inverse CDF, empirical ones by their sorted values) at the
    midpoints of `K <= MAX_STRATA` equal-weight strata; a stratum of weight w is w identical
    sequences (weights are whole sequences, so batch sizes stay integers). Prompt, every turn's
    response and every tool latency get their levels through independent low-discrepancy
    permutations (a Kronecker sequence per dimension), so the admission order mixes short and long
    samples as a random order does, without a random draw.
  * the longest sample (`longest`): a sum of independent heavy-tailed terms is large through one
    big term ("one big jump"), so P(S > x) ~ sum over a sample's components (response turns at
    a small-batch step time per token, tool calls) of P(that one exceeds x - the others' means).
    x is set where the batch's samples put e^-0.5772 of them above it (the expected maximum of a
    Gumbel-type tail); the likeliest component carries the excess. When a mass at the cap puts
    m > 1 samples at that level, the longest of them has a second jump: another component at
    the expected maximum over m. Its position in the admission queue matters once a replica
    runs more samples than its concurrency; the makespan is then averaged over three positions
    (1/6, 1/2, 5/6 of the queue).
  * a replica with many samples runs a steady state in its middle: it is priced at n and n / 2
    samples, both throughput-bound (`reduced_count`: past the first wave's preemption down to
    the steady concurrency, and past the longest sample's span), the longest sample mid-queue,
    and the line through them is extended to its count (candidates that differ only in dp
    share those runs; measured against replaying all samples: within 6% on
    tests/test_lpu_rollout.py's ppo-llama8b-hetero-like case, where a line through 2 and 4
    concurrencies' worth was 16% short, the longest sample dominating both).
  * engine: exactly the simulator's scheduling (`placer.admission.engine`): admit while free KV
    covers the new tokens and fewer than `max_num_seqs` run, one prefill step over every
    admitted sequence's new tokens (`costmodel.prefill_time` at their mean context), then decode
    the batch until the next sequence ends its turn, a tool call returns or the KV is full (then
    the newest are preempted and recomputed later), each run of fixed batch summed in closed
    form (`batching.Run`, decode_step_time is max(line, floor) in the total KV context); a
    sequence holds its KV through its tool call (latency + overhead, no CPU queueing here:
    `timing.rollout_tool_time` adds the queueing as a pair term).
  * tail policies as the simulator runs them: over-provisioning ends the stage once `kept` of the
    `generated` samples are done over all replicas (replicas hold `per` or `per - 1` samples, the
    critical sample is not injected: the longest samples are the ones dropped); partial rollouts
    cut every row at `token_budget` response tokens (`simulator.tails.cut_row`'s rule) and run the
    carried rests of the previous step beside the fresh rows (steady state: one carried row per
    row cut, its context prefilled again, at most `budget` tokens of it this step).
With every distribution fixed (or the simulator's `--no-variance` run, priced on `at_means(job)`)
the caller keeps the lockstep wave formula (`estimate.wave_time`), which this miniature reduces to
exactly on identical sequences (tests/test_rollout_tail.py checks it).

Assumptions and error. The max over replicas is taken to be the replica holding the batch's
longest sample: other replicas' extra load (a replica with more long samples than average) is not
priced, nor the joint tail of two long samples in one replica; this underestimates by a few percent
when a replica runs many waves. Speculative re-issue of tool calls and CPU queueing inside the
engine's timeline (only whole-wave queueing rounds are added, by `timing`) are not modelled; an
over-provisioned rollout whose queued calls hide under the next wave is thus over-priced.
Measured against `placer simulate --iterations 8` on the examples (variance on): within 10% of
the simulated mean (longtail-replay -9%, whose iterations themselves range 357-640 s of rollout).
Cost: at most MAX_STRATA + 1 sequences and six runs per candidate, O(K turns log K) events each,
plus one per KV-full moment (at most one per `kv_block_tokens` steps while the KV is short).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any, TypeVar

import numpy as np

from placer.admission import run_replica
from placer.batching import KvBudget, StepTerms, step_terms
from placer.costmodel import Efficiency, Parallel
from placer.distributions import Distribution
from placer.spec import DeviceType, Job, ModelArch

MAX_STRATA = 48  # representative sequences per replica (besides the longest sample)
POSITIONS = (1 / 6, 1 / 2, 5 / 6)  # queue positions of the longest sample, averaged
# a replica with more than REDUCE x its throughput-bound count (`reduced_count`) is priced by
# extrapolation; 2 keeps the solver benchmark's candidate table near HEAD's time (4 doubles it)
REDUCE = 2
# `identical_span` replays a replica's identical samples exactly up to this many (the simulator's
# variance-off run; the replay costs ~50 us per sample, measured on ppo-llama8b-hetero's LPU
# replica), and extends a line beyond: its spans are a sawtooth in the sample count (which wave
# the last samples fall in), so a line through a few waves misses it by up to one wave
IDENTICAL_EXACT = 1024
_ND = NormalDist()


# ------------------------------------------------------------------------------ distributions
def varies(dist: Distribution) -> bool:
    """Whether draws of `dist` can differ (a fixed value, or a zero spread clipped, cannot)."""
    lo, hi = quantile(dist, np.array([1e-9, 1 - 1e-9]))
    return bool(hi > lo)


def has_variance(job: Job) -> bool:
    """Whether any length or tool latency of the job varies (else waves of means are exact)."""
    env = job.environment
    dists = [job.lengths.prompt, job.lengths.response]
    if env.kind != "none" and env.turns > 1:
        dists.append(env.tool_latency_s)
    return any(varies(d) for d in dists)


def at_means(job: Job) -> Job:
    """The job with every length and latency fixed at its (clipped) mean: what the simulator's
    no-variance run draws. Each keeps its largest value as a cap (a lognormal of zero spread), so
    the job's longest context, and with it the engines' KV reservation, is unchanged."""
    def fixed(d: Distribution) -> Distribution:
        mean = d.mean_value()
        if mean <= 0:  # nothing to fix (a zero latency stays zero)
            return d
        return Distribution(kind="lognormal", median=mean, sigma=0.0, cap=max(d.max_value(), mean))

    lengths = job.lengths.model_copy(update={"prompt": fixed(job.lengths.prompt),
                                             "response": fixed(job.lengths.response)})
    env = job.environment.model_copy(update={"tool_latency_s": fixed(job.environment.tool_latency_s)})
    return job.model_copy(update={"lengths": lengths, "environment": env})


@lru_cache(maxsize=64)
def _sorted_values(path: str, field: str) -> np.ndarray:
    return np.sort(np.asarray(Distribution(kind="empirical", path=path, field=field).samples(),
                              dtype=float))


def quantile(dist: Distribution, u: np.ndarray) -> np.ndarray:
    """Inverse CDF of the clipped distribution at levels u in (0, 1)."""
    if dist.kind == "fixed":
        out = np.full(len(u), float(dist.fixed_value()))
    elif dist.kind in ("normal", "lognormal"):
        a, b = dist.params()
        z = np.array([_ND.inv_cdf(float(min(max(x, 1e-12), 1 - 1e-12))) for x in u])
        out = a + b * z if dist.kind == "normal" else a * np.exp(b * z)
    else:
        vals = _sorted_values(*dist.source())  # uniform over the values, as `sampling.draw`
        idx = np.minimum((np.asarray(u) * len(vals)).astype(int), len(vals) - 1)
        out = vals[idx]
    return np.clip(out, dist.min, dist.cap if dist.cap is not None else np.inf)


def tokens(dist: Distribution, u: np.ndarray) -> np.ndarray:
    """Token counts at levels u, rounded and at least 1 (as `sampling.draw_lengths`)."""
    return np.maximum(np.rint(quantile(dist, u)), 1).astype(np.int64)


# --------------------------------------------------------------------------------- workloads
@dataclass
class Rows:
    """Representative sequences of one replica, in admission order; row i stands for weight[i]
    identical sequences."""

    prompt: list[int]
    response: list[list[int]]  # [row][turn]
    tool_s: list[list[float]]  # [row][call]: latency incl. overhead (empty: no tool calls)
    weight: list[int]

    @property
    def sequences(self) -> int:
        return sum(self.weight)


def _levels(weights: np.ndarray, dim: int) -> np.ndarray:
    """Stratum midpoints in (0, 1), assigned to positions by a low-discrepancy permutation."""
    k = len(weights)
    alpha = math.sqrt((2, 3, 5, 7, 11, 13, 17, 19, 23, 29)[dim % 10]) % 1 + dim // 10 * 0.01
    order = np.argsort(((np.arange(k) + 0.5) * alpha) % 1, kind="stable")  # position of rank r
    w = weights[order]
    mid = (np.cumsum(w) - w / 2) / w.sum()
    out = np.empty(k)
    out[order] = mid
    return out


def _split(total: int, parts: int) -> np.ndarray:
    base, extra = divmod(total, parts)
    return np.array([base + 1] * extra + [base] * (parts - extra), dtype=np.int64)


def strata(job: Job, count: int, tool_overhead_s: float) -> Rows:
    """`count` samples of the job as at most MAX_STRATA weighted, interleaved strata."""
    env, lengths = job.environment, job.lengths
    turns, calls = env.turns, (env.turns - 1 if env.kind != "none" and env.turns > 1 else 0)
    k = min(count, MAX_STRATA)
    w = _split(count, k) if k else np.zeros(0, dtype=np.int64)
    p = tokens(lengths.prompt, _levels(w, 0)) if k else np.zeros(0, dtype=np.int64)
    r = np.stack([tokens(lengths.response, _levels(w, 1 + t)) for t in range(turns)], axis=1) \
        if k else np.zeros((0, turns), dtype=np.int64)
    lat = (np.stack([quantile(env.tool_latency_s, _levels(w, 1 + turns + c)) for c in range(calls)],
                    axis=1) + tool_overhead_s) if calls and k else np.zeros((k, 0))
    return Rows(p.tolist(), r.tolist(), lat.tolist(), w.tolist())


def tail(dist: Distribution, x: float) -> float:
    """P(X >= x) of the clipped distribution (its mass at the cap included)."""
    hi = dist.cap if dist.cap is not None else math.inf
    if x > hi:
        return 0.0
    if x <= dist.min:
        return 1.0
    if dist.kind == "fixed":
        return float(dist.fixed_value() >= x)
    if dist.kind in ("normal", "lognormal"):
        a, b = dist.params()
        z = (x - a if dist.kind == "normal" else math.log(x / a)) / b if b > 0 else math.inf
        return 1 - _ND.cdf(z) if math.isfinite(z) else float(z < 0)
    vals = _sorted_values(*dist.source())
    return float(len(vals) - np.searchsorted(vals, x, side="left")) / len(vals)


EXPECTED_MAX = math.exp(-0.5772156649)  # N P(S > x) at E[max S] for a Gumbel-type tail


def longest(job: Job, draws: int, tool_overhead_s: float, step_s: float) -> Rows:
    """The batch's longest sample (one row of weight 1) by the one-big-jump rule: with S a
    sample's solo duration (responses at `step_s` per token, plus tool latencies),
    P(S > x) ~ sum over components of P(that one exceeds x minus the others' means); x is set
    where `draws` samples put EXPECTED_MAX of them above it (the expected maximum of a
    Gumbel-type tail), the component most likely to carry it takes the excess, the rest sit at
    their means."""
    env, lengths = job.environment, job.lengths
    turns, calls = env.turns, (env.turns - 1 if env.kind != "none" and env.turns > 1 else 0)
    rd, ld = lengths.response, env.tool_latency_s
    r_mean, l_mean = rd.mean_value(), ld.mean_value()
    total = turns * r_mean * step_s + calls * l_mean

    def over(x: float) -> tuple[float, float]:  # expected samples with S > x, via a turn / a call
        resp = turns * tail(rd, (x - total) / step_s + r_mean) if step_s > 0 else 0.0
        return draws * resp, draws * calls * tail(ld, x - total + l_mean) if calls else 0.0

    lo, hi = total, total + (rd.max_value() - r_mean) * step_s + (ld.max_value() if calls else 0)
    for _ in range(60):  # bisection: sum(over(x)) falls from >= draws at `total` to 0 past `hi`
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(over(mid)) > EXPECTED_MAX else (lo, mid)
    x = hi
    by_resp, by_call = over(lo)
    resp = [max(int(round(r_mean)), 1)] * turns
    lat = [l_mean + tool_overhead_s] * calls
    big_call = bool(calls) and by_call > by_resp
    if big_call:
        lat[0] = min(x - total + l_mean, ld.max_value()) + tool_overhead_s
    elif step_s > 0:
        resp[0] = max(int(round(min((x - total) / step_s + r_mean, rd.max_value()))), 1)
    # a mass at the cap puts m > 1 samples at that level: the longest of them is the one whose
    # other components run longest, a second jump at the expected maximum over m of those
    m = by_resp + by_call
    n_r, n_l = turns - (0 if big_call else 1), calls - (1 if big_call else 0)
    if m > 1 and n_r + n_l > 0:
        r2 = float(quantile(rd, np.array([1 - EXPECTED_MAX / (m * n_r)]))[0]) if n_r else r_mean
        l2 = float(quantile(ld, np.array([1 - EXPECTED_MAX / (m * n_l)]))[0]) if n_l else l_mean
        if n_l and l2 - l_mean > (r2 - r_mean) * step_s:
            lat[1 if big_call else 0] = l2 + tool_overhead_s
        elif n_r:
            resp[0 if big_call else 1] = max(int(round(r2)), 1)
    prompt = max(int(round(lengths.prompt.mean_value())), 1)
    return Rows([prompt], [resp], [lat], [1])


def insert(rows: Rows, extra: Rows, at: float) -> Rows:
    """`rows` with `extra`'s rows placed at fraction `at` of the queue (by sequences)."""
    cum = np.cumsum(rows.weight) if rows.weight else np.zeros(0)
    i = int(np.searchsorted(cum, at * rows.sequences)) if rows.weight else 0
    return Rows(rows.prompt[:i] + extra.prompt + rows.prompt[i:],
                rows.response[:i] + extra.response + rows.response[i:],
                rows.tool_s[:i] + extra.tool_s + rows.tool_s[i:],
                rows.weight[:i] + extra.weight + rows.weight[i:])


def cut(rows: Rows, budget: int, tool_output: int) -> Rows:
    """Partial rollouts in steady state: every row cut after `budget` response tokens, plus, for
    each cut row, the carried rest of its twin from the previous step (context prefilled again,
    at most `budget` tokens of it now), so a step runs as many carried rows as it cuts."""
    out = Rows([], [], [], [])
    carried = Rows([], [], [], [])
    for p, resp, lat, w in zip(rows.prompt, rows.response, rows.tool_s, rows.weight):
        now, rest = _cut_row(p, resp, lat, budget, tool_output)
        _add(out, now, w)
        if rest is not None:
            _add(carried, _cut_row(*rest, budget, tool_output)[0], w)
    if not carried.weight:
        return out
    # the step runs as many rows as before: carried rows first, fresh rows scaled down to fit
    n, c = out.sequences, carried.sequences
    fresh = np.maximum(np.rint(np.array(out.weight) * max(n - c, 0) / n), 0).astype(int)
    keep = [i for i, f in enumerate(fresh) if f > 0]
    return Rows(carried.prompt + [out.prompt[i] for i in keep],
                carried.response + [out.response[i] for i in keep],
                carried.tool_s + [out.tool_s[i] for i in keep],
                carried.weight + [int(fresh[i]) for i in keep])


def _add(rows: Rows, row: tuple[int, list[int], list[float]], weight: int) -> None:
    rows.prompt.append(row[0])
    rows.response.append(row[1])
    rows.tool_s.append(row[2])
    rows.weight.append(weight)


def _cut_row(prompt: int, resp: list[int], lat: list[float], budget: int, tool_output: int
             ) -> tuple[tuple[int, list[int], list[float]], tuple[int, list[int], list[float]] | None]:
    left, ctx = budget, prompt
    for t, r in enumerate(resp):
        g = r if r <= left else max(left, 1)
        if g < r:
            return (prompt, resp[:t] + [g], lat[:t]), (ctx + g, [r - g] + resp[t + 1:], lat[t:])
        left -= r
        ctx += r + (tool_output if t < len(resp) - 1 else 0)
    return (prompt, resp, lat), None


# ------------------------------------------------------------------------------------ makespan
@dataclass(frozen=True)
class Replicas:
    """How the rollout's samples meet its engines (`estimate.RolloutShape`'s counts)."""

    replicas: int
    per_replica: int  # samples of the busiest replica
    concurrency: int
    generated: int  # samples generated over all replicas
    kept: int  # samples the step waits for


def makespan(job: Job, m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency,
             shape: Replicas) -> float:
    """Expected rollout stage seconds (generation and un-queued tool waits) of the job on
    `shape.replicas` replicas of `par` (module docstring: method and assumptions)."""
    st = step_terms(m, dev, par, eff)
    env, tp = job.environment, job.tail_policy
    tools = env.kind != "none" and env.turns > 1
    out_tokens = env.tool_output_tokens if tools else 0
    over = shape.generated > shape.kept > 0
    per = shape.per_replica

    def run(rows: Rows) -> list[tuple[float, int]]:
        if tp.kind == "partial" and tp.token_budget is not None:
            rows = cut(rows, tp.token_budget, out_tokens)
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
    top = longest(job, shape.generated, tool_overhead_s, step_s)
    solo_top = sum(top.response[0]) * step_s + sum(top.tool_s[0])
    solo_mean = (env.turns * lengths.response.mean_value() * step_s
                 + calls * (env.tool_latency_s.mean_value() + tool_overhead_s))
    ratio = math.ceil(solo_top / solo_mean) if solo_mean > 0 else 1
    kv = st.kv
    prompt = max(int(round(lengths.prompt.mean_value())), 1)
    first = min(kv.max_seqs, max(kv.tokens // (prompt + 1 + kv.seq), 1))
    return REDUCE * max(shape.concurrency * max(ratio, 1), first)


_SPANS: OrderedDict[tuple, Any] = OrderedDict()  # least recently used first
SPANS_KEPT = 4096
_TERMS: dict[int, StepTerms] = {}  # the terms whose ids key _SPANS (kept alive while they do)
_T = TypeVar("_T")


def _job_key(job: Job, st: StepTerms, tool_overhead_s: float) -> tuple:
    """What a replay depends on, by value: the step terms (one object per model, device, layout
    and efficiency: `batching.step_terms`), the job's lengths, environment and tail policy."""
    return (id(st), job.lengths.model_dump_json(), job.environment.model_dump_json(),
            job.tail_policy.model_dump_json(), tool_overhead_s)


def _cached(key: tuple, st: StepTerms, compute: Callable[[], _T]) -> _T:
    """`compute()` kept in an LRU of SPANS_KEPT entries; `st` is kept beside its id in
    `_TERMS` so the id stays its own while any entry uses it."""
    hit = _SPANS.get(key)
    if hit is not None and _TERMS.get(key[0]) is st:
        _SPANS.move_to_end(key)
        return hit
    t = compute()
    _TERMS[id(st)] = st
    _SPANS[key] = t
    if len(_SPANS) > SPANS_KEPT:
        _SPANS.popitem(last=False)
        if len(_TERMS) > SPANS_KEPT:  # entries keyed by dropped terms simply miss
            _TERMS.clear()
            _SPANS.clear()
    return t


def _replica_s(job: Job, per: int, shape: Replicas, eff: Efficiency, st: StepTerms,
               run: Callable[[Rows], list[tuple[float, int]]], over: bool,
               reduced: bool = False) -> float:
    """Seconds until the critical replica holding `per` samples is done (over-provisioned: until
    the kept share of all samples is). Candidates that differ only in their replica count share
    the reduced replicas' runs, so results are kept per (job, replica layout, counts). A reduced
    replica (`reduced_count`) is throughput-bound: the longest sample's queue position no longer
    decides its end, so it is placed mid-queue only."""
    key = (*_job_key(job, st, eff.tool_overhead_s), per, shape.concurrency, shape.generated,
           shape.kept, shape.replicas if over and per == shape.per_replica else 0, reduced)
    return _cached(key, st, lambda: _replica_uncached(job, per, shape, eff, st, run, over,
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
    ctx = job.lengths.prompt.mean_value() + job.lengths.response.mean_value()
    top = longest(job, shape.generated, eff.tool_overhead_s, st.step(1, ctx))
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
    (`estimate.wave_time`); else `identical_span` replays it."""
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
    replica layout and count (`placer.split` prices shares of the batch) replays it once."""
    env = job.environment
    out = env.tool_output_tokens if env.kind != "none" and env.turns > 1 else 0
    row = strata(job, 1, tool_overhead_s)
    if n <= 0:
        return []
    key = (id(st), "identical", row.prompt[0], tuple(row.response[0]), tuple(row.tool_s[0]),
           out, n)
    return _cached(key, st, lambda: run_replica(st, row.prompt, row.response, row.tool_s, [n],
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
