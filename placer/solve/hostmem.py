"""Host memory and checkpoints: the model state that lives off the accelerator.

A GPU node's host RAM (`Pool.host_memory_gb`, else the device type's `host_memory_gb`; GB = 1e9
bytes) holds, per node: the state of every training role whose optimizer steps on the host
(`offload`: 16 B/param of its shard as `sharding.train_state_bytes` shards it, the fp32 parameter,
Adam's moments and the pinned gradient buffer, `offload.HOST_OPTIMIZER_BYTES`); the weights a frozen
model streams from the host (`Parallel.stream_params_bytes` a parameter of its shard, `streamed_gb`)
or keeps there to swap into the policy's model (NeMo-RL's reference: its state dict and the policy's
saved one, `swapped_gb`, `placer.cost.refswap`); the state a slot parks while its colocated roles
take turns (`timing.slot_switch`: the worst moment parks every member but the smallest; each member
parks its own ranks' shards of what the framework moves off the device, at the framework's bytes per
parameter, `parked_gb`, `offload.host_parked_gb`: 12 B under verl's FSDP worker, 14 B where no
scheme is recorded; a slot whose members fit on its devices together parks only its parked states,
`placer.cost.optpark`); pinned transfer buffers of every device that moves state to or from the host
(`PINNED_GB_PER_DEVICE`); and Ray's object store on every node the plan uses (30% of RAM, at most
200 GB: Ray's defaults); and, where it fits, the full copy of the policy's weights that the
weight-sync senders keep between steps (`sync_copy_gb`: each trainer rank beside a colocated engine,
else the trainer's first rank; none with pipeline stages; one copy of the weights at
`SYNC_COPY_BYTES` a parameter, the FP32 master weights the executor's trainer keeps and streams,
`sync_copy_bytes`). The copy is kept only when every checked node holds it beside everything else
(`keeps_sync_copy`); then `plan_nodes` counts it, else the senders gather each refresh from the
shards as they stream it and nothing is kept. The executor reads the same decision
(`executors.runplan.RunPlan.keep_sync_copy`).

The planner refuses a candidate whose own need on one node exceeds the node's RAM
(`refuse_candidates`); the solver keeps each switching slot's parked and offloaded state within
`park_budget_gb` per device (`placer.solve.ilp`); the assembled plan is checked node by node
(`over_nodes`), where colocated roles add up, and a role whose offloaded candidates overflow a
node is re-planned without offload (`planner.plan_job`). Only GPU nodes are checked: a CPU
node's RAM is its `memory_gb`, LPUs hold weights in SRAM, and a device type without
`host_memory_gb` is not checked.

Checkpoints hold the trained roles' state (actor, and critic under PPO): 14 B/param (bf16
weights 2, fp32 master weights and Adam m, v 12; gradients are recomputed, not saved). Writing
one takes size / `Cluster.storage_gbs` (`checkpoint_s`, which `placer goodput` uses); on a plan's
layouts (`plan_checkpoint_s`) a sharded trainer first gathers its optimizer state whole and a
fixed `checkpoint_overhead_s` covers the rest. Sources: docs/cost-model.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from placer.base.roles import base_role, is_training
from placer.cost import optpark
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.estimate import frozen_shard_gb, frozen_sharded
from placer.cost.offload import MODEL_BYTES, host_optimizer_gb, host_parked_gb, parked_states
from placer.cost.pricer import Pricer
from placer.cost.refswap import swap_host_gb
from placer.cost.roofline import GB, Memory
from placer.cost.sharding import BYTES, Parallel, params_per_device, train_state_bytes
from placer.solve.assemble import placed_estimate
from placer.solve.planfile import calibration_of
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind, DeviceType, Pool

if TYPE_CHECKING:
    from placer.solve.candidates import Candidate
    from placer.solve.planfile import Plan, RolePlacement

CHECKPOINT_BYTES = 14  # bf16 weights 2 + the optimizer's 12; gradients are not saved
PINNED_GB_PER_DEVICE = 2.0
OBJECT_STORE_SHARE = 0.30
OBJECT_STORE_MAX_GB = 200.0
PARTS = ("optimizer", "streamed", "parked", "pinned", "object_store", "sync_copy")


@dataclass
class NodeHost:
    """Host memory one node of a pool needs (GB, by part) against what it has."""

    pool: str
    node: int
    capacity_gb: float
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    roles: set[str] = field(default_factory=set)

    @property
    def total_gb(self) -> float:
        return sum(self.parts.values())

    @property
    def over(self) -> bool:
        return self.total_gb > self.capacity_gb

    def describe(self) -> str:
        parts = ", ".join(f"{k.replace('_', ' ')} {v:,.0f}" for k, v in self.parts.items() if v)
        return (f"pool {self.pool} node {self.node} needs {self.total_gb:,.0f} GB of host memory "
                f"({parts}) of {self.capacity_gb:,.0f} GB")


def host_capacity_gb(res: Resolved, pool: Pool) -> float | None:
    """A node's host RAM (GB), or None where it is not checked (see the module docstring)."""
    dev = res.device_of(pool)
    if dev.kind is not DeviceKind.gpu:
        return None
    return pool.host_memory_gb or dev.host_memory_gb


def object_store_gb(capacity_gb: float) -> float:
    return min(OBJECT_STORE_SHARE * capacity_gb, OBJECT_STORE_MAX_GB)


def offloaded_gb_per_device(m: ModelArch, par: Parallel) -> float:
    """Host memory one device of a training role whose optimizer steps on the host keeps there:
    `offload.host_optimizer_gb` of the optimizer part of the cost model's `train_state_bytes`
    (ZeRO-sharded, experts apart; 16 B a parameter of the shard)."""
    return host_optimizer_gb(train_state_bytes(m, par)[2] / GB) if par.offload else 0.0


def offloaded_gb(res: Resolved, role: str, par: Parallel) -> float:
    """GB per device `role` keeps on the host on layout `par` (its offloaded optimizer state)."""
    m = res.model_of(role)
    return offloaded_gb_per_device(m, par) if is_training(role) and m is not None else 0.0


def streamed_gb(res: Resolved, role: str, par: Parallel) -> float:
    """GB per device of host memory a frozen model streaming its weights
    (`Parallel.stream_params_bytes`, FSDP's CPU parameter offload) holds there: its shard (the
    FSDP shard, `estimate.frozen_shard_gb`, or a whole copy over tp x pp) at the host copy's
    bytes a parameter; pinned for the whole job, whatever its slot does."""
    m = res.model_of(role)
    if par.stream_params_bytes <= 0 or m is None:
        return 0.0
    bf16 = (frozen_shard_gb(m, par)[0] if frozen_sharded(par)
            else m.params() * BYTES / par.weight_shards / GB)
    return par.stream_params_bytes * bf16 / MODEL_BYTES["params"]


def swapped_gb(res: Resolved, role: str, par: Parallel) -> float:
    """GB per device of host memory a frozen model the framework swaps into the policy's model
    (`FrameworkProfile.swap_frozen`, NeMo-RL's reference) holds there: its state dict and the
    policy's saved one (`refswap.swap_host_gb`)."""
    m = res.model_of(role)
    if m is None or base_role(role) not in res.job.profile.swap_frozen:
        return 0.0
    # its FSDP shard, or its tp x pp x expert shard (`sharding.params_per_device`)
    bf16 = (frozen_shard_gb(m, par)[0] if frozen_sharded(par)
            else BYTES * sum(params_per_device(m, par)) / GB)
    return swap_host_gb(bf16)


def host_weights_gb(res: Resolved, role: str, par: Parallel) -> float:
    """GB per device of a frozen model's weights held on the host: streamed (`streamed_gb`) or
    swapped (`swapped_gb`)."""
    return streamed_gb(res, role, par) + swapped_gb(res, role, par)


def held_gb(res: Resolved, role: str, par: Parallel) -> float:
    """GB per device `role` keeps on the host for the whole job on layout `par`: a host-stepped
    optimizer's state (`offloaded_gb`), streamed weights (`streamed_gb`) and a swapped
    reference's state dicts (`swapped_gb`)."""
    return offloaded_gb(res, role, par) + host_weights_gb(res, role, par)


def parked_gb(mem: Memory, role: str, framework: str, sleep_level: int) -> float:
    """GB per device a member of a switching slot keeps on the host while another runs: its
    weights and on-device optimizer state as its layout shards them (TP/PP splits, ZeRO/FSDP
    over its shard group), so a node parks only its own ranks' shards. A trainer parks weights
    and optimizer moments (volcengine/verl verl/utils/fsdp_utils.py `offload_fsdp_model_to_cpu`
    moves the parameters, `offload_fsdp_optimizer` the optimizer state, at a4cf020); its
    gradients are freed after the update (verl/workers/actor/dp_actor.py `update_policy` ends
    with `zero_grad()`, at 0081137), not kept. A frozen model parks its weights; a GPU rollout
    engine its weights at vLLM sleep level 1, none at level 2 (`sleep_level`, the job's, as
    `costmodel.engine_swap_time` prices it). KV caches and activations are discarded. An
    offloaded optimizer is on the host already (`offloaded_gb`), not parked again. Each state at
    the bytes per parameter the job's framework moves (`offload.host_parked_gb`: verl's FSDP
    worker parks its fp32 parameters and Adam's moments, 12 B a parameter; the model's own
    14 B, `model.switched_gb`, where no scheme is recorded)."""
    return host_parked_gb(mem, role, framework, sleep_level=sleep_level)


def parked_states_gb(mem: Memory, role: str, par: Parallel, framework: str) -> float:
    """GB per device of host memory the states `par` parks between phases fill
    (`offload.parked_states` at the framework's bytes): a slot whose members fit together."""
    return host_parked_gb(mem, role, framework, parked_states(par))


def park_budget_gb(res: Resolved, pool_name: str) -> float | None:
    """GB per device of a node's host RAM a switching slot on `pool_name` may fill with parked
    and offloaded state: the RAM less Ray's object store, shared by the node's devices, less
    each device's pinned buffers (None: the pool is not checked). The solver keeps to it
    (`placer.solve.ilp`); the plan is then checked node by node (`over_nodes`)."""
    pool = res.cluster.pool(pool_name)
    cap = host_capacity_gb(res, pool)
    if cap is None:
        return None
    return (cap - object_store_gb(cap)) / pool.devices_per_node - PINNED_GB_PER_DEVICE


# ------------------------------------------------------------------------------ candidates
def candidate_node(res: Resolved, c: Candidate) -> NodeHost | None:
    """The host need of one candidate alone on its fullest node (None: not checked); of a
    candidate split over pools, its neediest part's."""
    placements = [(p.est.pool, p.est.devices, p.est.par) for p in c.est.parts] or [
        (c.pool, c.devices, c.est.par)]
    nodes = [n for pool, devices, par in placements
             if (n := _alone_on_node(res, c.role, pool, devices, par)) is not None]
    return max(nodes, key=lambda n: n.total_gb, default=None)


def _alone_on_node(res: Resolved, role: str, pool_name: str, devices: int, par: Parallel
                   ) -> NodeHost | None:
    pool = res.cluster.pool(pool_name)
    cap = host_capacity_gb(res, pool)
    if cap is None:
        return None
    n = min(devices, pool.devices_per_node)
    node = NodeHost(pool_name, 0, cap, roles={role})
    per, stream = offloaded_gb(res, role, par), host_weights_gb(res, role, par)
    node.parts["optimizer"] = per * n
    node.parts["streamed"] = stream * n
    node.parts["pinned"] = PINNED_GB_PER_DEVICE * n if per or stream else 0.0
    node.parts["object_store"] = object_store_gb(cap)
    return node


def refuse_candidates(res: Resolved, cands: dict[str, list[Candidate]]
                      ) -> tuple[dict[str, list[Candidate]], dict[str, NodeHost]]:
    """(candidates that fit their node's host memory, role -> the smallest refused need)."""
    kept: dict[str, list[Candidate]] = {}
    refused: dict[str, NodeHost] = {}
    for role, cs in cands.items():
        kept[role] = []
        for c in cs:
            node = candidate_node(res, c)
            if node is None or not node.over:
                kept[role].append(c)
            elif role not in refused or node.total_gb < refused[role].total_gb:
                refused[role] = node
    return kept, refused


def without_offload(cands: dict[str, list[Candidate]], roles: set[str]
                    ) -> dict[str, list[Candidate]]:
    """The candidate table with the candidates of `roles` that keep optimizer state on the
    host (offloaded, or parked between phases) dropped."""
    return {r: [c for c in cs if not (r in roles and (c.est.par.offload
                                                      or c.est.par.park_optimizer))]
            for r, cs in cands.items()}


def refusal(res: Resolved, roles: list[str], why: dict[str, NodeHost]) -> str:
    """Why roles have no candidate left once host memory is checked (an Infeasible message);
    roles refused on the same node share one sentence."""
    groups: dict[str, list[str]] = {}
    for role in roles:
        m = res.model_of(role)
        node = why.get(role)
        detail = (f"with the optimizer offloaded {node.describe()}" if node is not None
                  else "no candidate fits host memory")
        groups.setdefault(detail, []).append(f"{role} ({m.name})" if m else role)
    return " | ".join(
        f"{' and '.join(labels)} {'do' if len(labels) > 1 else 'does'} not fit host memory: "
        f"without optimizer offload {'they do' if len(labels) > 1 else 'it does'} not fit "
        f"device memory, and {detail}. Smallest change: nodes with more host memory (the "
        "pool's host_memory_gb) or more devices to shard the state"
        for detail, labels in groups.items())


# ----------------------------------------------------------------------------------- plans
def plan_nodes(plan: Plan, px: Pricer) -> list[NodeHost]:
    """Every checked node the plan uses, with its host memory by part, the weight-sync
    senders' kept copy included when the plan keeps it (`keeps_sync_copy`).

    A role using fewer devices than its slot is spread evenly over the slot's bundles."""
    nodes = _state_nodes(plan, px)
    if _copy_fits(nodes, plan):
        copy = sync_copy_gb(plan)
        for n in nodes:
            n.parts["sync_copy"] = copy.get((n.pool, n.node), 0.0)
    return nodes


# Bytes a parameter of the kept copy takes: the executor's trainer keeps the refresh's source,
# its FP32 master weights (`executors.precision`: BF16 compute over FP32 masters, and weight
# sync carries FP32), not the BF16 bytes `roofline.weight_bytes` prices a device's copy at.
SYNC_COPY_BYTES = 4.0


def sync_copy_bytes(m: ModelArch) -> float:
    """Bytes of one kept copy of `m`'s weights (`SYNC_COPY_BYTES` a parameter)."""
    return m.params() * SYNC_COPY_BYTES


def sync_copy_gb(plan: Plan) -> dict[tuple[str, int], float]:
    """GB of host memory, by (pool, node), that a full copy of the policy's weights kept
    between steps takes on the trainer ranks that send a refresh: every rank beside a
    colocated engine (a trainer in the rollout's slot without pipeline stages: each hands over
    to the engine on its own device, `executors.ipc`), else the trainer's first rank (a
    stage's first rank keeps its stage's layers: together one copy, counted on the first
    node: an upper bound for that node). Empty without an actor and a rollout, or with
    pipeline stages (each stage's sender gathers its layers as it streams them: nothing is
    kept)."""
    res = plan.resolved()
    actor, m = plan.roles.get("actor"), res.model_of("actor")
    if actor is None or m is None or "rollout" not in plan.roles or actor.pp > 1:
        return {}
    full = sync_copy_bytes(m) / GB
    slot = next(s for s in plan.slots if s.name == actor.slot)
    bundles = [b for b in sorted(plan.bundles, key=lambda b: b.index)
               if b.slot == actor.slot and b.pool == actor.pool]
    out: dict[tuple[str, int], float] = {}
    if "rollout" in slot.roles:
        slot_devices = dict(slot.pool_devices())[actor.pool]
        for b in bundles:
            key = (b.pool, b.node)
            out[key] = out.get(key, 0.0) + full * len(b.devices) * actor.devices / slot_devices
    elif bundles:
        out[(bundles[0].pool, bundles[0].node)] = full
    return out


def _copy_fits(nodes: list[NodeHost], plan: Plan) -> bool:
    copy = sync_copy_gb(plan)
    return bool(copy) and all(n.total_gb + copy.get((n.pool, n.node), 0.0) <= n.capacity_gb
                              for n in nodes)


def keeps_sync_copy(plan: Plan, px: Pricer) -> bool:
    """Whether the plan keeps the weight-sync senders' full copy between steps: every checked
    node the plan uses holds it beside its other host memory (a node that is not checked
    sets no limit). False without an actor and a rollout."""
    return _copy_fits(_state_nodes(plan, px), plan)


def _state_nodes(plan: Plan, px: Pricer) -> list[NodeHost]:
    """`plan_nodes` without the kept copy."""
    res = px.res
    slots = {s.name: s for s in plan.slots}
    parked = _parked_per_device(plan, px)
    nodes: dict[tuple[str, int], NodeHost] = {}
    for b in plan.bundles:
        pool = res.cluster.pool(b.pool)
        cap = host_capacity_gb(res, pool)
        if cap is None:
            continue
        node = nodes.get((b.pool, b.node))
        if node is None:
            node = nodes[(b.pool, b.node)] = NodeHost(b.pool, b.node, cap)
            node.parts["object_store"] = object_store_gb(cap)
        slot = slots[b.slot]
        slot_devices = dict(slot.pool_devices())[b.pool]
        moves = b.slot in parked
        for role in slot.roles:
            devices, par = _on_pool(plan.roles[role], b.pool)
            n = len(b.devices) * devices / slot_devices
            per, stream = offloaded_gb(res, role, par), host_weights_gb(res, role, par)
            node.parts["optimizer"] += per * n
            node.parts["streamed"] += stream * n
            node.roles.add(role)
            moves = moves or per > 0 or stream > 0
        if moves:
            node.parts["pinned"] += PINNED_GB_PER_DEVICE * len(b.devices)
        node.parts["parked"] += parked.get(b.slot, 0.0) * len(b.devices)
    return list(nodes.values())


def _on_pool(r: RolePlacement, pool: str) -> tuple[int, Parallel]:
    """(devices, layout) a role has on `pool`: its own, or (split over pools) that part's."""
    part = next((p for p in r.parts if p.pool == pool), None)
    return (r.devices, r.par) if part is None else (part.devices, part.par)


def _parked_per_device(plan: Plan, px: Pricer) -> dict[str, float]:
    """Per switching slot: GB per device parked on the host at its worst moment (a split role
    alone in its slot never switches; a mixed rollout parks its part on the slot's pool). A
    slot that fits holds its parked states and the largest state of the members its framework
    switches every step (`FrameworkProfile.switches_every_step`: NeMo-RL's policy is on the
    host while its engine generates, the engine's weights while the policy trains)."""
    out = {}
    slots = {s.name: s for s in plan.slots}
    framework = px.res.job.profile.park_scheme
    for name in plan.breakdown.switch_s:
        slot = slots[name]
        rs = [plan.roles[role] for role in slot.roles]
        home = slot.parts[0].devices if slot.parts else slot.devices
        # on the slot's pool (a mixed rollout: its first part), per slot device, spread evenly
        shares = [(r.parts[0].devices if r.parts else r.devices) / home for r in rs]
        mems = [(r.parts[0].memory_gb if r.parts else r.memory_gb, r.parked_gb) for r in rs]
        memories = [placed_estimate(px, role, r, True).memory for role, r in zip(slot.roles, rs)]
        if optpark.slot_peak_gb(mems) <= px.res.device_of(
                slot.pool).memory_gb:  # they fit together: only parked states are moved, and
            # the whole state of the members the framework switches every step, one at a time
            every = px.res.job.profile.switches_every_step(slot.roles)
            kept = sum(parked_states_gb(mem, role, r.par, framework) * k
                       for role, mem, r, k in zip(slot.roles, memories, rs, shares)
                       if role not in every)
            moved = [parked_gb(mem, role, framework, px.res.job.sleep_level) * k
                     for role, mem, k in zip(slot.roles, memories, shares) if role in every]
            out[name] = kept + max(moved, default=0.0)
            continue
        states = [parked_gb(mem, role, framework, px.res.job.sleep_level) * k
                  for role, mem, k in zip(slot.roles, memories, shares)]
        out[name] = sum(states) - min(states, default=0.0)
    return out


def over_nodes(plan: Plan, px: Pricer) -> list[NodeHost]:
    return [n for n in plan_nodes(plan, px) if n.over]


def busiest_per_pool(nodes: list[NodeHost]) -> dict[str, NodeHost]:
    """The node of each pool that needs the most host memory (a report's one row per pool)."""
    out: dict[str, NodeHost] = {}
    for n in nodes:
        if n.pool not in out or n.total_gb > out[n.pool].total_gb:
            out[n.pool] = n
    return out


# ----------------------------------------------------------------------------- checkpoints
def checkpoint_gb(res: Resolved) -> float:
    """One checkpoint's size: 14 B/param of every trained model (actor; critic under PPO)."""
    return sum(CHECKPOINT_BYTES * m.params() / GB for role in res.job.role_names()
               if is_training(role) and (m := res.model_of(role)) is not None)


def checkpoint_s(res: Resolved) -> float:
    """Seconds one checkpoint blocks the job: its size over the cluster's storage bandwidth."""
    return checkpoint_gb(res) / res.job.cluster.storage_gbs


def checkpoint_time(m: ModelArch, eff: Efficiency, storage_gbs: float) -> float:
    """Seconds one trained model's checkpoint takes: its 14 B/param written at `storage_gbs` and
    the fixed `checkpoint_overhead_s`. Every rank writes its own shards (executors/shardckpt.py,
    as torch DCP, verl's FSDP checkpoint manager and Megatron's distributed checkpoint do), so no
    layout gathers first and the bytes are the same on any layout."""
    return CHECKPOINT_BYTES * m.params() / GB / storage_gbs + eff.checkpoint_overhead_s


def trained_layouts(plan: Plan) -> list[tuple[ModelArch, DeviceType, Parallel]]:
    """(model, device type, parallel config) of every trained role the plan places (actor;
    critic under PPO): what a checkpoint saves."""
    res = plan.resolved()
    return [(m, res.device_of(p.pool), p.par) for role, p in plan.roles.items()
            if is_training(role) and (m := res.model_of(role)) is not None]


def plan_checkpoint_s(plan: Plan, calib: Calibration | None = None) -> float:
    """Seconds a checkpoint blocks the job under `plan` (`calib`: default the plan's own):
    every trained role saves at once, so the slowest one's `checkpoint_time`; each sees the
    cluster's storage bandwidth (the executor writes the actor's and critic's files side by
    side). 0 without a trained role."""
    calib = calib if calib is not None else calibration_of(plan)
    storage = plan.resolved().job.cluster.storage_gbs
    return max((checkpoint_time(m, calib.for_device(dev), storage)
                for m, dev, _ in trained_layouts(plan)), default=0.0)
