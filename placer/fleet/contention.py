"""What a fleet's jobs share when they run side by side: the `contention` section of a fleet
file, read by `placer fleet --simulate` (`simulator.fleet`).

    contention:
      checkpoint_every: 2        # iterations between checkpoints (absent: none)
      spine_gbs: 25              # GB/s of each spine link between two pools (absent: unlimited)
      cpu_pools:                 # CPU environment pools several jobs' tool calls queue on
        - {jobs: [agentic-code, agentic-tool], nodes: 4}
      preemptions:               # a lending team submits work and takes its nodes back
        - {at_s: 900, team: evaluation, pool: h100, nodes: 1}

A shared CPU pool's `nodes` default to the largest environment share any of its jobs was planned
with (the jobs then time-share the nodes one of them would have had alone). Checkpoints of every
job write to the cluster's one storage (`cluster.storage_gbs`) at once. A preemption reclaims the
lending team's unused nominal nodes of the pool from the jobs of teams of its cohort that borrow
there, as Kueue's `reclaimWithinCohort` preemption does (kubernetes-sigs/kueue
site/content/en/docs/concepts/preemption.md, commit ff69552).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import Field

from placer.spec.base import PosFloat, PosInt, Strict


class SharedCpuPool(Strict):
    """Jobs whose environment tool calls queue on one set of CPU nodes."""

    jobs: list[str] = Field(min_length=2, description="the jobs (fleet names) sharing the pool")
    nodes: PosInt | None = Field(None, description="the shared pool's nodes; absent: the "
                                                      "largest environment share of its jobs")


class Preemption(Strict):
    """The lending team submits work needing `nodes` nodes of `pool` at `at_s` seconds."""

    at_s: Annotated[float, Field(strict=True, ge=0, le=1e15)] = Field(
        description="seconds after the fleet starts")
    team: str = Field(description="the lending team (a key of `teams`)")
    pool: str = Field(description="the pool it takes nodes of")
    nodes: PosInt = Field(description="nodes its new work needs")


class Contention(Strict):
    """The resources a fleet's jobs share in `placer fleet --simulate`."""

    checkpoint_every: PosInt | None = Field(None, description="iterations between each "
                                                                 "job's checkpoints")
    spine_gbs: PosFloat | None = Field(None, description="GB/s of each spine link between "
                                                            "two pools (weight syncs that cross "
                                                            "pools share it)")
    cpu_pools: list[SharedCpuPool] = Field(default_factory=list,
                                           description="CPU environment pools shared by jobs")
    preemptions: list[Preemption] = Field(default_factory=list,
                                          description="lending teams taking their nodes back")


def contention_errors(c: Contention, jobs: list[str], teams: dict[str, list[str]],
                      pools: Mapping[str, int], source: str) -> list[str]:
    """One line per name in `c` that is not a job, team or pool of the fleet (`teams`: team ->
    the pools its quota names; `pools`: pool -> its nodes), and per preemption asking for more
    nodes than its pool has."""
    out = []
    seen: dict[str, int] = {}
    for i, cp in enumerate(c.cpu_pools):
        for name in cp.jobs:
            if name not in jobs:
                out.append(f"{source}: contention.cpu_pools.{i}.jobs: no job {name!r} in the "
                           f"fleet (jobs: {', '.join(jobs)}) (got {name!r})")
            elif name in seen:
                out.append(f"{source}: contention.cpu_pools.{i}.jobs: job {name!r} already "
                           f"shares cpu_pools.{seen[name]} (got {name!r})")
            else:
                seen[name] = i
    for i, p in enumerate(c.preemptions):
        where = f"{source}: contention.preemptions.{i}"
        if p.team not in teams:
            out.append(f"{where}.team: no team {p.team!r} (teams: {', '.join(teams)}) "
                       f"(got {p.team!r})")
        elif p.pool not in teams[p.team]:
            out.append(f"{where}.pool: team {p.team}'s quota names no pool {p.pool!r} "
                       f"(got {p.pool!r})")
        if p.pool not in pools:
            out.append(f"{where}.pool: no pool {p.pool!r} in the cluster (pools: "
                       f"{', '.join(pools)}) (got {p.pool!r})")
        elif p.nodes > pools[p.pool]:
            out.append(f"{where}.nodes: pool {p.pool} has {pools[p.pool]} nodes (got "
                       f"{p.nodes})")
    return out
