"""Where a run's workers live: in this process, or as Ray actors in placement groups.

`World.local` holds every role's rank-0 worker in this process (`LocalRuntime`). `World.ray`
gets a cluster for the run plan (`executors.cluster`), one placement group per slot
(`executors.placement`), one actor per seat (`RayRuntime`), checks that every actor landed
where the plan says, and keeps the `Elastic` that re-plans and rebuilds them when the cluster
changes (the one piece of the run that holds the `Plan` itself).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from executors import cluster
from executors import placement as pl
from executors.backends import Backend
from executors.elastic import Elastic
from executors.roles import RunConfig
from executors.runplan import RunPlan
from executors.runtime import LocalRuntime, RayRuntime, Runtime
from placer.base.phases import PhaseClock
from placer.solve.planfile import Plan


@dataclass
class World:
    """Where the run's workers live: this process, or Ray actors in placement groups (with
    the `Elastic` that rebuilds them when the cluster changes)."""

    rt: Runtime
    described: str  # the cluster, in words
    emulated: list[str] = field(default_factory=list)
    elastic: Elastic | None = None
    ray_cluster: cluster.ClusterInfo | None = None  # an embedded one stops at `close`

    @staticmethod
    def local(run: RunPlan, cfg: RunConfig, backend: Backend,
              phases: PhaseClock | None = None) -> World:
        (phases or PhaseClock()).begin("starting workers, loading models")
        return World(LocalRuntime(run, cfg, backend), "local (one process, no Ray)")

    @staticmethod
    def ray(plan: Plan, run: RunPlan, cfg: RunConfig, backend: Backend, address: str | None,
            max_restarts: int, note: Callable[[str], None] | None,
            phases: PhaseClock | None = None) -> World:
        """`phases`: each step of the set-up begins a phase of its own (what a user waits for)."""
        clock = phases or PhaseClock()
        clock.begin(f"joining Ray at {address}" if address else "starting Ray")
        info = cluster.start(run, address)
        if note:
            note(f"cluster: {info.describe()}")
        groups: dict[str, Any] = {}
        rt: RayRuntime | None = None
        try:
            clock.begin("reserving placement groups")
            groups = pl.create_groups(run, info.pinned)
            # an actor's constructor loads its model: Ray reports them started once all are
            clock.begin("starting actors, loading models")
            rt = RayRuntime(run, cfg, groups, info.pinned, backend, max_restarts)
            clock.begin("checking placement")
            placement = pl.verify(rt.members, groups)
            pl.check(placement, info.pinned)
        except BaseException:  # nothing of this run outlives it: actors, groups, its own Ray
            if rt is not None:
                rt.close()
            pl.remove_groups(groups)
            cluster.stop(info)
            raise
        elastic = Elastic(plan, run, cfg, groups, rt, info.pinned, backend, max_restarts,
                          placement=placement)
        return World(rt, info.describe(), info.emulated, elastic, info)

    def close(self) -> list[dict[str, Any]]:
        """Stop every worker; where each actor ran (the last placement, after any rebuild)."""
        if self.elastic is None:
            self.rt.close()
            return []
        try:
            self.elastic.close()  # the current actors and groups (a rebuild replaced the first)
        finally:
            if self.ray_cluster is not None:
                cluster.stop(self.ray_cluster)  # an embedded Ray goes with the run that started it
        return self.elastic.placement
