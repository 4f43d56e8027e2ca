"""The planner: job -> candidates (cost table) -> ILP -> assemble -> Plan.

This is the API the CLI, the notebooks, the simulator's tests and the executor's re-planning call:

    plan_job(res, calib, time_limit_s=10, hint=None, move_cost_s=0) -> Plan
    sweep_job(res, calib, ...) -> list[Plan]      # time/cost Pareto frontier, fastest first
    with_nodes(job, {pool: nodes}) -> Resolved    # the job on a grown or shrunk cluster
    build_problem(res, calib) -> Problem          # the cost table, for solving directly
Re-planning is `plan_job(with_nodes(job, ...), calib, hint=old_plan, move_cost_s=...)`: the old
plan seeds the solver and every role that changes config costs `move_cost_s`.

The candidate table (`placer.candidates.all_candidates`) is the only thing handed from estimation
to the solver; every plan, the ILP's and the baselines', is priced and mapped by `assemble`.
A job that cannot be placed raises `placer.errors.Infeasible` with a diagnosis naming what does not
fit and the smallest change that would (see `placer.explain.diagnose`).
"""
from __future__ import annotations

from placer.assemble import assemble
from placer.candidates import all_candidates
from placer.catalog import Resolved, resolve
from placer.costmodel import Calibration
from placer.errors import Infeasible
from placer.explain import diagnose
from placer.ilp import Assignment, Hint, Problem, Solution, Unsolved, score
from placer.ilp_solve import frontier, solve
from placer.plan import Plan, SolverInfo
from placer.spec import Job, SpecError

DEFAULT_TIME_LIMIT_S = 10.0


def build_problem(res: Resolved, calib: Calibration, objective: str | None = None) -> Problem:
    """The cost table of a job; Infeasible (with a diagnosis) if some role has no candidate."""
    if objective is not None and objective != res.job.objective:  # the plan records its objective
        res = resolve(res.job.model_copy(update={"objective": objective}))
    cands = all_candidates(res, calib)
    missing = [r for r, cs in cands.items() if not cs]
    if missing:
        raise Infeasible(diagnose(res, calib, missing))
    return Problem(res, calib, cands, objective or res.job.objective)


def to_plan(problem: Problem, sol: Solution, calibration_doc: dict | None = None) -> Plan:
    info = SolverInfo(status=sol.status.lower(), objective=sol.objective, bound=sol.bound,
                      gap=sol.gap, solve_s=sol.solve_s)
    return assemble(problem.res, sol.assignment.placed(), problem.calib, info, calibration_doc)


def plan_job(res: Resolved, calib: Calibration, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
             hint: Plan | None = None, objective: str | None = None, move_cost_s: float = 0.0,
             workers: int = 2, seed: int = 0, calibration_doc: dict | None = None) -> Plan:
    """Place every role of the job with the ILP and return the assembled plan."""
    problem = build_problem(res, calib, objective)
    h = hint_of(hint, move_cost_s) if hint is not None else None
    try:
        sol = solve(problem, time_limit_s, hint=h, workers=workers, seed=seed)
    except Unsolved as e:
        raise Infeasible(f"the solver found no placement: {e}") from None
    return to_plan(problem, sol, calibration_doc)


def hint_of(plan: Plan, move_cost_s: float = 0.0) -> Hint:
    """A previous plan as a CP-SAT hint: its configs and its colocation groups."""
    choice = {r: (p.pool, p.tp, p.pp, p.dp, p.offload) for r, p in plan.roles.items()}
    groups = [list(s.roles) for s in plan.slots]
    return Hint(choice, groups, move_cost_s)


def sweep_job(res: Resolved, calib: Calibration, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
              max_points: int = 8, workers: int = 2, seed: int = 0,
              calibration_doc: dict | None = None) -> list[Plan]:
    """The time/cost-per-sample Pareto frontier, fastest first (`ilp_solve.frontier`)."""
    problem = build_problem(res, calib, "time")
    sols = frontier(problem, time_limit_s, max_points, workers=workers, seed=seed)
    if not sols:
        raise Infeasible(f"the solver found no placement within {time_limit_s:g} s")
    return [to_plan(problem, s, calibration_doc) for s in sols]


def plan_assignment(problem: Problem, a: Assignment, name: str,
                    calibration_doc: dict | None = None) -> Plan:
    """Assemble a placement chosen by something other than the solver (a baseline)."""
    t, c = score(problem, a)
    obj = t if problem.objective == "time" else c
    info = SolverInfo(name=name, status="heuristic", objective=obj, bound=0.0, gap=0.0, solve_s=0.0)
    return assemble(problem.res, a.placed(), problem.calib, info, calibration_doc)


def with_nodes(job: Job, nodes: dict[str, int], source: str = "job") -> Resolved:
    """The job on a changed cluster: `nodes` gives the new node count of some pools (0: gone)."""
    names = {p.name for p in job.cluster.pools}
    for name, n in nodes.items():
        if name not in names:
            raise SpecError(f"{source}: no pool {name!r} in the cluster (pools: "
                            f"{', '.join(sorted(names))})")
        if n < 0:
            raise SpecError(f"{source}: pool {name} would have {n} nodes (it has "
                            f"{job.cluster.pool(name).nodes})")
    # a pool that lost every node is gone; roles that only it could host make the job infeasible
    pools = [p.model_copy(update={"nodes": nodes.get(p.name, p.nodes)}) for p in job.cluster.pools
             if nodes.get(p.name, p.nodes) > 0]
    if not pools:
        raise Infeasible("the cluster has no nodes left")
    cluster = job.cluster.model_copy(update={"pools": pools})
    return resolve(job.model_copy(update={"cluster": cluster}), source)
