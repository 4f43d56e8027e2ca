"""`plan_fleet`: every job of a fleet given whole nodes, each job planned on its share.

    plan_fleet(load_fleet("examples/fleet-mixed.yaml"), calib) -> FleetResult

The allocation is `placer.fleet.alloc`'s lazy CP-SAT loop over `placer.fleet.inner`'s grids and
job planner. A fleet that cannot fit raises `Infeasible` naming the job and the resource: a job
that no pool its team may use can host, a job its team's whole quota cannot place (the job
planner's diagnosis), a deadline missed even on the whole quota, or the pool, quota or cohort
that the jobs' smallest allocations already overflow. `Infeasible` means proven: a search that
runs out of time before it finds any allocation raises `TimedOut` instead, naming the limit to
raise, and a diagnosis whose own checks run out of time says which it could not settle.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from placer.base.errors import Infeasible, TimedOut
from placer.cost.efficiency import Calibration
from placer.fleet.alloc import (
    MAX_ROUND_S,
    AllocProblem,
    NoAllocation,
    OutOfTime,
    Unsolved,
    Vec,
    allocate,
    fair_shares,
    solve_round,
)
from placer.fleet.allocproblem import misses
from placer.fleet.inner import JobPlanner, alloc_problem
from placer.fleet.result import FleetResult, SharedUse, team_usage
from placer.fleet.sharedplan import SharedRollouts
from placer.fleet.sharing import as_written
from placer.fleet.spec import Fleet

Progress = Callable[[str], None]
CHECK_S = 5.0  # the most one diagnosis check (the fleet less one job) may solve for
DIAGNOSIS_S = 30.0  # the diagnosis's time when the search has used up its own


def plan_fleet(fleet: Fleet, calib: Calibration, *, time_limit_s: float = 60.0,
               job_time_limit_s: float = 5.0, workers: int = 2, seed: int = 0,
               progress: Progress | None = None) -> FleetResult:
    """The fleet's allocation and each job's plan on it (module docstring)."""
    planner = JobPlanner(fleet, calib, job_time_limit_s, seed, workers)
    try:
        return _plan(planner, time_limit_s, workers, seed, progress)
    finally:
        planner.close()


def _plan(planner: JobPlanner, time_limit_s: float, workers: int, seed: int,
          progress: Progress | None) -> FleetResult:
    deadline = time.monotonic() + time_limit_s
    fleet = planner.fleet
    if progress is not None:
        progress(f"fleet: {len(fleet.jobs)} jobs: their allocation grids, then each on all its "
                 "team may hold")
    rollouts = SharedRollouts(planner)
    pr = rollouts.extend(alloc_problem(planner))
    if progress is not None:
        progress(f"fleet: grids of {sum(len(job.grid) for job in pr.jobs)} allocations; "
                 f"{len(set(planner.kind_of))} kinds of job to plan")
    _check_jobs(pr, planner, rollouts)
    if progress is not None:
        progress(f"fleet: {pr.evaluated()} job plans priced (each kind on its fair share, "
                 "or on its cap where that does not fit)")

    def on_round(r: int, evaluated: int, best: float | None, bound: float) -> None:
        if progress is not None:
            shown = "none yet" if best is None else f"{best:.4g}"
            progress(f"fleet: round {r}: {evaluated} job plans priced; best {fleet.objective} "
                     f"{shown}, bound {bound:.4g}")

    try:
        a = allocate(pr, time_limit_s=max(deadline - time.monotonic(), 1.0), workers=workers,
                     seed=seed, on_round=on_round)
    except OutOfTime as e:
        raise TimedOut(timed_out(str(e), time_limit_s, time.monotonic() >= deadline)) from None
    except NoAllocation as e:  # proven: the model over the optimistic times has no solution
        budget = max(deadline - time.monotonic(), DIAGNOSIS_S)
        raise Infeasible(diagnose(pr, planner, str(e), budget)) from None
    jobs, engines, vectors, chosen = rollouts.results(a)
    choices = rollouts.priced_alternatives(pr, a, deadline, workers, seed)
    shared = []
    cpu_groups = pr.shared[:rollouts.offset]  # declared CPU pools; chosen ones: `results`
    for g in cpu_groups:  # each member's cost: its time shared against alone on its nodes
        alone = [planner.alone(j, a.vectors[j]) for j in g.members]
        for j, t in zip(g.members, alone):
            jobs[j] = replace(jobs[j], shared_pool=pr.pools[g.pool], alone_iteration_s=t,
                              plan=as_written(jobs[j].plan, fleet.jobs[j].job))
        shared.append(SharedUse(pr.pools[g.pool], a.vectors[g.members[0]][g.pool],
                                [jobs[j].name for j in g.members],
                                [jobs[j].iteration_s for j in g.members], alone))
    inner_gap = max(j.plan.solver.gap for j in jobs)
    groups = pr.shared[:len(cpu_groups)] + rollouts.active_groups(a.vectors)
    return FleetResult(fleet.name, fleet.objective, jobs, team_usage(fleet, vectors, groups),
                       a.objective, a.bound, a.gap, a.optimal, a.not_monotone, inner_gap, a.rounds,
                       a.evaluated, sum(len(job.grid) for job in pr.jobs), a.solve_s,
                       shared + chosen, engines, choices)


def _nodes(planner: JobPlanner, a: Vec) -> str:
    return ", ".join(f"{p}: {n} node{'s' * (n != 1)}" for p, n in planner.nodes_of(a).items()
                     if n) or "no nodes"


def _check_jobs(pr: AllocProblem, planner: JobPlanner, rollouts: SharedRollouts) -> None:
    """Each job alone on the most its team may hold: placed, and within its limits. Where the
    fair shares exist (`alloc.fair_shares`, the search's first incumbent) they are planned
    first: a job placed within its limits on its share is so on its top, which holds at least
    as many nodes of every pool (more nodes never slow the planner's optimum, the monotone
    bound the allocation search rests on), so only the other jobs' tops are planned here."""
    shares = fair_shares(pr)
    if shares is not None:
        pr.fetch(list(enumerate(shares)))
    done = {j for j, a in enumerate(shares or []) if j not in pr.optional()
            and (t := pr.known[j].get(a)) is not None and not misses(pr.jobs[j], t)}
    pr.fetch([(j, max(job.grid, key=sum)) for j, job in enumerate(pr.jobs)
              if job.grid and j not in done])
    for j, job in enumerate(pr.jobs):
        if j in pr.optional() or j in done:
            continue  # either flavour may be the one that fits; placed within its limits
        if not job.grid:
            raise Infeasible(f"job {job.name}: team {job.team}'s quota gives it no nodes of a "
                             "pool its roles can run on")
        top = max(job.grid, key=sum)
        t = pr.evaluate(j, top)
        if t is None:
            raise Infeasible(f"job {job.name}: cannot be placed even on all its team "
                             f"{job.team} may hold ({_nodes(planner, top)}): "
                             f"{rollouts.reason(j, top)}")
        if job.max_iteration_s is not None and t > job.max_iteration_s:
            raise Infeasible(f"job {job.name}: misses its deadline or minimum throughput even on "
                             f"all its team {job.team} may hold ({_nodes(planner, top)}): an "
                             f"iteration takes {t:.4g} s, it may take at most "
                             f"{job.max_iteration_s:.4g} s")


def timed_out(what: str, time_limit_s: float, spent: bool) -> str:
    """Why the allocation search stopped without an allocation, and how to give it more time:
    `--time-limit` when the search used it up (`spent`), else a single round of the model ran
    its longest (`MAX_ROUND_S`) without a solution, which more search workers may find."""
    more = (f"give it more time with --time-limit S (it had {time_limit_s:g} s)" if spent else
            f"a round of the allocation model may run at most {MAX_ROUND_S:g} s; more CP-SAT "
            "search workers (--workers N) may find a first solution sooner")
    return (f"the allocation search found no allocation before its time ran out ({what}); "
            f"this is not proof that the fleet cannot fit: {more}")


def diagnose(pr: AllocProblem, planner: JobPlanner, why: str, limit_s: float = DIAGNOSIS_S
             ) -> str:
    """Which pool, quota or cohort the jobs' smallest allocations overflow; else the job whose
    removal lets the others fit, each removal solved for at most `CHECK_S` seconds and all of
    them within `limit_s`. A removal whose model runs out of time settles nothing: the
    diagnosis names the jobs it could not try instead of reading them as not fitting."""
    end = time.monotonic() + limit_s
    least = [pr.zero if j in pr.optional() else pr.held(j, _least(pr, j))  # a shared pool once
             for j in range(len(pr.jobs))]
    for p, pool in enumerate(pr.pools):
        need = {job.name: m[p] for job, m in zip(pr.jobs, least) if m[p]}
        if sum(need.values()) > pr.nodes[p]:
            return (f"pool {pool}: the jobs need at least {sum(need.values())} nodes "
                    f"({_named(need)}); it has {pr.nodes[p]}")
        for tq in pr.teams.values():
            mine = {job.name: m[p] for job, m in zip(pr.jobs, least) if job.team == tq.name
                    and m[p]}
            if sum(mine.values()) > tq.cap[p]:
                return (f"pool {pool}: team {tq.name}'s jobs need at least {sum(mine.values())} "
                        f"nodes ({_named(mine)}); its quota allows {tq.cap[p]}")
    fair = _fairness(pr, least)
    if fair is not None:
        return fair
    unsettled = []
    for j, job in enumerate(pr.jobs):
        if pr.choices:
            break  # a choice's jobs are indexed: removing one would leave it pointing astray
        left = end - time.monotonic()
        if left <= 0:
            unsettled.append(job.name)
            continue
        rest = replace(pr, jobs=pr.jobs[:j] + pr.jobs[j + 1:],
                       known=pr.known[:j] + pr.known[j + 1:], lows=pr.lows[:j] + pr.lows[j + 1:])
        try:
            solve_round(rest, min(CHECK_S, left), 1, 0)
        except Unsolved:  # out of time: not proof that the others do not fit either
            unsettled.append(job.name)
            continue
        except NoAllocation:
            continue
        return (f"job {job.name} (team {job.team}): does not fit beside the others; its "
                f"smallest allocation is {_nodes(planner, least[j])}: {why}")
    if unsettled:
        return (f"no allocation of the fleet meets the quotas: {why}; whether the others fit "
                f"without {_listed(unsettled)} was not settled in the diagnosis's "
                f"{limit_s:g} s (a longer --time-limit gives it more)")
    return f"no allocation of the fleet meets the quotas: {why}"


def _listed(names: list[str]) -> str:
    shown = ", ".join(f"job {n}" for n in names[:5])
    return shown + (f" or {len(names) - 5} more" if len(names) > 5 else "")


def _fairness(pr: AllocProblem, least: list[Vec]) -> str | None:
    """A team that must borrow a pool where the others' nominal shares, which they keep while
    anyone borrows, leave too little for it."""
    for p, pool in enumerate(pr.pools):
        for tq in pr.teams.values():
            mine = {job.name: m[p] for job, m in zip(pr.jobs, least) if job.team == tq.name
                    and m[p]}
            if tq.cohort is None or sum(mine.values()) <= tq.nominal[p]:
                continue
            others = [o for o in pr.teams.values() if o.cohort == tq.cohort and o is not tq]
            kept = {o.name: max(min(o.nominal[p], pr.demand(o.name, p)),
                                sum(m[p] for job, m in zip(pr.jobs, least) if job.team == o.name))
                    for o in others}
            if sum(mine.values()) + sum(kept.values()) > sum(
                    t.nominal[p] for t in pr.teams.values() if t.cohort == tq.cohort):
                total = sum(t.nominal[p] for t in pr.teams.values() if t.cohort == tq.cohort)
                return (f"pool {pool}: team {tq.name}'s jobs need at least {sum(mine.values())} "
                        f"nodes ({_named(mine)}), beyond its nominal {tq.nominal[p]}; the other "
                        f"teams of cohort {tq.cohort} keep their nominal shares while a team "
                        f"borrows ({_named(kept)}), and the cohort has {total}")
    return None


def _least(pr: AllocProblem, j: int) -> Vec:
    """Per pool, the fewest nodes any still-possible vector of job j takes."""
    ok = [a for a in pr.jobs[j].grid if _possible(pr, j, a)]
    return tuple(min((a[p] for a in ok), default=0) for p in range(len(pr.pools)))


def _possible(pr: AllocProblem, j: int, a: Vec) -> bool:
    t, _ = pr.bound(j, a)
    limit = pr.jobs[j].max_iteration_s
    return t is not None and (limit is None or t <= limit)


def _named(need: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in need.items())
