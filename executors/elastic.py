"""Elasticity: noticing that the cluster changed under a run, re-planning, and rebuilding on it.

A pool's size is what Ray says is alive: the `pool_<name>` resource of the alive nodes, summed, in
whole nodes of the pool (`devices_per_node`). When that differs from the plan's (a node died, or
one joined), the loop stops at the failure or at the next step boundary and asks `Elastic` for a
new world:

  1. re-plan: `placer.planner.plan_job` on `with_nodes(original job, alive counts)`, warm-started
     from the running plan (`hint`), with a movement cost per role that changes config, so that a
     small change moves few roles;
  2. drop the old actors and placement groups, create the new plan's groups and actors, check they
     landed where the plan says.
The loop then restores the trainer (and critic) from the last checkpoint and continues
(`executors.loop.Loop.recover_cluster`).

Node keys (`placer_node_<pool>_<i>`): the new plan numbers a pool's nodes 0..n-1. When the
surviving nodes do not advertise exactly those keys (node 0 died while node 1 lives) the rebuilt
placement groups are not pinned to nodes, only to pools (`pool_<name>` resources), and
`describe()` says so.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from executors import placement as pl
from executors.cluster import node_key, node_resources
from executors.roles import RunConfig
from placer.plan import Plan, calibration_of

MOVE_COST_S = 1.0  # a role that changes config is rebuilt: worth ~1 s of iteration time
REPLAN_TIME_LIMIT_S = 5.0


class ClusterChanged(RuntimeError):
    """The alive cluster no longer matches the plan: re-plan and rebuild."""

    def __init__(self, counts: dict[str, int], reason: str) -> None:
        super().__init__(reason)
        self.counts, self.reason = counts, reason


def alive_counts(plan_job_pools: list[Any]) -> dict[str, int]:
    """Whole nodes alive per pool, from the alive Ray nodes' `pool_<name>` resources."""
    import ray  # noqa: PLC0415
    have: dict[str, float] = {}
    for n in ray.nodes():
        if n.get("Alive"):
            for k, v in n.get("Resources", {}).items():
                have[k] = have.get(k, 0.0) + v
    return {p.name: int(have.get(f"pool_{p.name}", 0.0) // p.devices_per_node)
            for p in plan_job_pools}


def moves(old: Plan, new: Plan) -> list[str]:
    """Roles whose config or slot changed, as `role: pool tp/pp/dp -> pool tp/pp/dp`."""
    def cfg(p: Plan, r: str) -> str:
        x = p.roles.get(r)
        return "absent" if x is None else f"{x.pool} tp{x.tp} pp{x.pp} dp{x.dp}"
    out = []
    for r in sorted(set(old.roles) | set(new.roles)):
        if cfg(old, r) != cfg(new, r):
            out.append(f"{r}: {cfg(old, r)} -> {cfg(new, r)}")
    return out


def keys_present(plan: Plan) -> bool:
    """Every plan node's key is advertised by an alive node."""
    import ray  # noqa: PLC0415
    have = {k for n in ray.nodes() if n.get("Alive") for k in n.get("Resources", {})}
    return all(node_key(p, n) in have for p, n in node_resources(plan))


@dataclass
class Elastic:
    """The run's current plan, placement groups and runtime, and how to rebuild them."""

    plan: Plan
    cfg: RunConfig
    groups: dict[str, Any]
    rt: Any
    pinned: bool
    backend: str = "torch"
    max_restarts: int = 3
    move_cost_s: float = MOVE_COST_S
    time_limit_s: float = REPLAN_TIME_LIMIT_S
    placement: list[dict[str, Any]] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)  # the last rebuild's parts (s)

    def __post_init__(self) -> None:
        self.original = self.plan.resolved().job  # pools that died keep their shape here
        # Watched: the pools the run started on. A pool the plan leaves unused may not be
        # advertised at all (an embedded Ray advertises what the plan's bundles ask for).
        self.watched = sorted({b.pool for b in self.plan.bundles})

    def planned(self) -> dict[str, int]:
        pools = {p.name: p.nodes for p in self.plan.resolved().job.cluster.pools}
        return {p: pools.get(p, 0) for p in self.watched}

    def changed(self) -> ClusterChanged | None:
        """A ClusterChanged (with the alive node count of every pool) when a watched pool's
        alive nodes differ from the plan's, else None."""
        now, want = alive_counts(self.original.cluster.pools), self.planned()
        diff = [f"{p} {want[p]}->{now[p]} node(s)" for p in self.watched if now[p] != want[p]]
        return ClusterChanged(now, f"cluster changed: {', '.join(diff)}") if diff else None

    def replan(self, counts: dict[str, int]) -> Plan:
        from placer.planner import plan_job, with_nodes  # noqa: PLC0415
        res = with_nodes(self.original, counts, "alive cluster")
        return plan_job(res, calibration_of(self.plan), time_limit_s=self.time_limit_s,
                        hint=self.plan, move_cost_s=self.move_cost_s, seed=self.original.seed)

    def rebuild(self, counts: dict[str, int]) -> tuple[Plan, Any, list[str]]:
        """New plan for `counts`; the old actors and groups go, the new ones are placed."""
        from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

        from executors.runtime import RayRuntime  # noqa: PLC0415
        t0 = time.monotonic()
        new = self.replan(counts)
        t1 = time.monotonic()
        self.close()
        pinned = self.pinned and keys_present(new)
        self.groups = pl.create_groups(new, pinned)
        t2 = time.monotonic()
        try:
            self.rt = RayRuntime(new, self.cfg, self.groups, pinned, self.backend,
                                 self.max_restarts)
        except Exception:
            for pg in self.groups.values():
                remove_placement_group(pg)
            self.groups = {}
            raise
        self.placement = pl.verify(new, self.rt.members, self.groups)
        pl.check(self.placement, pinned)
        changes = moves(self.plan, new)
        if not pinned and self.pinned:
            changes.append("node pinning off: surviving nodes do not carry the new plan's keys")
        self.plan, self.pinned = new, pinned
        self.timing = {"replan_s": round(t1 - t0, 3), "groups_s": round(t2 - t1, 3),
                       "actors_s": round(time.monotonic() - t2, 3)}
        return new, self.rt, changes

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group  # noqa: PLC0415
        if self.rt is not None:
            self.rt.close()
        for pg in self.groups.values():
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - its node is gone with it
                pass
        self.groups = {}
