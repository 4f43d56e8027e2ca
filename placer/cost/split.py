"""Roles split over pools: rollout engines on several device types, each part with its own layout
and its own share of the samples.

On a heterogeneous cluster the fastest plan often serves generation from more than one pool (the
training GPUs keep the actor, the samples go to H20 and L40S engines: StreamRL, AReaL-Hex and
Helix report their wins from this). A split candidate joins two single-pool candidates of the
rollout role and divides the batch so that both parts finish together: the group-aligned count n
on part a minimising max(t_a(n), t_b(N - n)), found by bisection, each part priced by
`placer.cost.estimate.estimate` with the tail model. GRPO groups stay whole on one part.

The step ends when its slowest part ends, and its longest sample, the longest of the step's N
draws, may land on either part: so each part's busiest replica is priced holding that sample
(`PriceContext.with_samples` keeps the step's draws), as one pool's busiest replica is. A part
priced on its own n draws would end sooner, and max over parts of those expectations is below
the step's expected end (E max >= max E): two halves of a pool were priced faster than the
pool. With the step's draws, two identical pools split at any share cost no less than the
merged pool (some part's busiest replica holds at least as many samples as the merged pool's).

Which pairs: every two accelerator pools that can host the role, and on each every layout (so
every device count) the role has there alone, after dominance pruning. No pair is left out
unpriced unless a bound shows it cannot be in a plan better than a known one (`SplitKeep`, from
`placer.solve.ilp_bound.split_keep`): a part's time grows with its samples, so each part can run
at most so many groups within the time a better plan allows, and a pair whose two parts cannot
cover the batch between them is pruned (`split_estimates`). The rest are balanced, priced with
the tail model, and those another split of the same pools beats on devices and every stage are
dropped; `SplitSpace` counts each. How slots, weight sync and tool calls treat a split role:
docs/cost-model.md, "How roles combine into one iteration".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import combinations

from placer.base.roles import Role
from placer.cost.context import PriceContext
from placer.cost.estimate import estimate
from placer.cost.roleestimate import Estimate, Part
from placer.cost.sharding import Parallel
from placer.cost.tail_samples import at_means, has_variance
from placer.spec.hardware import DeviceKind

SPLITTABLE = (Role.ROLLOUT,)

# Whether a split candidate of these parts (their single-pool estimates: pool, layout, devices),
# whose time is at least this many seconds, may be in a plan better than a known one
# (`placer.solve.ilp_bound.split_keep`); it must be monotone: false at t, false at every t' > t.
# The third argument names the pool of the part that time-shares a slot (a mixed rollout,
# `colocated`), None for a split alone in its slot.
SplitKeep = Callable[[tuple[Estimate, ...], float, str | None], bool]


def kept_as(keep: SplitKeep | None, parts: tuple[Estimate, ...], t: float,
            shared: frozenset[str]) -> list[str | None]:
    """How a split of `parts` lasting `t` may be in a better plan: alone (None) and/or with its
    part on each pool of `shared` time-sharing a slot there."""
    ways: list[str | None] = [None, *sorted(p.pool for p in parts if p.pool in shared)]
    return ways if keep is None else [w for w in ways if keep(parts, t, w)]


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
    """t(n): a part's estimate for n samples, cached per (pool, layout, n) for one problem and
    kept on the layout's `StepTerms` (`part`) by what determines it: the job as a value less
    its name and cluster (model, lengths, batch, environment, tail policy, profile), the step's
    draws, the role, the pool's name and device, the layout and n. A rollout part reads
    nothing of the cluster but its pool's device, so the plans of one job on many allocations
    (a fleet's search), and of jobs that differ only in name, share these prices."""

    ctx: PriceContext
    role: str
    _cache: dict[tuple[str, Parallel, int], Estimate | None]
    _job: str = ""  # the job's value key (`of`)

    @classmethod
    def of(cls, ctx: PriceContext, role: str) -> PartTimer:
        job = ctx.res.job.model_dump_json(exclude={"name", "cluster"})
        return cls(ctx, role, {}, job)

    def __call__(self, single: Estimate, n: int) -> Estimate | None:
        key = (single.pool, single.par, n)
        if key not in self._cache:
            res = self.ctx.res
            dev = res.device_of(single.pool)
            st = self.ctx.step_terms(res.arch_of(self.role), dev, single.par, self.ctx.eff(dev))
            shared = (self._job, self.ctx.step_draws, self.role, single.pool, dev, single.par, n)
            got = st.part(shared, lambda: self._priced(single, n))
            assert got is None or isinstance(got, Estimate)
            self._cache[key] = got
        return self._cache[key]

    def _priced(self, single: Estimate, n: int) -> Estimate | None:
        part = self.ctx.with_samples(n)
        est = estimate(part, self.role, part.res.cluster.pool(single.pool), single.par)
        return est if est.feasible else None


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


def join(parts: list[Part], shared: bool = False) -> Estimate:
    """The split role's estimate: the slower part's stages, the parts' devices and memory (the
    neediest part's; `shared`: the first part's, the one that time-shares a slot)."""
    first = parts[0].est
    slow = max(parts, key=lambda p: p.est.time_s).est
    mem = first.memory if shared else max((p.est.memory for p in parts), key=lambda m: m.total)
    return Estimate(first.role, "+".join(p.est.pool for p in parts), first.par, mem,
                    dict(slow.stage_s), concurrency=first.concurrency, parts=tuple(parts))


def colocated(split: Estimate, pool: str) -> Estimate:
    """A mixed rollout: `split` with its part on `pool` time-sharing a slot with the roles there
    (the actor's phases, in sync mode) while its other part runs on its own pool alongside. The
    part on `pool` comes first (its layout is the role's, its pool the slot's) and its memory
    is the role's, what the slot must hold beside its other members or switch (`timing`)."""
    home = next(p for p in split.parts if p.est.pool == pool)
    return join([home, *[p for p in split.parts if p is not home]], shared=True)


def home_pool(est: Estimate) -> str:
    """The pool an estimate occupies in its slot: its own, or a split's first part's."""
    return est.parts[0].est.pool if est.parts else est.pool


@dataclass
class SplitSpace:
    """What `split_estimates` searched: layout pairs over every pair of pools (`pairs`), those
    the bound showed cannot be in a better plan (`pruned_by_bound`), those another priced split
    of the same pools beats on devices and time (`dominated`), and the candidates kept."""

    pairs: int = 0
    pruned_by_bound: int = 0
    dominated: int = 0
    kept: int = 0

    def add(self, other: SplitSpace) -> None:
        self.pairs += other.pairs
        self.pruned_by_bound += other.pruned_by_bound
        self.dominated += other.dominated
        self.kept += other.kept


def _cap(e: Estimate, pair: tuple[Estimate, Estimate], total: int, group: int,
         timer: Callable[[Estimate, int], Estimate | None],
         keep: Callable[[tuple[Estimate, ...], float], bool] | None) -> int:
    """Most groups part `e` can run (at least `_min_groups`; 0 when even those cannot) and
    still end in a time `keep` accepts for a split of `pair`: its time grows with its
    samples, so a doubling search then bisection on the tail-aware timer (cached per count)."""
    groups, lo = total // group, _min_groups(e, group)

    def fits(g: int) -> bool:
        t = _time(timer(e, g * group))
        return math.isfinite(t) and (keep is None or keep(pair, t))

    if lo > groups or not fits(lo):
        return 0
    if keep is None or fits(groups):
        return groups
    good, step = lo, 1
    while good + step <= groups and fits(good + step):
        good, step = good + step, step * 2
    bad = min(good + step, groups + 1)  # fits(good), not fits(bad) (groups + 1: past the end)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def split_estimates(ctx: PriceContext, role: str, singles: dict[str, list[Estimate]],
                    keep: SplitKeep | None = None, space: SplitSpace | None = None,
                    shared: frozenset[str] = frozenset()) -> list[Estimate]:
    """Split estimates of `role` over every pair of pools, each part at every layout (device
    count) it has alone.

    `singles`: pool -> the role's single-pool estimates there (already pruned). CPU pools are
    left out: a CPU engine next to accelerators only adds a long tail. For every pair of parts:
      1. the bound (`keep`): each part's most groups within the time a better plan allows
         (`_cap`, tail-aware); a pair whose parts cannot cover the batch between them is
         pruned (every share leaves one part past that time);
      2. the balance there on the job at its means (`rollout_tail.at_means`: lockstep waves,
         cheap), then priced on the job itself (tail-aware) and corrected by secant steps
         (`_refined`), which also drops a pair that `keep` rules out at its first point;
      3. per pair of pools, a split that another beats on devices of each pool and on every
         stage is dropped (`prune_dominated`'s rule for single-pool candidates).
    `space` (when given) counts what was searched, pruned and kept. `shared`: pools where a
    part may time-share a slot (`colocated`): a pair is kept while it may be in a better plan
    either way (`kept_as`), and a split beats another only if its parts there also hold no
    more weights per device (what a shared slot switches)."""
    if role not in SPLITTABLE:
        return []
    res = ctx.res
    total, group = res.job.batch.samples, res.job.batch.samples_per_prompt
    usable = {p: sorted(es, key=lambda e: e.devices) for p, es in singles.items()
              if es and res.device_of(p).kind is not DeviceKind.cpu}
    exact = PartTimer.of(ctx, role)
    tails = has_variance(res.job)
    rough = PartTimer.of(ctx.with_res(replace(res, job=at_means(res.job))), role) if tails else exact
    seen = space if space is not None else SplitSpace()
    either = None if keep is None else _either(keep, shared)
    out: list[Estimate] = []
    for pa, pb in combinations(sorted(usable, key=lambda p: _pool_order(ctx, p)), 2):
        found = []
        for a in usable[pa]:
            for b in usable[pb]:
                seen.pairs += 1
                est = _pair(a, b, total, group, exact, rough, either, tails)
                if est is None:
                    seen.pruned_by_bound += 1
                else:
                    found.append(est)
        front = _undominated(found, shared)
        seen.dominated += len(found) - len(front)
        out += front
    seen.kept += len(out)
    return out


def _either(keep: SplitKeep, shared: frozenset[str]
            ) -> Callable[[tuple[Estimate, ...], float], bool]:
    """Whether a split may be in a better plan in any of the ways `kept_as` lists (monotone in
    the time, as each way is): the first way that keeps it answers."""
    def any_way(parts: tuple[Estimate, ...], t: float) -> bool:
        return keep(parts, t, None) or any(keep(parts, t, p) for p in
                                           sorted(p.pool for p in parts if p.pool in shared))
    return any_way


def _pool_order(ctx: PriceContext, pool: str) -> tuple[str, str]:
    """Pools by what they are, then by name: which part of a pair comes first (and so where the
    balance search starts) must not depend on what the pools are called."""
    return ctx.res.cluster.pool(pool).model_dump_json(exclude={"name"}), pool


def _pair(a: Estimate, b: Estimate, total: int, group: int,
          exact: Callable[[Estimate, int], Estimate | None],
          rough: Callable[[Estimate, int], Estimate | None],
          keep: Callable[[tuple[Estimate, ...], float], bool] | None, tails: bool
          ) -> Estimate | None:
    """The split of parts a and b, or None when the bound shows no split of them can be in a
    better plan (or a part cannot get a share of its own)."""
    if keep is not None and not keep((a, b), 0.0):
        return None  # ruled out whatever its time (the other roles do not fit beside it)
    groups = total // group
    cap_a = _cap(a, (a, b), total, group, exact, keep)
    cap_b = _cap(b, (a, b), total, group, exact, keep)
    lo = max(_min_groups(a, group), groups - cap_b)
    hi = min(cap_a, groups - _min_groups(b, group))
    if lo > hi or not cap_a or not cap_b:
        return None
    found = balance(a, b, total, group, rough)  # over every share: as an unbounded table
    if found is None:
        return None
    parts = (_refined(a, b, found[0], total, group, exact, keep) if tails
             else _parts(a, b, found[0], total, exact))
    return None if parts is None else join(parts)


def _parts(a: Estimate, b: Estimate, n: int, total: int,
           timer: Callable[[Estimate, int], Estimate | None]) -> list[Part] | None:
    ea, eb = timer(a, n), timer(b, total - n)
    return None if ea is None or eb is None else [Part(ea, n), Part(eb, total - n)]


def _refined(a: Estimate, b: Estimate, n: int, total: int, group: int,
             timer: Callable[[Estimate, int], Estimate | None],
             keep: Callable[[tuple[Estimate, ...], float], bool] | None = None,
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
    if keep is not None and not keep((a, b), min(ta, tb)):
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


def _undominated(splits: list[Estimate], shared: frozenset[str] = frozenset()
                 ) -> list[Estimate]:
    """Splits of one pair of pools that no other beats: none with no more devices on each pool
    and no more time in any stage (the first of equals kept). Safe for the ILP as
    `candidates.prune_dominated` is: a split sits alone in its slot, so its devices and stage
    times are all it brings to a plan besides its weight-sync and tool terms."""
    order = sorted(splits, key=lambda e: (sum(e.pool_devices().values()), e.time_s))
    kept: list[Estimate] = []
    for e in order:
        if not any(_beats(k, e, shared) for k in kept):
            kept.append(e)
    return kept


def _beats(a: Estimate, b: Estimate, shared: frozenset[str] = frozenset()) -> bool:
    da, db = a.pool_devices(), b.pool_devices()
    stages = set(a.stage_s) | set(b.stage_s)
    wa = {p.est.pool: p.est.memory.weights for p in a.parts if p.est.pool in shared}
    wb = {p.est.pool: p.est.memory.weights for p in b.parts if p.est.pool in shared}
    return (all(da.get(p, 0) <= n for p, n in db.items())
            and all(a.stage_s.get(s, 0.0) <= b.stage_s.get(s, 0.0) for s in stages)
            and all(w <= wb.get(p, w) for p, w in wa.items()))
