"""The fleet allocation's CP-SAT model, one round of the lazy search (`placer.fleet.alloc`, whose
docstring gives the notation and the model's constraints): x_ja per job and vector, capacity,
quotas, cohorts and their fairness, shared pools, sharing choices, service limits, symmetry
breaking among jobs of one kind, and the objective over the round's (optimistic) times;
`fewest_nodes` re-solves it for the allocation as good as the incumbent holding the fewest nodes.
"""
from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from placer.fleet.allocproblem import (
    AllocProblem,
    NoAllocation,
    TeamQuota,
    Unsolved,
    Vec,
    misses,
)
from placer.solve.ilp_solve import packed_keys
from placer.solve.ilp_vars import LinExpr

SCALE = 1_000_000_000  # the largest objective coefficient, after scaling to integers


@dataclass
class _Round:
    vectors: list[Vec]
    exact: bool
    objective: float  # of the model's values (optimistic where not exact)
    bound: float  # the fleet's, over the job plans' lower bounds (`fleet_bound`)
    proven: bool


def _model(pr: AllocProblem, values: list[dict[Vec, float]], hint: list[Vec] | None = None
           ) -> tuple[cp_model.CpModel, list[dict[Vec, cp_model.IntVar]], float,
                      cp_model.LinearExprT]:
    """The master model over the vectors with a value; returns (model, x, objective scale,
    the objective's expression). `hint`: an allocation among the vectors (an incumbent), given
    to CP-SAT as a value of every variable (a partial hint, on a large fleet's model, is not
    completed within a round)."""
    m = cp_model.CpModel()
    x = [{a: m.new_bool_var(f"x{j}_{i}") for i, a in enumerate(vals)}
         for j, vals in enumerate(values)]
    for xs in x:
        m.add_exactly_one(xs.values())
    if hint is not None and not all(a in xs for xs, a in zip(x, hint)):
        for xs, a in zip(x, hint):  # not an allocation of this model: its vectors that are
            if a in xs:
                m.add_hint(xs[a], 1)
        hint = None
    for xs, a in zip(x, hint or []):
        for b, v in xs.items():
            m.add_hint(v, int(b == a))
    _symmetry(pr, m, x)
    _choices(pr, m, x, hint)
    for g in pr.shared:
        for first, second in zip(g.members, g.members[1:]):
            m.add(sum(a[g.pool] * v for a, v in x[first].items())
                  == sum(a[g.pool] * v for a, v in x[second].items()))
    _quotas(pr, m, _usage(pr, m, x, hint), hint)
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
    if hint is not None:
        m.add_hint(mk, max((int(round(vals[a] * k)) for vals, a in zip(values, hint)),
                           default=0))
    m.minimize(mk)
    return m, x, k, mk


def _usage(pr: AllocProblem, m: cp_model.CpModel, x: list[dict[Vec, cp_model.IntVar]],
           hint: list[Vec] | None) -> dict[str, list[cp_model.IntVar]]:
    """u_tp, each team's nodes of each pool, one integer variable defined once, and the pools'
    capacities over them (every job is some team's): the quota, cohort and fairness rows then
    name u_tp instead of repeating its sum over the team's vectors. The same model; a large
    fleet's (tens of thousands of x_ja) otherwise has most of a million terms, whose presolve
    alone outlasts a round."""
    use: dict[str, list[cp_model.IntVar]] = {}
    for t in pr.teams:
        use[t] = []
        for p, n in enumerate(pr.nodes):
            u = m.new_int_var(0, n, f"use_{t}_{p}")
            m.add(u == sum(pr.held(j, a)[p] * v for j, xs in enumerate(x)
                           if pr.jobs[j].team == t for a, v in xs.items()))
            use[t].append(u)
            if hint is not None:
                m.add_hint(u, _used(pr, hint, t, p))
    for p, n in enumerate(pr.nodes):
        m.add(sum(use[t][p] for t in pr.teams) <= n)
    return use


def _used(pr: AllocProblem, vecs: list[Vec], team: str, p: int) -> int:
    """u_tp of an allocation."""
    return sum(pr.held(j, a)[p] for j, a in enumerate(vecs) if pr.jobs[j].team == team)


def _choices(pr: AllocProblem, m: cp_model.CpModel, x: list[dict[Vec, cp_model.IntVar]],
             hint: list[Vec] | None = None) -> None:
    """Per choice, one boolean: share (every shared flavour on, every alone flavour off) or not."""
    z = pr.zero
    for c, ch in enumerate(pr.choices):
        share = m.new_bool_var(f"share_{c}")
        if hint is not None:
            m.add_hint(share, int(hint[ch.alone[0]] == z))
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


def _quotas(pr: AllocProblem, m: cp_model.CpModel, use: dict[str, list[cp_model.IntVar]],
            hint: list[Vec] | None = None) -> None:
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
            if hint is not None:
                m.add_hint(borrows, int(any(_used(pr, hint, tq.name, p) > tq.nominal[p]
                                            for tq in teams)))
            for tq in teams:
                m.add(use[tq.name][p] <= tq.nominal[p] + tq.cap[p] * borrows)
                floor = min(tq.nominal[p], pr.demand(tq.name, p))
                m.add(use[tq.name][p] >= floor * borrows)


def solve_round(pr: AllocProblem, limit_s: float, workers: int, seed: int,
                hint: list[Vec] | None = None) -> _Round:
    """The master model over the optimistic times; `hint`: the last round's vectors. Raises
    NoAllocation when the model has no solution, Unsolved when its time limit passed first.
    The round's bound is the fleet's (`fleet_bound`): over the job plans' lower bounds."""
    values: list[dict[Vec, float]] = []
    exact: list[dict[Vec, bool]] = []
    lows: list[dict[Vec, float]] = []  # each option's value at its lower bound (`pr.lower`)
    for j, job in enumerate(pr.jobs):
        vals, ex, low = {}, {}, {}
        for a in pr.options(j):
            t, is_exact = pr.bound(j, a)
            if t is None:
                continue
            lo = pr.lower(j, a)
            assert lo is not None  # None exactly where `bound` is
            if not misses(job, lo):  # the job's optimum there may meet its limits
                low[a] = pr.value(j, lo)
            if misses(job, t):
                continue  # the bound already misses the deadline: so does the time
            vals[a], ex[a] = pr.value(j, t), is_exact
        values.append(vals)
        exact.append(ex)
        lows.append(low)
    if any(not v for v in values):
        raise NoAllocation("a job has no allocation left")
    m, x, k, objective = _model(pr, values, hint)
    solver = cp_model.CpSolver()
    _params(solver, limit_s, workers, seed)
    status = solver.solve(m)
    if status == cp_model.INFEASIBLE:
        raise NoAllocation("no allocation meets the quotas")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise Unsolved("the allocation model found no solution in its time limit")
    chosen = _read(x, solver)
    if status == cp_model.OPTIMAL:  # the round's plans to evaluate: the same whatever the search
        held = objective >= int(round(solver.objective_value))
        if pr.objective != "throughput":
            held = objective <= int(round(solver.objective_value))
        m.add(held)
        chosen = _lexmin(m, x, canonical_levels(x), chosen, limit_s, workers, seed)
    return _Round(chosen, all(exact[j][a] for j, a in enumerate(chosen)),
                  solver.objective_value / k,
                  fleet_bound(pr, values, lows, solver.best_objective_bound / k),
                  status == cp_model.OPTIMAL)


def fleet_bound(pr: AllocProblem, values: list[dict[Vec, float]],
                lows: list[dict[Vec, float]], model_bound: float) -> float:
    """The best fleet objective still possible, given CP-SAT's bound on the model over the
    optimistic times (`values`) and each option's value at its job plan's lower bound (`lows`,
    v^L; with every job plan optimal, v^L = v and this is `model_bound`). Each of these holds
    for every allocation x (throughput; makespan mirrored, with min for max):
      sum_j v^L_j(x_j) <= B + sum_j max_a (v^L_j(a) - v_j(a))       (additive)
      sum_j v^L_j(x_j) <= B * max_{j,a} v^L_j(a) / v_j(a)            (ratio)
      sum_j v^L_j(x_j) <= sum_j max_a v^L_j(a)                       (each job apart)
    and the tightest is kept. The first two bound only the model's options: where an option's
    time misses a job's limit but its lower bound does not (it is in `lows`, not in `values`),
    the optimum may lie outside the model and only the last holds."""
    through = pr.objective == "throughput"
    optional = pr.optional()
    if through:
        apart = sum(max(low.values(), default=0.0) for low in lows)
    else:  # a job that may be off adds nothing to the makespan
        apart = max((min(low.values(), default=0.0) for j, low in enumerate(lows)
                     if j not in optional), default=0.0)
    if any(set(low) - set(vals) for vals, low in zip(values, lows)):
        return apart
    diff = [lows[j][a] - v for j, vals in enumerate(values) for a, v in vals.items()]
    ratio = [lows[j][a] / v for j, vals in enumerate(values) for a, v in vals.items() if v > 0]
    if through:
        per_job = sum(max((lows[j][a] - v for a, v in vals.items()), default=0.0)
                      for j, vals in enumerate(values))
        return min(apart, model_bound + max(per_job, 0.0),
                   model_bound * max(max(ratio, default=1.0), 1.0))
    return max(apart, model_bound + min(min(diff, default=0.0), 0.0),
               model_bound * min(min(ratio, default=1.0), 1.0))


def _params(solver: cp_model.CpSolver, limit_s: float, workers: int, seed: int) -> None:
    """A round's solver: probing and the search for big linear overlaps are off (on a large
    fleet's model each alone outlasts a round's presolve; the optimum is the same)."""
    solver.parameters.max_time_in_seconds = max(limit_s, 0.1)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.find_big_linear_overlap = False


def fewest_nodes(pr: AllocProblem, vecs: list[Vec], workers: int, seed: int) -> list[Vec]:
    """Among the evaluated allocations as good as `vecs` (the same scaled objective), one that
    holds the fewest nodes: nodes that no job's plan would be faster with go back to the pool.
    Many such allocations tie (a job whose plan is as fast on either of two vectors), and
    CP-SAT returns whichever its search meets first, which moves with its workers, seed and
    load; so, the fewest nodes proven, each job in order takes its earliest vector in sorted
    order that the jobs before it leave open (`canonical_levels`): the same allocation
    whatever the search."""
    values: list[dict[Vec, float]] = []
    for j, job in enumerate(pr.jobs):
        ok = {a: t for a, t in pr.known[j].items() if t is not None
              and a in set(pr.options(j)) and not misses(job, t)}
        values.append({a: pr.value(j, t) for a, t in ok.items()})
    m, x, k, objective = _model(pr, values, vecs)
    now = [int(round(vals[a] * k)) for vals, a in zip(values, vecs)]
    m.add(objective >= sum(now) if pr.objective == "throughput" else objective <= max(now))
    nodes = sum(sum(pr.held(j, a)) * v for j, xs in enumerate(x) for a, v in xs.items())
    return _lexmin(m, x, [nodes, *canonical_levels(x)], vecs, 5.0, workers, seed)


def _read(x: list[dict[Vec, cp_model.IntVar]], solver: cp_model.CpSolver) -> list[Vec]:
    return [next(a for a, v in xs.items() if solver.value(v)) for xs in x]


def _lexmin(m: cp_model.CpModel, x: list[dict[Vec, cp_model.IntVar]], levels: list[LinExpr],
            start: list[Vec], limit_s: float, workers: int, seed: int) -> list[Vec]:
    """Minimise `levels` in turn on `m`, each held at its optimum for the next, from the
    allocation `start` (a solution of `m`, hinted); stops at the first level not proven
    optimal within `limit_s` (the next would not be lexicographic) with the best found."""
    chosen = start
    for level in levels:
        m.clear_hints()
        for xs, a in zip(x, chosen):
            for b, v in xs.items():
                m.add_hint(v, int(b == a))
        m.minimize(level)
        solver = cp_model.CpSolver()
        _params(solver, limit_s, workers, seed)
        status = solver.solve(m)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return chosen
        chosen = _read(x, solver)
        if status != cp_model.OPTIMAL:
            return chosen
        m.add(level <= int(round(solver.objective_value)))
    return chosen


def canonical_levels(x: list[dict[Vec, cp_model.IntVar]]) -> list[LinExpr]:
    """The jobs' canonical keys as objectives minimised in turn: job j's key is its chosen
    vector's rank in sorted order, below its vector count; the keys in job order packed as
    `placer.solve.ilp_solve.packed_keys` packs the roles', so their minimum is the
    lexicographic one."""
    keys: list[tuple[LinExpr, int]] = [
        (sum(i * xs[a] for i, a in enumerate(sorted(xs))), len(xs)) for xs in x]
    return packed_keys(keys)
