"""Elasticity: noticing that the cluster changed under a run, re-planning, and rebuilding on it.

A pool's size is what Ray says is alive: the `pool_<name>` resource of the alive nodes, summed, in
whole nodes of the pool (`devices_per_node`). When that differs from the plan's (a node died, or
one joined), the loop stops at the failure or at the next step boundary and asks `Elastic` for a
new world:

  1. re-plan: `placer.solve.planner.plan_job` on `with_nodes(original job, alive counts)`, warm-started
     from the running plan (`hint`), with a movement cost per role that changes config, so that a
     small change moves few roles; the new plan is resolved into its run plan
     (`executors.runplan`), the one place besides the run's start that reads a `Plan`;
  2. keep what survived unchanged: a slot whose roles (and their parallel layout) and bundles
     are the same in both plans, on pools that kept every node, with every actor alive, keeps its
     placement group and its actors (their processes, loaded models and sandboxes) -
     `kept_slots`; drop the other actors and groups, create the new plan's, check that every
     actor is where the plan says. A trainer's micro-batch is no part of its layout here: a
     kept actor takes the new plan's in place (`Worker.set_micro_batches`), as the driver
     cuts the batches anyway; only a change of layout rebuilds.
The loop then restores the trainer (and critic) from the last checkpoint and continues
(`executors.recovery.Recovery.recover_cluster`).

Node keys (`placer_node_<pool>_<i>`): the new plan numbers a pool's nodes 0..n-1. When the
surviving nodes do not advertise exactly those keys (node 0 died while node 1 lives) the rebuilt
placement groups are not pinned to nodes, only to pools (`pool_<name>` resources), and
`describe()` says so.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from executors import placement as pl
from executors.backends import Backend, backend_of
from executors.cluster import node_key
from executors.roles import RunConfig
from executors.runplan import RunPlan, resolve_plan
from executors.runtime import RayRuntime
from placer.cost.pricer import Pricer
from placer.solve.moves import moves
from placer.solve.planfile import Plan, calibration_of
from placer.solve.planner import plan_job
from placer.spec.catalog import with_nodes

MOVE_COST_S = 1.0  # a role that changes config is rebuilt: worth ~1 s of iteration time
REPLAN_TIME_LIMIT_S = 5.0


class ClusterChanged(RuntimeError):
    """The alive cluster no longer matches the plan: re-plan and rebuild."""

    def __init__(self, counts: dict[str, int], reason: str) -> None:
        super().__init__(reason)
        self.counts, self.reason = counts, reason


def alive_counts(plan_job_pools: list[Any]) -> dict[str, int]:
    """Whole nodes alive per pool, from the alive Ray nodes' `pool_<name>` resources."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
    have: dict[str, float] = {}
    for n in ray.nodes():
        if n.get("Alive"):
            for k, v in n.get("Resources", {}).items():
                have[k] = have.get(k, 0.0) + v
    return {p.name: int(have.get(f"pool_{p.name}", 0.0) // p.devices_per_node)
            for p in plan_job_pools}


def slot_signature(run: RunPlan, slot: str) -> tuple:
    """What a slot's actors depend on: its roles with their layouts (not their micro-batch,
    which a running actor takes in place) and its bundles (pool, node, devices, resources, in
    order). Two slots with one signature get the same actors."""
    roles = tuple(sorted((r.name, r.arrangement) for r in run.roles.values() if r.slot == slot))
    bundles = tuple((b.pool, b.node, tuple(b.devices), tuple(sorted(b.resources.items())))
                    for b in run.slots[slot].bundles)
    return roles, bundles


def kept_slots(old: RunPlan, new: RunPlan, counts: dict[str, int], dead: set[str]
               ) -> dict[str, str]:
    """New slot -> old slot for the slots a rebuild keeps: same signature, every pool of its
    bundles still has the node count it had (node numbers mean the same nodes), no actor of it
    dead (`dead`: old slot names with a dead actor)."""
    was = {name: p.nodes for name, p in old.pools.items()}
    old_sig = {slot_signature(old, name): name for name in old.slots}
    out = {}
    for name in new.slots:
        sig = slot_signature(new, name)
        prev = old_sig.get(sig)
        pools = {b[0] for b in sig[1]}
        if prev and prev not in dead and all(counts.get(p) == was.get(p) for p in pools):
            out[name] = prev
    return out


def keys_present(run: RunPlan) -> bool:
    """Every plan node's key is advertised by an alive node."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
    have = {k for n in ray.nodes() if n.get("Alive") for k in n.get("Resources", {})}
    return all(node_key(p, n) in have for p, n in run.nodes)


@dataclass
class Elastic:
    """The run's current plan (what a re-plan starts from) and its run plan, placement groups
    and runtime, and how to rebuild them."""

    plan: Plan
    run: RunPlan
    cfg: RunConfig
    groups: dict[str, Any]
    rt: RayRuntime | None
    pinned: bool
    backend: Backend = field(default_factory=backend_of)
    max_restarts: int = 3
    move_cost_s: float = MOVE_COST_S
    time_limit_s: float = REPLAN_TIME_LIMIT_S
    placement: list[dict[str, Any]] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)  # the last rebuild's parts (s)
    kept: list[str] = field(default_factory=list)  # actors the last rebuild kept (role + rank)

    def __post_init__(self) -> None:
        self.original = self.plan.resolved().job  # pools that died keep their shape here
        # Watched: the pools the run started on. A pool the plan leaves unused may not be
        # advertised at all (an embedded Ray advertises what the plan's bundles ask for).
        self.watched = sorted(self.run.used_pools)

    def planned(self) -> dict[str, int]:
        pools = self.run.pools
        return {p: pools[p].nodes if p in pools else 0 for p in self.watched}

    def changed(self) -> ClusterChanged | None:
        """A ClusterChanged (with the alive node count of every pool) when a watched pool's
        alive nodes differ from the plan's, else None."""
        now, want = alive_counts(self.original.cluster.pools), self.planned()
        diff = [f"{p} {want[p]}->{now[p]} node(s)" for p in self.watched if now[p] != want[p]]
        return ClusterChanged(now, f"cluster changed: {', '.join(diff)}") if diff else None

    def replan(self, counts: dict[str, int]) -> Plan:
        res = with_nodes(self.original, counts, "alive cluster")
        return plan_job(Pricer(res, calibration_of(self.plan)), time_limit_s=self.time_limit_s,
                        hint=self.plan, move_cost_s=self.move_cost_s, seed=self.original.seed)

    def rebuild(self, counts: dict[str, int]) -> tuple[RunPlan, RayRuntime, list[str]]:
        """New plan for `counts`; unchanged slots keep their groups and actors (`kept_slots`),
        the others go and the new plan's are placed."""
        from ray.util.placement_group import remove_placement_group  # lazy: Ray run only
        t0 = time.monotonic()
        new = self.replan(counts)
        run = resolve_plan(new)
        t1 = time.monotonic()
        dead = {m.slot for m in self.rt.dead_members()} if self.rt is not None else set()
        keep = kept_slots(self.run, run, counts, dead)
        old_slot = {r: x.slot for r, x in self.run.roles.items()}
        reuse = {(m.role, m.rank): m.handle for m in (self.rt.members if self.rt else [])
                 if old_slot.get(m.role) in keep.values()}
        kept_groups = {n: self.groups[o] for n, o in keep.items()}
        self.close(keep=set(keep.values()), keep_handles=list(reuse.values()))
        pinned = self.pinned and keys_present(run)
        fresh = pl.create_groups(run, pinned, skip=set(keep))
        self.groups = {**fresh, **kept_groups}
        t2 = time.monotonic()
        # new trainers and engines take the new plan's layouts (a split rollout's per part)
        self.cfg = self.cfg.for_run(run)
        try:
            self.rt = RayRuntime(run, self.cfg, self.groups, pinned, self.backend,
                                 self.max_restarts, reuse=reuse)
        except Exception:
            for pg in fresh.values():
                remove_placement_group(pg)
            self.groups = kept_groups
            raise
        self.placement = pl.verify(self.rt.members, self.groups)
        pl.check(self.placement, pinned)
        self._set_micro_batches(reuse)
        # roles whose actors change; a slot whose partners change is rebuilt via its signature
        changes = [str(m) for m in moves(self.plan, new, colocation=False).values()]
        if not pinned and self.pinned:
            changes.append("node pinning off: surviving nodes do not carry the new plan's keys")
        self.plan, self.run, self.pinned = new, run, pinned
        self.kept = sorted(f"{m.role}{m.rank}" for m in self.rt.members
                           if (m.role, m.rank) in reuse)
        self.timing = {"replan_s": round(t1 - t0, 3), "groups_s": round(t2 - t1, 3),
                       "actors_s": round(time.monotonic() - t2, 3)}
        return run, self.rt, changes

    def _set_micro_batches(self, reuse: dict[tuple[str, int], Any]) -> None:
        """Every kept actor takes the new config's micro-batches (what a new actor is built
        with); a kept slot's layouts are the old ones (`slot_signature`), so nothing else of
        its config differs."""
        assert self.rt is not None
        kept = [m for m in self.rt.members if (m.role, m.rank) in reuse]
        outs = self.rt.results([self.rt.call(m, "set_micro_batches", self.cfg.accumulate)
                                for m in kept])
        bad = next((f"{m.role}{m.rank}: {o.error}" for m, o in zip(kept, outs) if not o.ok), None)
        if bad is not None:
            raise RuntimeError(f"rebuild: a kept actor did not take the new micro-batch: {bad}")

    def close(self, keep: AbstractSet[str] = frozenset(), keep_handles: Sequence[Any] = ()) -> None:
        """Kill the actors and remove the placement groups, but those of the `keep` slots."""
        from ray.util.placement_group import remove_placement_group  # lazy: Ray run only
        if self.rt is not None:
            self.rt.close(spare=keep_handles)
        for slot, pg in self.groups.items():
            if slot in keep:
                continue
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - its node is gone with it
                pass
        self.groups = {}
