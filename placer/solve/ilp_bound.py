"""Bounds for the placement ILP: pricing a placement, a feasible heuristic plan, and pruning.

`score` prices a placement exactly as `assemble` does (`timing.iteration_time`); `heuristic` gives
a plan that always fits the pools, whose time (or cost per sample) bounds the optimum from above
when it also keeps to the model's host-memory rule (`problem.host_fits`; else nothing is pruned). Two
consumers use that bound:
  * `prune_by_bound` drops candidates that cannot be in a plan better than it before the CP-SAT
    model is built (`placer.solve.ilp_solve`);
  * `split_keep` tells `placer.cost.split` which split candidates are worth pricing at all: a split's
    tail-aware balance costs several rollout replays, and on large heterogeneous clusters most
    pool pairs' cheapest balances are far slower than the heuristic plan (`bench.bench_solver`).
Both rules rest on one fact of `timing.iteration_time`, in both pipeline modes: the iteration
lasts at least as long as any chosen role's own time (not the rollout's when its tool term may
be negative: `_tool_may_lower`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from placer.base.roles import Role
from placer.cost.roleestimate import Estimate
from placer.cost.rolloutcost import generated_samples
from placer.cost.split import SplitKeep
from placer.cost.timing import Placed
from placer.solve.candidates import Candidate
from placer.solve.pricing import device_price, slots_price
from placer.solve.problem import Assignment, Problem, host_fits, slot_names
from placer.spec.job import Job


def score(problem: Problem, a: Assignment) -> tuple[float, float]:
    """(iteration seconds, USD per sample) of a placement, priced exactly as `assemble` does."""
    bd = problem.px.iteration_time(a.placed())
    return bd.iteration_s, rate_per_hour(problem, a) / 3600 * bd.iteration_s / problem.res.job.batch.samples


def rate_per_hour(problem: Problem, a: Assignment, units: bool = False) -> float:
    """What a placement's devices cost per hour: each slot holds its largest role's devices
    (colocated roles time-share them). USD, or (`units`) milli-dollars as the model counts."""
    slots: dict[tuple[str, str], int] = {}
    for r, c in a.choice.items():
        for pool, n in c.pool_devices().items():
            key = (a.slot_of[r], pool)
            slots[key] = max(slots.get(key, 0), n)
    return slots_price(problem.res, ((pool, n) for (_, pool), n in slots.items()), units)


def heuristic(problem: Problem) -> Assignment:
    """A plan that always fits: each role's best candidate, all roles of a pool in one slot,
    then roles moved to their best candidate on other pools while that helps (`_descend_pools`).

    One slot per pool holds max(n_k) <= cap_p devices, so this is feasible whenever every role has
    a candidate; its time bounds the optimum and prunes candidates.
    """
    best: Assignment | None = None
    best_val = float("inf")
    pick: dict[str, Callable[[Candidate], float]] = {
        "time": lambda c: c.time_s, "cost": lambda c: candidate_price(problem, c) * c.time_s}
    for key in (pick["time"], pick["cost"]):
        # split candidates are left out: one slot per pool must hold every chosen role
        choice = {r: min(_singles(problem.cands[r]), key=lambda c: (key(c), c.devices))
                  for r in problem.roles}
        a, val = _descend_pools(problem, choice, key)
        if val < best_val:
            best, best_val = a, val
    assert best is not None
    return best


def _pooled(problem: Problem, choice: dict[str, Candidate]) -> Assignment:
    """All roles of a pool in one slot: feasible for any choice of single-pool candidates."""
    by_pool: dict[str, list[str]] = {}
    for r in problem.roles:
        by_pool.setdefault(choice[r].pool, []).append(r)
    return Assignment(dict(choice), slot_names(list(by_pool.values())))


def _descend_pools(problem: Problem, choice: dict[str, Candidate],
                   key: Callable[[Candidate], float]) -> tuple[Assignment, float]:
    """Greedy moves from `choice`: a role to its best candidate (by `key`) on another pool while
    the pooled plan's objective improves. Every plan tried is feasible (`_pooled`), so the result
    still bounds the optimum; it is tighter where the fastest candidates all crowd one pool
    (their times add in its one slot) and `prune_by_bound` then drops far more candidates."""
    obj = 0 if problem.objective == "time" else 1
    per_pool: dict[str, dict[str, Candidate]] = {}
    for r in problem.roles:
        per_pool[r] = {}
        for c in _singles(problem.cands[r]):
            cur = per_pool[r].get(c.pool)
            if cur is None or (key(c), c.devices) < (key(cur), cur.devices):
                per_pool[r][c.pool] = c
    a = _pooled(problem, choice)
    val = score(problem, a)[obj]
    improved = True
    while improved:  # each accepted move lowers `val` strictly: it ends
        improved = False
        for r in problem.roles:
            for c in per_pool[r].values():
                if c is a.choice[r]:
                    continue
                b = _pooled(problem, {**a.choice, r: c})
                v = score(problem, b)[obj]
                if v < val * (1 - 1e-9):
                    a, val, improved = b, v, True
    return a, val


def _singles(cands: list[Candidate]) -> list[Candidate]:
    return [c for c in cands if not c.split] or cands


def candidate_price(problem: Problem, c: Candidate, units: bool = False) -> float:
    return sum(device_price(problem.res, pool, units) * n for pool, n in c.pool_devices().items())


def prune_by_bound(problem: Problem, ub_time: float, ub_cost: float) -> Problem:
    """Drop candidates that cannot be in any plan better than the bound.

    Time: T >= a role's own time in both modes. Cost: rate >= price * n_k and T >= t_k.
    Not the rollout's where its tool term may be negative (`_tool_may_lower`).
    """
    samples = problem.res.job.batch.samples
    eps = 1e-9
    keep = {}
    floor = _stage_floors(problem)
    sync = sync_floor(problem)
    for r, cs in problem.cands.items():
        if r == Role.ROLLOUT and _tool_may_lower(problem):
            kept = cs  # its slot's rollout stage may end before its own time: no bound by it
        elif problem.objective == "time":
            kept = [c for c in cs
                    if _time_floor(problem, r, c, floor, sync) <= ub_time * (1 + eps)]
        else:
            kept = [c for c in cs if candidate_price(problem, c) / 3600 * c.time_s / samples
                    <= ub_cost * (1 + eps)]
        keep[r] = kept or cs
    return replace(problem, cands=keep)


def time_floor(problem: Problem) -> float:
    """A lower bound on T of every plan of the problem: each role runs one of its candidates,
    so T >= max over roles of the least `_time_floor` of its candidates (0 from the rollout
    where its tool term may be negative). What an out-of-time solve reports as its bound."""
    floor = _stage_floors(problem)
    sync = sync_floor(problem)
    least = [min((_time_floor(problem, r, c, floor, sync) for c in cs), default=0.0)
             for r, cs in problem.cands.items()
             if not (r == Role.ROLLOUT and _tool_may_lower(problem))]
    return max(least, default=0.0)


def _stage_floors(problem: Problem) -> dict[str, dict[str, float]]:
    """Per role and stage, the least time any of its candidates spends in that stage (0 for the
    rollout where its tool term may be negative: its slot's stage may end sooner)."""
    low = _tool_may_lower(problem)
    out: dict[str, dict[str, float]] = {}
    for r, cs in problem.cands.items():
        stages = {st for c in cs for st in c.est.stage_s}
        out[r] = {st: 0.0 if low and r == Role.ROLLOUT else
                  min(c.est.stage_s.get(st, 0.0) for c in cs) for st in stages}
    return out


def _time_floor(problem: Problem, role: str, c: Candidate, floor: dict[str, dict[str, float]],
                sync: Callable[[Estimate], float] | None = None) -> float:
    """A lower bound on T of any plan where `role` runs candidate `c`: its own time (any mode),
    plus for a split rollout its least weight sync (`sync_floor`: it sits alone in its slot);
    in sync mode the stages run in sequence and each lasts at least its longest role's time in
    it (`timing.iteration_time`), so T >= sum over stages of max(c's, the other roles' least);
    async, a step's chain of those stages spans at most s + 1 iterations
    (`PipelineMode.chain_bound_s`)."""
    stages = set(c.est.stage_s).union(*(f for r, f in floor.items() if r != role))
    apart = c.est.parts[1:] if c.colocated else c.est.parts  # a mixed part may sync locally
    y = (max((sync(p.est) for p in apart), default=0.0)
         if sync is not None and role == Role.ROLLOUT and c.split else 0.0)
    chain = y + sum(max([c.est.stage_s.get(st, 0.0)]
                        + [f.get(st, 0.0) for r, f in floor.items() if r != role]) for st in stages)
    return max(c.time_s + y, problem.res.job.pipeline.mechanism.chain_bound_s(chain))


def _tool_may_lower(problem: Problem) -> bool:
    return tool_may_lower(problem.res.job)


def tool_may_lower(job: Job) -> bool:
    """Whether the rollout's tool-queue term may be negative (`timing.rollout_tool_time`: an
    over-provisioned multi-turn rollout can reach its kept count sooner on a shared pool), so
    that T >= the rollout candidate's own time no longer holds."""
    env = job.environment
    return (env.kind != "none" and env.turns > 1
            and generated_samples(job) > job.batch.samples)


def split_keep(problem: Problem, slack_s: float = 0.0) -> Callable[[str], SplitKeep]:
    """Role -> `SplitKeep` for its candidates against the heuristic plan of `problem` (its cost
    table without splits suffices: `heuristic` leaves them out; priced once, on first use).

    A split sits alone in its slot, so every other role runs on the devices it leaves free: of
    each other role only the candidates that fit there count (`_left_floors`; none: no plan).
    Any plan with the split then has T >= its time plus its weight sync (`sync_floor`), T >=
    each other role's least time there, and, in either mode, T >= `chain_bound_s` of the split's
    time and sync plus the other roles' least time in the stages it has none of (as
    `_time_floor`); priced, a rate of at least its devices' price. The split is kept unless
    that lower bound on T rules it out (by more than `slack_s` on time: a re-plan's move
    costs). A mixed rollout (its part on the `shared` pool time-sharing a slot there,
    `placer.cost.split.colocated`) holds only its other parts' devices alone, and only their
    sync is bounded (the shared part may take its weights locally)."""
    bound: list[tuple[float, float]] = []  # the heuristic plan's (seconds, USD per sample)
    samples, eps = problem.res.job.batch.samples, 1e-9
    chain_bound = problem.res.job.pipeline.mechanism.chain_bound_s
    sync = sync_floor(problem)

    def ub() -> tuple[float, float]:
        if not bound:  # a plan over host memory bounds nothing
            h = heuristic(problem)
            bound.append(score(problem, h) if host_fits(problem, h) else (math.inf, math.inf))
        return bound[0]

    def time_floor(role: str) -> Callable[[tuple[Estimate, ...], float, str | None], float]:
        left = _left_floors(problem, role)
        # (parts' ids, shared) -> (parts, what of the bound does not depend on the time): a
        # split's pricing asks for one pair at many times; the parts are kept, so no id is reused
        seen: dict[tuple[object, ...], tuple[tuple[Estimate, ...],
                                             tuple[float, float, float] | None]] = {}

        def fixed(parts: tuple[Estimate, ...], shared: str | None
                  ) -> tuple[float, float, float] | None:
            """(sync floor, the other roles' stage floor, their slowest), None: they do not
            fit beside it."""
            key = (*map(id, parts), shared)
            hit = seen.get(key)
            if hit is not None and all(x is y for x, y in zip(hit[0], parts)):
                return hit[1]
            alone = tuple(p for p in parts if p.pool != shared)
            others = left(tuple((p.pool, p.devices) for p in alone))
            got = None
            if others is not None:
                y = max((sync(p) for p in alone), default=0.0) if role == Role.ROLLOUT else 0.0
                got = (y, *others)
            seen[key] = (parts, got)
            return got

        def low(parts: tuple[Estimate, ...], t_low: float, shared: str | None) -> float:
            got = fixed(parts, shared)
            if got is None:
                return math.inf  # the other roles do not fit beside it
            y, rest, slowest = got
            t = t_low + y
            return max(t, slowest, chain_bound(t + rest))
        return low

    def for_role(role: str) -> SplitKeep:
        if role == Role.ROLLOUT and _tool_may_lower(problem):
            return lambda _parts, _t_low, _shared: True
        low = time_floor(role)
        if problem.objective == "time":
            return lambda parts, t_low, shared: (low(parts, t_low, shared)
                                                 <= (ub()[0] + slack_s) * (1 + eps))

        def cheap_enough(parts: tuple[Estimate, ...], t_low: float, shared: str | None) -> bool:
            price = sum(device_price(problem.res, p.pool, False) * p.devices for p in parts)
            return price / 3600 * low(parts, t_low, shared) / samples <= ub()[1] * (1 + eps)
        return cheap_enough
    return for_role


def _left_floors(problem: Problem, role: str
                 ) -> Callable[[tuple[tuple[str, int], ...]], tuple[float, float] | None]:
    """(pool, devices) held by a split of `role` -> (the sum over the stages `role` has none of
    of the other roles' least time in each, the largest of the other roles' least own time),
    counting only candidates that fit on the devices the split leaves free; None when some
    other role has none that does. Cached per holding; each other role's candidates are one
    `_FitTable` (a split's pricing asks this for hundreds of holdings)."""
    cap = problem.capacity()
    own = {st for c in problem.cands.get(role, []) for st in c.est.stage_s}
    others = [cs for r, cs in problem.cands.items() if r != role]
    pools = sorted({*cap, *(p for cs in others for c in cs for p in c.pool_devices())})
    col = {p: i for i, p in enumerate(pools)}
    base = np.array([cap.get(p, 0) for p in pools], dtype=np.int64)
    tables = [_FitTable.of(cs, col, own) for cs in others]
    seen: dict[tuple[tuple[str, int], ...], tuple[float, float] | None] = {}

    def of(held: tuple[tuple[str, int], ...]) -> tuple[float, float] | None:
        if held not in seen:
            free = base.copy()
            for pool, n in held:
                if pool in col:  # else no other role's candidate holds that pool
                    free[col[pool]] -= n
            seen[held] = _floors(tables, free)
        return seen[held]
    return of


@dataclass(frozen=True)
class _FitTable:
    """One role's candidates as arrays: devices per pool (a row per candidate; `uses`, which
    pools it holds at all), own time, and time in each stage of `stages` (0 where a candidate
    has none of that stage)."""

    needs: np.ndarray
    uses: np.ndarray
    times: np.ndarray
    stages: tuple[str, ...]
    stage_s: np.ndarray

    @classmethod
    def of(cls, cands: list[Candidate], col: dict[str, int], own: set[str]) -> _FitTable:
        stages = tuple(sorted({st for c in cands for st in c.est.stage_s} - own))
        needs = np.zeros((len(cands), len(col)), dtype=np.int64)
        uses = np.zeros((len(cands), len(col)), dtype=bool)
        for i, c in enumerate(cands):
            for p, n in c.pool_devices().items():
                needs[i, col[p]], uses[i, col[p]] = n, True
        times = np.array([c.time_s for c in cands], dtype=float)
        stage_s = np.array([[c.est.stage_s.get(st, 0.0) for st in stages] for c in cands],
                           dtype=float).reshape(len(cands), len(stages))
        return cls(needs, uses, times, stages, stage_s)


def _floors(tables: list[_FitTable], free: np.ndarray) -> tuple[float, float] | None:
    """`_left_floors`'s value on `free` devices per pool. A stage of the union that no fitting
    candidate has counts 0 there, as the sum over the fitting candidates' own stages would."""
    stage: dict[str, float] = {}
    slowest = 0.0
    for t in tables:
        fit = ((t.needs <= free) | ~t.uses).all(axis=1)  # a pool it does not hold: any
        if not fit.any():
            return None
        slowest = max(slowest, float(t.times[fit].min()))
        if t.stages:
            for st, v in zip(t.stages, t.stage_s[fit].min(axis=0)):
                stage[st] = max(stage.get(st, 0.0), float(v))
    return sum(stage.values()), slowest


def sync_floor(problem: Problem) -> Callable[[Estimate], float]:
    """The least weight sync to a rollout part on its own slot (a split sits alone), over every
    actor candidate: a split's sync is its slowest part's (`timing.sync_time`), and a part's
    depends on its pool and layout only, so the max over its parts bounds the split's from
    below. Cached per (pool, layout); 0 without an actor."""
    actors = problem.cands.get(Role.ACTOR, [])
    seen: dict[tuple[str, object], float] = {}

    def of(part: Estimate) -> float:
        key = (part.pool, part.par)
        if key not in seen:
            seen[key] = min((problem.px.sync_time(Placed("a", a.est), Placed("r", part))
                             for a in actors), default=0.0)
        return seen[key]
    return of
