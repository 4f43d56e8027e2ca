"""Why a plan looks the way it does.

  breakdown  per role: pool, layout, time per stage, memory per device by kind (re-estimated from
             the one cost model, so the numbers are the ones the ILP used)
  binding    the constraints that hold the plan where it is: pools used to the last device, slots
             whose roles do not fit in memory together (they pay offload/onload), the slot that
             sets each stage (sync) or the busiest slot (async), roles at their largest config
  marginal   the value of one more node of each pool, by re-solving the ILP on the grown cluster
  release    nodes the plan leaves idle, per pool, that can be given back at the same iteration
             time: the plan's placement re-priced on the shrunk cluster through the cost table
             (`releases`), and what they cost per hour
  host       host memory of the busiest node of each GPU pool by part (`placer.solve.hostmem`)
  judge      a generative judge: its placement, its queue and the best plan with it held to each
             pool (`placer.solve.judgewhy`)
  micro      per trained role, its layout at each micro-batch size tried (`placer.solve.microwhy`)
  split      per role split over pools (`placer.cost.split`): its parts (pool, layout, share of the
             samples, time) and why: the best single-pool plan, re-solved with the split
             candidates left out, against the split plan (`single_pool_alternative`); a mixed
             rollout names the roles its first part time-shares its slot with

Each is a typed record (`placer.base.records.Record`) and `explain` gathers them in one
`Explanation`; `to_dict()` is the `explain` document `placer plan --explain --json` prints and
`render` the text it prints without `--json`.

Why a job does not fit at all is `placer.solve.diagnose`, which the planner calls; this module
sits above the planner, since `marginal` and `split` re-solve.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from pydantic import SerializerFunctionWrapHandler, model_serializer

from placer.base.errors import Infeasible
from placer.base.records import Record
from placer.base.roles import is_training
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.cost.timing import Placed
from placer.solve.assemble import placed_estimate, shares_slot
from placer.solve.asyncwhy import AsyncWhy, async_lines, async_why
from placer.solve.candidates import role_candidates
from placer.solve.hostmem import busiest_per_pool, offloaded_gb_per_device, plan_nodes
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import solve
from placer.solve.judgewhy import JudgeWhy, judge_lines, judge_why
from placer.solve.microwhy import MicroTry, micro_lines, micro_why
from placer.solve.moves import dims
from placer.solve.parktwins import park_note
from placer.solve.planfile import Plan, RolePlacement, SearchSpace
from placer.solve.planner import build_problem, plan_job
from placer.solve.pricing import device_price
from placer.solve.problem import Unsolved
from placer.spec.catalog import Resolved, with_nodes
from placer.spec.job import pin_of

MEMORY_KINDS = ("weights", "grads", "optimizer", "activations", "kv_cache", "overhead")


class MemoryByKind(Record):
    """GB per device of each kind of memory a role holds."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    kv_cache: float
    overhead: float


class PartRow(Record):
    """One part of a role split over pools, as `breakdown` and `split` report it."""

    pool: str
    device: str
    devices: int
    layout: str
    share: float
    samples: int
    time_s: float
    memory_total_gb: float
    device_memory_gb: float


class RoleRow(Record):
    """One role of `breakdown`: where it sits, its time per stage and its memory per device.
    A split role names every part's pool and device joined by "+" and lists its `parts` (a role
    on one pool has none, and its JSON form no `parts` key)."""

    pool: str
    device: str
    devices: int
    layout: str
    slot: str
    stage_s: dict[str, float]
    time_s: float
    share: float
    """of the predicted iteration time"""
    memory_gb: MemoryByKind
    memory_total_gb: float
    device_memory_gb: float
    host_optimizer_gb: float
    """optimizer state per device kept on the host (offloaded)"""
    pinned: str | None
    """the job's pin on this role's layout, as `placer.spec.pins` describes it"""
    parts: list[PartRow] | None = None

    @model_serializer(mode="wrap")
    def _parts_when_split(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if self.parts is None:
            del out["parts"]
        return out


def breakdown(plan: Plan, px: Pricer) -> dict[str, RoleRow]:
    res = px.res
    out = {}
    for role, r in plan.roles.items():
        pool = res.cluster.pool(r.pool)
        est = placed_estimate(px, role, r, shares_slot(plan, role))  # a split: parts re-priced
        mem = est.memory
        if r.parts:  # the part whose memory the role reports (the fullest) sets the device
            pool = res.cluster.pool(max(est.parts, key=lambda q: q.est.memory.total).est.pool)
        split = bool(r.parts)
        out[role] = RoleRow(
            pool="+".join(q.pool for q in r.parts) if split else r.pool,
            device=("+".join(res.cluster.pool(q.pool).device for q in r.parts) if split
                    else pool.device),
            devices=r.devices, layout=dims(r) + (" offload" if r.offload else ""),
            slot=r.slot, stage_s={k: round(v, 4) for k, v in r.stage_s.items()},
            time_s=round(r.time_s, 4), share=round(r.time_s / plan.predicted_iteration_s, 4),
            memory_gb=MemoryByKind(**{k: round(getattr(mem, k), 3) for k in MEMORY_KINDS}),
            memory_total_gb=round(mem.total, 3),
            device_memory_gb=res.device_of(pool).memory_gb,
            host_optimizer_gb=round(_host_optimizer(res, role, r.par), 3),
            pinned=pin.describe() if (pin := pin_of(res.job, role)) else None,
            parts=_parts(res, r) if split else None)
    return out


def _parts(res: Resolved, r: RolePlacement) -> list[PartRow]:
    """A split role's parts as `breakdown` and `split` report them."""
    return [PartRow(pool=q.pool, device=res.cluster.pool(q.pool).device, devices=q.devices,
                    layout=dims(q.par), share=round(q.share, 4), samples=q.samples,
                    time_s=round(q.time_s, 4), memory_total_gb=round(q.memory_gb, 3),
                    device_memory_gb=res.device_of(q.pool).memory_gb) for q in r.parts]


def _host_optimizer(res: Resolved, role: str, par: Parallel) -> float:
    """GB per device of optimizer state the role keeps on the host (offloaded)."""
    m = res.model_of(role)
    return offloaded_gb_per_device(m, par) if is_training(role) and m is not None else 0.0


@dataclass(frozen=True)
class Release:
    """Idle nodes of a pool that can go back at the same iteration time."""

    pool: str
    nodes: int
    keep: int  # nodes the plan uses
    usd_per_hour: float

    def line(self) -> str:
        return (f"release {self.nodes} node{'s' if self.nodes != 1 else ''} of {self.pool}: "
                f"same time, {self.usd_per_hour:.2f} USD/h less")


def releases(plan: Plan, px: Pricer) -> list[Release]:
    """Per pool, the nodes no bundle of the plan uses, if giving them back keeps the time."""
    used: dict[str, set[int]] = {}
    for b in plan.bundles:
        used.setdefault(b.pool, set()).add(b.node)
    res = px.res
    out = []
    for p in res.cluster.pools:
        keep = len(used.get(p.name, ()))
        idle = p.nodes - keep
        if idle > 0 and _same_time(plan, px, p.name, keep):
            out.append(Release(p.name, idle, keep,
                               device_price(res, p.name) * p.devices_per_node * idle))
    return out


def _same_time(plan: Plan, px: Pricer, pool: str, keep: int) -> bool:
    """The plan's placement priced by the cost table on the cluster with `pool` cut to `keep`
    nodes (0: gone) has the plan's iteration time."""
    try:
        small = px.with_res(with_nodes(px.res.job, {pool: keep}))
    except Infeasible:  # no nodes left at all
        return False
    placed = []
    for role, r in plan.roles.items():
        est = placed_estimate(small, role, r, shares_slot(plan, role))  # every part priced
        if not est.feasible:
            return False
        placed.append(Placed(r.slot, est))
    t = small.iteration_time(placed).iteration_s
    return math.isclose(t, plan.predicted_iteration_s, rel_tol=1e-9)


class HostMemoryRow(Record):
    """The busiest node of a GPU pool: its host memory by part (GB) against its capacity."""

    node: int
    parts_gb: dict[str, float]
    total_gb: float
    capacity_gb: float


def host_memory(plan: Plan, px: Pricer) -> dict[str, HostMemoryRow]:
    """Per checked GPU pool, its busiest node's host memory by part (GB) and capacity."""
    return {pool: HostMemoryRow(node=n.node, parts_gb={k: round(v, 1) for k, v in n.parts.items()},
                                total_gb=round(n.total_gb, 1), capacity_gb=n.capacity_gb)
            for pool, n in busiest_per_pool(plan_nodes(plan, px)).items()}


def binding(plan: Plan, px: Pricer) -> list[str]:
    res = px.res
    notes = []
    used: dict[str, int] = {}
    for s in plan.slots:
        for pool_name, n in s.pool_devices():  # a split role's slot: its devices on each pool
            used[pool_name] = used.get(pool_name, 0) + n
    for p in res.cluster.pools:
        cap = p.devices_per_node * p.nodes
        if used.get(p.name, 0) == cap:
            notes.append(f"pool {p.name}: all {cap} devices used (capacity binds)")
    for slot, t in plan.breakdown.switch_s.items():
        notes.append(park_note(plan, res, slot, t) or
                     f"slot {slot}: its roles do not fit in memory together; "
                     f"offload/onload costs {t:.2f} s per iteration")
    busy = plan.breakdown.slot_busy_s
    if plan.pipeline.overlaps_steps and busy:
        top = max(busy, key=busy.__getitem__)
        chain = sum(plan.breakdown.stage_s.values())
        stale = plan.pipeline.staleness
        if plan.pipeline.chain_bound_s(chain) > busy[top]:
            notes.append(f"async: one step's sync -> rollout -> score -> train chain "
                         f"({chain:.2f} s) must fit in staleness + 1 = {stale + 1} iterations "
                         f"and sets the iteration time (busiest slot {top}: {busy[top]:.2f} s)")
        else:
            notes.append(f"async: slot {top} is the busiest ({busy[top]:.2f} s) and sets the "
                         "iteration time")
    else:
        for stage, t in plan.breakdown.stage_s.items():
            if t > 0:
                notes.append(f"stage {stage}: {t:.2f} s, set by {_stage_setter(plan, stage)}")
    for role, r in plan.roles.items():
        if r.parts:  # a part that takes its whole pool: more of that pool would speed it up
            notes += [f"role {role}: its part on pool {q.pool} uses the whole pool ({q.devices} "
                      "devices)" for q in r.parts if q.devices == _capacity(res, q.pool)]
            continue
        biggest = max((c.devices for c in role_candidates(px, role, res.cluster.pool(r.pool))),
                      default=0)
        if r.devices == biggest and r.devices == res.cluster.pool(r.pool).devices_per_node * \
                res.cluster.pool(r.pool).nodes:
            notes.append(f"role {role}: uses the whole pool {r.pool}; only more nodes would "
                         "speed it up")
    return notes


def _capacity(res: Resolved, pool_name: str) -> int:
    pool = res.cluster.pool(pool_name)
    return pool.devices_per_node * pool.nodes


def _stage_setter(plan: Plan, stage: str) -> str:
    agents = plan.resolved().job.agents
    if agents is not None and stage in ("sync", "rollout"):  # `placer.cost.agents`
        what = "weight syncs" if stage == "sync" else "rollouts"
        parts = [f"{r} {rp.stage_s.get('rollout', 0.0):.2f} s" for r, rp in plan.roles.items()
                 if r.endswith(".rollout")] if stage == "rollout" else []
        return (f"every agent's {what}, one agent after another"
                + (f" ({' + '.join(parts)})" if parts else ""))
    if stage == "sync":
        return "weight sync actor -> rollout"
    if stage == "switch":
        return "offload/onload of a colocated slot"
    per_slot: dict[str, float] = {}
    for r in plan.roles.values():
        per_slot[r.slot] = per_slot.get(r.slot, 0.0) + r.stage_s.get(stage, 0.0)
    slot = max(per_slot, key=per_slot.__getitem__)
    roles = [role for role, r in plan.roles.items() if r.slot == slot and r.stage_s.get(stage)]
    return f"slot {slot} ({', '.join(roles)})"


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
    return {role: SplitWhy(parts=_parts(px.res, r), iteration_s=plan.predicted_iteration_s,
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


class ReleaseRow(Record):
    """A `Release` as the booking reports it: its figures (USD/h to 4 decimals) and its line."""

    pool: str
    nodes: int
    keep: int
    usd_per_hour: float
    line: str

    @classmethod
    def of(cls, r: Release) -> ReleaseRow:
        return cls(pool=r.pool, nodes=r.nodes, keep=r.keep,
                   usd_per_hour=round(r.usd_per_hour, 4), line=r.line())


class Booking(Record):
    """Booked (every node of the cluster) against used (the plan's devices) cost, and the idle
    nodes that can be released at the same iteration time."""

    booked_usd_per_hour: float
    used_usd_per_hour: float
    booked_cost_per_sample: float
    used_cost_per_sample: float
    release: list[ReleaseRow]


def booking(plan: Plan, px: Pricer) -> Booking:
    """Booked against used USD/h and per sample, and the nodes that can be released."""
    return Booking(booked_usd_per_hour=plan.booked_usd_per_hour,
                   used_usd_per_hour=plan.used_usd_per_hour,
                   booked_cost_per_sample=plan.booked_cost_per_sample,
                   used_cost_per_sample=plan.cost_per_sample,
                   release=[ReleaseRow.of(r) for r in releases(plan, px)])


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
    lines = [*search_lines(ex.search_space), "per role:",
             f"  {'role':<12} {'pool':<8} {'devices':>7} {'layout':<16} "
             f"{'time s':>9} {'share':>6} {'mem GB':>8}  memory by kind"]
    for role, r in ex.roles.items():
        if r.parts:  # split over pools: the role's total, then one line per part
            lines += _part_lines(role, r)
            continue
        host = r.host_optimizer_gb
        lines.append(f"  {role:<12} {r.pool:<8} {r.devices:>7} {r.layout:<16} "
                     f"{r.time_s:>9.3f} {r.share:>6.0%} {r.memory_total_gb:>8.2f}  "
                     f"{_kinds(r.memory_gb)} (of {r.device_memory_gb:g})"
                     + (f"; on the host: optimizer {host:.1f} per device" if host else "")
                     + (f"; pinned by the job ({r.pinned})" if r.pinned else ""))
    lines += micro_lines(ex.micro_batch, {k: r.device_memory_gb for k, r in ex.roles.items()})
    if ex.host_memory:
        lines.append("host memory per node (GB, busiest node of each GPU pool):")
        for pool, h in ex.host_memory.items():
            parts = ", ".join(f"{k.replace('_', ' ')} {v:,.1f}" for k, v in h.parts_gb.items()
                              if v)
            lines.append(f"  {pool:<8} node {h.node}: {h.total_gb:,.1f} of "
                         f"{h.capacity_gb:,.0f} ({parts})")
    for role, sp in ex.split.items():
        lines += split_lines(role, sp)
    if ex.judge is not None:
        lines += judge_lines(ex.judge)
    lines += async_lines(ex.async_alternative)
    lines += booking_lines(ex.booking)
    lines.append("binding:")
    lines += [f"  - {b}" for b in ex.binding] or ["  (none)"]
    lines.append("one more node of each pool (re-solved):")
    for pool, m in ex.marginal_node.items():
        lines.append(f"  {pool:<8} iteration {m.iteration_s:.3f} s ({m.delta_s:+.3f} s), "
                     f"cost/sample {m.cost_per_sample:.6f} USD "
                     f"({m.delta_cost_per_sample:+.6f})")
    return "\n".join(lines)


def _kinds(mem: MemoryByKind) -> str:
    """The kinds of memory a role holds, in GB per device (those above 0)."""
    return ", ".join(f"{k} {v:.1f}" for k, v in mem.to_dict().items() if v > 0)


def _part_lines(role: str, r: RoleRow) -> list[str]:
    """`render`'s rows of a split role: "split" and its total, then each part on its pool."""
    parts = r.parts or []
    out = [f"  {role:<12} {'split':<8} {r.devices:>7} {'over ' + str(len(parts)) + ' pools':<16} "
           f"{r.time_s:>9.3f} {r.share:>6.0%} {r.memory_total_gb:>8.2f}  {_kinds(r.memory_gb)} "
           f"(of {r.device_memory_gb:g}, fullest part)"
           + (f"; pinned by the job ({r.pinned})" if r.pinned else "")]
    out += [f"    {'part':<10} {q.pool:<8} {q.devices:>7} {q.layout:<16} "
            f"{q.time_s:>9.3f} {'':>6} {q.memory_total_gb:>8.2f}  {q.share:.1%} of the "
            f"samples ({q.samples}), {q.device} (of {q.device_memory_gb:g})"
            for q in parts]
    return out


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


def booking_lines(b: Booking) -> list[str]:
    """Booked vs used cost and the release advice, as `--explain` prints them."""
    lines = [f"booked {b.booked_usd_per_hour:.2f} USD/h ({b.booked_cost_per_sample:.6f} "
             f"USD/sample), used {b.used_usd_per_hour:.2f} USD/h "
             f"({b.used_cost_per_sample:.6f} USD/sample)"]
    lines += [f"  {r.line}" for r in b.release]
    return lines
