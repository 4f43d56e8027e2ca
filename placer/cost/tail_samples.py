"""Representative samples of a job for the rollout's replica replay (`placer.cost.rollout_tail`).

The replay cannot run every sample of a batch, so it runs a few weighted rows standing for them,
drawn without randomness from the job's clipped distributions (`placer.spec.distributions`): the
critical replica's `per - 1` samples as stratified quantiles at the midpoints of at most
`MAX_STRATA` equal-weight strata, in a low-discrepancy admission order (a Kronecker sequence per
dimension), plus the batch's longest sample by the one-big-jump rule (`longest`, placed in the
queue by `insert`). Partial rollouts reshape the rows (`cut`, as `simulator.tails.cut_row` cuts a
sample). The job at its means (`at_means`, with `has_variance` telling whether that is exact) is
what the simulator's no-variance run draws.

The sampling rules and why: docs/cost-model.md, "Tails".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from placer.spec.distributions import Distribution
from placer.spec.job import Job
from traces.workload import file_version

MAX_STRATA = 48  # representative sequences per replica (besides the longest sample)
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
        mean = d.mean_value() - d.offset  # the offset (a prompt's image tokens) stays apart
        if mean <= 0:  # nothing to fix (a zero latency stays zero)
            return d
        return Distribution(kind="lognormal", median=mean, sigma=0.0,
                            cap=max(d.max_value() - d.offset, mean), offset=d.offset)

    lengths = job.lengths.model_copy(update={"prompt": fixed(job.lengths.prompt),
                                             "response": fixed(job.lengths.response)})
    env = job.environment.model_copy(update={"tool_latency_s": fixed(job.environment.tool_latency_s)})
    update: dict[str, object] = {"lengths": lengths, "environment": env}
    rm = job.reward_model
    if rm is not None and rm.verdict is not None:  # a generative judge's verdicts too
        update["reward_model"] = rm.model_copy(update={"verdict": fixed(rm.verdict)})
    if job.agents is not None:  # every agent's own turn lengths too
        members = {n: a.model_copy(update={"response": fixed(a.response)})
                   if a.response is not None else a for n, a in job.agents.members.items()}
        update["agents"] = job.agents.model_copy(update={"members": members})
    return job.model_copy(update=update)


@lru_cache(maxsize=64)
def _sorted_values(path: str, field: str, version: tuple[int, int] | None
                   ) -> npt.NDArray[np.float64]:
    """A trace field's values, sorted (cached by the file's version)."""
    return np.sort(np.asarray(Distribution(kind="empirical", path=path, field=field).samples(),
                              dtype=float))


def quantile(dist: Distribution, u: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Inverse CDF of the clipped distribution at levels u in (0, 1)."""
    out: npt.NDArray[np.float64]
    if dist.kind == "fixed":
        out = np.full(len(u), float(dist.fixed_value()))
    elif dist.kind in ("normal", "lognormal"):
        a, b = dist.params()
        z = np.array([_ND.inv_cdf(float(min(max(x, 1e-12), 1 - 1e-12))) for x in u])
        out = a + b * z if dist.kind == "normal" else a * np.exp(b * z)
    else:
        vals = _sorted_values(*dist.source(), file_version(dist.source()[0]))  # as `sampling.draw`
        idx = np.minimum((np.asarray(u) * len(vals)).astype(int), len(vals) - 1)
        out = vals[idx]
    out = np.clip(out, dist.min, dist.cap if dist.cap is not None else np.inf)
    return out + dist.offset if dist.offset else out


TOTALS_GRID = 4096  # quantiles (or draws) behind a sample total's truncated moments


def sample_totals(dist: Distribution, turns: int, seed: int) -> npt.NDArray[np.float64]:
    """`TOTALS_GRID` totals of `turns` draws of `dist`, sorted: one turn on the exact quantile
    grid, several as sums of draws from `seed`. The trained samples' truncated mean
    (`estimate.trained_context`) and spread (`attnspan.attention_span`) are read off these."""
    if turns == 1:
        return quantile(dist, (np.arange(TOTALS_GRID) + 0.5) / TOTALS_GRID)
    u = np.random.default_rng(seed).random(TOTALS_GRID * turns)
    return np.sort(quantile(dist, u).reshape(TOTALS_GRID, turns).sum(axis=1))


def shortest(totals: npt.NDArray[np.float64], keep: float) -> npt.NDArray[np.float64]:
    """The `keep` fraction of sorted `totals` with the smallest values (at least one)."""
    return totals[:max(int(keep * len(totals)), 1)]


def tokens(dist: Distribution, u: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
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


def _levels(weights: npt.NDArray[np.int64], dim: int) -> npt.NDArray[np.float64]:
    """Stratum midpoints in (0, 1), assigned to positions by a low-discrepancy permutation."""
    k = len(weights)
    alpha = math.sqrt((2, 3, 5, 7, 11, 13, 17, 19, 23, 29)[dim % 10]) % 1 + dim // 10 * 0.01
    order = np.argsort(((np.arange(k) + 0.5) * alpha) % 1, kind="stable")  # position of rank r
    w = weights[order]
    mid = (np.cumsum(w) - w / 2) / w.sum()
    out = np.empty(k)
    out[order] = mid
    return out


def _split(total: int, parts: int) -> npt.NDArray[np.int64]:
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
    """P(X >= x) of the clipped distribution (its mass at the cap included), plus its offset."""
    x -= dist.offset
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
    vals = _sorted_values(*dist.source(), file_version(dist.source()[0]))
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
