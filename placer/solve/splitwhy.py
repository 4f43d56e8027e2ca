"""Why a role is split over pools (`placer.cost.split`).

Per split role: its parts (pool, layout, share of the samples, time) and the best plan with
every role on one pool, re-solved from the job's cost table with the split candidates left out
and priced as `assemble` would predict it (`single_pool_alternative`), against the split plan. A
mixed rollout names the roles its first part time-shares its slot with. This re-solves, so it
sits above the planner; `placer.solve.explain` gathers it and `split_lines` prints it.
"""
from __future__ import annotations

from dataclasses import replace

from placer.base.records import Record
from placer.cost.pricer import Pricer
from placer.solve.breakdown import PartRow, part_rows
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import solve
from placer.solve.moves import dims
from placer.solve.planfile import Plan
from placer.solve.planner import build_problem
from placer.solve.problem import Unsolved


class SinglePool(Record):
    """The best plan with every role on one pool, priced as `assemble` would predict it."""

    iteration_s: float
    cost_per_sample: float
    status: str
    """the solver's status, lower case"""
    placement: dict[str, str]
    """role -> `POOL xN layout`"""


class SplitWhy(Record):
    """A role split over pools: its parts, the split plan's figures and the best single-pool
    plan's (None when none was found within the time limit)."""

    parts: list[PartRow]
    iteration_s: float
    cost_per_sample: float
    single_pool: SinglePool | None
    shares_with: list[str] = []
    """a mixed rollout (sync mode): the roles its first part time-shares its slot with"""


def split(plan: Plan, px: Pricer, time_limit_s: float = 5.0) -> dict[str, SplitWhy]:
    """Per role split over pools: its parts, the split plan's figures and the best single-pool
    plan's (`single_pool_alternative`, solved once for all split roles); {} when none is split."""
    roles = {role: r for role, r in plan.roles.items() if r.parts}
    if not roles:
        return {}
    alt = single_pool_alternative(px, plan.objective, time_limit_s)
    return {role: SplitWhy(parts=part_rows(px.res, r), iteration_s=plan.predicted_iteration_s,
                           cost_per_sample=plan.cost_per_sample, single_pool=alt,
                           shares_with=[o for o, q in plan.roles.items()
                                        if o != role and q.slot == r.slot])
            for role, r in roles.items()}


def single_pool_alternative(px: Pricer, objective: str,
                            time_limit_s: float = 5.0) -> SinglePool | None:
    """The best plan with every role on one pool: the job's cost table with the split
    candidates left out, solved for the same objective and priced by `ilp_bound.score` (what
    `assemble` would predict); None when no such plan is found in the time limit."""
    full = build_problem(px, objective)
    problem = replace(full, cands={r: [c for c in cs if not c.split]
                                   for r, cs in full.cands.items()})
    try:
        sol = solve(problem, time_limit_s=time_limit_s)
    except Unsolved:
        return None
    t, usd = score(problem, sol.assignment)
    return SinglePool(iteration_s=t, cost_per_sample=usd, status=sol.status.lower(),
                      placement={r: f"{c.pool} x{c.devices} {dims(c.est.par)}"
                                 for r, c in sol.assignment.choice.items()})


def split_lines(role: str, sp: SplitWhy) -> list[str]:
    """Why a role is split: its shares, and the best single-pool plan against the split plan."""
    parts = "; ".join(f"{q.pool} x{q.devices} {q.layout}: {q.share:.1%} of the "
                      f"samples ({q.samples}), {q.time_s:.2f} s" for q in sp.parts)
    lines = [f"{role} is split over {len(sp.parts)} pools: {parts}",
             "  shares: group-aligned sample counts at which the parts finish together "
             "(placer.cost.split)"]
    if sp.shares_with:
        home, rest = sp.parts[0], ", ".join(f"{q.pool} x{q.devices}" for q in sp.parts[1:])
        lines.append(f"  mixed rollout: its part on {home.pool} x{home.devices} time-shares "
                     f"its slot with {', '.join(sp.shares_with)} (their phases in turn); "
                     f"{rest} runs alongside on devices of its own")
    alt = sp.single_pool
    if alt is None:
        lines.append("  no single-pool plan was found within the time limit")
        return lines
    t, t_split = alt.iteration_s, sp.iteration_s
    gain = (t - t_split) / t if t > 0 else 0.0
    where = ", ".join(f"{r} {w}" for r, w in alt.placement.items())
    lines.append(f"  why: the best single-pool plan ({alt.status}; {where}) predicts "
                 f"{t:.3f} s per iteration and {alt.cost_per_sample:.6f} USD/sample; the split "
                 f"plan {t_split:.3f} s and {sp.cost_per_sample:.6f} USD/sample "
                 + (f"({gain:.1%} faster)" if gain > 0 else f"({-gain:.1%} slower)"))
    return lines
