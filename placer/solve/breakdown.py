"""Per role of a plan: its pool, layout, time per stage and memory per device by kind.

Every figure is re-estimated from the one cost model (`assemble.placed_estimate`), so the numbers
are the ones the ILP used. A role split over pools names every part's pool and device joined by
"+" and lists its parts; the part with the fullest memory sets the device the role reports.
`placer.solve.explain` gathers this with the other explanations; `breakdown_lines` is its text.
"""
from __future__ import annotations

from typing import Any

from pydantic import SerializerFunctionWrapHandler, model_serializer

from placer.base.records import Record
from placer.base.roles import is_training
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.solve.assemble import placed_estimate, shares_slot
from placer.solve.hostmem import offloaded_gb_per_device
from placer.solve.moves import dims
from placer.solve.planfile import Plan, RolePlacement
from placer.spec.catalog import Resolved
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
    """One part of a role split over pools, as `breakdown` and `placer.solve.splitwhy` report
    it."""

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
            parts=part_rows(res, r) if split else None)
    return out


def part_rows(res: Resolved, r: RolePlacement) -> list[PartRow]:
    """A split role's parts as `breakdown` and `placer.solve.splitwhy` report them."""
    return [PartRow(pool=q.pool, device=res.cluster.pool(q.pool).device, devices=q.devices,
                    layout=dims(q.par), share=round(q.share, 4), samples=q.samples,
                    time_s=round(q.time_s, 4), memory_total_gb=round(q.memory_gb, 3),
                    device_memory_gb=res.device_of(q.pool).memory_gb) for q in r.parts]


def _host_optimizer(res: Resolved, role: str, par: Parallel) -> float:
    """GB per device of optimizer state the role keeps on the host (offloaded)."""
    m = res.model_of(role)
    return offloaded_gb_per_device(m, par) if is_training(role) and m is not None else 0.0


def breakdown_lines(roles: dict[str, RoleRow]) -> list[str]:
    """The per-role table `placer plan --explain` prints."""
    lines = ["per role:",
             f"  {'role':<12} {'pool':<8} {'devices':>7} {'layout':<16} "
             f"{'time s':>9} {'share':>6} {'mem GB':>8}  memory by kind"]
    for role, r in roles.items():
        if r.parts:  # split over pools: the role's total, then one line per part
            lines += _part_lines(role, r)
            continue
        host = r.host_optimizer_gb
        lines.append(f"  {role:<12} {r.pool:<8} {r.devices:>7} {r.layout:<16} "
                     f"{r.time_s:>9.3f} {r.share:>6.0%} {r.memory_total_gb:>8.2f}  "
                     f"{_kinds(r.memory_gb)} (of {r.device_memory_gb:g})"
                     + (f"; on the host: optimizer {host:.1f} per device" if host else "")
                     + (f"; pinned by the job ({r.pinned})" if r.pinned else ""))
    return lines


def _kinds(mem: MemoryByKind) -> str:
    """The kinds of memory a role holds, in GB per device (those above 0)."""
    return ", ".join(f"{k} {v:.1f}" for k, v in mem.to_dict().items() if v > 0)


def _part_lines(role: str, r: RoleRow) -> list[str]:
    """The rows of a split role: "split" and its total, then each part on its pool."""
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
