"""The fleet's time function with shared rollout pools: each member of a rollout group priced on
the group's engines (`placer.fleet.rolloutpool`), every other job by its own planner.

`SharedRollouts(planner).extend(problem)` returns the allocation problem with the rollout groups
added to its shared pools (one count of the engines' pool per group, charged once) and its time
function and prefetch dispatching: a member's vector is planned as `engines_job` (rollout on the
engines' pool, its other roles off it) and its time is `shared_iteration_s` with the group's
queueing at that many engine nodes; any other job's goes to `JobPlanner`. `plan`, `reason` and
`alone_s` answer for every job alike, so the fleet's result reads plans through this object.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from placer.fleet.alloc import AllocProblem, Vec
from placer.fleet.inner import JobPlanner, plan_on
from placer.fleet.result import EngineShare, JobResult, SharedRolloutUse
from placer.fleet.rolloutpool import EngineQueue, engines_job, shared_iteration_s
from placer.fleet.sharing import ShareGroup, groups_of
from placer.solve.planfile import Plan
from placer.spec.job import Job


@dataclass
class SharedRollouts:
    planner: JobPlanner
    groups: tuple[ShareGroup, ...] = ()  # the rollout groups (charged member first)
    queues: list[EngineQueue] = field(default_factory=list)
    member: dict[int, tuple[int, int]] = field(default_factory=dict)  # job -> (group, place)
    jobs: dict[int, Job] = field(default_factory=dict)  # each member as planned (engines_job)
    plans: dict[tuple[int, Vec], Plan] = field(default_factory=dict)
    why: dict[tuple[int, Vec], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        fleet = self.planner.fleet
        pools = list(self.planner.pools)
        names = [fj.name for fj in fleet.jobs]
        every = groups_of(fleet.shared, pools, names, {fj.name: fj.team for fj in fleet.jobs})
        self.groups = every[len(fleet.shared.cpu_pools if fleet.shared else []):]
        for g_index, g in enumerate(self.groups):
            pool = pools[g.pool]
            self.queues.append(EngineQueue([fleet.jobs[j].job for j in g.members], pool,
                                           self.planner.calib))
            for place, j in enumerate(g.members):
                self.member[j] = (g_index, place)
                self.jobs[j] = engines_job(fleet.jobs[j].job, pool)

    def extend(self, pr: AllocProblem) -> AllocProblem:
        """`pr` with the rollout groups shared and this object's time function."""
        if not self.groups:
            return pr
        jobs = list(pr.jobs)
        for g in self.groups:
            for j in g.members[1:]:
                jobs[j] = replace(jobs[j], grid=engines_axis(jobs[g.members[0]].grid,
                                                             jobs[j].grid, g.pool))
        return replace(pr, jobs=jobs, time_of=self.time, prefetch=self.prefetch, known=[],
                       shared=pr.shared + self.groups)

    def time(self, j: int, a: Vec) -> float | None:
        if j not in self.member:
            return self.planner.time(j, a)
        g, place = self.member[j]
        plan = self._plan(j, a)
        queue = self.queues[g].queue_s(place, a[self.groups[g].pool])
        if plan is None or queue is None:
            return None
        return shared_iteration_s(plan, self.jobs[j], queue)

    def prefetch(self, pairs: list[tuple[int, Vec]]) -> None:
        self.planner.prefetch([(j, a) for j, a in pairs if j not in self.member])

    def _plan(self, j: int, a: Vec) -> Plan | None:
        key = (j, a)
        if key not in self.plans and key not in self.why:
            p = self.planner
            got = plan_on(self.jobs[j], p.nodes_of(a), p.calib, p.time_limit_s, p.seed)
            if isinstance(got, str):
                self.why[key] = got
            else:
                self.plans[key] = got
        return self.plans.get(key)

    def plan(self, j: int, a: Vec) -> Plan:
        """Job j's plan on `a` (a member's: its engines plan; its time is `time`)."""
        if j not in self.member:
            return self.planner.plan(j, a)
        plan = self._plan(j, a)
        assert plan is not None, (j, a)
        return plan

    def reason(self, j: int, a: Vec) -> str:
        return self.why[(j, a)] if j in self.member else self.planner.reason(j, a)

    def parts(self, j: int, a: Vec) -> tuple[float, float, float]:
        """A member's (own generation G_j, one swap S, queueing Q_j) on `a`'s engines."""
        g, place = self.member[j]
        gens, swap = self.queues[g].parts(a[self.groups[g].pool])
        queue = self.queues[g].queue_s(place, a[self.groups[g].pool])
        own = gens[place]
        assert own is not None and queue is not None
        return own, swap, queue


def rollout_uses(rollouts: SharedRollouts, jobs: list[JobResult], vectors: list[Vec],
                 times: list[float]) -> tuple[list[JobResult], list[SharedRolloutUse]]:
    """The jobs with each member's shared iteration time and engines' pool, and each rollout
    group's engines: nodes, each member's generation, queueing and time against alone."""
    jobs = list(jobs)
    out = []
    pools = rollouts.planner.pools
    for g in rollouts.groups:
        pool = pools[g.pool]
        rows = []
        for j in g.members:
            own, swap, queue = rollouts.parts(j, vectors[j])
            alone = rollouts.plan(j, vectors[j]).predicted_iteration_s
            jobs[j] = replace(jobs[j], iteration_s=times[j], rollout_pool=pool,
                              alone_iteration_s=alone)
            rows.append(EngineShare(jobs[j].name, own, queue, times[j], alone))
        out.append(SharedRolloutUse(pool, vectors[g.members[0]][g.pool], jobs[g.members[0]].team,
                                    swap, rows))
    return jobs, out


def engines_axis(charged: tuple[Vec, ...], grid: tuple[Vec, ...], pool: int) -> tuple[Vec, ...]:
    """A member's grid with the engines' pool axis the charged member's (a member of another
    team holds the engines on the charged team's quota, not its own)."""
    counts = sorted({a[pool] for a in charged})
    return tuple(sorted({b for a in grid for n in counts
                         if any(b := a[:pool] + (n,) + a[pool + 1:])}))
