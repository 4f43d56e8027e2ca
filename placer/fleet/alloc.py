"""The fleet's allocation model: whole nodes of each pool to each job, under team quotas (CP-SAT).

Notation. Jobs j (team t(j), weight w_j, iterations I_j), pools p of N_p nodes, teams t with
nominal quota n_tp, cap c_tp (nominal plus borrowing limit, `Fleet.team_cap`) and cohort k(t).
Each job chooses one allocation vector a in a finite grid A_j (`placer.fleet.inner`): per
pool, 0, the powers of two below its cap, and the cap (0 only, for a pool none of its roles can
use), less the vectors on which some role has no candidate layout that fits. T_j(a) is the
job's iteration time on the cluster restricted to a, from the job-level planner
(`JobPlanner.time`), computed only at the vectors the search visits and memoised.

Model. x_ja in {0, 1}, sum_a x_ja = 1. u_tp = sum_{j of t} sum_a a_p x_ja, and
  capacity       sum_j sum_a a_p x_ja <= N_p
  quota          u_tp <= c_tp
  cohort         sum_{t in k} u_tp <= sum_{t in k} n_tp  (a team alone: u_tp <= n_tp)
  fairness       b_kp = 1 if any team of cohort k borrows pool p (u_tp <= n_tp + c_tp b_kp);
                 then every team of k holds at least min(n_tp, D_tp) (u_tp >= min(n, D) b_kp),
                 D_tp = the most its jobs could use (the sum of their grids' largest a_p): no
                 team falls below its nominal share while another borrows
  shared pool    the members of a shared CPU pool g on pool P hold one count of it,
                 sum_a a_P x_ja = sum_a a_P x_ka, charged once (`placer.fleet.sharing`): a_p
                 above, in capacity, quotas and demand, is `charged(j, a)`
  choice         a shared pool the allocation may use or not (`Choice`): its members are extra
                 jobs, the shared flavours of the jobs `alone`; each of both flavours may take
                 the zero vector z (off, time infinite, objective term 0), and a boolean s_c
                 per choice ties them: x_jz = s_c for every alone flavour, x_ez = 1 - s_c for
                 every shared one (`forced` fixes s_c, to price the option not chosen)
  service        x_ja = 0 where T_j(a) exceeds the job's deadline or minimum throughput
  symmetry       jobs j < k of one kind (`AllocJob.kind`: one time function, the same team,
                 weight, iterations, limit and grid; `twins`) take vectors in grid order,
                 sum_a r(a) x_ja <= sum_a r(a) x_ka with r(a) a's index in the grid: swapping
                 their vectors changes no constraint and no objective, so this cuts only
                 permutations of one allocation.
The problem and its memo are `placer.fleet.allocproblem`; the CP-SAT model of one round is
`placer.fleet.allocmodel`; this module is the lazy loop over them.
Objective: throughput, max sum_j w_j 3600 / T_j(a) x_ja (iterations per hour); or makespan,
min M with M >= sum_a I_j T_j(a) x_ja. Both are linear in x, the coefficients scaled to integers.

Lazy evaluation. T_j is known only where evaluated. More nodes never make the planner's optimum
slower (it may leave nodes idle), so T_j(a) >= T_j(b) for every evaluated b >= a, and a is
infeasible when an evaluated b >= a is; and T_j(a) >= F_j(a), the job's floor there, from its
cost table on its cap (`placer.fleet.floors`). Each round solves the model with T_j(a) replaced
by the larger of these optimistic bounds where a is not evaluated, evaluates the vectors it
chose, and stops when every chosen vector was already evaluated: the solution is then optimal
over the grids (up to CP-SAT's own gap). Before the first round the fair shares are planned
(the first incumbent), and each grid's top where no floor bounds it or the tops are expected
(at the pace of the plans so far) within half the time left; on a large fleet the others wait
for a round to choose them, so a first round is solved sooner. A round whose chosen vectors'
plans are not expected within the time left ends the search with the incumbent and its bound.
One kind's jobs share one memo (`known`), and a round's new vectors are computed together
(`prefetch`, in parallel by the caller). A round whose model finds no solution in its time
limit (a large model's presolve) is retried with twice the limit;
until an incumbent exists a round gets its full limit, and after, at most the time left less
`FINISH_S` (what follows the last round). The incumbent is each round's complete hint, so a
large fleet's round has a solution as soon as its presolve ends. The bound reported (the best objective
still possible) is the tightest of the rounds' optimistic bounds; the incumbent is the best
solution whose times are all evaluated. Job plans that stop at their time limit are incumbents:
each round's bound uses their proven lower bounds, not their times (`placer.fleet.allocproblem`,
`allocmodel.fleet_bound`), so the gap counts how far each job plan may be from its own optimum
too. So the gap is relative to (1) the grids of allocation vectors (thinned on a large fleet:
`placer.fleet.inner`), (2) the monotone bound holding (pairs that break it are counted), (3) the
integer scaling of the coefficients (1e-9 of the largest). Of the allocations as good as the
incumbent, the one holding the fewest nodes is kept (`fewest_nodes`): a node that no job would
run faster with stays free. Ties (in a round, and among the fewest-node allocations) go to the
canonical allocation, each job in order on its earliest vector in sorted order
(`allocmodel.canonical_levels`), so the vectors a round evaluates and the allocation returned
do not move with CP-SAT's workers, seed or load wherever each level is proven.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from placer.fleet.allocmodel import SCALE, fewest_nodes, solve_round, twins
from placer.fleet.allocproblem import (
    Allocation,
    AllocJob,
    AllocProblem,
    NoAllocation,
    OutOfTime,
    TeamQuota,
    Unsolved,
    Vec,
    misses,
)
from placer.fleet.relax import lagrange_bound
from placer.fleet.sharing import consistent

__all__ = ["MAX_ROUND_S", "SCALE", "AllocJob", "AllocProblem", "Allocation", "NoAllocation",
           "OutOfTime", "TeamQuota", "Unsolved", "Vec", "allocate", "fair_shares", "fewest_nodes",
           "solve_round", "twins"]

MAX_ROUND_S = 80.0  # the longest one round's model may run before the search gives up
# left by a round with an incumbent for what follows its CP-SAT solve (its model's build and
# bound, the fewest-nodes re-solve, the Lagrange bound: about 2 s on the 64-job bench fleet),
# so the search ends within its time limit
FINISH_S = 3.0


def allocate(pr: AllocProblem, *, time_limit_s: float = 60.0, round_limit_s: float = 5.0,
             workers: int = 2, seed: int = 0,
             on_round: Callable[[int, int, float | None, float], None] | None = None
             ) -> Allocation:
    """The lazy loop (module docstring). `on_round(round, evaluated, incumbent, bound)` reports
    progress; stops early at `time_limit_s` with the incumbent and its gap."""
    start = time.monotonic()
    tops = [(j, a) for j, job in enumerate(pr.jobs) for a in _maximal(job.grid)]
    shares = fair_shares(pr)
    # the fair shares, an incumbent from the start, bound the vectors below them; the top of
    # each grid bounds every vector below it: planned first where there are no fair shares,
    # where floors do not bound every vector of the grid, or where the tops are expected
    # within half the time left (else floors bound them until a round chooses them: a first
    # round sooner)
    loose = {j for j, job in enumerate(pr.jobs) if any(pr.floor(j, a) <= 0.0 for a in job.grid)}
    first = tops if shares is None else [(j, a) for j, a in enumerate(shares)] + [
        (j, a) for j, a in tops if j in loose]
    pr.fetch(first)
    if pr.fits_in(tops, (time_limit_s - (time.monotonic() - start)) / 2):
        pr.fetch(tops)
    best: tuple[float, list[Vec]] | None = None
    if shares is not None:
        best = _keep_best(pr, None, shares)
    # every job at its tops' lower bound: a bound before any round (T_j(a) >= L_j(top))
    fastest = [_fastest(pr, j) for j in range(len(pr.jobs))]
    bound = (_objective(pr, [t for t in fastest if t is not None])
             if None not in fastest and not (pr.choices and pr.objective == "makespan")
             else float("inf") if pr.objective == "throughput" else 0.0)
    rounds, proven, r = 0, False, None
    while True:
        rounds += 1
        left = time_limit_s - (time.monotonic() - start)
        # until there is an incumbent, a round gets its full limit whatever time is left
        limit = (round_limit_s if best is None
                 else min(round_limit_s, max(left - FINISH_S, 1.0)))
        try:
            r = solve_round(pr, limit, workers, seed, best[1] if best else None)
        except Unsolved:
            if best is not None and left <= round_limit_s:
                break
            if round_limit_s >= MAX_ROUND_S:
                raise OutOfTime(f"the allocation model found no solution in {limit:g} s"
                                ) from None
            round_limit_s *= 2  # a large model's presolve alone may outlast a round
            continue
        better = min if pr.objective == "throughput" else max
        bound = better(bound, r.bound)  # it holds whether or not CP-SAT proved it
        chosen = list(enumerate(r.vectors))
        if (best is not None and not r.exact
                and not pr.fits_in(chosen, time_limit_s - (time.monotonic() - start))):
            if on_round is not None:
                on_round(rounds, pr.evaluated(), best[0], bound)
            break  # its plans are not expected in the time left: the incumbent, this bound
        pr.fetch(chosen)
        best = _keep_best(pr, best, r.vectors)
        if on_round is not None:
            on_round(rounds, pr.evaluated(), best[0] if best else None, bound)
        proven = r.exact and r.proven
        if r.exact or time.monotonic() - start > time_limit_s:
            break
    if best is None:
        raise OutOfTime(f"no allocation found within the time limit ({time_limit_s:g} s)")
    obj, vecs = best
    vecs = fewest_nodes(pr, vecs, workers, seed)
    times = [t for j, a in enumerate(vecs) if (t := pr.known[j][a]) is not None]
    obj = _objective(pr, times)
    if not (r is not None and r.exact and r.proven):  # else the round's bound is the optimum
        better = min if pr.objective == "throughput" else max
        relaxed = lagrange_bound(pr, obj)  # every node priced: a bound with no round solved
        bound = bound if relaxed is None else better(bound, relaxed)
    gap = _gap(pr.objective, obj, bound)
    return Allocation(vecs, times, obj, bound, gap,
                      proven and gap == 0.0 and pr.not_monotone == 0, pr.not_monotone, rounds,
                      pr.evaluated(), time.monotonic() - start)


def fair_shares(pr: AllocProblem) -> list[Vec] | None:
    """Each job's largest grid vector within an equal split of its team's nominal quota among
    the team's jobs (None if some job has none): no team borrows and every pool holds them, so
    the quotas hold; a first incumbent, and a first bound below the tops."""
    if any(pr.forced.values()):
        return None  # an allocation that must share: the alone fair shares are not one
    off = {e for c in pr.choices for e in pr.shared[c.group].members}
    out: list[Vec] = []
    for j, job in enumerate(pr.jobs):
        if j in off:
            out.append(pr.zero)
            continue
        tq = pr.teams[job.team]
        n = sum(1 for k, o in enumerate(pr.jobs) if o.team == job.team and k not in off)
        share = [k // n for k in tq.nominal]
        fit = [a for a in job.grid if all(x <= y for x, y in zip(a, share))]
        if not fit:
            return None
        out.append(max(fit, key=lambda a: (sum(a), a)))
    if not consistent(pr.shared, out) or any(
            sum(pr.held(j, a)[p] for j, a in enumerate(out)) > n for p, n in enumerate(pr.nodes)):
        return None
    return out


def _keep_best(pr: AllocProblem, best: tuple[float, list[Vec]] | None, vecs: list[Vec]
               ) -> tuple[float, list[Vec]] | None:
    """The incumbent: the chosen vectors, now evaluated, if each placed and met its limits."""
    times = [pr.known[j][a] for j, a in enumerate(vecs)]
    if any(t is None for t in times):
        return best
    if any(t is not None and misses(job, t) for job, t in zip(pr.jobs, times)):
        return best
    obj = _objective(pr, [t for t in times if t is not None])
    if best is None or (obj > best[0] if pr.objective == "throughput" else obj < best[0]):
        return obj, list(vecs)
    return best


def _objective(pr: AllocProblem, times: list[float]) -> float:
    vals = [pr.value(j, t) for j, t in enumerate(times)]
    return sum(vals) if pr.objective == "throughput" else max(vals)


def _gap(objective: str, obj: float, bound: float) -> float:
    """Relative gap between the incumbent and the best value still possible (below the
    coefficients' scaling error: 0)."""
    if math.isinf(bound):
        return 1.0  # a job plan without a bound (its solver stopped before any): none known
    gap = (bound - obj) / bound if objective == "throughput" else (obj - bound) / obj
    return 0.0 if gap < 1e-6 else min(gap, 1.0)


def _fastest(pr: AllocProblem, j: int) -> float | None:
    """A lower bound on job j's time on any vector of its grid: the least over its tops of
    their plans' proven lower bounds, or of their floors where not planned (`pr.lower`); None
    where no top is known to place it."""
    lows = [pr.lower(j, a) for a in _maximal(pr.jobs[j].grid)]
    return min((t for t in lows if t is not None), default=None)


def _maximal(grid: Sequence[Vec]) -> list[Vec]:
    """The vectors of the grid no other vector of it dominates, in grid order. A vector that
    dominates another has a larger sum, and dominance is transitive, so each vector is checked
    only against the maximal ones of larger sum (a large fleet's grid has hundreds of vectors
    and a handful of maximal ones: all pairs cost seconds per round)."""
    top: list[Vec] = []
    for a in sorted(set(grid), key=sum, reverse=True):
        if not any(all(x <= y for x, y in zip(a, b)) for b in top):
            top.append(a)
    kept = set(top)
    return [a for a in grid if a in kept]
