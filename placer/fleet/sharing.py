"""A CPU environment pool shared by several jobs of a fleet: the `shared` section, its pricing,
and how the allocation model counts the shared nodes.

    shared:
      cpu_pools:
        - {pool: cpu, jobs: [agentic-code, agentic-tool]}

The listed jobs' environment roles run on one set of nodes of `pool`, whose size the allocation
chooses. Declared, the jobs share; with `choose: true` the allocation prices both options and
picks one (`placer.fleet.alloc`'s choices, `placer.fleet.sharedplan`). The jobs must
be of one team, whose quota of the pool the shared nodes count against once (Kueue charges a
workload to one ClusterQueue).

Pricing. The cost model queues a job's tool calls on its environment's cores, `slots = cores //
cpu_per_call` (`placer.cost.timing._queueing`, `placer.cost.model.tool_waves`). On a shared pool
the other jobs' calls queue on the same cores: with every job's calls of a wave waiting at once
(the cost model's lockstep convention), the combined demand is sum_k samples_k x cpu_per_call_k
cores, and job j's calls get the fraction f_j = its own demand / the combined one of the cores
(first come, first served in proportion to what is waiting). Pricing job j with `cpu_per_call /
f_j` on the pool's whole size is exactly that share: each slot count, wave count and environment
estimate the cost model derives from `cores // cpu_per_call` becomes `f_j cores // cpu_per_call`.

Allocation. A shared pool is one variable: every member's vector has the same count of `pool`
(`AllocProblem` adds sum_a a_P x_ja = sum_a a_P x_ka for consecutive members) and only the first
member's count is charged to capacity, quotas and node counts (`charged`).
"""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, StrictBool

from placer.fleet.rolloutpool import (
    SharedRolloutPoolDecl,
    charged_first,
    rollout_errors,
    section_errors,
)
from placer.solve.planfile import Plan
from placer.spec.base import Strict
from placer.spec.hardware import DeviceKind
from placer.spec.job import Job


class SharedCpuPoolDecl(Strict):
    """Jobs whose environment roles share one set of nodes of a CPU pool."""

    pool: str = Field(description="the CPU pool (a pool of the cluster) the jobs share")
    jobs: list[str] = Field(min_length=2, description="the jobs (fleet names, one team) sharing "
                                                      "it")
    choose: StrictBool = Field(False, description="let the allocation choose whether the jobs share "
                                            "(each option priced, the report names both); "
                                            "false: they share")


class Shared(Strict):
    """What the fleet's jobs share in the allocation (and so in the simulation)."""

    cpu_pools: list[SharedCpuPoolDecl] = Field(default_factory=list,
                                               description="CPU environment pools shared by "
                                                           "jobs")
    rollout_pools: list[SharedRolloutPoolDecl] = Field(
        default_factory=list, description="inference engines time-shared by jobs rolling out "
                                          "one model (`placer.fleet.rolloutpool`)")


@dataclass(frozen=True)
class ShareGroup:
    """A shared pool in the allocation model: its pool's index and its members' job indices."""

    pool: int
    members: tuple[int, ...]


@dataclass(frozen=True)
class Choice:
    """A shared pool the allocation may or may not use: `group` indexes the problem's shared
    groups, whose members are the shared flavours of the jobs `alone` (the same order); each job
    of the choice takes the zero vector (off) in the flavour not chosen."""

    group: int
    alone: tuple[int, ...]


def charged(groups: tuple[ShareGroup, ...], j: int, a: tuple[int, ...]) -> tuple[int, ...]:
    """The nodes job j's vector `a` holds on its own: the shared pool counts at its first
    member only."""
    for g in groups:
        if j in g.members[1:]:
            return tuple(0 if p == g.pool else n for p, n in enumerate(a))
    return a


def consistent(groups: tuple[ShareGroup, ...], vectors: list[tuple[int, ...]]) -> bool:
    """Whether every group's members hold one count of its pool."""
    return all(len({vectors[j][g.pool] for j in g.members}) == 1 for g in groups)


def tool_demand(job: Job) -> float:
    """Cores a job's tool calls ask for at once: every sample's call (0: no tool calls)."""
    env = job.environment
    if env.kind == "none" or env.turns < 2:
        return 0.0
    return job.batch.samples * env.cpu_per_call


def shared_job(job: Job, mates: list[Job]) -> Job:
    """The job priced on a pool shared with `mates`: its calls get its share of the cores
    (module docstring), as a larger `cpu_per_call`."""
    own = tool_demand(job)
    total = own + sum(tool_demand(m) for m in mates)
    if own == 0 or total == own:
        return job
    env = job.environment.model_copy(update={"cpu_per_call":
                                             job.environment.cpu_per_call * total / own})
    return job.model_copy(update={"environment": env})


def groups_of(s: Shared | None, pools: list[str], names: list[str], teams: dict[str, str]
              ) -> tuple[ShareGroup, ...]:
    """Every shared pool of `s` as the allocation's groups: CPU pools' members in fleet order,
    a rollout pool's with the charged team's first (`rolloutpool.charged_first`)."""
    if s is None:
        return ()
    out = [ShareGroup(pools.index(cp.pool), tuple(sorted(names.index(n) for n in cp.jobs)))
           for cp in s.cpu_pools]
    for rp in s.rollout_pools:
        ordered = charged_first([n for n in names if n in rp.jobs], teams, rp.charge)
        out.append(ShareGroup(pools.index(rp.pool), tuple(names.index(n) for n in ordered)))
    return tuple(out)


def as_written(plan: Plan, job: Job) -> Plan:
    """A shared pool member's plan with its job's own `cpu_per_call` (it was priced with its
    share of the cores): what it runs, exports and simulates is the job as written; its
    predicted time stays the shared one."""
    env = {**plan.job["environment"], "cpu_per_call": job.environment.cpu_per_call}
    return plan.model_copy(update={"job": {**plan.job, "environment": env}})


def shared_errors(s: Shared, jobs: dict[str, Job], teams: dict[str, str],
                  pools: dict[str, DeviceKind | None], source: str) -> list[str]:
    """One line per mistake in `shared` (`jobs`: fleet name -> job; `teams`: -> its team;
    `pools`: the cluster's pools -> their device kind, None: unknown): a CPU pool's environment workers need
    a pool of CPU nodes, a rollout pool's engines one of accelerators."""
    out = _cpu_errors(s, teams, list(pools), source)
    out += [f"{source}: shared.cpu_pools.{i}.pool: pool {cp.pool} is of {pools[cp.pool]} "
            f"devices; environment workers run on a pool of CPU nodes (got {cp.pool!r})"
            for i, cp in enumerate(s.cpu_pools)
            if pools.get(cp.pool) not in (None, DeviceKind.cpu)]
    out += [f"{source}: shared.rollout_pools.{i}.pool: pool {rp.pool} is of CPU nodes; "
            f"rollout engines run on a pool of GPUs or LPUs (got {rp.pool!r})"
            for i, rp in enumerate(s.rollout_pools) if pools.get(rp.pool) is DeviceKind.cpu]
    taken = {n: f"shared.cpu_pools.{i}" for i, cp in enumerate(s.cpu_pools) for n in cp.jobs}
    return out + rollout_errors(s.rollout_pools, jobs, teams, list(pools), taken, source)


def _cpu_errors(s: Shared, jobs: dict[str, str], pools: list[str], source: str) -> list[str]:
    out: list[str] = []
    taken: dict[str, str] = {}
    for i, cp in enumerate(s.cpu_pools):
        where = f"{source}: shared.cpu_pools.{i}"
        out += section_errors(where, f"shared.cpu_pools.{i}", cp.pool, cp.jobs, pools,
                              list(jobs), taken)[0]
        teams = sorted({jobs[n] for n in cp.jobs if n in jobs})
        if len(teams) > 1:
            out.append(f"{where}.jobs: the jobs are of teams {', '.join(teams)}; a shared "
                       f"pool's nodes count against one team's quota (got {cp.jobs})")
    return out
