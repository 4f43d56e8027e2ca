"""Paired refit: each engine rank takes its share from its own trainer rank, all in parallel.

The checkpoint engines of NeMo-RL (NIXL, `shard_expert_weights`) and verl pair every rollout
rank with a trainer rank (NeMo-RL's `_source_rank_for_rollout`: rollout rank r reads from
trainer rank r), so the refit is as many streams as engine ranks, not one broadcast. What a
stream moves depends on the transport (`placer.spec.weightsync`):

  sharded  the engine rank's own slice: every routed expert over the replica's expert shards
           (`Parallel.expert_shards`: its pipeline stage and its TP or EP slice), the dense
           tensors of its stage whole (NeMo-RL sends them to vLLM's standard loader)
  full     the full weights (`shard_experts: false`, the reference loader)

  t = weights / sync_export_gbs + share x slice / (stream GB/s x link_eff) + latency + calls

The export term is the trainer's side: the sender assembles every full tensor from its PP / EP
shards before it keeps the destination's slice, so it pays for the whole model whatever it
sends (NeMo-RL's full-expert and sharded-expert refits differ by the wire bytes alone). A stream
runs at the transport's rate over the network (`SyncTransport.stream_gbs`), NVLink inside one
node, or `sync_local_gbs` when trainer and engine share the GPUs (CUDA IPC). A trainer with
fewer ranks than the engines serves `share` receivers in turn.

NeMo-RL's nccl_reshard refit (`nccl-reshard`; NVIDIA-NeMo/RL @7ea279ab
docs/design-docs/nccl-reshard-refit.md, nemo_rl/weight_sync/nccl_reshard_weight_synchronizer.py,
nemo_rl/models/generation/vllm/vllm_backend.py `nccl_reshard_refit`) sends an engine rank
  bulk  its own slice of the FFN projection weights (dense MLP gate/up/down and the routed
        experts, `reshard_bulk_bytes`; shared experts ride the misc path), each trainer rank's
        local shard "sent as-is", so no export; one `xferdtensor` call per projection of a
        layer (experts grouped into one `[num_experts, ...]` entry): 3 per layer
  misc  everything else whole, after the bulk ("the workers run the misc broadcast strictly
        after the bulk reshard"), by the conventional packed broadcast (nemo_rl/utils/
        packed_tensor.py: GPU buffers of `sync_bucket_gb`, 0.02 of device memory by default),
        which goes through the trainer's HF export (`sync_export_gbs`) as a full refit does
both over the engine rank's NIC from GPU memory (`NcclReshard.stream_gbs`), plus two per-item
costs the wire does not carry (`reshard_fixed_s`):
  misc tensors   each misc tensor is exported one by one on the trainer (Megatron-Bridge's
                 `export_hf_weights`: its PP broadcast and TP gather, the HF renaming, the copy
                 into the packed buffer) and loaded one by one by the engine (vLLM's
                 `load_weights`): `reshard_misc_tensor_s` each
  grouped calls  each layer's routed experts go as one `xferdtensor` call per projection, with
                 the trainer stacking its local experts (`pre`), the engine staging and copying
                 the fused w13 / w2 region (`pre` / `post`) and the transfer gathering from every
                 expert shard: `reshard_grouped_call_s` each, on the engine's refit streams
                 (`RESHARD_STREAMS`, NRL_REFIT_NUM_STREAMS: one trainer pipeline stage a stream,
                 so a trainer of PP >= 2 halves the calls in line)
Both are fitted on the published nccl_reshard rows (`workflows.loo`; 7 rows, 5 of them one
model's layouts), not measured per call. Colocated, the framework refits by CUDA IPC instead
("the colocated path uses IPC and is unaffected"): with no colocated refit of its own
(`COLOCATED_REFITS`), the full weights at `sync_local_gbs`, as a broadcast's local refresh.

NeMo-RL's colocated refit (`ipc-stream`, the framework profile's `colocated_refit`; NVIDIA-NeMo/RL
@7ea279ab nemo_rl/algorithms/grpo.py `refit_policy_generation`, nemo_rl/models/policy/utils.py
`stream_weights_via_ipc_zmq_impl`, vllm_backend.py `update_weights_via_ipc_zmq`), whatever the
job's transport: every trainer rank streams the full HF weights to the engine worker on its own
GPU, all GPUs at once, no wire. Per GPU:
  export   the trainer's HF export of every tensor (Megatron-Bridge `export_hf_weights`: its PP
           broadcast and TP / EP gather, as the paired and misc paths): weights / sync_export_gbs
  tensors  each tensor exported one by one and loaded one by one by vLLM's `load_weights` (the
           same walk as nccl_reshard's misc tensors): `reshard_misc_tensor_s` each
  copies   the trainer packs each tensor into a staging buffer (`pack_tensor`, a device copy)
           and the engine's loader copies its TP slice out of the IPC view: full + slice bytes,
           each read and written once in HBM (mem_bw / 2 a byte), x link_eff
  groups   ping-pong staging buffers of NRL_REFIT_BUFFER_MEMORY_RATIO (0.3) of free memory,
           halved (`IPC_BUFFER_RATIO`; free memory taken as the device's, an upper bound): per
           group a stream synchronize, an IPC handle and a ZMQ round trip, `sync_call_s` each
No new factor: the per-tensor cost and the export rate are the nccl_reshard / paired fits.
Sources: docs/cost-model.md.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from placer.cost.efficiency import Efficiency
from placer.cost.model import sync_call_cost, transfer_time
from placer.cost.roofline import GB, weight_bytes, weight_tensors
from placer.cost.sharding import BYTES, Parallel
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceType

# CUDA streams an nccl_reshard engine spreads the trainer's pipeline stages over
# (NRL_REFIT_NUM_STREAMS, default 2: NVIDIA-NeMo/RL @7ea279ab vllm_backend.py `nccl_reshard_refit`)
RESHARD_STREAMS = 2
# NeMo-RL's colocated IPC staging: NRL_REFIT_BUFFER_MEMORY_RATIO (default 0.3) of the trainer's
# free memory, split into two ping-pong buffers (NVIDIA-NeMo/RL @7ea279ab nemo_rl/algorithms/
# grpo.py `refit_policy_generation`, nemo_rl/models/policy/utils.py `stream_weights_via_ipc_zmq_impl`)
IPC_BUFFER_RATIO = 0.3


def slice_bytes(m: ModelArch, r_par: Parallel, sharded: bool) -> float:
    """Bytes one engine rank receives: its destination-local slice, or the full weights."""
    full = weight_bytes(m)
    if not sharded:
        return full
    routed = m.moe_layers * m.experts * m.expert_params() * BYTES
    return routed / r_par.expert_shards + (full - routed) / r_par.pp


def reshard_bulk_bytes(m: ModelArch) -> float:
    """Bytes of the FFN projection weights nccl_reshard moves shard to shard: every layer's
    dense MLP (3 h mlp) or routed experts (experts x 3 h expert_mlp). Qwen3-4B 66.9%,
    Qwen3-30B-A3B 95.0%, DeepSeek-V3 97.6% of the weights: the doc's "XferDTensor fraction"."""
    dense = (m.layers - m.moe_layers) * 3 * m.hidden * m.mlp
    return (dense + m.moe_layers * m.experts * m.expert_params()) * BYTES


def reshard_bytes(m: ModelArch, r_par: Parallel) -> tuple[float, float]:
    """(bulk, misc) bytes one engine rank receives from a nccl_reshard refit: its TP / expert
    slice of the FFN weights (dense MLP over the TP x PP ranks, experts over
    `Parallel.expert_shards`), and the misc weights whole."""
    routed = m.moe_layers * m.experts * m.expert_params() * BYTES
    bulk = reshard_bulk_bytes(m)
    return (routed / r_par.expert_shards + (bulk - routed) / (r_par.tp * r_par.pp),
            weight_bytes(m) - bulk)


def reshard_misc_tensors(m: ModelArch) -> int:
    """HF tensors of the misc path: every tensor but the FFN projections the bulk path moves
    (a dense layer's gate/up/down and every routed expert's). Qwen3-4B 290, Qwen3-30B-A3B 435,
    DeepSeek-V3 784 (its shared experts ride the misc path)."""
    bulk = 3 * (m.layers - m.moe_layers) + 3 * m.moe_layers * m.experts
    return weight_tensors(m) - bulk


def reshard_grouped_calls(m: ModelArch, trainer_pp: int) -> float:
    """Grouped-expert `xferdtensor` calls in line on one engine stream: 3 per MoE layer, the
    trainer's pipeline stages spread over `RESHARD_STREAMS` streams."""
    return 3 * m.moe_layers / min(max(trainer_pp, 1), RESHARD_STREAMS)


def reshard_fixed_s(m: ModelArch, trainer_pp: int, eff: Efficiency) -> float:
    """Seconds of an nccl_reshard refit that scale with items, not bytes (module docstring)."""
    return (reshard_misc_tensors(m) * eff.reshard_misc_tensor_s
            + reshard_grouped_calls(m, trainer_pp) * eff.reshard_grouped_call_s)


@dataclass(frozen=True)
class PairedRoute:
    """One stream of a paired refit (every stream alike, all at once)."""

    links: dict[str, float]  # raw GB/s of each link one stream crosses (achieved: x link_eff)
    gb: float  # GB one trainer rank sends: its receivers' slices, in turn
    calls: int  # sequential calls of that stream (buckets; tensors when unbucketed)
    export_s: float  # the trainer's export of the full weights
    call_s: float  # each call after the first (`costmodel.sync_call_cost`)
    fixed_s: float = 0.0  # per-item costs beside the wire (nccl_reshard: `reshard_fixed_s`)


def ipc_stream_route(m: ModelArch, dev: DeviceType, r_par: Parallel,
                     eff: Efficiency) -> PairedRoute:
    """NeMo-RL's colocated refit on one GPU (module docstring): the export, one walk per tensor,
    the pack and load copies in HBM and one ZMQ round trip per staging group."""
    full = weight_bytes(m)
    loaded = full / max(r_par.tp * r_par.pp, 1)  # the engine rank's TP / PP slice
    group_gb = IPC_BUFFER_RATIO / 2 * dev.memory_gb
    return PairedRoute({"local": dev.mem_bw_gbs / 2}, (full + loaded) / GB,
                       max(math.ceil(full / GB / group_gb), 1), full / (eff.sync_export_gbs * GB),
                       eff.sync_call_s, weight_tensors(m) * eff.reshard_misc_tensor_s)


# A framework's own colocated refit (`FrameworkProfile.colocated_refit`): its route on one GPU.
COLOCATED_REFITS: dict[str, Callable[[ModelArch, DeviceType, Parallel, Efficiency],
                                     PairedRoute]] = {"ipc-stream": ipc_stream_route}


def streams_colocated(res: Resolved, same_slot: bool) -> bool:
    """Whether a refit into engines on the trainer's GPUs runs the framework's own colocated
    path (`COLOCATED_REFITS`), priced as a paired route, rather than the shared local one."""
    return same_slot and res.job.profile.colocated_refit in COLOCATED_REFITS


def paired_route(res: Resolved, m: ModelArch, a_pool: str, a_devices: int, r_pool: str,
                 r_devices: int, r_par: Parallel, same_slot: bool,
                 eff: Efficiency, a_pp: int = 1) -> PairedRoute:
    """The links, bytes and calls of one stream (see the module docstring); `a_pp`: the
    trainer's pipeline stages (nccl_reshard's engine streams)."""
    if streams_colocated(res, same_slot):
        return COLOCATED_REFITS[res.job.profile.colocated_refit](m, res.device_of(r_pool), r_par,
                                                                 eff)
    ws = res.job.weight_sync
    mech = ws.mechanism
    a_dev, r_dev = res.device_of(a_pool), res.device_of(r_pool)
    if mech.reshards:
        return _reshard_route(res, m, (a_pool, a_devices, a_pp), r_pool, r_devices, r_par,
                              same_slot, eff)
    share = math.ceil(r_devices / max(a_devices, 1))  # receivers one trainer rank serves
    gb = slice_bytes(m, r_par, mech.shards(ws.shard_experts)) * share / GB
    per_node = res.job.cluster.pool(a_pool).devices_per_node
    if same_slot:
        links = {"local": eff.sync_local_gbs}
    elif a_pool == r_pool and a_devices + r_devices <= per_node:
        links = {"stream": min(a_dev.intra_link_gbs, r_dev.intra_link_gbs)}
    else:
        links = {"stream": mech.stream_gbs(min(a_dev.nic_gbs, r_dev.nic_gbs), eff.sync_sender_gbs)}
        cross = res.job.cluster.topology.cross_pool_gbs
        if a_pool != r_pool and cross is not None:  # every concurrent stream crosses it
            nodes = min(_nodes(res, a_pool, a_devices), _nodes(res, r_pool, r_devices))
            links["cross"] = cross * nodes / min(a_devices, r_devices)
    full = weight_bytes(m)
    calls = (math.ceil(gb / eff.sync_bucket_gb) if eff.sync_bucket_gb > 0  # unbucketed: its tensors
             else math.ceil(weight_tensors(m) * min(gb * GB / full, 1.0)))
    return PairedRoute(links, gb, max(calls, 1), full / (eff.sync_export_gbs * GB),
                       sync_call_cost(m, eff))


def _reshard_route(res: Resolved, m: ModelArch, actor: tuple[str, int, int], r_pool: str,
                   r_devices: int, r_par: Parallel, same_slot: bool,
                   eff: Efficiency) -> PairedRoute:
    """nccl_reshard's one stream (module docstring): bulk slice then misc, one link, and the
    per-item costs; colocated, CUDA IPC of the full weights in `sync_bucket_gb` buckets.
    `actor`: the trainer's pool, devices and pipeline stages."""
    a_pool, a_devices, a_pp = actor
    full = weight_bytes(m)
    bucket = max(eff.sync_bucket_gb, 1e-9)
    if same_slot:
        return PairedRoute({"local": eff.sync_local_gbs}, full / GB,
                           max(math.ceil(full / GB / bucket), 1), 0.0, eff.sync_call_s)
    a_dev, r_dev = res.device_of(a_pool), res.device_of(r_pool)
    bulk, misc = reshard_bytes(m, r_par)
    if a_pool == r_pool and a_devices + r_devices <= res.job.cluster.pool(a_pool).devices_per_node:
        links = {"stream": min(a_dev.intra_link_gbs, r_dev.intra_link_gbs)}
    else:
        links = {"stream": res.job.weight_sync.mechanism.stream_gbs(
            min(a_dev.nic_gbs, r_dev.nic_gbs), eff.sync_sender_gbs)}
        cross = res.job.cluster.topology.cross_pool_gbs
        if a_pool != r_pool and cross is not None:  # every concurrent stream crosses it
            nodes = min(_nodes(res, a_pool, a_devices), _nodes(res, r_pool, r_devices))
            links["cross"] = cross * nodes / min(a_devices, r_devices)
    calls = 3 * m.layers + math.ceil(misc / GB / bucket)  # xferdtensor calls + misc buckets
    return PairedRoute(links, (bulk + misc) / GB, calls, misc / (eff.sync_export_gbs * GB),
                       eff.sync_call_s, reshard_fixed_s(m, a_pp, eff))


def paired_time(route: PairedRoute, dst: DeviceType, eff: Efficiency) -> float:
    """Seconds of a paired refit: the export and the per-item costs, then the stream on its
    slowest link (`costmodel.transfer_time`: latency, calls, an LPU's reload)."""
    wire = transfer_time(route.gb * GB, min(route.links.values()), dst, eff, route.calls,
                         route.call_s)
    return route.export_s + route.fixed_s + wire


def _nodes(res: Resolved, pool: str, devices: int) -> int:
    return -(-devices // res.job.cluster.pool(pool).devices_per_node)
