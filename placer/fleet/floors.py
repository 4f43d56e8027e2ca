"""A proven lower bound on a job's iteration time on an allocation no plan has been made on.

The fleet's search (`placer.fleet.alloc`) knows T_j(a) only where it planned job j on vector a;
elsewhere its bound was the time of an evaluated vector above a (more nodes never slow a job),
so a vector far below every evaluated one looked as fast as the largest: the fleet's bound was
little better than every job on its whole cap at once. This module bounds T_j(a) from the job's
single-pool cost table on its cap (`RoleTable`, priced once per kind with the grid,
`placer.fleet.workers.least_devices`), at no planning cost per vector.

Why the table on the cap serves every vector a below it. A layout of a role on a pool is priced
the same on any number of that pool's nodes that holds its devices (the cost model prices a
layout on its own devices), and dominance pruning on the cap keeps, for every candidate it
drops, one with no more devices and no more time in any stage. So every single-pool candidate
of the plan on `a` has one on the cap with no more devices of its pool (it fits `a`) and no
more time. The allocation grid already reads the table so (`JobPlanner.grid`).

The bound, over the candidates c of each role r that fit a (`floor`), combines what the job
planner's own bound uses (`placer.solve.ilp_bound.time_floor`) with the devices a holds:
  (1) T >= min_c t_c for each role: the role's slot is busy at least its time;
  (2) T >= chain_bound(sum over stages of max_r min_c t_c,stage): the stages of a step run in
      order (async: the chain spans at most s + 1 steps);
  (3) T >= sum_r min_c (d_c t_c) / D(a), D(a) the devices of a: slots hold disjoint devices,
      each busy at least the sum of its roles' times and at most T, and a role's devices are
      its slot's (`placer.cost.timing.iteration_time`).
A role that may split over two pools (the rollout, where the job's framework splits roles and
`a` holds two accelerator pools it can run on) may run faster than any single-pool candidate.
A split's parts are single-pool candidates that fit `a`, each holding its share of the batch
of N samples, and it lasts as long as its slower part (`placer.cost.split.join`); one part
holds at least ceil(N / 2) samples, and a part's time never falls with more samples (the rule
`split.split_estimates` prunes by). So the role lasts at least the least time of its fitting
candidates priced as a part of ceil(N / 2) samples (`Entry.half_s`, by the planner's own
`PartTimer`; a candidate alone runs all N, no faster), in (1) and, where its candidates have
one stage, in (2); it adds nothing to (3). A rollout whose tool-queue term may be negative
(`ilp_bound.tool_may_lower`) adds nothing anywhere, as in the planner's own bound.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from placer.base.roles import Role
from placer.cost.split import SPLITTABLE
from placer.solve.candidates import Candidate
from placer.solve.planfile import Plan
from placer.spec.job import Job


@dataclass(frozen=True)
class Entry:
    """One single-pool candidate: its devices per pool, its time, its time per stage, and the
    least time of a split part on its layout (`half_s`, module docstring; its time where it
    cannot be one)."""

    devices: tuple[tuple[str, int], ...]
    time_s: float
    stage_s: tuple[tuple[str, float], ...]
    half_s: float

    def fits(self, have: dict[str, int]) -> bool:
        return all(n <= have.get(p, 0) for p, n in self.devices)

    @property
    def work(self) -> float:
        """Device-seconds: its devices busy for its time."""
        return sum(n for _, n in self.devices) * self.time_s


@dataclass(frozen=True)
class RoleTable:
    """Per role (in the job's order), its single-pool candidates on the cap; `splits`: the
    roles that may split over two accelerator pools (CPU pools take no split part,
    `placer.cost.split.split_estimates`; `cpu`: those pools); `loose`: those whose time bounds
    nothing (a rollout whose tool term may be negative)."""

    roles: tuple[tuple[str, tuple[Entry, ...]], ...]
    splits: frozenset[str]
    loose: frozenset[str]
    cpu: frozenset[str]

    def devices(self) -> list[list[dict[str, int]]]:
        """Per role, each candidate's devices per pool (what the grid is cut by)."""
        return [[dict(e.devices) for e in es] for _, es in self.roles]


def role_table(cands: dict[str, list[Candidate]], splits_roles: bool, tool_lower: bool,
               cpu: frozenset[str], part: Callable[[Candidate], float]) -> RoleTable:
    """A job's `RoleTable` from its single-pool candidates (role -> candidates); `splits_roles`:
    its framework splits a role over pools; `tool_lower`: its rollout's tool term may be
    negative; `cpu`: the cluster's CPU pools; `part(c)`: a split role's accelerator candidate
    priced as a split part holding half the batch (0 where that part does not fit)."""
    splits = frozenset(r for r in cands if splits_roles and r in SPLITTABLE)
    roles = tuple((r, tuple(Entry(tuple(sorted(c.pool_devices().items())), c.time_s,
                                      tuple(sorted(c.est.stage_s.items())),
                                      part(c) if r in splits and c.pool not in cpu
                                      else c.time_s) for c in cs))
                  for r, cs in cands.items())
    loose = frozenset({Role.ROLLOUT.value} if tool_lower else ())
    return RoleTable(roles, splits, loose, cpu)


def floor(table: RoleTable, job: Job, have: dict[str, int], per_node: dict[str, int]
          ) -> float | None:
    """A lower bound on the job's iteration time on `have` nodes per pool (module docstring);
    None: some role has no candidate that fits, so no plan exists there."""
    devices = {p: n * per_node[p] for p, n in have.items()}
    own = work = 0.0
    stages: dict[str, float] = {}
    for r, index in _indexed(table):
        least = index.least(devices)
        if least is None:
            return None
        if r in table.loose:
            continue
        if r in table.splits and least.pools > 1:  # a split may run: its larger part's least
            own = max(own, least.half_s)
            if len(least.stage_s) == 1:  # a split's one stage: its slower part's time
                st = next(iter(least.stage_s))
                stages[st] = max(stages.get(st, 0.0), least.half_s)
            continue
        own, work = max(own, least.time_s), work + least.work
        for st, t in least.stage_s.items():
            stages[st] = max(stages.get(st, 0.0), t)
    chain = job.pipeline.mechanism.chain_bound_s(sum(stages.values()))
    total = sum(devices.values())
    return max(own, chain, work / total if total else 0.0)


@dataclass(frozen=True)
class _Least:
    """Of one role's candidates that fit: the least time, device-seconds, time per stage (0
    where some candidate spends none) and split-part time, and how many accelerator pools they
    run on."""

    time_s: float
    work: float
    stage_s: dict[str, float]
    half_s: float
    pools: int


@dataclass
class _RoleIndex:
    """One role's candidates by pool and device count, with prefix minima, so that `least` on
    a vector is a bisection per pool (the search asks it for every vector of every grid)."""

    stages: tuple[str, ...]
    counts: dict[str, list[int]]  # pool -> device counts, ascending
    best: dict[str, list[_Row]]  # pool -> prefix minima
    multi: list[Entry]  # candidates over several pools (looked at one by one)
    cpu: frozenset[str]

    @classmethod
    def of(cls, entries: tuple[Entry, ...], cpu: frozenset[str]) -> _RoleIndex:
        stages = tuple(sorted({st for e in entries for st, _ in e.stage_s}))
        single = sorted(((e.devices[0][0], e.devices[0][1], e) for e in entries
                         if len(e.devices) == 1), key=lambda x: (x[0], x[1]))
        counts: dict[str, list[int]] = {}
        best: dict[str, list[_Row]] = {}
        for pool, n, e in single:
            row = _row(e, stages)
            prev = best.get(pool)
            if prev:
                t, w, h, st = prev[-1]
                row = (min(t, row[0]), min(w, row[1]), min(h, row[2]),
                       tuple(map(min, st, row[3])))
            counts.setdefault(pool, []).append(n)
            best.setdefault(pool, []).append(row)
        return cls(stages, counts, best, [e for e in entries if len(e.devices) != 1], cpu)

    def least(self, devices: dict[str, int]) -> _Least | None:
        rows = []
        pools = set()
        for pool, ns in self.counts.items():
            k = bisect_right(ns, devices.get(pool, 0))
            if k:
                rows.append(self.best[pool][k - 1])
                pools.add(pool)
        for e in self.multi:
            if e.fits(devices):
                rows.append(_row(e, self.stages))
                pools.update(p for p, n in e.devices if n)
        if not rows:
            return None
        return _Least(min(r[0] for r in rows), min(r[1] for r in rows),
                      dict(zip(self.stages, map(min, *(r[3] for r in rows))))
                      if len(rows) > 1 else dict(zip(self.stages, rows[0][3])),
                      min(r[2] for r in rows), len(pools - self.cpu))


_Row = tuple[float, float, float, tuple[float, ...]]  # time, work, split part, per stage


def _row(e: Entry, stages: tuple[str, ...]) -> _Row:
    """The candidate's row: its time, work and split-part time, and its time in each stage (0
    in one it has none of)."""
    own = dict(e.stage_s)
    return e.time_s, e.work, e.half_s, tuple(own.get(st, 0.0) for st in stages)


def _indexed(table: RoleTable) -> list[tuple[str, _RoleIndex]]:
    """The table's roles, indexed once (kept on the table, which is frozen and compared by its
    candidates alone)."""
    got = table.__dict__.get("_index")
    if got is None:
        got = [(r, _RoleIndex.of(es, table.cpu)) for r, es in table.roles]
        object.__setattr__(table, "_index", got)
    return got


def plan_low(plan: Plan, t: float, least: float) -> float:
    """A proven lower bound on the job's optimum where `plan` (priced at time `t`) was made, given
    `least`, a bound on any plan's time there (`floor`). A plan for time proves its own bound,
    t (1 - gap); a plan for cost per sample proves a bound on its cost, not on its time: its
    time is the optimum's only where the plan is proven optimal, else any plan's bound is all."""
    if plan.objective == "time":
        return max(t * (1.0 - plan.solver.gap), least)
    return t if plan.solver.gap <= 0.0 else least
