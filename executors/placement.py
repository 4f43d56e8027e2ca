"""From a run plan's slots and seats to Ray placement groups and role actors, and a check that
they landed.

One placement group per slot (`executors.runplan.SlotRun`), its bundles in the plan's bundle
order (stable: bundle k of a slot is always the plan's k-th bundle of that slot, so a
tensor-parallel group never moves between runs), with the slot's strategy
(`executors.seats.strategy`). Every bundle also asks for its plan node's key
(`cluster.node_key`), so it can only land on that node. One actor per seat
(`executors.seats`): `Member` is a seat with the worker running there; colocated roles share a
bundle's resources in equal parts (`actor_options`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from executors.cluster import node_key
from executors.runplan import RunPlan
from executors.seats import Seat
from placer.solve.planfile import Bundle


class PlacementError(RuntimeError):
    """An actor is not where the plan says."""


@dataclass
class Member:
    role: str
    rank: int
    slot: str
    bundle: Bundle
    bundle_pos: int  # index of the bundle inside its slot's placement group
    sharers: int = 1
    part: int | None = None  # index in the role's `parts` when the role is split over pools
    handle: Any = None
    where: dict[str, Any] = field(default_factory=dict)

    @property
    def device_ids(self) -> list[str]:
        return [f"{self.bundle.pool}:{self.bundle.node}:{d}" for d in self.bundle.devices]

    @property
    def trace_pid(self) -> str:
        return f"{self.bundle.pool}:{self.bundle.node}"


def assign(seats: Sequence[Seat]) -> list[Member]:
    """A member (no worker yet) for every seat (a run plan's `seats`)."""
    return [Member(x.role, x.rank, x.slot, x.bundle, x.bundle_pos, x.sharers, x.part)
            for x in seats]


def bundle_request(b: Bundle, pinned: bool) -> dict[str, float]:
    req = dict(b.resources)
    if pinned:
        req[node_key(b.pool, b.node)] = 1.0
    return req


def _share(amount: float, k: int) -> float:
    """Ray takes fractions only below 1 (above, whole units) and counts in 1e-4 steps: round
    down, or k shares of a bundle could add up to more than the bundle and never schedule."""
    s = amount / k
    return math.floor(s * 1e4) / 1e4 if s <= 1 else float(math.floor(s))


def _gpu_share(gpus: float, k: int) -> float:
    """Ray hands out GPUs as unit instances and a fraction must fit inside one GPU: k sharers
    of g GPUs take g//k each, or, when more sharers than GPUs, 1/ceil(k/g) of one GPU each."""
    g = int(gpus)
    if k <= g:
        return float(g // k)
    return math.floor(1e4 / math.ceil(k / max(g, 1))) / 1e4


def actor_options(m: Member, pg: Any, pinned: bool) -> dict[str, Any]:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # lazy: Ray run only
    req = {k: _gpu_share(v, m.sharers) if k == "GPU" else _share(v, m.sharers)
           for k, v in bundle_request(m.bundle, pinned).items()}
    opts: dict[str, Any] = {"num_cpus": req.pop("CPU", 0.0), "num_gpus": req.pop("GPU", 0.0),
                            "resources": req,
                            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                                pg, placement_group_bundle_index=m.bundle_pos)}
    return opts


def create_groups(run: RunPlan, pinned: bool, timeout_s: float = 120.0,
                  skip: frozenset[str] | set[str] = frozenset(), prefix: str = ""
                  ) -> dict[str, Any]:
    """One ready placement group per slot (but the `skip` slots: a rebuild keeps their groups),
    named `placer-PREFIXSLOT` (`prefix`: a fleet's job, `executors.fleetrun`)."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
    from ray.util.placement_group import placement_group  # lazy: Ray run only
    groups = {}
    for name, slot in run.slots.items():
        if name in skip:
            continue
        pg = placement_group([bundle_request(b, pinned) for b in slot.bundles],
                             strategy=slot.strategy, name=f"placer-{prefix}{name}")
        groups[name] = pg
    for name, pg in groups.items():
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_groups(groups)  # the ready ones too: they would hold their bundles
            raise PlacementError(f"placement group for slot {name} not ready after {timeout_s:.0f}s:"
                                 f" the cluster lacks {[b.resources for b in run.slots[name].bundles]}"
                                 ) from None
    return groups


def remove_groups(groups: dict[str, Any]) -> None:
    """Remove every placement group of `groups` (a run's, or a set-up that failed)."""
    from ray.util.placement_group import remove_placement_group  # lazy: Ray run only
    for pg in groups.values():
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - gone with its node, or never made
            pass


def verify(members: list[Member], groups: dict[str, Any]) -> list[dict[str, Any]]:
    """Each actor's node has its plan node's key, and it holds its own bundle of its slot's group."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
    wheres = ray.get([m.handle.where.remote() for m in members])
    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n.get("Alive")}
    rows = []
    for m, w in zip(members, wheres):
        m.where = w
        pg_hex = groups[m.slot].id.hex()
        key = node_key(m.bundle.pool, m.bundle.node)
        on_node = key in nodes.get(w.get("node_id"), {})
        table = ray.util.placement_group_table(groups[m.slot])
        bundle_node = table.get("bundles_to_node_id", {}).get(m.bundle_pos)
        in_bundle = w.get("placement_group") == pg_hex and bundle_node == w.get("node_id")
        rows.append({"role": m.role, "rank": m.rank, "slot": m.slot, "bundle": m.bundle.index,
                     "pool": m.bundle.pool, "node": m.bundle.node, "ray_node": w.get("node_id"),
                     "pid": w.get("pid"), "on_plan_node": on_node, "in_bundle": in_bundle,
                     **({"part": m.part} if m.part is not None else {})})
    return rows


def check(rows: list[dict[str, Any]], pinned: bool) -> None:
    bad = [r for r in rows if not r["in_bundle"] or (pinned and not r["on_plan_node"])]
    if bad:
        r = bad[0]
        raise PlacementError(f"{r['role']}[{r['rank']}] is not on {r['pool']}:{r['node']} bundle "
                             f"{r['bundle']} as the plan says ({len(bad)} actor(s) misplaced)")


def device_of(m: Member, role: list[Member]) -> tuple[int, Any]:
    """The (bundle, device) a member's first device is: a bundle's devices go to the role's
    members in it in rank order, an equal share each (a trainer rank one, an engine replica
    its TP group)."""
    same = sorted(x.rank for x in role if x.bundle.index == m.bundle.index)
    devices = list(m.bundle.devices)
    per = max(len(devices) // max(len(same), 1), 1)
    at = same.index(m.rank) * per if m.rank in same else 0
    return m.bundle.index, devices[min(at, len(devices) - 1)] if devices else None


def devices_of(m: Member, role: list[Member], tp: int) -> list[tuple[int, Any]]:
    """The (bundle, device) of each of engine `m`'s `tp` TP ranks: its share of its bundle's
    devices (`device_of`: the first), one per TP rank (the last again when the share is
    short: an emulated bundle)."""
    bundle, first = device_of(m, role)
    devices = list(m.bundle.devices)
    at = devices.index(first) if first in devices else 0
    return [(bundle, devices[min(at + t, len(devices) - 1)] if devices else None)
            for t in range(tp)]
