"""The inner problem: a job's iteration time on the nodes the fleet gives it, from its own planner.

`JobPlanner.time(j, vector)` plans job j with `placer.solve.planner.plan_job` on the fleet's
cluster restricted to the vector's nodes (`placer.spec.catalog.with_nodes`; a pool given 0 nodes
is gone) and keeps the plan: the allocation model (`placer.fleet.alloc`) asks only for the vectors
its search visits, and each is planned once. A vector the job cannot be placed on is None, with
the planner's diagnosis kept for the report.

Jobs with the same job document (a sweep's seeds, say) are one kind: their time function is
planned once (`kind_of`), and the allocation model treats them as interchangeable. Each kind
is priced on one memo for the whole search (`placer.fleet.workers`): its cost table on the cap
and each later plan reuse the engine replays priced before. `prefetch` plans a round's new
vectors in `workers` worker processes, each kind on the worker that holds its memo.

`grid(j)` is the job's finite set of allocation vectors: per pool 0, the powers of two below the
team's cap and the cap; 0 alone for a pool that no role of the job has a candidate on (its
single-pool cost table on the cap's nodes), so idle pools never multiply the grid. Where the
product of those axes passes `max_grid` vectors, each axis is thinned to 0 and a geometric
ladder from 1 node to the cap (`ladder`), as few rungs as keep the product within `max_grid`,
plus the job's fair share (its team's nominal quota split equally among the team's jobs, the
allocation search's first incumbent): a large fleet's model stays small, and its gap is
reported relative to the thinned grid.

The table that cuts the grid also bounds the job's time on every vector of it without planning
there (`floor`, `placer.fleet.floors`): the allocation search's bound on the vectors it has not
visited, and the bound of a job plan for cost per sample, which proves none on its time (`low`).
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field

from placer.cost.efficiency import Calibration
from placer.fleet.alloc import AllocJob, AllocProblem, TeamQuota, Vec
from placer.fleet.floors import RoleTable, floor, plan_low
from placer.fleet.sharing import ShareGroup, shared_job
from placer.fleet.spec import Fleet
from placer.fleet.workers import KindWorkers, Pricers, Task, least_devices, plan_on, run_task
from placer.solve.planfile import Plan
from placer.spec.job import Job

__all__ = ["MAX_GRID", "JobPlanner", "alloc_problem", "kinds", "ladder", "least_devices",
           "levels", "plan_on", "priced_jobs", "share_groups", "thinned"]

MAX_GRID = 256  # allocation vectors per job before its axes are thinned


def levels(cap: int) -> list[int]:
    """0, the powers of two below `cap`, and `cap`."""
    out, k = {0, cap}, 1
    while k < cap:
        out.add(k)
        k *= 2
    return sorted(out)


def ladder(cap: int, rungs: int) -> list[int]:
    """0 and `rungs` whole-node counts from 1 to `cap`, spaced geometrically (fewer if they
    round to the same count)."""
    if cap <= 1 or rungs <= 1:
        return sorted({0, cap})
    return sorted({0, *(round(cap ** (i / (rungs - 1))) for i in range(rungs))})


def _size(axes: list[list[int]]) -> int:
    out = 1
    for x in axes:
        out *= len(x)
    return out


def thinned(axes: list[list[int]], max_grid: int, keep: list[int] | None = None
            ) -> list[list[int]]:
    """The axes, each cut to a ladder of as many rungs as keep their product within
    `max_grid` (at least two rungs: 1 node and the cap), plus the count `keep[i]` on a cut
    axis i where it lies inside it (a job's fair share). Axes within `max_grid` are kept."""
    if _size(axes) <= max_grid:
        return axes
    rungs = max(len(x) for x in axes)
    cut = [ladder(max(x), 2) if len(x) > 3 else x for x in axes]
    while rungs > 2:
        rungs -= 1
        trial = [ladder(max(x), rungs) if len(x) > rungs + 1 else x for x in axes]
        if _size(trial) <= max_grid:
            cut = trial
            break
    return [sorted({*c, k}) if keep is not None and 0 < (k := keep[i]) < max(c) and c != a
            else c for i, (c, a) in enumerate(zip(cut, axes))]


def kinds(jobs: list[Job]) -> list[int]:
    """Each job's kind: the index of the first job with the same document but for its name."""
    first: dict[str, int] = {}
    return [first.setdefault(json.dumps(job.model_dump(mode="json", exclude={"name"}),
                                        sort_keys=True), i) for i, job in enumerate(jobs)]


@dataclass
class JobPlanner:
    """Each job's planner on its allocation, memoised (`plans`, `why`)."""

    fleet: Fleet
    calib: Calibration
    time_limit_s: float = 5.0
    seed: int = 0
    workers: int = 1
    max_grid: int = MAX_GRID
    plans: dict[tuple[int, Vec], Plan] = field(default_factory=dict)  # (kind, vector) ->
    why: dict[tuple[int, Vec], str] = field(default_factory=dict)
    kind_of: list[int] = field(default_factory=list)
    priced: list[Job] = field(default_factory=list)  # each job as planned (shared pools priced)
    memo: Pricers | None = None  # each kind's pricing memo, planning here (`workers` < 2)
    pool: KindWorkers | None = None  # else the worker processes, each with its own memos
    computed: int = 0  # plans and tables computed (not found in `plans`, `why`)
    planned_s: float = 0.0  # wall seconds spent computing plans (their batches, in parallel)
    planned: int = 0  # plans computed in them
    # (kind, cap) -> its single-pool table on the cap (`grids`); (kind, cap, vector) -> floor
    tables: dict[tuple[int, Vec], RoleTable | None] = field(default_factory=dict)
    floors: dict[tuple[int, Vec, Vec], float | None] = field(default_factory=dict)
    caps: list[Vec] = field(default_factory=list)  # per job, `cap` (asked per vector and round)

    def __post_init__(self) -> None:
        self.priced = priced_jobs(self.fleet)
        self.kind_of = kinds(self.priced)
        self.memo = Pricers(self.calib)
        self.caps = [tuple(self.fleet.team_cap(fj.team, p) for p in self.pools)
                     for fj in self.fleet.jobs]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def _run(self, tasks: list[Task]) -> list[object]:
        """The tasks' results: in the worker processes when there are several workers and
        tasks, else here (each kind on its memo either way)."""
        self.computed += len(tasks)
        start = time.monotonic()
        if self.workers < 2 or len(tasks) < 2:
            assert self.memo is not None
            out = [run_task(t, self.priced, self.memo, self.time_limit_s, self.seed)
                   for t in tasks]
        else:
            if self.pool is None:  # forked at the first batch, the grids' tables, before this
                # fleet's first CP-SAT solve
                self.pool = KindWorkers(self.priced, self.calib, self.time_limit_s, self.seed,
                                        self.workers)
            out = self.pool.run(tasks)
        plans = sum(1 for t in tasks if t[0] == "plan")
        if plans == len(tasks):
            self.planned_s += time.monotonic() - start
            self.planned += plans
        return out

    def pace(self) -> float | None:
        """Wall seconds one more job plan is expected to take, in a batch of plans: the mean so
        far (None before any), for the search to judge whether a batch fits its time left."""
        return self.planned_s / self.planned if self.planned else None

    def plan(self, j: int, a: Vec) -> Plan:
        return self.plans[(self.kind_of[j], a)]

    def reason(self, j: int, a: Vec) -> str:
        return self.why[(self.kind_of[j], a)]

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.fleet.cluster.pools)

    def nodes_of(self, a: Vec) -> dict[str, int]:
        return dict(zip(self.pools, a))

    def time(self, j: int, a: Vec) -> float | None:
        key = (self.kind_of[j], a)
        if key not in self.plans and key not in self.why:
            self._keep(key, self._run([("plan", key[0], self.nodes_of(a))])[0])
        return self.plans[key].predicted_iteration_s if key in self.plans else None

    def low(self, j: int, a: Vec) -> float:
        """A lower bound on job j's optimum on `a` (after `time` placed it there): its plan's
        time less the plan's own proven relative gap, T (1 - gap) (its solver's bound; 0 for a
        plan its solver stopped before any bound). A plan for cost per sample proves a bound on
        its cost, not its time: its time is its optimum's only where it is proven optimal, else
        the bound is `floor`'s (any plan's time is at least that)."""
        plan = self.plan(j, a)
        return plan_low(plan, plan.predicted_iteration_s, self.floor(j, a) or 0.0)

    def floor(self, j: int, a: Vec) -> float | None:
        """A proven lower bound on job j's time on `a` from its cost table on its cap, without
        planning there (`placer.fleet.floors`); 0 where the table is not known, None where some
        role has no candidate that fits `a`."""
        key = (self.kind_of[j], self.cap(j), a)
        if key not in self.floors:
            table = self.tables.get(key[:2])
            per_node = {p.name: p.devices_per_node for p in self.fleet.cluster.pools}
            self.floors[key] = (0.0 if table is None else
                                floor(table, self.priced[j], self.nodes_of(a), per_node))
        return self.floors[key]

    def alone(self, j: int, a: Vec) -> float | None:
        """Job j's iteration time on `a` as written: a shared pool's member with the pool to
        itself (what sharing costs it is its priced time against this)."""
        got = plan_on(self.fleet.jobs[j].job, self.nodes_of(a), self.calib, self.time_limit_s,
                      self.seed)
        return None if isinstance(got, str) else got.predicted_iteration_s

    def replan(self, j: int, a: Vec, running: Plan) -> Plan | str:
        """Job j planned again on `a` (the nodes it kept after a preemption), warm-started from
        its `running` plan: the same optimum as `time(j, a)`'s, reached from the old configs
        where they still exist. The plan, or why none fits there; not memoised (the hint
        differs per call)."""
        return plan_on(self.priced[j], self.nodes_of(a), self.calib, self.time_limit_s,
                       self.seed, self.memo, hint=running)

    def _keep(self, key: tuple[int, Vec], got: object) -> None:
        if isinstance(got, str):
            self.why[key] = got
        else:
            assert isinstance(got, Plan)
            self.plans[key] = got

    def prefetch(self, pairs: list[tuple[int, Vec]]) -> None:
        """Plan the new (job, vector) pairs, in `workers` processes when there are several."""
        todo = sorted({(self.kind_of[j], a) for j, a in pairs} - set(self.plans) - set(self.why))
        if self.workers < 2 or len(todo) < 2:
            return
        got = self._run([("plan", k, self.nodes_of(a)) for k, a in todo])
        for key, g in zip(todo, got):
            self._keep(key, g)

    def cap(self, j: int) -> Vec:
        """The most nodes of each pool job j's team may hold."""
        return self.caps[j]

    def grids(self) -> list[tuple[Vec, ...]]:
        """Every job's grid: each kind's candidate table on each cap built once, in `workers`
        processes when there are several (its prices kept in the kind's memo, where the plans
        on its grid find them)."""
        keys = sorted({(self.kind_of[j], self.cap(j)) for j in range(len(self.fleet.jobs))})
        tables = self._run([("least", k, self.nodes_of(cap)) for k, cap in keys])
        self.tables.update(zip(keys, tables))  # type: ignore[arg-type]
        seen: dict[tuple[int, str], tuple[Vec, ...]] = {}  # a kind's grid per team, built once
        for j, fj in enumerate(self.fleet.jobs):  # (the cap and fair share are the team's)
            key = (self.kind_of[j], fj.team)
            if key not in seen:
                seen[key] = self.grid(j, self.tables[(self.kind_of[j], self.cap(j))])
        return [seen[(self.kind_of[j], fj.team)] for j, fj in enumerate(self.fleet.jobs)]

    def grid(self, j: int, table: RoleTable | None) -> tuple[Vec, ...]:
        """Job j's allocation vectors (module docstring), less those on which some role has no
        single-pool candidate that fits its devices (`roles`, from `least_devices`): no
        placement exists there (a split role's parts are each a layout a single pool also
        offers)."""
        cap = self.cap(j)
        roles = None if table is None else table.devices()
        use = (set(self.pools) if roles is None
               else {p for cs in roles for c in cs for p in c})
        team = self.fleet.jobs[j].team
        mates = sum(1 for fj in self.fleet.jobs if fj.team == team)
        quota = self.fleet.teams[team].quota
        share = [quota[p].nominal // mates if p in quota else 0 for p in self.pools]
        axes = thinned([levels(c) if p in use else [0] for p, c in zip(self.pools, cap)],
                       self.max_grid, share)
        per_node = {p.name: p.devices_per_node for p in self.fleet.cluster.pools}
        least = None if roles is None else [_least_needs(cs) for cs in roles]

        def fits(a: Vec) -> bool:
            have = {p: n * per_node[p] for p, n in zip(self.pools, a)}
            return least is None or all(
                any(all(n <= have[p] for p, n in c) for c in cs) for cs in least)
        top = tuple(max(x) for x in axes)
        return tuple(a for a in itertools.product(*axes) if any(a) and (a == top or fits(a)))


def _least_needs(cands: list[dict[str, int]]) -> list[tuple[tuple[str, int], ...]]:
    """A role's candidates' devices per pool, less those another's needs imply: c is left
    out where some d holds no pool c does not and no more devices of any (d fits wherever c
    does), so a vector fits one of these exactly when it fits one of `cands`."""
    needs = sorted({tuple(sorted(c.items())) for c in cands}, key=lambda c: (len(c), c))

    def implies(d: tuple[tuple[str, int], ...], c: tuple[tuple[str, int], ...]) -> bool:
        held = dict(c)
        return all(p in held and n <= held[p] for p, n in d)
    out: list[tuple[tuple[str, int], ...]] = []
    for c in needs:
        if not any(implies(d, c) for d in out):
            out = [d for d in out if not implies(c, d)] + [c]
    return out


def share_groups(fleet: Fleet) -> tuple[ShareGroup, ...]:
    """The fleet's shared CPU pools as the allocation model's groups (members in fleet order)."""
    if fleet.shared is None:
        return ()
    pools = [p.name for p in fleet.cluster.pools]
    index = {fj.name: j for j, fj in enumerate(fleet.jobs)}
    return tuple(ShareGroup(pools.index(cp.pool), tuple(sorted(index[n] for n in cp.jobs)))
                 for cp in fleet.shared.cpu_pools if not cp.choose)  # chosen: `sharedplan`


def priced_jobs(fleet: Fleet) -> list[Job]:
    """Each job as the allocation prices it: a shared pool's member with its share of the
    cores (`placer.fleet.sharing.shared_job`), the others as written."""
    out = [fj.job for fj in fleet.jobs]
    for g in share_groups(fleet):
        for j in g.members:
            out[j] = shared_job(fleet.jobs[j].job, [fleet.jobs[k].job for k in g.members
                                                    if k != j])
    return out


def alloc_problem(planner: JobPlanner) -> AllocProblem:
    """The allocation model of `planner.fleet`, timed by `planner`."""
    fleet = planner.fleet
    pools = planner.pools
    teams = {name: TeamQuota(
        name, t.cohort,
        tuple(t.quota[p].nominal if p in t.quota else 0 for p in pools),
        tuple(fleet.team_cap(name, p) for p in pools)) for name, t in fleet.teams.items()}
    jobs = [AllocJob(fj.name, fj.team, fj.weight, fj.iterations or 1, grid,
                     fj.max_iteration_s(), planner.kind_of[j])
            for j, (fj, grid) in enumerate(zip(fleet.jobs, planner.grids()))]
    return AllocProblem(pools, tuple(fleet.pool_nodes()[p] for p in pools), teams, jobs,
                        "throughput" if fleet.objective == "throughput" else "makespan",
                        planner.time, prefetch=planner.prefetch, low_of=planner.low,
                        floor_of=planner.floor, pace=planner.pace,
                        shared=share_groups(fleet))
