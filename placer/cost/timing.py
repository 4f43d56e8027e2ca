"""Iteration time of a placement: how role estimates combine into one RL step.

One iteration has four stages, in order: `sync` (actor weights to every rollout placement),
`rollout` (generation and tool calls), `score` (reference, reward, critic values, old log-probs)
and `train` (actor, critic). Roles in one *slot* time-share its devices, so inside a stage their
times add; different slots run side by side, so a stage lasts as long as its busiest slot
(HybridFlow's rule). A slot whose roles' memory does not fit its devices together pays an onload
per role and iteration (`onload_time`), and so do the roles a framework switches every step
whenever its generation shares the policy's devices (`FrameworkProfile.switches_every_step`:
NeMo-RL's policy and vLLM engine). Two terms price a pair of placements: the weight sync
(`sync_time`, one broadcast every rollout replica joins) and the queueing of tool calls for CPU
cores (`rollout_tool_time`). A job that validates every N steps (`Job.validation`) adds a fifth
stage, `validate`, on the rollout's slot: one validation generation with its refit / N
(`placer.cost.validation`).

sync mode:   T = sum over stages of max over slots of (sum of the slot's roles' stage times)
async mode:  T = max(the busiest slot's total work, the sync -> rollout -> score -> train chain of
             one step / (staleness + 1)) (`PipelineMode.chain_bound_s`, `placer.spec.pipeline`)

Weight-sync links and calls, switching costs and their sources: docs/cost-model.md.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from placer.base.roles import Role
from placer.cost import optpark
from placer.cost.context import PriceContext
from placer.cost.efficiency import Efficiency
from placer.cost.model import (
    engine_swap_time,
    host_round_trip_time,
    switch_time,
    sync_call_cost,
    weight_sync_time,
)
from placer.cost.offload import parked_states, unparked_gb
from placer.cost.refit import paired_route, paired_time, streams_colocated
from placer.cost.roleestimate import Estimate
from placer.cost.rollout_tail import Replicas
from placer.cost.rolloutcost import rollout_shape
from placer.cost.roofline import GB, Memory, weight_bytes, weight_tensors
from placer.cost.tail_samples import at_means, strata
from placer.cost.toolqueue import queue_delays
from placer.cost.validation import validation_time
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind, DeviceType

STAGES = ("sync", "rollout", "score", "train")


@dataclass(frozen=True)
class Placed:
    """A role's estimate together with the slot it sits in."""

    slot: str
    est: Estimate


@dataclass(frozen=True)
class Breakdown:
    iteration_s: float
    stage_s: dict[str, float]
    slot_busy_s: dict[str, float]
    switch_s: dict[str, float] = field(default_factory=dict)
    sync_s: float = 0.0


def sync_senders(a_pp: int, eff: Efficiency) -> int:
    """Parallel sender streams of a refresh: one per pipeline stage when bucketed (each stage
    streams its own layers: Miles, NeMo-RL, checkpoint-engine); one when unbucketed (verl's NCCL
    path: actor rank 0 gathers every tensor and broadcasts it)."""
    return a_pp if eff.sync_bucket_gb > 0 else 1


def sync_calls(m: ModelArch, a_pp: int, eff: Efficiency, nbytes: float | None = None) -> int:
    """Sequential calls of one sender stream: its share of the weights in `sync_bucket_gb`
    buckets, or every tensor (`weight_tensors`) when unbucketed (`sync_bucket_gb` = 0).
    `nbytes` (default: all of `m`'s weights) prices a partial push, as a trace records one:
    unbucketed, it sends that share of the tensors."""
    full = weight_bytes(m)
    nbytes = full if nbytes is None else nbytes
    if eff.sync_bucket_gb <= 0:
        tensors = weight_tensors(m)
        return tensors if nbytes >= full else max(math.ceil(tensors * nbytes / full), 1)
    return max(math.ceil(nbytes / GB / sync_senders(a_pp, eff) / eff.sync_bucket_gb), 1)


def sync_links(res: Resolved, a_pool: str, a_devices: int, a_pp: int, r_pool: str,
               r_devices: int, r_replica: int, same_slot: bool,
               eff: Efficiency | None = None) -> dict[str, float]:
    """Raw GB/s of every link one weight refresh crosses (achieved: x `link_eff`).

    The refresh is one pipelined broadcast that every rollout replica joins (NCCL broadcast,
    checkpoint-engine, CUDA IPC), so its time does not grow with the replicas: t = latency +
    bytes / min(links) (relation 4 of the published runs: c + bytes / (BW_eff x senders)).
      local  actor and rollout in one slot: each replica takes the full weights from the
             co-located actor (CUDA IPC + the engine's weight loading), all replicas at once, at
             `sync_local_gbs` per replica whatever its TP size (Miles' 27B into one-GPU
             SGLang engines in 2.5 s, row r10's sync stage)
      send   the actor's senders (`sync_senders`): one per pipeline stage (each holds different
             layers; a ZeRO / FSDP actor gathers every tensor to one sender; an unbucketed
             sync has one sender whatever the layout), each at most `sync_sender_gbs`
             over the NIC (verl's checkpoint-engine README: ~8.25 GB/s achieved for NCCL over
             400 Gb/s IB), or over NVLink when actor and rollout share one node
      recv   one rank's link: a broadcast hands every rank of every GPU replica the full
             weights (each rank then loads its shard; Miles' p2p-weight-transfer.md: broadcast
             sends "redundant copies of the same weights ... to multiple ranks"), all at once;
             LPU chips each take their own slice
      cross  between two pools, when the topology caps it: cross_pool_gbs per node x the fewer
             nodes
    LPUs: `r_replica` is every chip of the placement (loaded once).
    """
    eff = eff or Efficiency()
    a_dev, r_dev = res.device_of(a_pool), res.device_of(r_pool)
    if same_slot:
        return {"local": eff.sync_local_gbs}
    senders = sync_senders(a_pp, eff)
    per_node = res.cluster.pool(a_pool).devices_per_node
    fan_in = r_replica if r_dev.kind is DeviceKind.lpu else 1  # ranks sharing the stream
    if a_pool == r_pool and a_devices + r_devices <= per_node:  # one node: NVLink both ways
        return {"send": senders * a_dev.intra_link_gbs, "recv": fan_in * r_dev.intra_link_gbs}
    # unbucketed: each tensor goes straight from the sender's GPU into one NCCL ring broadcast
    # over every actor and rollout rank, at the NIC; `sync_sender_gbs` is a bucketed sender's
    # rate (verl's checkpoint engine: a serial per-tensor fill and per-bucket wait in GPU
    # buffers, not the wire, paces it; docs/cost-model.md, Weight sync)
    cap = eff.sync_sender_gbs if eff.sync_bucket_gb > 0 else a_dev.nic_gbs
    links = {"send": senders * min(a_dev.nic_gbs, cap), "recv": fan_in * r_dev.nic_gbs}
    cross = res.cluster.topology.cross_pool_gbs
    if a_pool != r_pool and cross is not None:
        nodes = min(_nodes_of(res, a_pool, a_devices), _nodes_of(res, r_pool, r_devices))
        links["cross"] = cross * nodes
    return links


def _nodes_of(res: Resolved, pool: str, devices: int) -> int:
    per = res.cluster.pool(pool).devices_per_node
    return -(-devices // per)


def _links(res: Resolved, actor: Placed, rollout: Placed, eff: Efficiency) -> dict[str, float]:
    r_dev = res.device_of(rollout.est.pool)
    r_par = rollout.est.par
    replica = rollout.est.devices if r_dev.kind is DeviceKind.lpu else r_par.replica
    return sync_links(res, actor.est.pool, actor.est.devices, actor.est.par.pp,
                      rollout.est.pool, rollout.est.devices, replica,
                      actor.slot == rollout.slot, eff)


def sync_bandwidth(res: Resolved, actor: Placed, rollout: Placed,
                   eff: Efficiency | None = None) -> float:
    """Raw GB/s of the refresh's slowest link (`sync_links`); achieved: x `link_eff`."""
    return min(_links(res, actor, rollout, eff or Efficiency()).values())


def sync_time(ctx: PriceContext, actor: Placed, rollout: Placed) -> float:
    """Time to refresh every rollout replica: one broadcast of the full weights that all of
    them join (`sync_links`) in `sync_calls` calls per sender, priced by
    `costmodel.weight_sync_time`; a paired transport (the job's `weight_sync`), one stream per
    engine rank (`placer.cost.refit`). A rollout split over pools: every part's replicas join the one
    broadcast, so the slowest part's links pace it (the max over parts). A mixed rollout (a
    part in the actor's slot, `placer.cost.split.colocated`): that part takes the weights
    locally, the others over their own links."""
    if rollout.est.parts:
        return max(sync_time(ctx, actor, Placed(_part_slot(actor, rollout, p.est), p.est))
                   for p in rollout.est.parts)
    res = ctx.res
    m = res.arch_of(Role.ROLLOUT)
    dev = res.device_of(rollout.est.pool)
    eff = ctx.calib.for_device(dev)
    # one stream per engine rank, or the framework's own colocated refit (`placer.cost.refit`)
    if res.job.weight_sync.mechanism.paired or streams_colocated(res, actor.slot == rollout.slot):
        a, r = actor.est, rollout.est
        return paired_time(paired_route(res, m, a.pool, a.devices, r.pool, r.devices, r.par,
                                        actor.slot == rollout.slot, eff, a.par.pp), dev, eff)
    return weight_sync_time(m, sync_bandwidth(res, actor, rollout, eff), dev, eff,
                            sync_calls(m, actor.est.par.pp, eff), sync_call_cost(m, eff))


def _part_slot(actor: Placed, rollout: Placed, part: Estimate) -> str:
    """The slot a split rollout's part runs in: the role's slot on the pool that slot is on
    (where the actor may sit too), a slot of its own on any other pool."""
    if part.pool == rollout.est.parts[0].est.pool:
        return rollout.slot
    return f"{rollout.slot}/{part.pool}"


def onload_time(role: str, mem: Memory, dev: DeviceType, eff: Efficiency,
                sleep_level: int) -> float:
    """What one role pays per iteration to give its colocated slot up and take it back: a GPU
    rollout engine sleeps and wakes at the job's vLLM `sleep_level` (`Job.sleep_level`,
    `costmodel.engine_swap_time`: at level 1 its weights over the host link, at level 2 none;
    its KV pool discarded and re-allocated); any other role copies its weights and optimizer
    state out and back (`costmodel.switch_time`). A generative judge's engines (the reward's
    estimate then holds a KV pool) sleep and wake as the rollout's do."""
    if dev.kind is DeviceKind.gpu and (role == Role.ROLLOUT or mem.kv_cache > 0):
        return engine_swap_time(mem.weights, eff, sleep_level)
    return switch_time(mem, eff)


def slot_switch(ctx: PriceContext, placed: list[Placed]) -> dict[str, float]:
    """Per slot, what its roles pay per RL step to take turns on its devices (`member_switch`):
    when they do not fit together even with parked state (`optpark.slot_peak_gb`), every
    member's onload (`onload_time`: its weights and optimizer out and back); when they fit, the
    onload of the members the job's framework switches every step anyway
    (`FrameworkProfile.switches_every_step`: NeMo-RL offloads its policy and sleeps its vLLM
    engine each step of a colocated run, whatever the memory); a member that parks state pays
    its framework's copies of it (`placer.cost.offload`) either way. Slots paying nothing are
    left out."""
    res = ctx.res
    by_slot: dict[str, list[Placed]] = defaultdict(list)
    for p in placed:
        by_slot[p.slot].append(p)
    out = {}
    for slot, members in by_slot.items():
        first = members[0].est
        if first.parts and len(members) < 2:
            continue  # a split role alone in its slot parks nothing
        # a split role in a shared slot (a mixed rollout): its memory is its part's on the
        # slot's pool (`placer.cost.split.colocated`), the pool its first part is on
        dev = res.device_of(first.parts[0].est.pool if first.parts else first.pool)
        if dev.host_backed:  # its memory is host RAM already: a switch moves nothing
            continue
        eff = ctx.calib.for_device(dev)
        rows = [(p.est.memory.total, optpark.parked_gb(p.est.memory, p.est.par)) for p in members]
        whole = len(members) > 1 and optpark.slot_peak_gb(rows) > dev.memory_gb
        always = res.job.profile.switches_every_step(p.est.role for p in members)
        fw, level = res.job.profile.park_scheme, res.job.sleep_level
        if t := sum(member_switch(p.est, dev, eff, fw, whole or p.est.role in always, level)
                    for p in members):
            out[slot] = t
    return out


def member_switch(est: Estimate, dev: DeviceType, eff: Efficiency, framework: str,
                  whole: bool, sleep_level: int) -> float:
    """What one member of a shared slot pays per RL step: the copies of what it parks, as its
    framework moves them (`optpark.moved_gb`: verl loads parked weights for every phase that
    runs the module, whether or not the slot would fit without), and, when the slot switches
    whole or its framework switches the member every step (`whole`), its onload
    (`onload_time`): all of its state leaves the devices once at least, so a parking member
    pays the larger of its onload and its copies plus the round trip of what it does not park
    (`offload.unparked_gb`); an engine sleeps at `sleep_level`. A parked twin in a switching
    slot so never prices below its unparked twin (the ILP's parking rule,
    `placer.solve.ilp_memory`, relies on it)."""
    parks = bool(parked_states(est.par))
    moved = optpark.park_time(optpark.moved_gb(est, framework), eff) if parks else 0.0
    if not whole:
        return moved
    onload = onload_time(est.role, est.memory, dev, eff, sleep_level)
    if not parks:
        return onload
    return max(onload, moved + host_round_trip_time(unparked_gb(est.memory, est.par), eff))


def rollout_tool_time(ctx: PriceContext, rollout: Placed, env: Placed) -> float:
    """Seconds the rollout engines wait on tool calls queued for a CPU core (multi-turn jobs).

    A sequence keeps its engine slot (its KV) while its tool call runs; the rollout estimate
    already holds each call's latency as if served at once (`estimate._waves`,
    `rollout_tail.makespan`). What the environment's size adds is queueing: when the replicas
    hold more sequences than the cores serve at once, calls queue first come, first served while
    the groups already back decode (`toolqueue.queue_delay`: the lockstep waves at the job's
    means replayed on every replica with one shared pool, minus the same replay with unlimited
    cores). Like `sync_time` this prices a pair of placements (rollout, environment).
    Over-provisioned it can be negative: staggered returns let the first groups decode in a
    smaller batch, so the stage reaches its kept count sooner (`toolqueue.queue_delay`).
    A rollout split over pools: every part's replicas share the one pool, as the simulator's
    parts share its `CorePool`, so a part's calls queue behind another's only where their
    bursts meet in time (`toolqueue.queue_delays`); each part's queueing adds to that part's
    time, and the term is what the slowest part (with its queueing) adds to the split
    estimate's rollout stage.
    """
    env_spec = ctx.res.job.environment
    if env_spec.kind == "none" or env_spec.turns < 2:
        return 0.0
    parts = ([(ctx.with_samples(p.samples), p.est) for p in rollout.est.parts]
             if rollout.est.parts else [(ctx, rollout.est)])
    delays = _queueing(ctx, parts, env.est)
    worst = max(est.stage_s.get("rollout", 0.0) + d for (_, est), d in zip(parts, delays))
    if not rollout.est.parts:
        return delays[0]
    return max(worst - rollout.est.stage_s.get("rollout", 0.0), 0.0)


def _queueing(ctx: PriceContext, parts: list[tuple[PriceContext, Estimate]], env: Estimate
              ) -> tuple[float, ...]:
    """The queueing of each rollout placement's tool calls (a split's parts, each priced on its
    own samples' context) when all of them share `env`'s cores."""
    res, calib = ctx.res, ctx.calib
    env_spec = res.job.environment
    e_dev = res.device_of(env.pool)
    slots = max(int(env.devices * e_dev.cores // env_spec.cpu_per_call), 1)
    groups = []
    for part, est in parts:
        r_dev = res.device_of(est.pool)
        r_eff = calib.for_device(r_dev)
        shape = rollout_shape(part, r_dev, est.par, r_eff)
        if shape.concurrency < 1:
            return (0.0,) * len(parts)  # infeasible: priced elsewhere
        st = ctx.step_terms(res.arch_of(Role.ROLLOUT), r_dev, est.par, r_eff)
        groups.append((st, Replicas(shape.replicas, shape.per_replica, shape.steady,
                                    shape.generated, shape.kept), shape.concurrency))
    if sum(sh.replicas * conc for _, sh, conc in groups) <= slots:
        return (0.0,) * len(parts)  # every sequence's call finds a free core
    row = strata(at_means(res.job), 1, 0.0)
    lat = env_spec.tool_latency_s.mean_value() + calib.for_device(e_dev).tool_overhead_s
    return queue_delays(tuple((st, sh) for st, sh, _ in groups), row.prompt[0], row.response[0],
                        env_spec.tool_output_tokens, lat, slots)


def validation_swap_s(ctx: PriceContext, rollout: Estimate) -> float:
    """The rollout engines' sleep and wake for one validation pass where their slot holds other
    roles (`onload_time` on the slot's pool: a mixed rollout's shared part's); 0 where their
    memory is host RAM. Whether the slot is shared is the placement's: the caller's."""
    pool = rollout.parts[0].est.pool if rollout.parts else rollout.pool
    dev = ctx.res.device_of(pool)
    if dev.host_backed:
        return 0.0
    return onload_time(Role.ROLLOUT, rollout.memory, dev, ctx.calib.for_device(dev),
                       ctx.res.job.sleep_level)


def _validation(ctx: PriceContext, placed: list[Placed], rollout: Placed, sync: float) -> float:
    """The job's periodic validation per step (`placer.cost.validation`): its generation, the
    refit and, where the engines share their slot, their sleep and wake."""
    shared = sum(p.slot == rollout.slot for p in placed) > 1
    swap = validation_swap_s(ctx, rollout.est) if shared else 0.0
    return validation_time(ctx, rollout.est, sync, swap)


def iteration_time(ctx: PriceContext, placed: list[Placed]) -> Breakdown:
    """Combine placed estimates into the iteration time of the job's pipeline mode."""
    res = ctx.res
    by_role = {p.est.role: p for p in placed}
    sync = 0.0
    if Role.ACTOR in by_role and Role.ROLLOUT in by_role:
        sync = sync_time(ctx, by_role[Role.ACTOR], by_role[Role.ROLLOUT])
    switch = slot_switch(ctx, placed)
    per_slot_stage: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p in placed:
        for stage, t in p.est.stage_s.items():
            per_slot_stage[p.slot][stage] += t
    rollout_slot = by_role[Role.ROLLOUT].slot if Role.ROLLOUT in by_role else None
    if rollout_slot is not None:
        per_slot_stage[rollout_slot]["sync"] += sync
        if Role.ENVIRONMENT in by_role:  # engines hold their sequences through tool calls
            per_slot_stage[rollout_slot]["rollout"] += rollout_tool_time(
                ctx, by_role[Role.ROLLOUT], by_role[Role.ENVIRONMENT])
        if res.job.validation is not None:  # its mean share of the step (validation.py)
            per_slot_stage[rollout_slot]["validate"] += _validation(ctx, placed,
                                                                    by_role[Role.ROLLOUT], sync)
    for slot, t in switch.items():
        per_slot_stage[slot]["switch"] += t
    busy = {s: sum(st.values()) for s, st in per_slot_stage.items()}
    stage_s = {st: max((v.get(st, 0.0) for v in per_slot_stage.values()), default=0.0)
               for st in STAGES + (("validate",) if res.job.validation is not None else ())}
    stage_s["switch"] = max(switch.values(), default=0.0)
    chain = sum(stage_s.values())  # sync -> rollout -> score -> train of one step, in order
    total = res.job.pipeline.mechanism.iteration_s(chain, max(busy.values(), default=0.0))
    return Breakdown(total, stage_s, busy, switch, sync)
