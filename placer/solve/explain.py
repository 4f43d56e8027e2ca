"""Why a plan looks the way it does: every kind of explanation, gathered in one record.

  roles      per role: pool, layout, time per stage, memory per device by kind
             (`placer.solve.breakdown`)
  binding    the constraints that hold the plan where it is (`placer.solve.binding`)
  marginal   the value of one more node of each pool, re-solved (`placer.solve.marginal`)
  booking    booked against used cost, and the idle nodes that can be released at the same
             iteration time (`placer.solve.booking`)
  host       host memory of the busiest node of each GPU pool by part (`placer.solve.hostwhy`)
  split      per role split over pools, its parts against the best single-pool plan
             (`placer.solve.splitwhy`)
  judge      a generative judge: its placement, its queue and the best plan with it held to each
             pool (`placer.solve.judgewhy`)
  async      a sync plan that leaves accelerators idle against the async plan
             (`placer.solve.asyncwhy`)
  micro      per trained role, its layout at each micro-batch size tried (`placer.solve.microwhy`)

Each is a typed record (`placer.base.records.Record`) with its own `*_lines`; `explain` gathers
them in one `Explanation`, whose `to_dict()` is the `explain` document `placer plan --explain
--json` prints, and `render` joins their lines into the text it prints without `--json`.

Why a job does not fit at all is `placer.solve.diagnose`, which the planner calls; this module
sits above the planner, since `marginal`, `split`, `judge` and `async` re-solve.
"""
from __future__ import annotations

from placer.base.records import Record
from placer.cost.pricer import Pricer
from placer.solve.asyncwhy import AsyncWhy, async_lines, async_why
from placer.solve.binding import binding, binding_lines
from placer.solve.booking import Booking, booking, booking_lines
from placer.solve.breakdown import RoleRow, breakdown, breakdown_lines
from placer.solve.hostwhy import HostMemoryRow, host_lines, host_memory
from placer.solve.judgewhy import JudgeWhy, judge_lines, judge_why
from placer.solve.marginal import MarginalNode, marginal, marginal_lines
from placer.solve.microwhy import MicroTry, micro_lines, micro_why
from placer.solve.planfile import Plan, SearchSpace
from placer.solve.splitwhy import SplitWhy, split, split_lines


class Explanation(Record):
    """Why a plan looks the way it does: every section of the module docstring. The JSON form
    is the `explain` document of `placer plan --explain --json`."""

    roles: dict[str, RoleRow]
    binding: list[str]
    marginal_node: dict[str, MarginalNode]
    booking: Booking
    host_memory: dict[str, HostMemoryRow]
    split: dict[str, SplitWhy]
    judge: JudgeWhy | None = None
    async_alternative: AsyncWhy | None = None
    """a sync plan that leaves accelerators idle: the async plan's time and idle devices"""
    search_space: SearchSpace | None = None
    """what the solver searched, the space its status and gap are relative to (plans written
    before it was recorded: None)"""
    micro_batch: dict[str, list[MicroTry]] = {}
    """per trained role, each micro-batch size tried on its layout (`placer.solve.microwhy`)"""


def explain(plan: Plan, px: Pricer, time_limit_s: float = 5.0) -> Explanation:
    return Explanation(roles=breakdown(plan, px), binding=binding(plan, px),
                       marginal_node=marginal(plan, px, time_limit_s),
                       booking=booking(plan, px), host_memory=host_memory(plan, px),
                       split=split(plan, px, time_limit_s),
                       judge=judge_why(plan, px, time_limit_s),
                       async_alternative=async_why(plan, px, time_limit_s),
                       search_space=plan.solver.search_space, micro_batch=micro_why(plan, px))


def search_lines(sp: SearchSpace | None) -> list[str]:
    """What the solver's gap is relative to, in words."""
    if sp is None:
        return []
    return [f"searched: {sp.roles} roles, {sp.layouts} single-pool layouts, {sp.split_counts} "
            f"split pairs of layouts ({sp.pruned_by_bound} pruned by the bound, {sp.dominated} "
            "beaten by another split)",
            f"  the gap is relative to {sp.relative_to}"]


def render(ex: Explanation) -> str:
    lines = [*search_lines(ex.search_space), *breakdown_lines(ex.roles)]
    lines += micro_lines(ex.micro_batch, {k: r.device_memory_gb for k, r in ex.roles.items()})
    lines += host_lines(ex.host_memory)
    for role, sp in ex.split.items():
        lines += split_lines(role, sp)
    if ex.judge is not None:
        lines += judge_lines(ex.judge)
    lines += async_lines(ex.async_alternative)
    lines += booking_lines(ex.booking)
    lines += binding_lines(ex.binding)
    lines += marginal_lines(ex.marginal_node)
    return "\n".join(lines)
