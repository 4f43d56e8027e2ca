"""The fleet's time function with shared rollout pools: each member of a rollout group priced on
the group's engines (`placer.fleet.rolloutpool`), every other job by its own planner.

`SharedRollouts(planner).extend(problem)` returns the allocation problem with the rollout groups
added to its shared pools (one count of the engines' pool per group, charged once) and its time
function and prefetch dispatching: a member's vector is planned as `engines_job` (rollout on the
engines' pool, its other roles off it) and its time is `shared_iteration_s` with the group's
queueing at that many engine nodes; any other job's goes to `JobPlanner`.

A group declared with `choose: true` (a rollout pool, or a CPU pool: its shared flavour is the
job priced with its share of the cores, `placer.fleet.sharing.shared_job`) is a choice
(`placer.fleet.sharing.Choice`): its members are extra jobs of the problem, the shared flavours
of the fleet's jobs, and the allocation picks one flavour per job, all of the group's shared or
none (`placer.fleet.alloc`). `results` maps
the allocation back to the fleet's jobs (each job's active flavour), and `priced_alternatives`
solves each choice again with its other option forced, so the report prices both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from placer.fleet.alloc import Allocation, AllocProblem, NoAllocation, Vec, allocate
from placer.fleet.floors import plan_low
from placer.fleet.inner import JobPlanner, plan_on
from placer.fleet.result import (
    EngineShare,
    JobResult,
    SharedRolloutUse,
    SharedUse,
    SharingChoice,
)
from placer.fleet.rolloutpool import EngineQueue, engines_job, shared_iteration_s
from placer.fleet.sharing import Choice, ShareGroup, as_written, groups_of, shared_job
from placer.solve.planfile import Plan
from placer.spec.job import Job


@dataclass
class SharedRollouts:
    planner: JobPlanner
    # the CPU pools to choose, then the rollout groups (problem indices, charged first)
    groups: tuple[ShareGroup, ...] = ()
    cpu: int = 0  # how many of `groups` are CPU pools to choose
    choose: list[bool] = field(default_factory=list)  # per group: a choice (extra jobs)
    queues: dict[int, EngineQueue] = field(default_factory=dict)  # rollout group -> its queue
    member: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (group, place)
    base: dict[int, int] = field(default_factory=dict)  # problem index -> the fleet's job
    jobs: dict[int, Job] = field(default_factory=dict)  # each member as planned (engines_job)
    plans: dict[tuple[int, Vec], Plan] = field(default_factory=dict)
    why: dict[tuple[int, Vec], str] = field(default_factory=dict)
    offset: int = 0  # where the rollout groups start among the problem's shared groups

    def __post_init__(self) -> None:
        fleet = self.planner.fleet
        pools = list(self.planner.pools)
        names = [fj.name for fj in fleet.jobs]
        every = groups_of(fleet.shared, pools, names, {fj.name: fj.team for fj in fleet.jobs})
        cpu_decls = fleet.shared.cpu_pools if fleet.shared else []
        decls = fleet.shared.rollout_pools if fleet.shared else []
        extra = len(fleet.jobs)
        groups: list[ShareGroup] = []
        for g, cp in zip(every, cpu_decls):
            if cp.choose:
                members = tuple(range(extra, extra + len(g.members)))
                extra += len(members)
                for k, j in zip(members, g.members):
                    self.base[k] = j
                    self.jobs[k] = shared_job(fleet.jobs[j].job, [fleet.jobs[m].job for m in
                                                                 g.members if m != j])
                groups.append(ShareGroup(g.pool, members))
                self.choose.append(True)
        self.cpu = len(groups)
        for g, decl in zip(every[len(every) - len(decls):], decls):
            index = len(groups)
            members = tuple(range(extra, extra + len(g.members))) if decl.choose else g.members
            extra += len(g.members) if decl.choose else 0
            self.queues[index] = EngineQueue([fleet.jobs[j].job for j in g.members], decl.pool,
                                             self.planner.calib)
            for place, (k, j) in enumerate(zip(members, g.members)):
                self.member[k] = (index, place)
                self.base[k] = j
                self.jobs[k] = engines_job(fleet.jobs[j].job, decl.pool)
            groups.append(ShareGroup(g.pool, members))
            self.choose.append(decl.choose)
        self.groups = tuple(groups)

    def extend(self, pr: AllocProblem) -> AllocProblem:
        """`pr` with the rollout groups shared (a choice's shared flavours appended as jobs)
        and this object's time function."""
        self.offset = len(pr.shared)
        if not self.groups:
            return pr
        jobs = list(pr.jobs)
        choices = []
        for index, (g, choose) in enumerate(zip(self.groups, self.choose)):
            if choose:
                jobs += [replace(pr.jobs[self.base[k]], name=f"{pr.jobs[self.base[k]].name} "
                                                             "(shared)") for k in g.members]
                choices.append(Choice(self.offset + index,
                                      tuple(self.base[k] for k in g.members)))
            for k in g.members:  # priced here, not by the planner: no kind shared with it
                jobs[k] = replace(jobs[k], kind=None)
            for k in g.members[1:]:
                jobs[k] = replace(jobs[k], grid=engines_axis(jobs[g.members[0]].grid,
                                                             jobs[k].grid, g.pool))
        return replace(pr, jobs=jobs, time_of=self.time, prefetch=self.prefetch, known=[],
                       low_of=self.low, lows=[], floor_of=self.floor,
                       shared=pr.shared + self.groups, choices=tuple(choices))

    def time(self, j: int, a: Vec) -> float | None:
        if j not in self.jobs:
            return self.planner.time(j, a)
        if j not in self.member:  # a CPU pool's shared flavour
            plan = self._plan(j, a)
            return None if plan is None else plan.predicted_iteration_s
        g, place = self.member[j]
        plan = self._plan(j, a)
        queue = self.queues[g].queue_s(place, a[self.groups[g].pool])
        if plan is None or queue is None:
            return None
        return shared_iteration_s(plan, self.jobs[j], queue)

    def low(self, j: int, a: Vec) -> float:
        """A lower bound on job j's optimum on `a` (after `time`): the planner's, or a shared
        flavour's priced time less its plan's own relative gap."""
        if j not in self.jobs:
            return self.planner.low(j, a)
        t, plan = self.time(j, a), self.plans.get((j, a))
        assert t is not None and plan is not None  # asked only where `time` placed the job
        return plan_low(plan, t, 0.0)

    def floor(self, j: int, a: Vec) -> float | None:
        """The planner's floor (`placer.fleet.floors`) for a job it plans; none for a shared
        flavour, priced here."""
        return 0.0 if j in self.jobs else self.planner.floor(j, a)

    def prefetch(self, pairs: list[tuple[int, Vec]]) -> None:
        self.planner.prefetch([(j, a) for j, a in pairs if j not in self.jobs])

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
        if j not in self.jobs:
            return self.planner.plan(j, a)
        plan = self._plan(j, a)
        assert plan is not None, (j, a)
        return plan

    def reason(self, j: int, a: Vec) -> str:
        return self.why[(j, a)] if j in self.jobs else self.planner.reason(j, a)

    def parts(self, j: int, a: Vec) -> tuple[float, float, float]:
        """A member's (own generation G_j, one swap S, queueing Q_j) on `a`'s engines."""
        g, place = self.member[j]
        gens, swap = self.queues[g].parts(a[self.groups[g].pool])
        queue = self.queues[g].queue_s(place, a[self.groups[g].pool])
        own = gens[place]
        assert own is not None and queue is not None
        return own, swap, queue

    def active(self, vectors: list[Vec]) -> list[int]:
        """Per fleet job, the problem index of its flavour in use (its shared flavour where a
        choice shares)."""
        out = list(range(len(self.planner.fleet.jobs)))
        for k, j in self.base.items():
            if k != j and any(vectors[k]):
                out[j] = k
        return out

    def results(self, a: Allocation) -> tuple[list[JobResult], list[SharedRolloutUse],
                                              list[tuple[int, ...]], list[SharedUse]]:
        """The fleet's jobs on their active flavours, each shared rollout group's engines, each
        fleet job's vector, and each CPU pool the allocation chose to share."""
        fleet, pools = self.planner.fleet, self.planner.pools
        active = self.active(a.vectors)
        jobs = [JobResult.of(fleet.jobs[j], self.planner.nodes_of(a.vectors[k]),
                             self.plan(k, a.vectors[k])) for j, k in enumerate(active)]
        cpu = []
        for g in self.groups[:self.cpu]:
            if not any(a.vectors[g.members[0]]):
                continue  # a choice not to share
            fjs = [self.base[k] for k in g.members]
            alone_s = [self.planner.alone(j, a.vectors[k]) for j, k in zip(fjs, g.members)]
            for j, t in zip(fjs, alone_s):
                jobs[j] = replace(jobs[j], shared_pool=pools[g.pool], alone_iteration_s=t,
                                  plan=as_written(jobs[j].plan, fleet.jobs[j].job))
            cpu.append(SharedUse(pools[g.pool], a.vectors[g.members[0]][g.pool],
                                 [jobs[j].name for j in fjs], [jobs[j].iteration_s for j in fjs],
                                 alone_s))
        out = []
        for g in self.groups[self.cpu:]:
            if not any(a.vectors[g.members[0]]):
                continue  # a choice not to share
            rows = []
            for k in g.members:
                j = self.base[k]
                own, swap, queue = self.parts(k, a.vectors[k])
                alone = self.plan(k, a.vectors[k]).predicted_iteration_s
                jobs[j] = replace(jobs[j], iteration_s=a.times[k], rollout_pool=pools[g.pool],
                                  alone_iteration_s=alone)
                rows.append(EngineShare(jobs[j].name, own, queue, a.times[k], alone))
            first = self.base[g.members[0]]
            out.append(SharedRolloutUse(pools[g.pool], a.vectors[g.members[0]][g.pool],
                                        jobs[first].team, swap, rows))
        return jobs, out, [a.vectors[k] for k in active], cpu

    def active_groups(self, vectors: list[Vec]) -> tuple[ShareGroup, ...]:
        """The rollout groups that share, in the fleet's job indices (for the teams' usage)."""
        return tuple(ShareGroup(g.pool, tuple(self.base[k] for k in g.members))
                     for g in self.groups if any(vectors[g.members[0]]))

    def priced_alternatives(self, pr: AllocProblem, a: Allocation, deadline: float,
                            workers: int, seed: int) -> list[SharingChoice]:
        """Each choice: what the allocation chose, and the best allocation with the other
        option forced (None: none exists there)."""
        out = []
        pools = self.planner.pools
        for c, choice in enumerate(pr.choices):
            g = pr.shared[choice.group]
            shares = any(a.vectors[g.members[0]])
            try:
                alt: float | None = allocate(
                    replace(pr, forced={c: not shares}),
                    time_limit_s=max(deadline - time.monotonic(), 1.0), workers=workers,
                    seed=seed).objective
            except NoAllocation:
                alt = None
            kind = "CPU nodes" if choice.group - self.offset < self.cpu else "rollout engines"
            out.append(SharingChoice(pools[g.pool], [pr.jobs[j].name for j in choice.alone],
                                     shares, a.objective, alt, kind))
        return out


def engines_axis(charged: tuple[Vec, ...], grid: tuple[Vec, ...], pool: int) -> tuple[Vec, ...]:
    """A member's grid with the engines' pool axis the charged member's (a member of another
    team holds the engines on the charged team's quota, not its own)."""
    counts = sorted({a[pool] for a in charged})
    return tuple(sorted({b for a in grid for n in counts
                         if any(b := a[:pool] + (n,) + a[pool + 1:])}))
