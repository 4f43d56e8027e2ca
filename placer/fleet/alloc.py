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
Objective: throughput, max sum_j w_j 3600 / T_j(a) x_ja (iterations per hour); or makespan,
min M with M >= sum_a I_j T_j(a) x_ja. Both are linear in x, the coefficients scaled to integers.

Lazy evaluation. T_j is known only where evaluated. More nodes never make the planner's optimum
slower (it may leave nodes idle), so T_j(a) >= T_j(b) for every evaluated b >= a, and a is
infeasible when an evaluated b >= a is. Each round solves the model with T_j(a) replaced by this
optimistic bound where a is not evaluated, evaluates the vectors it chose, and stops when every
chosen vector was already evaluated: the solution is then optimal over the grids (up to CP-SAT's
own gap). One kind's jobs share one memo (`known`), and a round's new vectors are computed
together (`prefetch`, in parallel by the caller). A round whose model finds no solution in its
time limit (a large model's presolve) is retried with twice the limit; until an incumbent
exists a round gets its full limit. The bound reported (the best objective still possible) is
the tightest of the rounds' optimistic bounds; the incumbent is the best solution whose times
are all evaluated. So the gap is relative to (1) the grids of allocation vectors (thinned on a
large fleet: `placer.fleet.inner`), (2) the job-level plans being optimal (their own largest gap
is reported), (3) the integer scaling of the coefficients (1e-9 of the
largest). Of the allocations as good as the incumbent, the one holding the fewest nodes is kept
(`fewest_nodes`): a node that no job would run faster with stays free.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from placer.fleet.sharing import Choice, ShareGroup, charged, consistent

Vec = tuple[int, ...]
SCALE = 1_000_000_000  # the largest objective coefficient, after scaling to integers
MAX_ROUND_S = 80.0  # the longest one round's model may run before the search gives up


@dataclass(frozen=True)
class TeamQuota:
    """One team's quota per pool (in the pools' order), in nodes."""

    name: str
    cohort: str | None
    nominal: Vec
    cap: Vec


@dataclass(frozen=True)
class AllocJob:
    name: str
    team: str
    weight: float
    iterations: int
    grid: tuple[Vec, ...]
    max_iteration_s: float | None = None
    kind: int | None = None  # jobs of one kind are interchangeable (one time function)


@dataclass
class AllocProblem:
    """What the master model needs: pools, teams, jobs with grids, and the time function."""

    pools: tuple[str, ...]
    nodes: Vec
    teams: dict[str, TeamQuota]
    jobs: list[AllocJob]
    objective: str  # "throughput" | "makespan"
    time_of: Callable[[int, Vec], float | None]  # job index, vector -> seconds (None: no plan)
    # computes a batch of (job, vector) pairs ahead of `time_of` (in parallel, say)
    prefetch: Callable[[list[tuple[int, Vec]]], None] | None = None
    known: list[dict[Vec, float | None]] = field(default_factory=list)
    not_monotone: int = 0  # evaluated pairs where fewer nodes were faster (the bound failed)
    shared: tuple[ShareGroup, ...] = ()  # pools several jobs share (one count, charged once)
    choices: tuple[Choice, ...] = ()  # shared pools the allocation may use or not
    forced: dict[int, bool] = field(default_factory=dict)  # choice -> fixed share or not

    def __post_init__(self) -> None:
        if not self.known:  # one memo per kind: an identical job's times are the same
            shared: dict[int, dict[Vec, float | None]] = {}
            self.known = [{} if job.kind is None else shared.setdefault(job.kind, {})
                          for job in self.jobs]
        for j in self.optional():
            self.known[j][self.zero] = math.inf  # off: no time, no term in the objective

    @property
    def zero(self) -> Vec:
        return (0,) * len(self.pools)

    def optional(self) -> set[int]:
        """The jobs that may be off: both flavours of every choice's jobs."""
        return {j for c in self.choices for j in (*c.alone, *self.shared[c.group].members)}

    def options(self, j: int) -> tuple[Vec, ...]:
        """Job j's vectors: its grid, and the zero vector (off) for a choice's job."""
        grid = self.jobs[j].grid
        return grid + (self.zero,) if j in self.optional() else grid

    def evaluate(self, j: int, a: Vec) -> float | None:
        """T_j(a), memoised; counts each pair of evaluated vectors that breaks the monotone
        bound (fewer nodes faster, or placed where more nodes were not)."""
        if a not in self.known[j]:
            t = self.time_of(j, a)
            for b, tb in self.known[j].items():
                if tb is not None and math.isinf(tb):
                    continue  # off (a choice's zero vector): no plan to compare with
                if (_within(a, b) and _faster(t, tb)) or (_within(b, a) and _faster(tb, t)):
                    self.not_monotone += 1
            self.known[j][a] = t
        return self.known[j][a]

    def fetch(self, pairs: list[tuple[int, Vec]]) -> None:
        """Evaluate these pairs (the new ones computed together first, by `prefetch`)."""
        new = [(j, a) for j, a in pairs if a not in self.known[j]]
        if self.prefetch is not None and len(new) > 1:
            self.prefetch(new)
        for j, a in new:
            self.evaluate(j, a)

    def evaluated(self) -> int:
        """Time functions evaluated: each kind's once (a choice's zero vector is none)."""
        return sum(1 for k in {id(k): k for k in self.known}.values() for t in k.values()
                   if t is None or not math.isinf(t))

    def bound(self, j: int, a: Vec) -> tuple[float | None, bool]:
        """(the optimistic time of `a`, whether it is exact); None: `a` cannot be placed."""
        if a in self.known[j]:
            return self.known[j][a], True
        best = 0.0
        for b, t in self.known[j].items():
            if all(x <= y for x, y in zip(a, b)):
                if t is None:
                    return None, True
                best = max(best, t)
        return best, False

    def value(self, j: int, t: float) -> float:
        """Job j's term of the objective at iteration time t (infinite: off, no term)."""
        if math.isinf(t):
            return 0.0
        job = self.jobs[j]
        return job.weight * 3600 / t if self.objective == "throughput" else job.iterations * t

    def demand(self, team: str, p: int) -> int:
        """The most nodes of pool p the team's jobs could use (a choice's job: the larger of
        its two flavours, counted once)."""
        flavour = {e: c.alone[i] for c in self.choices
                   for i, e in enumerate(self.shared[c.group].members)}
        most: dict[int, int] = {}
        for j, job in enumerate(self.jobs):
            if job.team == team:
                k = flavour.get(j, j)
                most[k] = max(most.get(k, 0), *(charged(self.shared, j, a)[p] for a in job.grid))
        return sum(most.values())

    def held(self, j: int, a: Vec) -> Vec:
        """The nodes job j's vector `a` is charged (a shared pool at its first member only)."""
        return charged(self.shared, j, a)


@dataclass
class Allocation:
    """The result: a vector per job, its time, the objective, the bound and the gap."""

    vectors: list[Vec]
    times: list[float]
    objective: float
    bound: float
    gap: float
    optimal: bool  # every chosen time evaluated, CP-SAT proved its model, the bound held
    not_monotone: int  # evaluated pairs that broke the monotone bound
    rounds: int
    evaluated: int
    solve_s: float


class NoAllocation(Exception):
    """The master model has no solution (over the optimistic bounds: truly none on the grids)."""


class Unsolved(NoAllocation):
    """One round's model found no solution in its time limit (not proof that none exists)."""


class OutOfTime(NoAllocation):
    """The time limit passed before any allocation whose times were all evaluated was found."""


@dataclass
class _Round:
    vectors: list[Vec]
    exact: bool
    objective: float  # of the model's values (optimistic where not exact)
    bound: float
    proven: bool


def _model(pr: AllocProblem, values: list[dict[Vec, float]]
           ) -> tuple[cp_model.CpModel, list[dict[Vec, cp_model.IntVar]], float,
                      cp_model.LinearExprT]:
    """The master model over the vectors with a value; returns (model, x, objective scale,
    the objective's expression)."""
    m = cp_model.CpModel()
    x = [{a: m.new_bool_var(f"x{j}_{i}") for i, a in enumerate(vals)}
         for j, vals in enumerate(values)]
    for xs in x:
        m.add_exactly_one(xs.values())
    _symmetry(pr, m, x)
    _choices(pr, m, x)
    for g in pr.shared:
        for first, second in zip(g.members, g.members[1:]):
            m.add(sum(a[g.pool] * v for a, v in x[first].items())
                  == sum(a[g.pool] * v for a, v in x[second].items()))
    for p, n in enumerate(pr.nodes):
        m.add(sum(pr.held(j, a)[p] * v for j, xs in enumerate(x) for a, v in xs.items()) <= n)
    use: dict[str, list[cp_model.LinearExprT]] = {}
    for t in pr.teams:
        use[t] = [sum(pr.held(j, a)[p] * v for j, xs in enumerate(x) if pr.jobs[j].team == t
                      for a, v in xs.items()) for p in range(len(pr.pools))]
    _quotas(pr, m, use)
    top = max((v for vals in values for v in vals.values()), default=1.0) or 1.0
    k = SCALE / top
    terms = [int(round(vals[a] * k)) * v for vals, xs in zip(values, x) for a, v in xs.items()]
    if pr.objective == "throughput":
        total = sum(terms)
        m.maximize(total)
        return m, x, k, total
    mk = m.new_int_var(0, SCALE, "makespan")
    for vals, xs in zip(values, x):
        m.add(mk >= sum(int(round(vals[a] * k)) * v for a, v in xs.items()))
    m.minimize(mk)
    return m, x, k, mk


def _choices(pr: AllocProblem, m: cp_model.CpModel, x: list[dict[Vec, cp_model.IntVar]]
             ) -> None:
    """Per choice, one boolean: share (every shared flavour on, every alone flavour off) or not."""
    z = pr.zero
    for c, ch in enumerate(pr.choices):
        share = m.new_bool_var(f"share_{c}")
        if c in pr.forced:
            m.add(share == int(pr.forced[c]))
        for j, e in zip(ch.alone, pr.shared[ch.group].members):
            m.add(x[j][z] == share)
            m.add(x[e][z] == 1 - share)


def twins(pr: AllocProblem) -> list[tuple[int, int]]:
    """Pairs (j, k), j < k, of jobs of one kind, each with the next of its kind: the same time
    function, team, weight, iterations, limit, grid and shared pool (a shared pool's first
    member is charged its nodes: it has no twin), so swapping their vectors changes nothing."""
    last: dict[tuple[object, ...], int] = {}
    out = []
    optional = pr.optional()
    for k, job in enumerate(pr.jobs):
        group = next((g for g in pr.shared if k in g.members), None)
        if job.kind is None or (group is not None and k == group.members[0]) or k in optional:
            continue
        key = (job.kind, group, job.team, job.weight, job.iterations, job.max_iteration_s, job.grid)
        if key in last:
            out.append((last[key], k))
        last[key] = k
    return out


def _symmetry(pr: AllocProblem, m: cp_model.CpModel,
              x: list[dict[Vec, cp_model.IntVar]]) -> None:
    """Symmetry breaking: of two interchangeable jobs the first takes a vector no later in their
    grid than the second's, so CP-SAT does not search the permutations of one allocation."""
    for j, k in twins(pr):
        rank = {a: i for i, a in enumerate(pr.jobs[j].grid)}
        m.add(sum(rank[a] * v for a, v in x[j].items())
              <= sum(rank[a] * v for a, v in x[k].items()))


def _quotas(pr: AllocProblem, m: cp_model.CpModel,
            use: dict[str, list[cp_model.LinearExprT]]) -> None:
    cohorts: dict[str | None, list[TeamQuota]] = {}
    for tq in pr.teams.values():
        cohorts.setdefault(tq.cohort, []).append(tq)
    for cohort, teams in cohorts.items():
        for p in range(len(pr.pools)):
            for tq in teams:
                m.add(use[tq.name][p] <= tq.cap[p])
                if cohort is None:
                    m.add(use[tq.name][p] <= tq.nominal[p])
            if cohort is None:
                continue
            m.add(sum(use[tq.name][p] for tq in teams) <= sum(tq.nominal[p] for tq in teams))
            borrows = m.new_bool_var(f"borrow_{cohort}_{p}")
            for tq in teams:
                m.add(use[tq.name][p] <= tq.nominal[p] + tq.cap[p] * borrows)
                floor = min(tq.nominal[p], pr.demand(tq.name, p))
                m.add(use[tq.name][p] >= floor * borrows)


def solve_round(pr: AllocProblem, limit_s: float, workers: int, seed: int,
                hint: list[Vec] | None = None) -> _Round:
    """The master model over the optimistic times; `hint`: the last round's vectors. Raises
    NoAllocation when the model has no solution, Unsolved when its time limit passed first."""
    values: list[dict[Vec, float]] = []
    exact: list[dict[Vec, bool]] = []
    for j, job in enumerate(pr.jobs):
        vals, ex = {}, {}
        for a in pr.options(j):
            t, is_exact = pr.bound(j, a)
            if t is None:
                continue
            if _misses(job, t):
                continue  # the bound already misses the deadline: so does the time
            vals[a], ex[a] = pr.value(j, t), is_exact
        values.append(vals)
        exact.append(ex)
    if any(not v for v in values):
        raise NoAllocation("a job has no allocation left")
    m, x, k, _ = _model(pr, values)
    for xs, a in zip(x, hint or []):
        if a in xs:
            m.add_hint(xs[a], 1)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(limit_s, 0.1)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.cp_model_probing_level = 0  # probing a large fleet's model outlasts a round
    status = solver.solve(m)
    if status == cp_model.INFEASIBLE:
        raise NoAllocation("no allocation meets the quotas")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise Unsolved("the allocation model found no solution in its time limit")
    chosen = [next(a for a, v in xs.items() if solver.value(v)) for xs in x]
    return _Round(chosen, all(exact[j][a] for j, a in enumerate(chosen)),
                  solver.objective_value / k, solver.best_objective_bound / k,
                  status == cp_model.OPTIMAL)


def allocate(pr: AllocProblem, *, time_limit_s: float = 60.0, round_limit_s: float = 5.0,
             workers: int = 2, seed: int = 0,
             on_round: Callable[[int, int, float | None, float], None] | None = None
             ) -> Allocation:
    """The lazy loop (module docstring). `on_round(round, evaluated, incumbent, bound)` reports
    progress; stops early at `time_limit_s` with the incumbent and its gap."""
    start = time.monotonic()
    tops = [(j, a) for j, job in enumerate(pr.jobs) for a in _maximal(job.grid)]
    shares = fair_shares(pr)
    # the top of each grid bounds every vector below it; the fair shares, an incumbent from the
    # start, bound the vectors below them
    pr.fetch(tops + [(j, a) for j, a in enumerate(shares or [])])
    best: tuple[float, list[Vec]] | None = None
    if shares is not None:
        best = _keep_best(pr, None, shares)
    # every job at its top's time: a bound before any round (T_j(a) >= T_j(top) on the grid)
    fastest = [min((t for a in _maximal(job.grid) if (t := pr.known[j].get(a)) is not None),
                   default=None) for j, job in enumerate(pr.jobs)]
    bound = (_objective(pr, [t for t in fastest if t is not None])
             if None not in fastest and not (pr.choices and pr.objective == "makespan")
             else float("inf") if pr.objective == "throughput" else 0.0)
    rounds, proven = 0, False
    while True:
        rounds += 1
        left = time_limit_s - (time.monotonic() - start)
        # until there is an incumbent, a round gets its full limit whatever time is left
        limit = round_limit_s if best is None else min(round_limit_s, max(left, 1.0))
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
        bound = better(bound, r.bound)  # CP-SAT's bound holds whether or not it proved it
        pr.fetch(list(enumerate(r.vectors)))
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
    gap = _gap(pr.objective, obj, bound)
    return Allocation(vecs, times, obj, bound, gap,
                      proven and pr.not_monotone == 0, pr.not_monotone, rounds,
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


def fewest_nodes(pr: AllocProblem, vecs: list[Vec], workers: int, seed: int) -> list[Vec]:
    """Among the evaluated allocations as good as `vecs` (the same scaled objective), one that
    holds the fewest nodes: nodes that no job's plan would be faster with go back to the pool."""
    values: list[dict[Vec, float]] = []
    for j, job in enumerate(pr.jobs):
        ok = {a: t for a, t in pr.known[j].items() if t is not None
              and a in set(pr.options(j)) and not _misses(job, t)}
        values.append({a: pr.value(j, t) for a, t in ok.items()})
    m, x, k, objective = _model(pr, values)
    now = [int(round(vals[a] * k)) for vals, a in zip(values, vecs)]
    m.add(objective >= sum(now) if pr.objective == "throughput" else objective <= max(now))
    m.minimize(sum(sum(pr.held(j, a)) * v for j, xs in enumerate(x) for a, v in xs.items()))
    for xs, a in zip(x, vecs):
        m.add_hint(xs[a], 1)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 5.0
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.cp_model_probing_level = 0  # probing a large fleet's model outlasts a round
    if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return vecs
    return [next(a for a, v in xs.items() if solver.value(v)) for xs in x]


def _keep_best(pr: AllocProblem, best: tuple[float, list[Vec]] | None, vecs: list[Vec]
               ) -> tuple[float, list[Vec]] | None:
    """The incumbent: the chosen vectors, now evaluated, if each placed and met its limits."""
    times = [pr.known[j][a] for j, a in enumerate(vecs)]
    if any(t is None for t in times):
        return best
    if any(t is not None and _misses(job, t) for job, t in zip(pr.jobs, times)):
        return best
    obj = _objective(pr, [t for t in times if t is not None])
    if best is None or (obj > best[0] if pr.objective == "throughput" else obj < best[0]):
        return obj, list(vecs)
    return best


def _misses(job: AllocJob, t: float) -> bool:
    """Whether time t misses the job's deadline or minimum throughput (off never does)."""
    return job.max_iteration_s is not None and not math.isinf(t) and t > job.max_iteration_s


def _within(a: Vec, b: Vec) -> bool:
    """Whether `a` takes no more nodes of any pool than `b`."""
    return all(x <= y for x, y in zip(a, b))


def _faster(fewer: float | None, more: float | None) -> bool:
    """Whether the time on fewer nodes beats the time on more (beyond rounding)."""
    if fewer is None:
        return False
    return more is None or fewer < more * (1 - 1e-9)


def _objective(pr: AllocProblem, times: list[float]) -> float:
    vals = [pr.value(j, t) for j, t in enumerate(times)]
    return sum(vals) if pr.objective == "throughput" else max(vals)


def _gap(objective: str, obj: float, bound: float) -> float:
    """Relative gap between the incumbent and the best value still possible (below the
    coefficients' scaling error: 0)."""
    gap = (bound - obj) / bound if objective == "throughput" else (obj - bound) / obj
    return 0.0 if gap < 1e-6 else min(gap, 1.0)


def _maximal(grid: Sequence[Vec]) -> list[Vec]:
    """The vectors of the grid no other vector of it dominates."""
    return [a for a in grid if not any(b != a and all(x <= y for x, y in zip(a, b))
                                       for b in grid)]
