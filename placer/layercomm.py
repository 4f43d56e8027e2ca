"""The collectives of a parallel layout's passes, priced with `placer.collectives`: what each
layer, micro-batch and optimizer step sends (`placer.sharding` says how a layout splits the work).

  layer_comm      one pass's TP all-reduces, EP all-to-alls and CP ring exchanges
  decode_comm     one decode step's TP all-reduces (and EP all-to-alls), each a whole call
  pp_send         the stage-to-stage sends of one micro-batch
  grad_sync_time  one optimizer step's gradient reduction (dense over dp x cp, experts over
                  expert DP)
  zero3_gathers   ZeRO-3 / FSDP weight gathers and gradient reduce-scatters per micro-batch
Links: a TP group stays on NVLink (`tp_link`); any other group is on NVLink while it fits one
node of `NODE_DEVICES`, else on the NIC (`span_link`). Efficiency factors (achieved fraction of a
link, per-call and per-hop latencies) come from `placer.costmodel.Efficiency`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from placer.collectives import Link, all_gather, all_reduce, group_link
from placer.sharding import BYTES, Parallel, cp_kv_exchange, ep_all_to_all, grad_bytes
from placer.spec import DeviceType, ModelArch

if TYPE_CHECKING:
    from placer.costmodel import Efficiency

# Tokens a training or forward micro-batch holds on one device: verl's default
# ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu (16,384). Each micro-batch runs its
# own TP all-reduces, so it sets how many calls (and per-call latencies) a pass pays.
MICRO_TOKENS = 16384
NODE_DEVICES = 8  # devices a collective group may span before it leaves NVLink for the NIC


def tp_link(dev: DeviceType, eff: Efficiency) -> Link:
    """The NVLink a TP group runs its all-reduces on (TP stays inside one node)."""
    return Link(eff.nvlink_hop_s, dev.intra_link_gbs * eff.link_eff, eff.coll_base_s)


def span_link(dev: DeviceType, ranks: int, eff: Efficiency) -> Link:
    """The link of a group spanning `ranks` consecutive devices: NVLink inside a node, else
    the NIC (`collectives.group_link`)."""
    return group_link(dev.intra_link_gbs, dev.nic_gbs, ranks, NODE_DEVICES, eff.link_eff,
                      eff.nvlink_hop_s, eff.net_hop_s, eff.coll_base_s)


def layer_comm(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
               eff: Efficiency) -> float:
    """One pass's layer collectives over `tokens` tokens per dp rank, all layers, issued once
    per micro-batch of `MICRO_TOKENS` (the call count kept fractional so that a pass split
    into parts costs the sum of its parts; the simulator prices mini-batches one by one):
      TP   2 all-reduces of the activations (tokens / cp * h * b bytes) per layer (Shoeybi et
           al. 2019); a MoE layer under EP keeps only attention's
      EP   per MoE layer a dispatch and a combine all-to-all (`sharding.ep_all_to_all`) of
           each rank's tokens / (tp * cp), over ep * etp consecutive ranks
      CP   per layer the ring exchange of K and V (`sharding.cp_kv_exchange`)"""
    if tokens <= 0:
        return 0.0
    chunk = min(tokens, MICRO_TOKENS)
    group = chunk / par.cp  # tokens each device of a TP group holds
    out = 0.0
    if par.tp > 1:
        calls = 2 * m.layers - (m.moe_layers if par.ep > 1 else 0)
        out += calls * all_reduce(group * m.hidden * BYTES, par.tp, tp_link(dev, eff))
    if par.ep > 1:
        link = span_link(dev, par.ep * par.etp, eff)
        out += m.moe_layers * ep_all_to_all(m, par, group / par.tp, link)
    if par.cp > 1:
        out += m.layers * cp_kv_exchange(m, par, chunk, span_link(dev, par.tp * par.cp, eff))
    return out * tokens / chunk


def _tp_comm(m: ModelArch, dev: DeviceType, tp: int, tokens: float, eff: Efficiency) -> float:
    """One pass's TP all-reduces alone (`layer_comm` of a pure TP layout)."""
    return layer_comm(m, dev, Parallel(tp=tp), tokens, eff)


def decode_tp_comm(m: ModelArch, dev: DeviceType, tp: int, batch: int, eff: Efficiency) -> float:
    """One decode step's TP traffic: 2 all-reduces per layer of batch * h * b bytes, each a
    whole call, so even a batch of 1 pays 2 * L * (base + 2(tp-1) or 2 log2(tp) hops)."""
    return decode_comm(m, dev, Parallel(tp=tp), batch, eff)


def decode_comm(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                eff: Efficiency) -> float:
    """One decode step's collectives: 2 TP all-reduces of batch * h * b bytes per layer, each a
    whole call; with EP a MoE layer keeps attention's all-reduce and adds a dispatch and a
    combine all-to-all of the batch's routed copies (each rank routes batch / tp tokens)."""
    if batch <= 0 or par.tp == 1:
        return 0.0
    calls = 2 * m.layers - (m.moe_layers if par.ep > 1 else 0)
    out = calls * all_reduce(batch * m.hidden * BYTES, par.tp, tp_link(dev, eff))
    if par.ep > 1:
        out += m.moe_layers * ep_all_to_all(m, par, batch / par.tp,
                                            span_link(dev, par.ep * par.etp, eff))
    return out


def pp_send(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
            eff: Efficiency) -> float:
    """Stage-to-stage sends of one micro-batch of `tokens` tokens through pp stages: pp - 1
    point-to-point sends of tokens * h * b bytes (the hidden state), each a call (latency +
    bytes over the link; NVLink when a replica fits one node, else the NIC). On the critical
    path of a decode step; for training `train_time` counts one per micro-batch and pass."""
    if par.pp <= 1 or tokens <= 0:
        return 0.0
    link = span_link(dev, par.replica, eff)
    return (par.pp - 1) * (link.base_s + link.alpha_s + link.bytes_s(tokens * m.hidden * BYTES))


def grad_sync_time(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> float:
    """One optimizer step's gradient reduction: the dense grads over dp * cp ranks and the
    expert grads over `expert_dp` ranks (`sharding.grad_bytes`), each one all-reduce (ZeRO's
    reduce-scatter + all-gather move what one all-reduce moves) on NVLink or the NIC."""
    link = group_link(dev.intra_link_gbs, dev.nic_gbs, par.devices, NODE_DEVICES, eff.link_eff,
                      eff.nvlink_hop_s, eff.net_hop_s, eff.coll_base_s)
    dense, experts = grad_bytes(m, par)
    out = all_reduce(dense, par.dp * par.cp, link)
    if experts > 0:
        out += all_reduce(experts, par.expert_dp, link)
    return out


def zero3_gathers(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
                  collectives: int, eff: Efficiency) -> float:
    """ZeRO-3 / FSDP weight traffic of a pass over `tokens` tokens per dp rank: every
    micro-batch of `MICRO_TOKENS` gathers the sharded weights before it uses them and the
    backward reduce-scatters its gradients, `collectives` calls of the device's weight shard
    each (2 forward + backward: gather, gather again, reduce-scatter -- the 1.5x of ZeRO-3 over
    ZeRO-2, Rajbhandari et al. 2020, sec. 7.2.2; 1 for a forward pass), the dense part over
    dp * cp ranks and the experts over `expert_dp` (expert parallelism shrinks both the shard
    and the group). 0 below ZeRO stage 3 or without data parallelism."""
    if par.zero < 3 or tokens <= 0:
        return 0.0
    link = span_link(dev, par.devices, eff)
    dense, experts = grad_bytes(m, par)  # BF16 bytes of the device's weights, gathered
    per_call = (all_gather(dense, par.dp * par.cp, link)
                + (all_gather(experts, par.expert_dp, link) if experts > 0 else 0.0))
    return collectives * per_call * tokens / min(tokens, MICRO_TOKENS)
