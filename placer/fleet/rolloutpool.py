"""A rollout pool shared by several jobs of a fleet whose rollouts run the same model: one set of
inference engines, time-shared, each switch between jobs a weight swap.

    shared:
      rollout_pools:
        - {pool: h20, jobs: [grpo-7b-lr1, grpo-7b-lr2]}
        - {pool: h20, jobs: [grpo-a, grpo-b], charge: research}       # jobs of two teams
        - {pool: h20, jobs: [grpo-c, grpo-d], choose: true}            # the allocator decides

The members' rollout roles run on one set of nodes of `pool` (the engines), whose size E the
allocation chooses as it does a shared CPU pool's (`placer.fleet.sharing`: one count, charged
once); their other roles keep off those nodes (`pin.avoid`) and run on the members' own nodes.
The members must roll out one model (their rollouts' architectures equal) and be single-policy
jobs. The engines' nodes count against one team's quota: the members' team, or, for members of
several teams, `charge` (one of theirs): Kueue admits the engines' RayCluster in that team's
ClusterQueue alone. With `choose: true` the group is a candidate: the allocation model prices
both options, each job with the engines shared or planned as written on nodes of its own, and
chooses (one boolean per group, `placer.fleet.alloc`); the report says which it chose and the
best objective of the other.

Pricing (the CPU pool's lockstep convention, `placer.fleet.sharing`: every member's work waits
at once). G_k(E) is member k's generation on the E engine nodes: the fastest of its rollout's
single-pool candidates there (`placer.solve.candidates.role_candidates`: the engines' busy time,
tool calls excluded). S(E) is one weight swap: the cost model's weight-sync price of the model
pushed over the engines' fabric (`placer.cost.timing.sync_links` from a sender on another node of
the pool, `placer.cost.model.weight_sync_time` with `sync_calls` and `sync_call_cost`); the model
is the same for every member, so every switch costs the same. With each member's generation
waiting at once and served in proportion to its work (as the CPU pool serves its calls), every
member finishes with the last: member j's rollout is its own generation plus queueing behind the
others' generation and their swaps in,
    Q_j(E) = sum_{k != j} (G_k(E) + S(E))
(its own swap is its own weight sync, which its plan already pays). Its plan A_j is the job
planned on its vector with the rollout pinned to the engines' pool (`engines_job`); its
iteration, by its pipeline mode (`PipelineMode.iteration_s`), takes its chain of stages plus
Q_j, its engines' busiest work G_j + sync_j + Q_j:
    T_j = max(A_j, mode.iteration_s(chain_j + Q_j, G_j + sync_j + Q_j)).
So sharing costs each member the others' generation and swaps, and pays when the engines it no
longer holds alone buy the fleet more (trainer nodes, or a job that would not fit). The
convention is pessimistic where members' steps would interleave (one job trains while another
generates) and where an agentic rollout's tool calls leave the engines idle.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field, StrictBool

from placer.base.errors import Infeasible, SpecError
from placer.cost.efficiency import Calibration
from placer.cost.model import sync_call_cost, weight_sync_time
from placer.cost.pricer import Pricer
from placer.cost.timing import sync_calls, sync_links
from placer.solve.candidates import role_candidates
from placer.solve.planfile import Plan
from placer.spec.base import Strict
from placer.spec.catalog import resolve, with_nodes
from placer.spec.job import Job
from placer.spec.pins import Pin, Pins


class SharedRolloutPoolDecl(Strict):
    """Jobs whose rollouts (one model) time-share one set of inference engines on a pool."""

    pool: str = Field(description="the pool (of the cluster) the shared engines run on")
    jobs: list[str] = Field(min_length=2, description="the jobs (fleet names) sharing them")
    charge: str | None = Field(None, description="the team whose quota the engines' nodes count "
                                                 "against (needed when the jobs are of several "
                                                 "teams; one of theirs)")
    choose: StrictBool = Field(False, description="let the allocation choose whether the jobs share "
                                            "(each option priced, the report names both); "
                                            "false: they share")


def engines_job(job: Job, pool: str) -> Job:
    """The job with its rollout pinned to the engines' pool and every other role kept off it."""
    pins = job.pin or Pins()
    update: dict[str, Pin] = {}
    for role in job.roles():
        pin = pins.of(role)
        if role == "rollout":
            update[role] = (pin.model_copy(update={"pool": pool}) if pin is not None
                            else Pin(pool=pool))
        elif pin is None:
            update[role] = Pin(avoid=[pool])
        elif pin.pool is None:
            update[role] = pin.model_copy(update={"avoid": sorted({*(pin.avoid or []), pool})})
    return job.model_copy(update={"pin": pins.model_copy(update=update)})


def generation_s(job: Job, pool: str, nodes: int, calib: Calibration) -> float | None:
    """The job's generation on `nodes` nodes of `pool`: its rollout's fastest single-pool
    candidate there (None: none fits)."""
    px = Pricer(with_nodes(job, {pool: nodes}, job.name), calib)
    cands = role_candidates(px, "rollout", px.res.cluster.pool(pool))
    times = [c.time_s for c in cands if c.est.feasible]
    return min(times) if times else None


def swap_s(job: Job, pool: str, nodes: int, calib: Calibration) -> float:
    """One weight swap of the job's rollout model into `nodes` nodes of `pool`'s engines: the
    cost model's weight sync over the pool's fabric, from a sender on another node."""
    res = with_nodes(job, {pool: nodes}, job.name)
    p = res.cluster.pool(pool)
    dev = res.device_of(p)
    eff = Pricer(res, calib).eff(dev)
    m = res.arch_of("rollout")
    links = sync_links(res, pool, p.devices_per_node, 1, pool, p.devices_per_node * nodes, 1,
                       False, eff)
    return weight_sync_time(m, min(links.values()), dev, eff, sync_calls(m, 1, eff),
                            sync_call_cost(m, eff))


def shared_iteration_s(plan: Plan, job: Job, queue_s: float) -> float:
    """Member j's iteration on the shared engines: its plan with its rollout queued `queue_s`
    behind the others' generation and swaps (module docstring)."""
    b = plan.breakdown
    chain = sum(b.stage_s.values())
    engines = plan.roles["rollout"].time_s + b.sync_s + queue_s
    mode = job.pipeline.mechanism
    return max(plan.predicted_iteration_s, mode.iteration_s(chain + queue_s, engines))


@dataclass
class EngineQueue:
    """Per shared rollout group, each member's queueing Q_j(E) behind the others, memoised on
    E (`jobs`: the members' jobs as written, in the group's order)."""

    jobs: list[Job]
    pool: str
    calib: Calibration
    memo: dict[int, tuple[list[float | None], float]] = field(default_factory=dict)

    def parts(self, nodes: int) -> tuple[list[float | None], float]:
        """(each member's generation G_k(E), one swap S(E)) on `nodes` engine nodes."""
        if nodes not in self.memo:
            gens: list[float | None] = []
            for job in self.jobs:
                try:
                    gens.append(generation_s(job, self.pool, nodes, self.calib))
                except (Infeasible, SpecError):
                    gens.append(None)
            self.memo[nodes] = (gens, swap_s(self.jobs[0], self.pool, nodes, self.calib))
        return self.memo[nodes]

    def queue_s(self, member: int, nodes: int) -> float | None:
        """Q_j(E): the others' generation and swaps (None: no engines, or one of the jobs has
        no rollout layout on them)."""
        if nodes < 1:
            return None
        gens, swap = self.parts(nodes)
        others = [g for k, g in enumerate(gens) if k != member]
        if any(g is None for g in others):
            return None
        return sum(g + swap for g in others if g is not None)


def rollout_errors(pools: list[SharedRolloutPoolDecl], jobs: dict[str, Job],
                   teams: dict[str, str], cluster_pools: list[str], taken: dict[str, str],
                   source: str) -> list[str]:
    """One line per mistake in `shared.rollout_pools` (`jobs`: fleet name -> job; `teams`:
    fleet name -> team; `taken`: job -> the shared section that already holds it)."""
    out = []
    for i, rp in enumerate(pools):
        where = f"{source}: shared.rollout_pools.{i}"
        errors, known = section_errors(where, f"shared.rollout_pools.{i}", rp.pool, rp.jobs,
                                       cluster_pools, list(jobs), taken)
        out += errors
        out += _member_errors(rp, known, jobs, where)
        out += _charge_errors(rp, [n for n in rp.jobs if n in teams], teams, where)
    return out


def _member_errors(rp: SharedRolloutPoolDecl, names: list[str], jobs: dict[str, Job],
                   where: str) -> list[str]:
    """Single-policy members of one rollout model, none pinned off the engines' pool."""
    out = []
    models: dict[str, tuple[str, str]] = {}
    for name in names:
        job = jobs[name]
        if job.agents is not None:
            out.append(f"{where}.jobs: job {name!r} trains several agents; a shared rollout "
                       f"pool serves one model (got {name!r})")
            continue
        pin = job.pin.of("rollout") if job.pin is not None else None
        if pin is not None and pin.pool is not None and pin.pool != rp.pool:
            out.append(f"{where}.jobs: job {name!r} pins its rollout to pool {pin.pool}, not "
                       f"the shared pool (got {name!r})")
        for role, other in (job.pin.items() if job.pin is not None else []):
            if role != "rollout" and other.pool == rp.pool:
                out.append(f"{where}.jobs: job {name!r} pins its {role} to the shared engines' "
                           f"pool {rp.pool} (got {name!r})")
        try:
            models[name] = (job.models.policy, repr(resolve(job).arch_of("rollout")))
        except (SpecError, AssertionError):
            continue
    if len(set(models.values())) > 1:
        named = ", ".join(f"{n}: {jobs[n].models.policy}" for n in models)
        out.append(f"{where}.jobs: the jobs roll out different models ({named}); shared "
                   f"engines serve one (got {names})")
    return out


def _charge_errors(rp: SharedRolloutPoolDecl, names: list[str], teams: dict[str, str],
                   where: str) -> list[str]:
    of = sorted({teams[n] for n in names})
    if rp.charge is not None and rp.charge not in of:
        return [f"{where}.charge: team {rp.charge!r} has no job in the pool (its jobs' teams: "
                f"{', '.join(of)}) (got {rp.charge!r})"]
    if rp.charge is None and len(of) > 1:
        return [f"{where}.charge: the jobs are of teams {', '.join(of)}; name the team whose "
                f"quota the engines' nodes count against (got none)"]
    return []


def charged_first(names: list[str], teams: dict[str, str], charge: str | None) -> list[str]:
    """The members in fleet order with the first of the charged team's first: the allocation
    charges a shared pool's nodes to its group's first member (`placer.fleet.sharing.charged`)."""
    if charge is None:
        return names
    first = next(n for n in names if teams[n] == charge)
    return [first, *(n for n in names if n != first)]


def section_errors(where: str, section: str, pool: str, names: list[str],
                   cluster_pools: list[str], jobs: list[str], taken: dict[str, str]
                   ) -> tuple[list[str], list[str]]:
    """A shared section's pool and members checked (a CPU pool's or a rollout pool's): one
    line per mistake, and the members that are jobs of the fleet and in no earlier section.
    `taken`: job -> the section already holding it; this section's members are added."""
    out, known = [], []
    if pool not in cluster_pools:
        out.append(f"{where}.pool: no pool {pool!r} in the cluster (pools: "
                   f"{', '.join(cluster_pools)}) (got {pool!r})")
    for name in names:
        if name not in jobs:
            out.append(f"{where}.jobs: no job {name!r} in the fleet (jobs: "
                       f"{', '.join(jobs)}) (got {name!r})")
        elif name in taken:
            out.append(f"{where}.jobs: job {name!r} already shares {taken[name]} (got {name!r})")
        else:
            taken[name] = section
            known.append(name)
    return out, known
