"""The inner problem: a job's iteration time on the nodes the fleet gives it, from its own planner.

`JobPlanner.time(j, vector)` plans job j with `placer.solve.planner.plan_job` on the fleet's
cluster restricted to the vector's nodes (`placer.spec.catalog.with_nodes`; a pool given 0 nodes
is gone) and keeps the plan: the allocation model (`placer.fleet.alloc`) asks only for the vectors
its search visits, and each is planned once. A vector the job cannot be placed on is None, with
the planner's diagnosis kept for the report.

`grid(fleet, j)` is the job's finite set of allocation vectors: per pool 0, the powers of two
below the team's cap and the cap; 0 alone for a pool that no role of the job has a candidate on
(its single-pool cost table on the cap's nodes), so idle pools never multiply the grid.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from placer.base.errors import Infeasible, SpecError
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.fleet.alloc import AllocJob, AllocProblem, TeamQuota, Vec
from placer.fleet.spec import Fleet
from placer.solve.candidates import flat, single_candidates
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import with_nodes


def levels(cap: int) -> list[int]:
    """0, the powers of two below `cap`, and `cap`."""
    out, k = {0, cap}, 1
    while k < cap:
        out.add(k)
        k *= 2
    return sorted(out)


@dataclass
class JobPlanner:
    """Each job's planner on its allocation, memoised (`plans`, `why`)."""

    fleet: Fleet
    calib: Calibration
    time_limit_s: float = 5.0
    seed: int = 0
    plans: dict[tuple[int, Vec], Plan] = field(default_factory=dict)
    why: dict[tuple[int, Vec], str] = field(default_factory=dict)

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.fleet.cluster.pools)

    def nodes_of(self, a: Vec) -> dict[str, int]:
        return dict(zip(self.pools, a))

    def time(self, j: int, a: Vec) -> float | None:
        key = (j, a)
        if key in self.plans:
            return self.plans[key].predicted_iteration_s
        if key in self.why:
            return None
        job = self.fleet.jobs[j].job
        try:
            res = with_nodes(job, self.nodes_of(a), job.name)
            plan = plan_job(Pricer(res, self.calib), time_limit_s=self.time_limit_s,
                            workers=1, seed=self.seed)
        except (Infeasible, SpecError) as e:  # SpecError: a pin naming a pool given 0 nodes
            self.why[key] = str(e).split("\n")[0]
            return None
        self.plans[key] = plan
        return plan.predicted_iteration_s

    def least_devices(self, j: int, cap: Vec) -> list[list[dict[str, int]]] | None:
        """Per role of job j, the devices per pool of each of its single-pool candidates on the
        cap's nodes (None: the table cannot be built there; the planner will say why)."""
        if not any(cap):
            return None
        job = self.fleet.jobs[j].job
        try:
            res = with_nodes(job, self.nodes_of(cap), job.name)
            cands = flat(single_candidates(Pricer(res, self.calib)))
        except (Infeasible, SpecError):
            return None
        return [[c.pool_devices() for c in cs] for cs in cands.values()]

    def grid(self, j: int) -> tuple[Vec, ...]:
        """Job j's allocation vectors (module docstring), less those on which some role has no
        single-pool candidate that fits its devices: no placement exists there (a split role's
        parts are each a layout a single pool also offers)."""
        fj = self.fleet.jobs[j]
        cap = tuple(self.fleet.team_cap(fj.team, p) for p in self.pools)
        roles = self.least_devices(j, cap)
        use = (set(self.pools) if roles is None
               else {p for cs in roles for c in cs for p in c})
        axes = [levels(c) if p in use else [0] for p, c in zip(self.pools, cap)]
        per_node = {p.name: p.devices_per_node for p in self.fleet.cluster.pools}

        def fits(a: Vec) -> bool:
            have = {p: n * per_node[p] for p, n in zip(self.pools, a)}
            return roles is None or all(
                any(all(n <= have[p] for p, n in c.items()) for c in cs) for cs in roles)
        top = tuple(max(x) for x in axes)
        return tuple(a for a in itertools.product(*axes) if any(a) and (a == top or fits(a)))


def alloc_problem(planner: JobPlanner) -> AllocProblem:
    """The allocation model of `planner.fleet`, timed by `planner`."""
    fleet = planner.fleet
    pools = planner.pools
    teams = {name: TeamQuota(
        name, t.cohort,
        tuple(t.quota[p].nominal if p in t.quota else 0 for p in pools),
        tuple(fleet.team_cap(name, p) for p in pools)) for name, t in fleet.teams.items()}
    jobs = [AllocJob(fj.name, fj.team, fj.weight, fj.iterations or 1, planner.grid(j),
                     fj.max_iteration_s()) for j, fj in enumerate(fleet.jobs)]
    return AllocProblem(pools, tuple(fleet.pool_nodes()[p] for p in pools), teams, jobs,
                        "throughput" if fleet.objective == "throughput" else "makespan",
                        planner.time)
