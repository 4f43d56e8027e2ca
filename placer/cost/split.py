"""Roles split over pools: rollout engines on several device types, each part with its own layout
and its own share of the samples.

On a heterogeneous cluster the fastest plan often serves generation from more than one pool (the
training GPUs keep the actor, the samples go to H20 and L40S engines: StreamRL, AReaL-Hex and
Helix report their wins from this). A split candidate joins two single-pool candidates of the
rollout role and divides the batch so that both parts finish together: the group-aligned count n
on part a minimising max(t_a(n), t_b(N - n)), found by bisection, each part priced by
`placer.cost.estimate.estimate` with the tail model. GRPO groups stay whole on one part.

Which pairs: every two pools that can host the role; on each, the single candidates after
dominance pruning thinned to `PART_CHOICES` device counts (`thin`); each pair balanced at the
job's means, the Pareto set per pair of pools thinned to `PAIR_CHOICES`, and only those priced
with the tail model (`split_estimates`). The ILP picks among them, so the table stays small at
thousands of devices. How slots, weight sync and tool calls treat a split role:
docs/cost-model.md, "How roles combine into one iteration".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import combinations

from placer.base.roles import Role
from placer.cost.context import PriceContext
from placer.cost.estimate import Estimate, Part, estimate
from placer.cost.sharding import Parallel
from placer.cost.tail_samples import at_means, has_variance
from placer.spec.hardware import DeviceKind

SPLITTABLE = (Role.ROLLOUT,)
PART_CHOICES = 4  # device counts per pool that a part may take (spread over the pool's range)
PAIR_CHOICES = 8  # split candidates kept per pair of pools (spread over their total devices)

# Whether a split candidate holding these devices (pool -> count), whose time is at least this
# many seconds, may be in a plan better than a known one (`placer.solve.ilp_bound.split_keep`)
SplitKeep = Callable[[dict[str, int], float], bool]


def deal(n: int, kept: list[int]) -> list[int]:
    """Samples each part runs when a step runs `n` and part i's share of the kept batch is
    `kept[i]` (the plan's `parts[i].samples`): the kept counts, plus any extra (over-provisioned)
    dealt by the same shares, or with fewer than the batch (a smaller executed batch, a partial
    rollout's rows) all of them by the shares; largest remainder first, ties by index. The
    simulator and the executor both deal by this rule, as contiguous ranges in part order."""
    total = sum(kept)
    if n == total or len(kept) == 1:
        return [n] if len(kept) == 1 else list(kept)
    base, m = (list(kept), n - total) if n > total else ([0] * len(kept), n)
    exact = [m * k / total for k in kept]
    whole = [int(x) for x in exact]
    order = sorted(range(len(kept)), key=lambda i: (-(exact[i] - whole[i]), i))
    for i in order[:m - sum(whole)]:
        whole[i] += 1
    return [b + w for b, w in zip(base, whole)]



@dataclass
class PartTimer:
    """t(n): a part's estimate for n samples, cached per (pool, layout, n) for one problem."""

    ctx: PriceContext
    role: str
    _cache: dict[tuple[str, Parallel, int], Estimate | None]

    @classmethod
    def of(cls, ctx: PriceContext, role: str) -> PartTimer:
        return cls(ctx, role, {})

    def __call__(self, single: Estimate, n: int) -> Estimate | None:
        key = (single.pool, single.par, n)
        if key not in self._cache:
            part = self.ctx.with_samples(n)
            est = estimate(part, self.role, part.res.cluster.pool(single.pool), single.par)
            self._cache[key] = est if est.feasible else None
        return self._cache[key]


def _time(e: Estimate | None) -> float:
    return math.inf if e is None else e.time_s


def balance(a: Estimate, b: Estimate, total: int, group: int,
            timer: Callable[[Estimate, int], Estimate | None]) -> tuple[int, float] | None:
    """(samples on part a, the slower part's time) at the balance point; None when a part would
    get fewer samples than it has replicas (it is then no better than the other pool alone)."""
    groups = total // group
    lo_g, hi_g = _min_groups(a, group), groups - _min_groups(b, group)
    if lo_g > hi_g:
        return None

    def worse(g: int) -> float:
        return max(_time(timer(a, g * group)), _time(timer(b, total - g * group)))

    lo, hi = lo_g, hi_g  # smallest g with t_a(g) >= t_b(total - g): the crossing
    while lo < hi:
        mid = (lo + hi) // 2
        if _time(timer(a, mid * group)) >= _time(timer(b, total - mid * group)):
            hi = mid
        else:
            lo = mid + 1
    best = min((g for g in (lo - 1, lo) if lo_g <= g <= hi_g), key=worse)
    t = worse(best)
    return (best * group, t) if math.isfinite(t) else None


def _min_groups(e: Estimate, group: int) -> int:
    """Groups a part needs so that every one of its replicas has work."""
    return max(math.ceil(_replicas(e) / group), 1)


def _replicas(e: Estimate) -> int:
    return max(e.par.dp, 1)


def join(parts: list[Part]) -> Estimate:
    """The split role's estimate: the slower part's stages, the parts' devices and memory."""
    first = parts[0].est
    slow = max(parts, key=lambda p: p.est.time_s).est
    mem = max((p.est.memory for p in parts), key=lambda m: m.total)
    return Estimate(first.role, "+".join(p.est.pool for p in parts), first.par, mem,
                    dict(slow.stage_s), concurrency=first.concurrency, parts=tuple(parts))


def thin(ests: list[Estimate], per_node: int, k: int = PART_CHOICES) -> list[Estimate]:
    """At most k estimates, the counts other roles leave free most often first: the whole pool,
    whole nodes (spread over the range), then halves, quarters, ... of a node."""
    ests = sorted(ests, key=lambda e: e.devices)
    if len(ests) <= k:
        return ests
    nodes = [e for e in ests[:-1] if e.devices % per_node == 0]
    pick = [ests[-1]] + [nodes[round(j * (len(nodes) - 1) / max(k - 2, 1))]
                         for j in range(min(k - 1, len(nodes)))]
    size = per_node // 2
    while len({id(e) for e in pick}) < k and size >= 1:
        pick += [e for e in ests if e.devices == size]
        size //= 2
    kept = {id(e): e for e in pick}
    return sorted(kept.values(), key=lambda e: e.devices)[:k]


def split_estimates(ctx: PriceContext, role: str,
                    singles: dict[str, list[Estimate]], keep: SplitKeep | None = None
                    ) -> list[Estimate]:
    """Split estimates of `role` over every pair of pools.

    `singles`: pool -> the role's single-pool estimates there (already pruned). CPU pools are
    left out: a CPU engine next to accelerators only adds a long tail. Every pair of parts is
    balanced first on the job at its means (`rollout_tail.at_means`: lockstep waves, cheap); per
    pair of pools the Pareto set of (devices on a, devices on b, time) is thinned to
    `PAIR_CHOICES`; those are priced on the job itself (the tail-aware makespan) and their split
    corrected once in proportion to the parts' measured rates, keeping the better of the two.
    `keep` skips the refinement of a pair whose first tail-aware point already shows it cannot
    beat a known plan (`_refined`)."""
    if role not in SPLITTABLE:
        return []
    res = ctx.res
    total, group = res.job.batch.samples, res.job.batch.samples_per_prompt
    usable = {p: thin(es, res.cluster.pool(p).devices_per_node) for p, es in singles.items()
              if es and res.device_of(p).kind is not DeviceKind.cpu}
    exact = PartTimer.of(ctx, role)
    tails = has_variance(res.job)
    rough = PartTimer.of(ctx.with_res(replace(res, job=at_means(res.job))), role) if tails else exact
    out = []
    for pa, pb in combinations(sorted(usable), 2):
        options = []
        for a in usable[pa]:
            for b in usable[pb]:
                found = balance(a, b, total, group, rough)
                if found is not None:
                    options.append((a, b, *found))
        for a, b, n, _ in _pareto(options, PAIR_CHOICES):
            parts = (_refined(a, b, n, total, group, exact, keep) if tails
                     else _parts(a, b, n, total, exact))
            if parts is not None:
                out.append(join(parts))
    return out


def _parts(a: Estimate, b: Estimate, n: int, total: int,
           timer: Callable[[Estimate, int], Estimate | None]) -> list[Part] | None:
    ea, eb = timer(a, n), timer(b, total - n)
    return None if ea is None or eb is None else [Part(ea, n), Part(eb, total - n)]


def _refined(a: Estimate, b: Estimate, n: int, total: int, group: int,
             timer: Callable[[Estimate, int], Estimate | None], keep: SplitKeep | None = None,
             steps: int = 4) -> list[Part] | None:
    """The balance on the tail model, from the guess n: a rate-proportional step, then secant
    steps on t_a(n) - t_b(N - n) (the tail adds a near-constant term that the means miss, so
    the guess can be far off but the difference stays smooth); the best split seen.

    None without refining when `keep` rules the pair out at the guess: t_a grows and t_b
    shrinks with n (more samples on a part never end it sooner), so every split of the pair
    lasts at least min(t_a, t_b) at any one point; most pairs of a large cluster that balance
    at few devices are far slower than the heuristic plan, and this saves their secant steps."""
    lo, hi = _min_groups(a, group), total // group - _min_groups(b, group)
    seen: dict[int, tuple[float, float, list[Part]]] = {}

    def at(g: int) -> tuple[float, float, list[Part]] | None:
        if g not in seen:
            parts = _parts(a, b, g * group, total, timer)
            if parts is None:
                return None
            ta, tb = parts[0].est.time_s, parts[1].est.time_s
            seen[g] = (max(ta, tb), ta - tb, parts)
        return seen[g]

    g0 = min(max(n // group, lo), hi)
    first = at(g0)
    if first is None:
        return None
    ta, tb = first[2][0].est.time_s, first[2][1].est.time_s
    if keep is not None and not keep({a.pool: a.devices, b.pool: b.devices}, min(ta, tb)):
        return None
    rate_a, rate_b = g0 / ta, (total // group - g0) / tb
    g1 = min(max(round(total // group * rate_a / (rate_a + rate_b)), lo), hi)
    for _ in range(steps):
        cur = at(g1)
        if cur is None or g1 == g0:
            break
        d0, d1 = seen[g0][1], cur[1]
        if d1 == d0:
            break
        g0, g1 = g1, min(max(round(g1 - d1 * (g1 - g0) / (d1 - d0)), lo), hi)
    return min(seen.values(), key=lambda v: v[0])[2]


def _pareto(options: list[tuple[Estimate, Estimate, int, float]], k: int
            ) -> list[tuple[Estimate, Estimate, int, float]]:
    """Options no other beats on devices of each pool and time, thinned to k over total devices."""
    front = [o for o in options
             if not any(q is not o and q[0].devices <= o[0].devices
                        and q[1].devices <= o[1].devices and q[3] <= o[3]
                        and (q[0].devices, q[1].devices, q[3]) != (o[0].devices, o[1].devices, o[3])
                        for q in options)]
    front.sort(key=lambda o: (o[0].devices + o[1].devices, o[3]))
    if len(front) <= k:
        return front
    return [front[i] for i in sorted({round(j * (len(front) - 1) / (k - 1)) for j in range(k)})]
