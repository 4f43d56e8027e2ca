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
`a` holds two pools it can run on) may run faster than any single-pool candidate: it adds
nothing to (1)-(3). Nor does a rollout whose tool-queue term may be negative
(`ilp_bound.tool_may_lower`), as in the planner's own bound.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.base.roles import Role
from placer.cost.split import SPLITTABLE
from placer.solve.candidates import Candidate
from placer.solve.planfile import Plan
from placer.spec.job import Job


@dataclass(frozen=True)
class Entry:
    """One single-pool candidate: its devices per pool, its time, its time per stage."""

    devices: tuple[tuple[str, int], ...]
    time_s: float
    stage_s: tuple[tuple[str, float], ...]

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
               cpu: frozenset[str]) -> RoleTable:
    """A job's `RoleTable` from its single-pool candidates (role -> candidates); `splits_roles`:
    its framework splits a role over pools; `tool_lower`: its rollout's tool term may be
    negative; `cpu`: the cluster's CPU pools."""
    roles = tuple((r, tuple(Entry(tuple(sorted(c.pool_devices().items())), c.time_s,
                                      tuple(sorted(c.est.stage_s.items()))) for c in cs))
                  for r, cs in cands.items())
    splits = frozenset(r for r, _ in roles if splits_roles and r in SPLITTABLE)
    loose = frozenset({Role.ROLLOUT.value} if tool_lower else ())
    return RoleTable(roles, splits, loose, cpu)


def floor(table: RoleTable, job: Job, have: dict[str, int], per_node: dict[str, int]
          ) -> float | None:
    """A lower bound on the job's iteration time on `have` nodes per pool (module docstring);
    None: some role has no candidate that fits, so no plan exists there."""
    devices = {p: n * per_node[p] for p, n in have.items()}
    fit = {r: [e for e in es if e.fits(devices)] for r, es in table.roles}
    if any(not es for es in fit.values()):
        return None
    bounded = [r for r, es in fit.items() if r not in table.loose
               and not (r in table.splits and _pools(es, table.cpu) > 1)]
    own = max((min(e.time_s for e in fit[r]) for r in bounded), default=0.0)
    stages: dict[str, float] = {}
    for r in bounded:
        least: dict[str, float] = {}
        for e in fit[r]:
            for st, t in dict(e.stage_s).items():
                least[st] = min(least.get(st, t), t)
        names = {st for e in fit[r] for st, _ in e.stage_s}
        for st in names:  # a candidate without the stage spends nothing in it
            t = least[st] if all(st in dict(e.stage_s) for e in fit[r]) else 0.0
            stages[st] = max(stages.get(st, 0.0), t)
    chain = job.pipeline.mechanism.chain_bound_s(sum(stages.values()))
    total = sum(devices.values())
    work = (sum(min(e.work for e in fit[r]) for r in bounded) / total) if total else 0.0
    return max(own, chain, work)


def _pools(entries: list[Entry], cpu: frozenset[str]) -> int:
    """How many accelerator pools these candidates run on (a split needs two)."""
    return len({p for e in entries for p, n in e.devices if n and p not in cpu})


def plan_low(plan: Plan, t: float, least: float) -> float:
    """A proven lower bound on the job's optimum where `plan` (priced at time `t`) was made, given
    `least`, a bound on any plan's time there (`floor`). A plan for time proves its own bound,
    t (1 - gap); a plan for cost per sample proves a bound on its cost, not on its time: its
    time is the optimum's only where the plan is proven optimal, else any plan's bound is all."""
    if plan.objective == "time":
        return max(t * (1.0 - plan.solver.gap), least)
    return t if plan.solver.gap <= 0.0 else least
