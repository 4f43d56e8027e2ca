"""The plan as the executor runs it: resolved once into a typed tree (`RunPlan`).

A `Plan` (`placer.solve.planfile`) is the file the planner writes: its job is a dict, its roles
are configs. The executor reads it once, at the start of a run (`resolve_plan`), into what each
of its parts needs, and every part takes its own piece from then on:

  job     `JobFacts`: the batch, lengths, algorithm, seed, pipeline mode, tail policy, dataset,
          the KL term, the sampling temperature and the models (architectures, local checkpoint
          folders) the loop and workers read;
  pools   `PoolRun` per pool: device kind and memory, node shape, what one node advertises to
          Ray, and the weight-sync bucket its engines receive in (the plan's calibration);
  roles   `RoleRun` per role: slot, pool, `Layout` (dp, tp, pp, HSDP shard, recompute), the
          other parallel degrees, precision and memory, its parts when split over pools (each
          with its share of the samples and its bundles), and its rollout engines (a mixed
          rollout's first part colocated with the actor, its other part not);
  slots   `SlotRun` per slot: its roles, its bundles in the plan's order and the placement
          group strategy they need;
  seats   `Seat` per actor: the bundle each rank of each role runs in (`executors.seats`);
  routes  the plan's weight-sync routes.

The runtime, the trainers, the engines, placement, weight sync and the loop read these; only a
re-plan (`executors.elastic`) goes back to a `Plan`, and it resolves the new one here too.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from executors.layouts import EngineGroup, Layout, Precision
from executors.seats import Seat, place, strategy
from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.roofline import GB
from placer.solve.moves import layout as arrangement_of
from placer.solve.moves import role_counts
from placer.solve.planfile import Bundle, Plan, RolePlacement, calibration_of
from placer.spec.agents import split_role
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.judge import RewardModel
from placer.spec.localdata import Dataset
from placer.spec.rlterms import KL
from placer.spec.tailpolicy import TailPolicy


@dataclass(frozen=True)
class PoolRun:
    """A pool of the job's cluster, as the executor asks Ray for it."""

    name: str
    kind: str  # gpu | cpu | lpu
    device: str
    memory_gb: float
    devices_per_node: int
    nodes: int
    node_devices: Mapping[str, float]  # one whole node's devices as Ray resources
    sync_bucket_bytes: int  # a weight refresh's bucket for engines here (0: a call per tensor)


@dataclass(frozen=True)
class PartRun:
    """One part of a role split over pools (`placer.cost.split`)."""

    index: int
    pool: str
    devices: int
    layout: Layout  # dp, tp, pp
    ep: int
    precision: Precision
    share: float  # of the batch's samples
    samples: int
    memory_gb: float
    mem_fraction: float  # memory_gb over its device's memory
    bundles: tuple[int, ...]  # positions in the slot's placement group


@dataclass(frozen=True)
class RoleRun:
    """A role as the executor runs it."""

    name: str
    slot: str
    pool: str  # the first part's, when split
    devices: int
    layout: Layout
    cp: int
    ep: int
    etp: int
    zero: int
    offload: bool
    precision: Precision
    memory_gb: float
    mem_fraction: float
    actors: int  # processes the executor starts for it (`actor_counts`)
    parts: tuple[PartRun, ...]  # () on one pool
    engines: tuple[EngineGroup, ...]  # rollout: one per part (or one for all); else ()
    # pool and degrees as `placer.solve.moves.layout` names them, less the micro-batch (a
    # running trainer takes a new one in place: `executors.elastic.slot_signature`)
    arrangement: str
    micro_batch: int = 0  # trained roles: sequences per micro-batch on one rank (0: one)

    def group_of(self, rank: int) -> EngineGroup:
        """The engine replica group holding rollout rank `rank` (the first by default)."""
        return next((e for e in self.engines if e.holds(rank)), self.engines[0])


@dataclass(frozen=True)
class SlotRun:
    """A colocation slot: one placement group of its bundles."""

    name: str
    roles: tuple[str, ...]
    bundles: tuple[Bundle, ...]  # in the plan's bundle order: bundle k is the group's k-th
    strategy: str  # STRICT_PACK | PACK | SPREAD (`executors.seats.strategy`)


@dataclass(frozen=True)
class Route:
    """A weight-sync route of the plan: sender and receiver node, link bandwidth, hops."""

    src: str
    dst: str
    gbs: float
    hops: tuple[str, ...]


@dataclass(frozen=True)
class JobFacts:
    """What the loop and the workers read of the job (a re-plan never changes it)."""

    name: str
    algorithm: str
    seed: int
    mode: str  # sync | async
    max_staleness: int
    prompts: int
    samples_per_prompt: int
    mini_batches: int
    turns: int
    tool_output_tokens: int
    max_new_tokens: int  # the longest response of one turn
    max_context: int  # prompt, every turn's response and tool output
    tail_policy: TailPolicy
    data: Dataset | None
    policy: ModelArch
    reward: ModelArch | None  # None: the rule reward
    paths: Mapping[str, str]  # model field -> local checkpoint folder
    kl: KL = KL()  # the KL penalty to the reference: coefficient, place, estimator
    temperature: float = 1.0  # the rollout's, which the trainer's log-probs use too
    judge: RewardModel | None = None  # a generative judge's settings (None: rule or scalar)
    images_per_prompt: int = 0  # a vision-language policy's images in every prompt

    @property
    def samples(self) -> int:
        return self.prompts * self.samples_per_prompt


@dataclass(frozen=True)
class RunPlan:
    """A plan as the executor runs it (see the module docstring)."""

    job: JobFacts
    pools: Mapping[str, PoolRun]  # every pool of the job's cluster, in its order
    roles: Mapping[str, RoleRun]
    slots: Mapping[str, SlotRun]
    seats: tuple[Seat, ...]
    nodes: tuple[tuple[str, int], ...]  # (pool, node) of every plan node a bundle is on
    routes: tuple[Route, ...]
    predicted_iteration_s: float
    # the weight-sync senders keep a full copy between steps (`placer.solve.hostmem.
    # keeps_sync_copy`: the plan prices it in host memory); else they gather at each refresh
    keep_sync_copy: bool = False

    def devices_per_rank(self, role: str) -> float:
        """Devices one of the role's processes holds in the plan: a trainer rank one, an
        engine replica its TP x PP group (1 for a name the plan does not place)."""
        r = self.roles.get(role)
        return r.devices / r.actors if r is not None and r.actors else 1.0

    @property
    def used_pools(self) -> list[str]:
        """The pools the plan's bundles are on, in the cluster's order."""
        used = {b.pool for s in self.slots.values() for b in s.bundles}
        return [p for p in self.pools if p in used]


def resolve_plan(plan: Plan, *, agents: bool = False) -> RunPlan:
    """The run plan of `plan`; SpecError (exit 2) when the plan's job names no policy, asks for
    a paired weight-sync transport or a sharded frozen model, is a multi-agent job (unless
    `agents`: the multi-agent driver, `executors.agentrun`, whose run plan's roles are named
    `AGENT.ROLE` and whose job facts are the first agent's), or its bundles do not hold its
    roles (`executors.seats`)."""
    res = plan.resolved()
    if res.job.agents is not None and not agents:  # the single-policy loop reads one policy
        names = ", ".join(res.job.agents.members)
        raise SpecError(f"job.agents: [{names}]: placer execute runs one policy in this loop; "
                        "a multi-agent plan runs in executors.agentrun")
    job = _job(res)
    _refuse_unlaunched_layouts(plan)
    _refuse_sharded_frozen(plan, res)
    pools = _pools(plan, res)
    by_slot: dict[str, list[Bundle]] = {}
    for b in sorted(plan.bundles, key=lambda b: b.index):
        by_slot.setdefault(b.slot, []).append(b)
    kinds = {name: p.kind for name, p in pools.items()}
    roles_of = {s.name: tuple(s.roles) for s in plan.slots}
    slots = {name: SlotRun(name, roles_of.get(name, ()), tuple(bs),
                           strategy(roles_of.get(name, ()), bs, kinds))
             for name, bs in by_slot.items()}  # in the order of their first bundles
    counts = actor_counts(plan)
    seats, part_bundles = place(plan.roles, by_slot, counts)
    roles = {name: _role(plan, name, r, res, counts[name], part_bundles.get(name, ()))
             for name, r in plan.roles.items()}
    routes = tuple(Route(r.src, r.dst, r.gbs, tuple(r.hops)) for r in plan.sync_routes)
    nodes = tuple(dict.fromkeys((b.pool, b.node) for b in plan.bundles))
    return RunPlan(job, pools, roles, slots, seats, nodes, routes, plan.predicted_iteration_s,
                   _keeps_sync_copy(plan, res))


def _keeps_sync_copy(plan: Plan, res: Resolved) -> bool:
    """The plan's host-memory decision on the senders' kept copy (`RunPlan.keep_sync_copy`)."""
    from placer.cost.pricer import Pricer  # lazy: the pricer only for the host-memory check
    from placer.solve.hostmem import keeps_sync_copy
    return keeps_sync_copy(plan, Pricer(res, calibration_of(plan)))


def actor_counts(plan: Plan) -> dict[str, int]:
    """Actors per role: `placer.solve.moves.role_counts`, but training runs one process per
    device of its layout (its TP, CP and PP ranks are processes of one torch.distributed
    group), a critic with context parallelism at least its CP ranks, and a split role runs
    every part's replicas."""
    counts = role_counts(plan)
    for role, r in plan.roles.items():  # the actor, or each agent's (`AGENT.actor`)
        if split_role(role)[1] == Role.ACTOR and role in counts:
            counts[role] *= r.tp * r.pp * r.cp
        elif split_role(role)[1] == Role.CRITIC and role in counts and r.cp > 1:
            counts[role] = max(counts[role], r.cp)  # a CP critic's ranks (`executors.critic`)
    for role, r in plan.roles.items():
        if r.parts:
            counts[role] = sum(p.dp for p in r.parts)
    return counts


def _job(res: Resolved) -> JobFacts:
    job = res.job
    policy = res.model_of(Role.ACTOR)
    if policy is None:  # every job has a policy; a plan without one is not this project's
        raise SpecError("plan.job.models.policy: missing (the executor needs a policy model)")
    if job.weight_sync.mechanism.paired:  # its pricing would not be what runs
        raise SpecError(f"plan.job.weight_sync.transport: {job.weight_sync.transport!r}: placer "
                        "execute syncs weights by broadcast (NCCL, gloo, CUDA IPC); plan the "
                        "job with transport: broadcast to execute it")
    return JobFacts(
        name=job.name, algorithm=job.algorithm.value, seed=job.seed, mode=job.pipeline.mode,
        max_staleness=job.pipeline.max_staleness, prompts=job.batch.prompts,
        samples_per_prompt=job.batch.samples_per_prompt, mini_batches=job.batch.mini_batches,
        turns=job.environment.turns, tool_output_tokens=job.environment.tool_output_tokens,
        max_new_tokens=int(job.lengths.response.max_value()), max_context=job.max_context,
        tail_policy=job.tail_policy, data=job.data, policy=policy,
        reward=res.model_of(Role.REWARD), paths=dict(job.models.paths), kl=job.kl,
        temperature=job.sampling.temperature, judge=job.judge,
        images_per_prompt=job.lengths.images_per_prompt)


def _refuse_unlaunched_layouts(plan: Plan) -> None:
    """SpecError (exit 2) for a layout the engines here cannot start as planned: data-parallel
    attention (SGLang --enable-dp-attention, vLLM --data-parallel-size with expert parallelism)
    would launch as plain TP, and run at another price than the plan's."""
    for name, r in plan.roles.items():
        where = [(f"plan.roles.{name}", r.attn_dp)] + [
            (f"plan.roles.{name}.parts.{i}", p.attn_dp) for i, p in enumerate(r.parts)]
        for field_path, attn_dp in where:
            if attn_dp > 1:
                raise SpecError(f"{field_path}.attn_dp: {attn_dp}: placer execute starts engines "
                                "as TP x PP replicas, not with data-parallel attention; export "
                                "the plan to a framework that runs it (placer export), or plan "
                                "on a pool of one node to execute it here")


def _refuse_sharded_frozen(plan: Plan, res: Resolved) -> None:
    """SpecError (exit 2) for a frozen model (reference, reward model) planned FSDP-sharded over
    its dp ranks on GPUs: the workers here hold whole copies, which would run at another
    memory and time than the plan's."""
    for name in (Role.REFERENCE, Role.REWARD):
        r = plan.roles.get(str(name))
        if r is None or res.model_of(name) is None:
            continue
        if res.device_of(res.cluster.pool(r.pool)).kind.value != "gpu":
            continue
        if r.sharded_weights and r.dp > 1:
            raise SpecError(f"plan.roles.{name}.sharded_weights: true (over dp {r.dp}): "
                            "placer execute runs frozen models as whole copies; plan with "
                            f"--framework native (or `pin: {{{name}: {{sharded: false}}}}`) to "
                            "execute here, or export the plan to the framework it was made for")


def _pools(plan: Plan, res: Resolved) -> dict[str, PoolRun]:
    from placer.solve.mapping import device_resources  # the bundles' own resource table
    calib = calibration_of(plan)
    out = {}
    for p in res.cluster.pools:
        dev = res.device_of(p)
        bucket_gb = calib.for_device(dev).sync_bucket_gb
        out[p.name] = PoolRun(p.name, dev.kind.value, dev.name, dev.memory_gb,
                              p.devices_per_node, p.nodes,
                              device_resources(dev, p.devices_per_node),
                              max(int(bucket_gb * GB), 1) if bucket_gb > 0 else 0)
    return out


def _role(plan: Plan, name: str, r: RolePlacement, res: Resolved, actors: int,
          bundles: tuple[tuple[int, ...], ...]) -> RoleRun:
    def share_of(pool: str, memory_gb: float) -> float:
        return memory_gb / res.device_of(pool).memory_gb

    parts = tuple(PartRun(i, p.pool, p.devices, Layout(p.dp, p.tp, p.pp), p.ep,
                          Precision(p.fp8_weights, p.fp8_kv), p.share, p.samples, p.memory_gb,
                          share_of(p.pool, p.memory_gb), bundles[i] if i < len(bundles) else ())
                  for i, p in enumerate(r.parts))
    engines: tuple[EngineGroup, ...] = ()
    agent, base = split_role(name)
    if base == Role.ROLLOUT:  # the engines: each part's replicas after the previous part's
        first, groups = 0, []
        actor = plan.roles.get(f"{agent}.{Role.ACTOR}" if agent else Role.ACTOR)
        shared = actor is not None and actor.slot == r.slot
        for q in parts:  # a mixed rollout's first part time-shares the slot, the rest run apart
            groups.append(EngineGroup(q.pool, first, q.layout.dp, q.layout.tp, q.mem_fraction,
                                      shared and q.index == 0))
            first += q.layout.dp
        engines = tuple(groups) or (
            EngineGroup(r.pool, 0, r.dp, r.tp, share_of(r.pool, r.memory_gb), shared),)
    layout = Layout(r.dp, r.tp, r.pp, r.shard if 0 < r.shard < r.dp else 0,
                    recompute=r.recompute, ep=r.ep if base == Role.ACTOR else 1,
                    cp=r.cp if base in (Role.ACTOR, Role.CRITIC) else 1)  # `executors.critic`
    return RoleRun(name, r.slot, r.pool, r.devices, layout, r.cp, r.ep, r.etp, r.zero, r.offload,
                   Precision(r.fp8_weights, r.fp8_kv, r.fp8_train), r.memory_gb,
                   share_of(r.pool, r.memory_gb), actors, parts, engines,
                   arrangement_of(plan, name, micro=False), r.micro_batch)
