"""A brute-force oracle for the fleet allocation: every combination of the jobs' grids, each
checked against the quota rules written out here on their own (not through the CP-SAT model),
and seeded random small fleets with monotone synthetic iteration times to run it on (a shared
CPU pool among them, optionally)."""
from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from placer.fleet.alloc import Allocation, AllocJob, AllocProblem, NoAllocation, TeamQuota, Vec, allocate
from placer.fleet.sharing import Choice, ShareGroup


def violations(pr: AllocProblem, vectors: list[Vec]) -> list[str]:
    """Every rule an allocation breaks: pool capacity, team cap, cohort nominal sum, and no
    team below min(nominal, demand) while a team of its cohort borrows."""
    out = []
    pools = range(len(pr.pools))
    for c in pr.choices:  # all of a choice's shared flavours on and alone ones off, or the reverse
        on = [any(vectors[e]) for e in pr.shared[c.group].members]
        off = [not any(vectors[j]) for j in c.alone]
        if len({*on, *off}) > 1:
            out.append(f"choice {c.group}")
    for g in pr.shared:  # one count of the shared pool, held by the group as a whole
        if len({vectors[j][g.pool] for j in g.members}) > 1:
            out.append(f"shared {pr.pools[g.pool]}")
        vectors = [tuple(0 if p == g.pool and j in g.members[1:] else n
                         for p, n in enumerate(v)) for j, v in enumerate(vectors)]
    for p in pools:
        if sum(v[p] for v in vectors) > pr.nodes[p]:
            out.append(f"capacity {pr.pools[p]}")
    use = {t: [sum(v[p] for job, v in zip(pr.jobs, vectors) if job.team == t) for p in pools]
           for t in pr.teams}
    cohorts: dict[str | None, list[TeamQuota]] = {}
    for tq in pr.teams.values():
        cohorts.setdefault(tq.cohort, []).append(tq)
    for cohort, teams in cohorts.items():
        for p in pools:
            for tq in teams:
                limit = tq.nominal[p] if cohort is None else tq.cap[p]
                if use[tq.name][p] > limit:
                    out.append(f"quota {tq.name} {pr.pools[p]}")
            if cohort is None:
                continue
            if sum(use[t.name][p] for t in teams) > sum(t.nominal[p] for t in teams):
                out.append(f"cohort {cohort} {pr.pools[p]}")
            if any(use[t.name][p] > t.nominal[p] for t in teams):
                for t in teams:
                    demand = _demand(pr, t.name, p)
                    if use[t.name][p] < min(t.nominal[p], demand):
                        out.append(f"fairness {t.name} {pr.pools[p]}")
    return out


def _demand(pr: AllocProblem, team: str, p: int) -> int:
    """The most of pool p the team's jobs could hold: each job's largest grid count (a shared
    pool's count at its charged member only), a choice's job the larger of its two flavours."""
    pairs = {j: [j] for j, job in enumerate(pr.jobs) if job.team == team}
    for c in pr.choices:
        for j, e in zip(c.alone, pr.shared[c.group].members):
            if j in pairs:
                pairs[j].append(pairs.pop(e)[0])
    return sum(max(0 if _tail(pr, k, p) else max(a[p] for a in pr.jobs[k].grid) for k in ks)
               for ks in pairs.values())


def _tail(pr: AllocProblem, j: int, p: int) -> bool:
    """Whether job j shares pool p and is not its group's first member (the group's count is
    that member's: the charged one)."""
    return any(g.pool == p and j in g.members and j != g.members[0] for g in pr.shared)


def brute_force(pr: AllocProblem, time_of: Callable[[int, Vec], float | None]
                ) -> float | None:
    """The best objective over every combination (None: no combination is allowed)."""
    best: float | None = None
    zero = (0,) * len(pr.pools)
    for share in itertools.product((False, True), repeat=len(pr.choices)):
        # each choice's option: its alone flavours off when it shares, its shared ones else
        off = {j for c, on in zip(pr.choices, share)
               for j in (c.alone if on else pr.shared[c.group].members)}
        grids = [(zero,) if j in off else job.grid for j, job in enumerate(pr.jobs)]
        got = _best(pr, time_of, grids)
        if got is not None and (best is None or (got > best if pr.objective == "throughput"
                                                 else got < best)):
            best = got
    return best


def _best(pr: AllocProblem, time_of: Callable[[int, Vec], float | None],
          grids: list[tuple[Vec, ...]]) -> float | None:
    """The best objective over every combination of `grids` that breaks no rule."""
    best: float | None = None
    for vectors in itertools.product(*grids):
        times = [math.inf if not any(a) else time_of(j, a) for j, a in enumerate(vectors)]
        if any(t is None for t in times):
            continue
        if any(job.max_iteration_s is not None and t is not None and not math.isinf(t)
               and t > job.max_iteration_s for job, t in zip(pr.jobs, times)):
            continue
        if violations(pr, list(vectors)):
            continue
        vals = [0.0 if math.isinf(t) else pr.value(j, t)
                for j, t in enumerate(times) if t is not None]
        obj = sum(vals) if pr.objective == "throughput" else max(vals)
        if best is None or (obj > best if pr.objective == "throughput" else obj < best):
            best = obj
    return best


def random_fleet(seed: int, objective: str, twins: bool = False, shared: bool = False,
                 charged: int = 0, choice: bool = False
                 ) -> tuple[AllocProblem, Callable[[int, Vec], float | None]]:
    """2-3 jobs, 2 pools of 1-4 nodes, 1-3 teams (a cohort or none), synthetic times that
    never grow with more nodes: T = c / (sum_p s_p a_p)^alpha + d, None below a need.
    `twins`: the first job is repeated once or twice as the same kind (one time function, the
    same team, weight and limits), so the model's symmetry breaking is exercised. `shared`: the
    first two jobs are of one team and share pool p1 (their grids' p1 axes the team's), the
    group's count charged to job `charged` (0 or 1; a shared rollout pool charges the first of
    its `charge` team's members, who need not come first). `choice`: two jobs only, which may
    share p1 or not (`Choice`): their shared flavours are two more jobs."""
    rng = random.Random(seed)
    pools = ("p0", "p1")
    nodes = tuple(rng.randint(2, 5) for _ in pools)
    names = [f"t{i}" for i in range(rng.randint(1, 3))]
    cohort = rng.choice(["c", None])
    teams = {}
    left = list(nodes)
    for t in names:
        nominal = tuple(rng.randint(min(1, n), n) for n in left)
        left = [n - k for n, k in zip(left, nominal)]
        cap = tuple(min(n, k + rng.randint(0, 2)) if cohort else k
                    for n, k in zip(nodes, nominal))
        teams[t] = TeamQuota(t, cohort, nominal, cap)
    jobs, params = [], []
    for j in range(rng.randint(2, 3)):
        team = names[0] if shared and j < 2 else rng.choice(names)
        axes = [sorted({0, *[k for k in (1, 2, 4) if k < c], c}) for c in teams[team].cap]
        grid = tuple(a for a in itertools.product(*axes) if any(a))
        limit = rng.choice([None, None, rng.uniform(5, 30)])
        jobs.append(AllocJob(f"j{j}", team, rng.choice([1.0, 2.0, 0.5]), rng.randint(1, 50),
                             grid, limit))
        params.append((rng.uniform(10, 50), [rng.uniform(0.2, 2) for _ in pools],
                       rng.uniform(0.5, 1.0), rng.uniform(0, 5), rng.uniform(0, 0.8)))

    if twins:
        copies = rng.randint(1, 2)
        jobs = [replace(jobs[0], kind=0)] * (copies + 1) + jobs[1:2]
        params = [params[0]] * (copies + 1) + params[1:2]

    def time_of(j: int, a: Vec) -> float | None:
        c, s, alpha, d, need = params[j]
        work = sum(si * ai for si, ai in zip(s, a))
        return None if work < need else c / work ** alpha + d

    groups = (ShareGroup(1, (charged, 1 - charged)),) if shared else ()
    if not choice:
        return AllocProblem(pools, nodes, teams, jobs, objective, time_of, shared=groups), time_of
    # the two jobs may share pool p1 or not: their shared flavours, appended, hold one
    # count of it and run slower (a queue behind each other: x 1.1 + 1 s)
    n = 2  # two jobs only: four flavours keep the brute force small
    jobs = jobs[:n] + [replace(jobs[0], name="j0~shared"), replace(jobs[1], name="j1~shared")]

    def either(j: int, a: Vec) -> float | None:
        t = time_of(j - n if j >= n else j, a)
        return t if j < n or t is None else 1.1 * t + 1

    pr = AllocProblem(pools, nodes, teams, jobs, objective, either,
                      shared=(ShareGroup(1, (n, n + 1)),), choices=(Choice(0, (0, 1)),))
    return pr, either


def oracle_checked(pr: AllocProblem, time_of: Callable[[int, Vec], float], seed: int
                   ) -> Allocation | None:
    """The CP-SAT loop's allocation of `pr`, checked against the brute-force optimum: proven
    optimal, at the oracle's objective and breaking no rule; None where the oracle finds no
    allocation (and the loop must prove there is none)."""
    best = brute_force(pr, time_of)
    if best is None:
        with pytest.raises(NoAllocation):
            allocate(pr, workers=1, seed=seed)
        return None
    a = allocate(pr, workers=1, seed=seed)
    assert a.optimal and a.objective == pytest.approx(best, rel=1e-6), seed
    assert violations(pr, a.vectors) == [], seed
    return a
