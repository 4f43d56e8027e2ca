"""Solve drivers for the placement ILP of `placer.solve.ilp`: time, cost per sample, the Pareto sweep.

  solve(problem)      the job's objective: `time` is one lexicographic minimum (min T, then
                      the cheapest, fewest-device plan at that T, then the canonical plan among
                      those: `placer.solve.ilp`, "Ties"); `cost` walks the (T, rate) frontier
                      (below) and proves its optimum by a bound
  frontier(problem)   the time/cost-per-sample Pareto frontier, fastest first

Objectives. time: min T (+ `move_cost_s` per role whose config changed, when re-planning); a
second level holds that value and minimises the rate sum_p price_p sum_j D_jp, then the devices;
a third picks the canonical plan among those left, so equal inputs give equal plans.
cost: USD per sample = rate * T / samples is a product, so instead of a weak
AddMultiplicationEquality the driver starts a bound B at the cheapest plan's rate * T and walks
the (T, rate) frontier from the fastest end by epsilon constraints: point i+1 is lexmin (T, rate)
subject to rate <= min(rate_i - 1, ceil(B / T_i) - 1) (every plan left has T >= T_i, so it beats
B only below that rate); the best product is kept, and the walk is optimal once no plan is left
under the cap. `--sweep` is the same walk, filtered to the (T, cost per sample) frontier.

Re-planning passes a `Hint`: the old placement seeds CP-SAT (add_hint) and every role whose
candidate config (`problem.layout_key`: pool, layout, offload, micro-batch, parked optimizer)
changes costs `move_cost_s` in the objective; what moved between two plans is reported by
`placer.solve.moves`. Every solve uses a fixed seed and at most `workers` search workers; the
time limit covers the whole call.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ortools.sat.python import cp_model

from placer.base.roles import Role
from placer.solve.candidates import Candidate
from placer.solve.ilp import TIME_STEPS, _Model
from placer.solve.ilp_bound import (
    candidate_price,
    heuristic,
    prune_by_bound,
    rate_per_hour,
    score,
    time_floor,
)
from placer.solve.ilp_vars import LinExpr
from placer.solve.pricing import PRICE_SCALE
from placer.solve.problem import (
    Assignment,
    Hint,
    LayoutKey,
    Problem,
    Solution,
    Unsolved,
    candidate_key,
    host_fits,
    keeps_apart,
    keeps_groups,
    slot_names,
)

CANON_SPAN = 1 << 40  # the widest range of one packed canonical objective (int64-safe)


@dataclass(frozen=True)
class _Step:
    """One lexicographic time solve: the plan, its status, objective and bound in seconds."""

    assignment: Assignment
    optimal: bool
    objective_s: float
    bound_s: float


@dataclass(frozen=True)
class _Point:
    """A point of the (T, rate) walk: its time solve, T in seconds and the rate in units."""

    step: _Step
    t: float
    rate: int


@dataclass(frozen=True)
class _End:
    """The end of the walk: `complete` when no cheaper-per-sample plan is left."""

    complete: bool


def _solver(time_limit_s: float, workers: int, seed: int) -> cp_model.CpSolver:
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    s.parameters.num_workers = workers
    s.parameters.random_seed = seed
    return s


def _key(c: Candidate) -> LayoutKey:
    return candidate_key(c)


def hint_assignment(problem: Problem, hint: Hint) -> Assignment | None:
    """The old placement in the new cost table, if all its configs still exist."""
    choice = {}
    for r in problem.roles:
        found = [c for c in problem.cands[r] if _key(c) == hint.choice.get(r)]
        if not found:
            return None
        choice[r] = found[0]
    groups = [[r for r in g if r in choice] for g in hint.groups]
    slot_of = slot_names([g for g in groups if g])
    if any(r not in slot_of for r in problem.roles):
        return None
    return Assignment(choice, slot_of)


def _moves(model: _Model, hint: Hint | None) -> LinExpr:
    """Number of roles that move: leave their old (pool, layout) or their old colocation group.

    A slot's leader is its first role in role order (`_Model.z`), so the grouping is unchanged
    exactly when every role keeps its old leader; a role counts once (`moved_r` >= either
    change), as `placer.solve.moves` reports it."""
    if hint is None or hint.move_cost_s <= 0:
        return 0
    leader = {r: g[0] for g in hint.groups for r in g}
    total: LinExpr = 0
    for r in model.roles:
        same = [v for c, v in zip(model.p.cands[r], model.x[r]) if _key(c) == hint.choice.get(r)]
        group = model.z.get((r, leader[r])) if r in leader else None
        if not same or group is None:
            total += 1
            continue
        moved = model.m.new_bool_var(f"moved[{r}]")
        model.m.add(moved >= 1 - same[0])
        model.m.add(moved >= 1 - group)
        total += moved
    return total


def rate_units(problem: Problem, a: Assignment) -> int:
    """Milli-dollars per hour of a placement, as the model counts it."""
    return int(rate_per_hour(problem, a, units=True))


def _lexmin_time(problem: Problem, deadline: float, hint: Hint | None, rate_cap: int | None,
                 prune: bool, workers: int, seed: int) -> _Step:
    """The lexicographic minimum of `_levels`: min T (+ moves), then the cheapest plan at that
    T, then the fewest devices, then the canonical plan; `Unsolved` if none in time.

    Each level is one CP-SAT solve with the levels before it held at their optimum. The last
    levels name one assignment, so when every level is proven optimal within the limit the plan
    is the same whatever the search workers, seed or machine load (else it is the best found
    by then: still no worse on the levels solved).

    A split rollout's tool terms are priced lazily (`_Model.priced`): each level is solved with
    0 for those not yet priced (a lower bound, so the model's plans include every true one),
    the chosen split's terms priced (with every environment candidate), and re-solved until the
    plan chosen has its terms priced; it is then that level's true optimum (the relaxed
    optimum, which no plan beats). Pricing a (split, environment) pair replays the tool queue,
    and on a large cluster most splits are never chosen."""
    tp = replace(problem, objective="time")
    h = heuristic(tp)
    ub = score(tp, h)[0]
    if prune and host_fits(tp, h) and keeps_groups(tp, h):  # feasible (no rate cap), so it bounds the optimum
        slack = len(tp.roles) * hint.move_cost_s if hint else 0.0
        tp = prune_by_bound(tp, ub + slack, math.inf)
    unit = max(ub, 1e-9) / TIME_STEPS
    guide = (hint_assignment(tp, hint) if hint else None) or h
    fixed: list[int] = []  # the optimum of each level solved so far
    step: _Step | None = None  # the first level's status and bound, the last level's plan
    while True:
        model, levels = _levels(tp, unit, hint, rate_cap, fixed)
        while len(fixed) < len(levels):
            left = deadline - time.perf_counter()
            if step is not None and left <= 0.02:
                return step
            model.m.clear_hints()
            model.hint(step.assignment if step else guide)
            model.m.minimize(levels[len(fixed)])
            solver = _solver(left, workers, seed)
            status = solver.Solve(model.m)
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                if step is None:
                    raise Unsolved("infeasible" if status == cp_model.INFEASIBLE else
                                   f"no solution in time ({solver.StatusName(status)})")
                return step
            a = model.read(solver)
            value = int(round(solver.ObjectiveValue()))
            k = _unpriced_split(tp, a)
            if k is not None:
                break
            step = (_Step(a, status == cp_model.OPTIMAL, value * unit,
                          solver.BestObjectiveBound() * unit) if step is None
                    else replace(step, assignment=a))
            model.m.add(levels[len(fixed)] <= value)
            fixed.append(value)
        else:
            assert step is not None  # every level solved
            return step
        for e in tp.cands[Role.ENVIRONMENT]:  # its terms: the next model has them
            tp.tool_s(k, e)
        if time.perf_counter() >= deadline - 0.02:
            if step is not None:
                return step
            t = score(tp, a)[0]  # priced as assembled; moves left out of the objective
            return _Step(a, False, max(t, value * unit), solver.BestObjectiveBound() * unit)


def _levels(problem: Problem, unit: float, hint: Hint | None, rate_cap: int | None,
            fixed: list[int]) -> tuple[_Model, list[LinExpr]]:
    """The model (its tool terms as priced so far) and its objectives in lexicographic order:
    T (+ `move_cost_s` per role moved), the tie-breaker (rate, then devices held), then the
    roles' canonical keys packed (`packed_keys`); the first len(fixed) held at those values."""
    model = _Model(problem, unit_s=unit, lazy_tools=True)
    first = model.T + (model.ti(hint.move_cost_s) if hint else 0) * _moves(model, hint)
    if rate_cap is not None:
        model.m.add(model.rate <= rate_cap)
    levels = [first, model.tie_breaker(), *packed_keys(model.canonical_keys())]
    for expr, value in zip(levels, fixed):
        model.m.add(expr <= value)
    return model, levels


def packed_keys(keys: list[tuple[LinExpr, int]]) -> list[LinExpr]:
    """The roles' canonical keys (key, range) packed, in role order, into as few objectives as
    keep their range within `CANON_SPAN`: kappa_1 W_1 + ... + kappa_n W_n, W_r the product of
    the later roles' ranges in the same objective. Every kappa is below its range, so the later
    roles together add less than one step of an earlier role's: the minimum is lexicographic."""
    out: list[LinExpr] = []
    cur: LinExpr = 0
    span = 1
    for key, size in keys:
        if span > 1 and span * size > CANON_SPAN:
            out.append(cur)
            cur, span = 0, 1
        cur = cur * size + key
        span *= size
    return [*out, cur]


def _unpriced_split(problem: Problem, a: Assignment) -> Candidate | None:
    """The chosen split rollout when its tool term with the chosen environment is not priced."""
    k, e = a.choice.get(Role.ROLLOUT), a.choice.get(Role.ENVIRONMENT)
    if k is None or e is None or not k.split or problem.has_tool(k, e):
        return None
    return k


def solve(problem: Problem, time_limit_s: float = 10.0, hint: Hint | None = None,
          workers: int = 2, seed: int = 0, prune: bool = True) -> Solution:
    """Solve for the problem's objective; `Unsolved` if no solution is found within the limit.

    `prune=False` keeps candidates slower than the heuristic plan (time objective; for
    benchmarking the model without that help)."""
    t0 = time.perf_counter()
    try:
        if problem.objective == "cost":
            return _solve_cost(problem, t0 + time_limit_s, hint, workers, seed, t0)
        step = _lexmin_time(problem, t0 + time_limit_s, hint, None, prune, workers, seed)
    except Unsolved as e:
        if str(e) == "infeasible":
            raise
        return _fallback(problem, t0)
    gap = max(step.objective_s - step.bound_s, 0.0) / step.objective_s if step.objective_s else 0.0
    return Solution(step.assignment, "OPTIMAL" if step.optimal else "FEASIBLE",
                    step.objective_s, step.bound_s, gap, time.perf_counter() - t0)


def _fallback(problem: Problem, t0: float) -> Solution:
    """Out of time before any solution: the heuristic plan (feasible unless the framework keeps
    roles of one pool apart: `Unsolved` then); bound: on time,
    each role's least time floor (`ilp_bound.time_floor`), on cost unknown (0)."""
    a = heuristic(problem)
    if not keeps_apart(problem, a):  # one slot a pool: no placement the framework runs
        raise Unsolved(f"no placement within {problem.px.res.job.framework} framework's rules "
                       "found in the time limit")
    t, c = score(problem, a)
    if problem.objective != "time":
        return Solution(a, "FEASIBLE", c, 0.0, 1.0, time.perf_counter() - t0)
    bound = min(time_floor(problem), t)
    return Solution(a, "FEASIBLE", t, bound, (t - bound) / t if t else 0.0,
                    time.perf_counter() - t0)


def _descend(problem: Problem, deadline: float, hint: Hint | None, workers: int, seed: int,
             keep_all: bool = False, best: float = math.inf) -> Iterator[_Point | _End]:
    """Yield the points (step, T seconds, rate units) down the (T, rate) frontier, fastest
    first, then `_End`: complete when no cheaper-per-sample plan is left.

    Step i+1 is min T s.t. rate <= cap with cap = min(rate_i - 1, ceil(B / T_i) - 1), where B is
    the best rate * T so far and T_i the lower bound of step i: every plan left has T >= T_i, so
    it beats B only if rate < B / T_i. `keep_all` walks every (T, rate) point instead; `best`
    starts B at a known plan's rate * T.
    """
    slack = len(problem.roles) * hint.move_cost_s if hint else 0.0
    cap: int | None = None
    while time.perf_counter() < deadline:
        try:
            step = _lexmin_time(problem, deadline, hint, cap, False, workers, seed)
        except Unsolved as e:
            yield _End(str(e) == "infeasible")
            return
        t, _ = score(problem, step.assignment)
        rate = rate_units(problem, step.assignment)
        best = min(best, rate * t)
        yield _Point(step, t, rate)
        cap = rate - 1
        t_low = (step.bound_s - slack) * (1 - 1e-6)
        if not keep_all and t_low > 0:
            cap = min(cap, math.ceil(best / t_low) - 1)
        if cap < 0:
            yield _End(True)
            return
    yield _End(False)


def _cheap_end(problem: Problem, deadline: float, hint: Hint | None, workers: int, seed: int
               ) -> _Step | None:
    """The cheapest plan (min rate, then min T): an early, good B for the descent."""
    model = _Model(replace(problem, objective="time"), unit_s=1.0)
    model.m.minimize(model.rate)
    solver = _solver(deadline - time.perf_counter(), workers, seed)
    if solver.Solve(model.m) != cp_model.OPTIMAL:
        return None
    try:
        return _lexmin_time(problem, deadline, hint, int(round(solver.ObjectiveValue())), False,
                            workers, seed)
    except Unsolved:
        return None


def _rate_floor(problem: Problem) -> int:
    """Any plan holds each role's devices somewhere: rate >= max over roles of its cheapest."""
    return max(min(int(candidate_price(problem, c, units=True)) for c in problem.cands[r])
               for r in problem.roles)


def _solve_cost(problem: Problem, deadline: float, hint: Hint | None, workers: int, seed: int,
                t0: float) -> Solution:
    per_unit = 1 / PRICE_SCALE / 3600 / problem.res.job.batch.samples  # (mUSD/h * s) -> USD/sample
    h = heuristic(problem)
    ub = (score(problem, h)[1] if host_fits(problem, h) and keeps_groups(problem, h)
          else math.inf)  # else no bound
    problem = prune_by_bound(problem, math.inf, ub)
    r_min = _rate_floor(problem)
    best: tuple[float, _Step] | None = None
    cheap = _cheap_end(problem, deadline, hint, workers, seed)
    if cheap is not None:
        t, _ = score(problem, cheap.assignment)
        best = (rate_units(problem, cheap.assignment) * t * per_unit, cheap)
    all_optimal, proven, rest_bound = True, False, 0.0
    start = best[0] / per_unit if best else math.inf
    for point in _descend(problem, deadline, hint, workers, seed, best=start):
        if isinstance(point, _End):
            proven = point.complete and all_optimal
            break
        step, t, rate = point.step, point.t, point.rate
        all_optimal &= step.optimal
        cost = rate * t * per_unit
        if best is None or cost < best[0]:
            best = (cost, step)
        rest_bound = step.bound_s * r_min * per_unit  # every later point: T >= this, rate >= r_min
    if best is None:
        raise Unsolved("no solution in time")
    cost, step = best
    bound = cost if proven else min(cost, rest_bound)
    return Solution(step.assignment, "OPTIMAL" if proven else "FEASIBLE", cost, bound,
                    (cost - bound) / cost if cost else 0.0, time.perf_counter() - t0)


def frontier(problem: Problem, time_limit_s: float = 10.0, max_points: int = 8,
             workers: int = 2, seed: int = 0) -> list[Solution]:
    """Time/cost-per-sample Pareto points, fastest first: each strictly cheaper per sample than
    every faster one (a (T, cost) Pareto point is always a (T, rate) one, so the walk finds it).
    Each point's objective/bound/gap are those of its time solve."""
    t0 = time.perf_counter()
    per_sample = 1 / PRICE_SCALE / 3600 / problem.res.job.batch.samples
    out: list[Solution] = []
    cheapest = math.inf
    for point in _descend(problem, t0 + time_limit_s, None, workers, seed):
        if isinstance(point, _End):
            break
        step, t, rate = point.step, point.t, point.rate
        cost = rate * t * per_sample
        if cost >= cheapest * (1 - 1e-9):
            continue  # slower and no cheaper per sample than a point already kept
        cheapest = cost
        gap = max(step.objective_s - step.bound_s, 0.0) / step.objective_s if step.objective_s else 0
        out.append(Solution(step.assignment, "OPTIMAL" if step.optimal else "FEASIBLE",
                            step.objective_s, step.bound_s, gap, time.perf_counter() - t0))
        if len(out) >= max_points:
            break
    return out
