"""The planner: job -> candidates (cost table) -> ILP -> assemble -> Plan.

This is the API the CLI, the notebooks, the simulator's tests and the executor's re-planning call:

    plan_job(Pricer(res, calib), time_limit_s=10, hint=None, move_cost_s=0) -> Plan
    sweep_job(Pricer(res, calib), ...) -> list[Plan]  # time/cost Pareto frontier, fastest first
    build_problem(Pricer(res, calib)) -> Problem      # the cost table, for solving directly
    with_nodes(job, {pool: nodes}) -> Resolved    # the job on a grown or shrunk cluster
                                                  # (placer.spec.catalog)
Each call makes one `Pricer` (`placer.cost.pricer`) for its job and prices everything through it.
Re-planning is `plan_job(Pricer(with_nodes(job, ...), calib), hint=old_plan, move_cost_s=...)`:
the old
plan seeds the solver and every role that changes config costs `move_cost_s`.

The candidate table (`placer.solve.candidates`: single-pool candidates, then splits) is the only thing
handed from estimation to the solver; every plan, the ILP's and the baselines', is priced and
mapped by `assemble`.
A job that cannot be placed raises `placer.base.errors.Infeasible` with a diagnosis naming what does not
fit and the smallest change that would (see `placer.solve.diagnose`).
Host memory (`placer.solve.hostmem`): candidates over a node's host RAM on their own are refused before
the solve; the solver keeps what a switching slot parks within its nodes' RAM (Infeasible naming
host memory when no placement does); a solved plan whose colocated roles still overflow a node
is re-solved without the optimizer offload of the roles there (Infeasible naming host memory
when nothing is left).
"""
from __future__ import annotations

from dataclasses import replace

from placer.base.errors import Infeasible
from placer.base.roles import TRAINING_ROLES, Role
from placer.cost.pricer import AgentPricer, Pricer
from placer.cost.split import SplitSpace
from placer.solve import hostmem
from placer.solve.agentplan import build_agent_problem
from placer.solve.assemble import assemble
from placer.solve.candidates import PerPool, flat, single_candidates, with_splits
from placer.solve.diagnose import diagnose
from placer.solve.ilp_bound import heuristic, score, split_keep
from placer.solve.ilp_solve import frontier, solve
from placer.solve.planfile import Plan, SearchSpace, SolverInfo
from placer.solve.problem import (
    Assignment,
    Hint,
    Problem,
    Solution,
    Unsolved,
    host_fits,
    keeps_apart,
    layout_key,
)
from placer.spec.catalog import resolve
from placer.spec.job import Job, pin_of

DEFAULT_TIME_LIMIT_S = 10.0


def build_problem(px: Pricer, objective: str | None = None, bounded: bool = True,
                  slack_s: float = 0.0, workers: int = 1) -> Problem:
    """The cost table of a job; Infeasible (with a diagnosis) if some role has no candidate.

    `bounded`: split candidates that cannot beat the heuristic plan on the objective by more
    than `slack_s` seconds (a re-plan's move costs; `placer.solve.ilp_bound.split_keep`) are not
    priced. Solving gives the same optimum (the solver would prune them); a table for other
    uses (the time/cost frontier, a narrower re-solve) keeps them all. `workers`: processes
    a large cluster's single-pool candidates may be priced in (`candidates.single_candidates`)."""
    job = px.res.job
    if objective is not None and objective != job.objective:  # the plan records its objective
        px = px.with_res(resolve(job.model_copy(update={"objective": objective})))
    res = px.res
    if isinstance(px, AgentPricer):  # every agent's roles, on its own pricer
        if res.job.framework is not None:
            p = res.job.profile
            raise Infeasible(f"framework: {p.name} ({p.title}) runs one policy per job; this "
                             f"job co-trains {len(px.agents.members)} agents (agents.members): "
                             "plan it without a framework")
        return build_agent_problem(px, objective)
    framework_check(res.job)
    per_pool = single_candidates(px, workers=workers)
    missing = [r for r, cs in flat(per_pool).items() if not cs]
    if missing:
        raise Infeasible(framework_refusal(res.job, missing) + diagnose(px, missing))
    keep = None
    if bounded:
        fit, _ = hostmem.refuse_candidates(res, flat(per_pool))
        if all(fit.values()):  # else the table below is refused with its diagnosis
            singles = Problem(px, fit, objective or res.job.objective)
            keep = split_keep(singles, slack_s)
    # over a node's host memory alone
    space = SplitSpace()
    cands, refused = hostmem.refuse_candidates(res, with_splits(px, per_pool, keep, space))
    missing = [r for r, cs in cands.items() if not cs]
    if missing:
        raise Infeasible(hostmem.refusal(res, missing, refused))
    return Problem(px, cands, objective or res.job.objective,
                   space=search_space(per_pool, space, bounded and keep is not None))


def search_space(per_pool: PerPool, split: SplitSpace, bounded: bool) -> SearchSpace:
    """The record of what a cost table covers (`planfile.SearchSpace`)."""
    pruned = ("; split pairs pruned only where a bound proves they cannot beat the heuristic "
              "plan" if bounded and split.pruned_by_bound else "")
    return SearchSpace(
        roles=len(per_pool), layouts=sum(len(cs) for cs in flat(per_pool).values()),
        split_counts=split.pairs, pruned_by_bound=split.pruned_by_bound,
        dominated=split.dominated,
        relative_to="every placement of the roles on one layout each (every parallel layout and "
                    "device count on every pool that may host them, or a split over two pools "
                    "with each part at every such count) in any slots that fit; candidates "
                    "another beats on devices, every stage and memory left out" + pruned)


def framework_check(job: Job) -> None:
    """Infeasible (exit 3) naming what the job's framework cannot run at all."""
    profile = job.profile
    why = profile.job_problem(critic=Role.CRITIC in job.roles(),
                              async_steps=job.pipeline.mechanism.overlaps_steps,
                              partial_rollout=job.tail_policy.mechanism.carries_over,
                              reward_model=job.models.reward != "rule")
    for role in job.roles():  # a pin the framework cannot run: say so, not "does not fit"
        pin = pin_of(job, role)
        if why is None and pin is not None:
            hsdp = pin.shard is not None and (pin.dp is None or pin.shard < pin.dp)
            why = profile.layout_problem(
                role, training=role in TRAINING_ROLES, has_model=False, on_gpu=True,
                tp=pin.tp or 1, pp=pin.pp or 1, ep=pin.ep or 1, shard=(pin.shard or 0) if hsdp else 0,
                attn_dp=1)
            why = why and f"{why}, which pin.{role} asks for"
    if why is not None:
        raise Infeasible(f"framework: {profile.name} ({profile.title}) {why}; plan the job for "
                         "another framework (placer compare JOB --framework all)")


def framework_refusal(job: Job, roles: list[str]) -> str:
    """What a named framework's layout rules left without a candidate ("" for a job that names
    none: the diagnosis alone)."""
    if job.framework is None:
        return ""
    p = job.profile
    return (f"framework: {p.name} ({p.title}) runs no layout of {', '.join(roles)} that fits "
            f"this cluster within its rules ({p.limits()}); ")


def to_plan(problem: Problem, sol: Solution) -> Plan:
    info = SolverInfo(status=sol.status.lower(), objective=sol.objective, bound=sol.bound,
                      gap=sol.gap, solve_s=sol.solve_s, search_space=problem.space)
    return assemble(problem.px, sol.assignment.placed(), info)


def plan_job(px: Pricer, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
             hint: Plan | None = None, objective: str | None = None, move_cost_s: float = 0.0,
             workers: int = 2, seed: int = 0) -> Plan:
    """Place every role of the job with the ILP and return the assembled plan. `workers`: CP-SAT
    search workers, and processes that price a large cluster's cost table (`build_problem`).
    The plan records `px`'s calibration profile."""
    h = hint_of(hint, move_cost_s) if hint is not None else None
    slack = len(px.res.job.role_names()) * move_cost_s if hint is not None else 0.0  # as `ilp_solve`
    problem = build_problem(px, objective, slack_s=slack, workers=workers)
    bounded = True
    # The ILP sees each candidate's own host memory, not colocated roles adding up on one node:
    # a plan over a node's host RAM is re-solved without the offload of the roles on that node.
    for _ in range(len(problem.roles) + 1):
        try:
            sol = solve(problem, time_limit_s, hint=h, workers=workers, seed=seed)
        except Unsolved as e:
            raise Infeasible(_unsolved(problem, e)) from None
        plan = to_plan(problem, sol)
        narrower = _host_checked(problem, plan)
        if narrower is None:
            return plan
        if bounded:  # the narrower optimum may need splits the wider table's bound ruled out
            bounded = False
            full = build_problem(px, objective, bounded=False, workers=workers)
            narrower = _host_checked(full, plan)
            assert narrower is not None  # the same plan over the same nodes
        problem = narrower
    raise Infeasible("host memory: no placement found that fits every node's host memory")


def _unsolved(problem: Problem, e: Unsolved) -> str:
    """Why the solver found no placement. The heuristic plan keeps to every constraint but the
    host-memory one (`ilp_bound.heuristic`), so when it breaks that one, host memory is why."""
    h = heuristic(problem)
    apart = problem.px.apart_roles()
    if str(e) == "infeasible" and not keeps_apart(problem, h):
        p = problem.res.job.profile
        return (f"framework: {p.name} ({p.title}) keeps {' and '.join(apart)} in slots of "
                f"their own under pipeline.mode async ({p.sources.get('async_apart', '')}), "
                "and no such placement fits this cluster. Smallest change: more devices, or "
                "pipeline.mode sync")
    if str(e) != "infeasible" or host_fits(problem, h):
        return f"the solver found no placement: {e}"
    nodes = hostmem.plan_nodes(plan_assignment(problem, h, "heuristic"), problem.px)
    worst = max(nodes, key=lambda n: n.total_gb)
    return (f"host memory: no placement keeps the state its colocated roles park within a node's "
            f"host RAM; with every role of a pool in one slot, {worst.describe()}. Smallest "
            "change: nodes with more host memory (the pool's host_memory_gb), more nodes, or "
            "a pool to put some roles apart")


def _host_checked(problem: Problem, plan: Plan) -> Problem | None:
    """None if the plan fits every node's host memory, else the problem without the offload of
    the roles on the nodes over it (Infeasible naming host memory if that leaves nothing)."""
    over = hostmem.over_nodes(plan, problem.px)
    if not over:
        return None
    roles = {r for n in over for r in n.roles if plan.roles[r].offload}
    if not roles:
        raise Infeasible(f"host memory: {over[0].describe()}; roles sharing its devices park "
                         "their state there while another runs. Smallest change: nodes with "
                         "more host memory (the pool's host_memory_gb) or more nodes")
    cands = hostmem.without_offload(problem.cands, roles)
    gone = [r for r in problem.roles if r in roles and not cands[r]]
    if gone:
        raise Infeasible(hostmem.refusal(problem.res, gone, {r: over[0] for r in gone}))
    return replace(problem, cands=cands)


def hint_of(plan: Plan, move_cost_s: float = 0.0) -> Hint:
    """A previous plan as a CP-SAT hint: its configs and its colocation groups."""
    choice = {r: (tuple(layout_key(q.pool, q.par) for q in p.parts) if p.parts
                  else layout_key(p.pool, p.par)) for r, p in plan.roles.items()}
    groups = [list(s.roles) for s in plan.slots]
    return Hint(choice, groups, move_cost_s)


def sweep_job(px: Pricer, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
              max_points: int = 8, workers: int = 2, seed: int = 0) -> list[Plan]:
    """The time/cost-per-sample Pareto frontier, fastest first (`ilp_solve.frontier`)."""
    # unbounded: the frontier's slow, cheap end may need any split
    problem = build_problem(px, "time", bounded=False, workers=workers)
    sols = frontier(problem, time_limit_s, max_points, workers=workers, seed=seed)
    if not sols:
        raise Infeasible(f"the solver found no placement within {time_limit_s:g} s")
    plans = [to_plan(problem, s) for s in sols]
    over = [hostmem.over_nodes(p, problem.px) for p in plans]
    if all(over):  # every frontier point overflows some node's host memory
        raise Infeasible(f"host memory: {over[0][0].describe()}")
    return [p for p, o in zip(plans, over) if not o]


def plan_assignment(problem: Problem, a: Assignment, name: str) -> Plan:
    """Assemble a placement chosen by something other than the solver (a baseline)."""
    t, c = score(problem, a)
    obj = t if problem.objective == "time" else c
    info = SolverInfo(name=name, status="heuristic", objective=obj, bound=0.0, gap=0.0, solve_s=0.0)
    return assemble(problem.px, a.placed(), info)

