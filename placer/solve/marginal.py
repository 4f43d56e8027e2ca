"""The value of one more node of each pool: the job re-solved on the grown cluster.

Per pool, the iteration time and cost per sample the ILP reaches with that pool one node larger,
and their change against the plan. This re-solves, so it sits above the planner;
`placer.solve.explain` gathers it and `marginal_lines` prints it.
"""
from __future__ import annotations

from placer.base.records import Record
from placer.cost.pricer import Pricer
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import with_nodes


class MarginalNode(Record):
    """The plan re-solved with one more node of a pool."""

    iteration_s: float
    delta_s: float
    cost_per_sample: float
    delta_cost_per_sample: float


def marginal(plan: Plan, px: Pricer, time_limit_s: float = 5.0) -> dict[str, MarginalNode]:
    """Per pool: iteration time and cost per sample with one more node (re-solved)."""
    out = {}
    for p in px.res.cluster.pools:
        grown = with_nodes(px.res.job, {p.name: p.nodes + 1})
        new = plan_job(Pricer(grown, px.given), time_limit_s=time_limit_s)
        out[p.name] = MarginalNode(
            iteration_s=new.predicted_iteration_s,
            delta_s=new.predicted_iteration_s - plan.predicted_iteration_s,
            cost_per_sample=new.cost_per_sample,
            delta_cost_per_sample=new.cost_per_sample - plan.cost_per_sample)
    return out


def marginal_lines(nodes: dict[str, MarginalNode]) -> list[str]:
    """One line per pool, as `placer plan --explain` prints them."""
    lines = ["one more node of each pool (re-solved):"]
    for pool, m in nodes.items():
        lines.append(f"  {pool:<8} iteration {m.iteration_s:.3f} s ({m.delta_s:+.3f} s), "
                     f"cost/sample {m.cost_per_sample:.6f} USD "
                     f"({m.delta_cost_per_sample:+.6f})")
    return lines
