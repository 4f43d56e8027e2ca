"""The collectives of a parallel layout's passes, priced with `placer.cost.collectives`: what each
layer, micro-batch and optimizer step sends (`placer.cost.sharding` says how a layout splits the work).

  layer_comm      one pass's TP all-reduces, EP all-to-alls and CP ring exchanges
  decode_comm     one decode step's TP all-reduces (and EP all-to-alls), each a whole call
  pp_send         the stage-to-stage sends of one micro-batch
  grad_sync_time  one optimizer step's gradient reduction (dense over dp x cp, experts over
                  expert DP)
  zero3_gathers   ZeRO-3 / FSDP weight gathers and gradient reduce-scatters per micro-batch
  hsdp_all_reduce HSDP: the gradient shards' all-reduce across the shard groups' replicas
  fsdp_units, fsdp_calls  FSDP units (each decoder layer and the root) and a micro-batch's calls
  weight_gather_time  the sharded trainer's full weights gathered per tensor for the sync
  oversubscription    an emulated device's ranks / host cores (> 1: they time-share the cores)
Links: any group (a TP group: `tp_link`) is on NVLink while it fits one node of
`NODE_DEVICES` (or the device's `scaleup_devices`, which a pool's NVLink domain sets:
`node_devices`), else on the NIC (`span_link`). Efficiency factors (achieved fraction of a
link, per-call and per-hop latencies) come from `placer.cost.efficiency.Efficiency`; sources in
docs/cost-model.md.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from placer.cost.collectives import (
    Link,
    all_gather,
    all_reduce,
    group_link,
    net_step_s,
    ring_all_reduce,
)
from placer.cost.fabric import fabric
from placer.cost.sharding import (
    BYTES,
    Parallel,
    cp_kv_exchange,
    ep_all_to_all,
    grad_bytes,
    reduce_ratio,
)
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceType

if TYPE_CHECKING:
    from placer.cost.efficiency import Efficiency

# Tokens a training or forward micro-batch holds on one device: verl's default
# ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu (16,384). Each micro-batch runs its
# own TP all-reduces, so it sets how many calls (and per-call latencies) a pass pays.
MICRO_TOKENS = 16384
NODE_DEVICES = 8  # devices a collective group may span before it leaves NVLink for the NIC


def node_devices(dev: DeviceType) -> int:
    """Consecutive devices a collective group may span and stay on NVLink: the device's
    `scaleup_devices` where its pool declares an NVLink domain (the whole domain when the pool
    fits in it, a GB200 NVL72 rack; one node when the pool spans several domains:
    `catalog.pool_scaleup`), else `NODE_DEVICES`."""
    return dev.scaleup_devices or NODE_DEVICES


def micro_tokens(par: Parallel, seq: float) -> float:
    """Tokens of one training micro-batch on a device's data-parallel rank: `micro_batch`
    sequences of `seq` tokens (a fixed count, verl's ppo_micro_batch_size_per_gpu), or the
    `MICRO_TOKENS` budget (or the layout's own, `micro_token_budget`) where it sets no count."""
    if par.micro_batch > 0:
        return par.micro_batch * seq
    return par.micro_token_budget if par.micro_token_budget > 0 else MICRO_TOKENS


def tp_link(dev: DeviceType, eff: Efficiency, ranks: int = 1) -> Link:
    """The link a TP group of `ranks` runs its all-reduces on: NVLink while the group fits one
    node, at the TP all-reduce's own `tp_link_eff`, per-call `tp_base_s` and per-step
    `tp_hop_s` (fitted on NCCL all-reduce kernels of TP-sized groups, which other
    collectives' `link_eff`, `coll_base_s` and `nvlink_hop_s` are not), a call costing the
    measured `tp_call_s` where the trainers' probe timed one; a group spanning nodes (an
    engine's TP 16 or 32) pays NCCL's hierarchical step latencies (`net_hop_s` for each step
    that crosses the network, the in-node ring's `tp_hop_s` for each step inside a node:
    `collectives.span_ring_steps_s`, `span_tree_steps_s`) and moves its bytes at a node's NICs
    together, one per device (NCCL runs a ring per channel and each channel crosses the node
    boundary on its own rail's NIC), or NVLink's rate where that is lower, both at the
    collectives' `link_eff` (as `span_link` prices every group that leaves a node: NCCL's
    inter-node graph, not the in-node TP kernel `tp_link_eff` was fitted on; OCI's two A100
    nodes run their tree's in-node chain at ~0.85 of NVLink); NCCL's tree loads the two
    differently (`collectives.span_bus_gbs`). The device's `network` adds its net plugin's
    declared latency to each network step and says whether LL runs (`placer.cost.fabric`)."""
    node = node_devices(dev)
    if ranks > node:  # the slower of the node's NICs and its own NVLink ring binds
        nvl, net = dev.intra_link_gbs * eff.link_eff, node * dev.nic_gbs * eff.link_eff
        f = fabric(dev)
        return Link(eff.net_hop_s, min(nvl, net), eff.tp_base_s, node, eff.tp_hop_s, nvl, net,
                    f.plugin_s, f.ll)
    return call_cost(Link(eff.tp_hop_s, dev.intra_link_gbs * eff.tp_link_eff, eff.tp_base_s),
                     eff.tp_call_s)


def tp_all_reduce(nbytes: float, tp: int, dev: DeviceType, eff: Efficiency) -> float:
    """One TP all-reduce of `nbytes` over tp ranks on `tp_link`: what `layer_comm` pays per
    call, and workflows/operators.py prices a measured one with. Inside one node NCCL runs
    the ring (`collectives.ring_all_reduce`); across nodes the faster of ring and tree."""
    link = tp_link(dev, eff, tp)
    if tp > node_devices(dev):
        return all_reduce(nbytes, tp, link)
    return min(ring_all_reduce(nbytes, tp, link), nvls_all_reduce(nbytes, tp, dev, eff))


def nvls_all_reduce(nbytes: float, tp: int, dev: DeviceType, eff: Efficiency) -> float:
    """NCCL's NVLS all-reduce inside a node whose NVSwitches reduce in the fabric
    (`DeviceType.nvlink_sharp`): each rank sends its buffer to the switch, which reduces and
    multicasts the sum back, so a rank moves the buffer once each way whatever the rank count
    (NCCL 2.17 release notes: NVLink SHARP all-reduce on H100 NVSwitch systems), at the TP
    all-reduce's `tp_link_eff` and the algorithm's own per-call `nvls_base_s` (fitted on
    Vidur's H100 kernels: their 4- and 8-rank all-reduces of 16-64 MB grow at one rate, 222
    GB/s, where rings of 4 and 8 would differ by 7/6; NCCL's own tuner puts NVLS's latency
    inside a node at 23 us, `collectives.NCCL_NVLS_NVLINK_S`). Infinite without NVLink SHARP
    or for a single rank, so `min` leaves the ring."""
    if not dev.nvlink_sharp or tp <= 1:
        return float("inf")
    return eff.nvls_base_s + nbytes / (dev.intra_link_gbs * eff.tp_link_eff * 1e9)


def span_link(dev: DeviceType, ranks: int, eff: Efficiency) -> Link:
    """The link of a group spanning `ranks` consecutive devices: NVLink inside a node, else
    the NIC (`collectives.group_link`, each network step as the device's `network` runs it:
    `collectives.net_step_s`); a node is `node_devices`."""
    f = fabric(dev)
    return group_link(dev.intra_link_gbs, dev.nic_gbs, ranks, node_devices(dev), eff.link_eff,
                      eff.nvlink_hop_s, net_step_s(eff.net_hop_s, f.plugin_s, f.ll),
                      eff.coll_base_s)


def p2p_link(dev: DeviceType, ranks: int, eff: Efficiency) -> Link:
    """`span_link` for one point-to-point send: across nodes its fixed time is the NCCL
    send/recv's own `p2p_net_s` (the network proxy's RDMA write and completion, fitted on
    two-node send/recv kernels), standing for the call and its one hop; inside a node the
    collective's `coll_base_s` and NVLink hop."""
    link = span_link(dev, ranks, eff)
    return replace(link, alpha_s=0.0, base_s=eff.p2p_net_s) if ranks > node_devices(dev) else link


def call_cost(link: Link, measured_s: float) -> Link:
    """`link` with a kind of call's own measured per-call cost (`gather_call_s`, `tp_call_s`,
    `fsdp_call_s`: the trainers' probe, executors/collprobe.py); unmeasured (0), the
    collective's `coll_base_s` it already carries."""
    return replace(link, base_s=measured_s) if measured_s > 0 else link


def gather_link(dev: DeviceType, ranks: int, eff: Efficiency) -> Link:
    """`span_link` for a whole-tensor gather: its per-call cost is `gather_call_s` where the
    probe measured one (`call_cost`)."""
    return call_cost(span_link(dev, ranks, eff), eff.gather_call_s)


def layer_comm(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
               eff: Efficiency, micro: float = MICRO_TOKENS) -> float:
    """One pass's layer collectives over `tokens` tokens per dp rank, all layers, issued once
    per micro-batch of `micro` tokens (`micro_tokens`; the call count kept fractional so that a pass split
    into parts costs the sum of its parts; the simulator prices mini-batches one by one):
      TP   2 all-reduces of the activations (tokens / cp * h * b bytes) per layer (Shoeybi et
           al. 2019); a MoE layer under EP keeps only attention's; with data-parallel
           attention, inside each attn_dp group over its tokens / attn_dp (`tp_link`)
      EP   per MoE layer a dispatch and a combine all-to-all (`sharding.ep_all_to_all`) of
           each rank's tokens / (tp * cp), over ep * etp consecutive ranks
      CP   per layer the ring exchange of K and V (`sharding.cp_kv_exchange`)"""
    if tokens <= 0:
        return 0.0
    # a micro-batch per attention group: data-parallel attention groups run theirs side by side
    chunk = min(tokens / par.attn_dp, micro) * par.attn_dp
    group = chunk / par.cp  # tokens each device of a TP group holds
    out = 0.0
    if par.attn_tp > 1:  # data-parallel attention: each group all-reduces its own tokens
        calls = 2 * m.layers - (m.moe_layers if par.ep > 1 else 0)
        out += calls * tp_all_reduce(group / par.attn_dp * m.hidden * BYTES, par.attn_tp, dev,
                                     eff)
    if par.ep > 1:  # an engine with data-parallel attention dispatches with DeepEP's normal
        out += m.moe_layers * ep_exchange(m, dev, par, group / par.tp, eff,
                                          node_dedup=par.attn_dp > 1)  # kernels
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
    combine all-to-all of the batch's routed copies (each rank routes batch / tp tokens). With
    data-parallel attention the all-reduces run inside each of the attn_dp groups over its own
    batch / attn_dp sequences (none at attn_tp 1), and the all-to-alls span all tp = ep ranks:
    NVLink inside a node, the NIC across nodes (`span_link`)."""
    if batch <= 0 or par.tp == 1:
        return 0.0
    out = 0.0
    if par.attn_tp > 1:  # data-parallel attention: each group all-reduces its own sequences
        calls = 2 * m.layers - (m.moe_layers if par.ep > 1 else 0)
        out += calls * all_reduce(batch / par.attn_dp * m.hidden * BYTES, par.attn_tp,
                                  decode_tp_link(dev, eff, par.attn_tp))
    if par.ep > 1:
        out += m.moe_layers * ep_exchange(m, dev, par, batch / par.tp, eff)
    return out


def host_devices(dev: DeviceType) -> int:
    """Devices of one host: the device's `host_devices` where its pool declares an NVLink
    domain (a GB200 compute tray of 4 inside a rack of 72), else `node_devices`."""
    return dev.host_devices or node_devices(dev)


def decode_tp_link(dev: DeviceType, eff: Efficiency, ranks: int) -> Link:
    """The link an engine's decode-step all-reduces run on: inside a host vLLM's and SGLang's
    custom all-reduce (peer-to-peer over NVLink, captured in the step's CUDA graph; NCCL only
    for tensors past its size limit, which a decode step's batch * h * b never reaches), whose
    per-call cost is `engine_ar_base_s`, not the NCCL kernel's `tp_base_s`; a group wider than
    a host NCCL (`tp_link`): on NVLink while it stays in the NVLink domain (an engine of two
    GB200 trays), on the NIC past it. The custom all-reduce opens its peers' buffers by CUDA
    IPC, one host's, and turns itself off for a group over several (vllm-project/vllm
    @00d618aab60448acdf3fac3e9c4e2e22d0c6c753 vllm/distributed/device_communicators/
    custom_all_reduce.py `CustomAllreduce.__init__`: "Custom allreduce is disabled because this
    process group spans across nodes", `in_the_same_node_as`; the same check in SGLang's)."""
    if ranks > host_devices(dev):
        return tp_link(dev, eff, ranks)
    return Link(eff.nvlink_hop_s, dev.intra_link_gbs * eff.tp_link_eff, eff.engine_ar_base_s)


def ep_exchange(m: ModelArch, dev: DeviceType, par: Parallel, tokens_per_rank: float,
                eff: Efficiency, node_dedup: bool = False) -> float:
    """One MoE layer's dispatch + combine of `tokens_per_rank` tokens per rank. Inside one node
    `sharding.ep_all_to_all` on NVLink. An EP group over several nodes (DeepEP's kernels, which
    vLLM and SGLang run for wide EP) moves the copies bound for other nodes over the rank's NIC
    and those for its own node's ranks over NVLink at the same time, so the slower of the two
    binds, plus a network hop per other node: of k copies a token sends, k (nodes - 1) / nodes
    leave the node, or with `node_dedup` (DeepEP's normal, prefill kernels: one RDMA send per
    destination node, forwarded over NVLink there) one per other node the token's experts sit
    on, nodes (1 - (1 - 1/nodes)^k) - 1 of them on average (uniform routing, no node limit).
    The dispatch sends FP8 where the weights are FP8 and the combine BF16 (DeepEP README:
    "FP8 dispatching and BF16 combining")."""
    ranks, node = par.ep * par.etp, node_devices(dev)
    if ranks <= 1 or not m.moe or tokens_per_rank <= 0:
        return 0.0
    if ranks <= node:
        return ep_all_to_all(m, par, tokens_per_rank, span_link(dev, ranks, eff))
    nodes = ranks / node
    k = m.experts_per_token
    remote = (nodes * (1 - (1 - 1 / nodes) ** k) - 1 if node_dedup else k * (nodes - 1) / nodes)
    local = k * (node - 1) / ranks  # copies for the other ranks of its own node
    nic, nvl = span_link(dev, ranks, eff), span_link(dev, node, eff)
    out = 0.0
    for width in (par.weight_scale * BYTES, BYTES):  # dispatch, combine
        per_copy = tokens_per_rank * m.hidden * width
        out += (nic.base_s + (nodes - 1) * nic.alpha_s
                + max(nic.bytes_s(remote * per_copy), nvl.bytes_s(local * per_copy)))
    return out


def pp_send(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
            eff: Efficiency, stage_devices: int = 0) -> float:
    """Stage-to-stage sends of one micro-batch of `tokens` tokens through pp stages: pp - 1
    point-to-point sends of tokens * h * b bytes (the hidden state), each a call (latency +
    bytes over the link). With `stage_devices` (an engine replica: its stages are that many
    consecutive devices each) every hop on its own link: NVLink between two stages inside one
    node, the NIC where the hop crosses nodes. Without (training, whose rank order the layout
    does not fix): NVLink when the replica fits one node, else the NIC for every hop. On the
    critical path of a decode step; for training `train_time` counts one per micro-batch and
    pass."""
    if par.pp <= 1 or tokens <= 0:
        return 0.0
    nbytes = tokens * m.hidden * BYTES
    if stage_devices <= 0:
        return (par.pp - 1) * stage_send(nbytes, p2p_link(dev, par.replica, eff))
    w, node, out = stage_devices, node_devices(dev), 0.0
    for s in range(par.pp - 1):  # the hop from stage s to s + 1
        crosses = w >= node or (s * w) // node != ((s + 2) * w - 1) // node
        out += stage_send(nbytes, p2p_link(dev, node + 1 if crosses else 2, eff))
    return out


def stage_send(nbytes: float, link: Link) -> float:
    """One point-to-point send of `nbytes` on `link`: its call, one hop and the bytes
    (`pp_send` pays one per stage boundary; workflows/operators.py prices a measured one)."""
    return link.base_s + link.alpha_s + link.bytes_s(nbytes)


def shard_link(dev: DeviceType, par: Parallel, eff: Efficiency) -> Link:
    """The link of one ZeRO shard group: its shard_dp x tp x cp x pp devices (every device of
    the layout without HSDP), NVLink while that fits one node, else the NIC."""
    return span_link(dev, par.shard_dp * par.replica, eff)


def hsdp_all_reduce(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> float:
    """HSDP's cross-group gradient sync: once its shard group has reduce-scattered, each rank
    all-reduces its gradient shard (dense / `zero_group`, experts / `expert_zero_group`) with
    the ranks that hold the same shard in the other `shard_replicas` groups (FSDP2's 2-D mesh:
    reduce-scatter over the shard dim, then all-reduce over the replicate dim,
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py `foreach_reduce`). The replicas
    lie one shard group apart, so the call spans the whole layout: the NIC once it leaves a
    node. The shards move at the trainer's reduce precision (`sharding.reduce_ratio`). 0
    without HSDP."""
    if not par.hsdp:
        return 0.0
    link = span_link(dev, par.devices, eff)
    dense, experts = (b * reduce_ratio(par) for b in grad_bytes(m, par))
    out = all_reduce(dense / par.zero_group, par.shard_replicas, link)
    if experts > 0:
        out += all_reduce(experts / par.expert_zero_group,
                          max(par.expert_dp // par.expert_zero_group, 1), link)
    return out


def grad_sync_time(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> float:
    """One optimizer step's gradient reduction: the dense grads over the dp * cp ranks of the
    ZeRO group and the expert grads over `expert_dp` ranks (`sharding.grad_bytes`), each one
    all-reduce (ZeRO's reduce-scatter + all-gather move what one all-reduce moves) on NVLink
    or the NIC. With HSDP the groups are the shard group's (`shard_link`); below ZeRO-3 the
    shards' cross-group all-reduce (`hsdp_all_reduce`) follows once per step (ZeRO-3 pays it
    every backward, `zero3_gathers`). The gradients move at the trainer's reduce precision
    (`sharding.reduce_ratio` r): with ZeRO the reduce-scatter half of the bytes at r and the
    all-gather half (BF16 weights) at 1, without ZeRO the whole all-reduce at r."""
    link = shard_link(dev, par, eff)
    r = reduce_ratio(par)
    scale = (r + 1) / 2 if par.zero >= 1 else r
    dense, experts = grad_bytes(m, par)
    out = all_reduce(dense * scale, par.zero_group, link)
    if experts > 0:
        out += all_reduce(experts * scale, par.expert_zero_group, link)
    return out + (hsdp_all_reduce(m, dev, par, eff) if par.zero < 3 else 0.0)


def zero3_gathers(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
                  collectives: int, eff: Efficiency, micro: float = MICRO_TOKENS) -> float:
    """ZeRO-3 / FSDP weight traffic of a pass over `tokens` tokens per dp rank: every
    micro-batch of `micro` tokens (`micro_tokens`) gathers the sharded weights before it uses them and the
    backward reduce-scatters its gradients, `collectives` calls of the device's weight shard
    each (2 forward + backward: gather, gather again, reduce-scatter -- the 1.5x of ZeRO-3 over
    ZeRO-2, Rajbhandari et al. 2020, sec. 7.2.2; 1 for a forward pass), the dense part over
    the ZeRO group's dp * cp ranks and the experts over `expert_dp` (expert parallelism shrinks
    both the shard and the group). With HSDP the calls stay inside the shard group
    (`shard_link`: NVLink when it fits a node) and every backward (collectives >= 3) adds the
    shards' cross-group all-reduce (`hsdp_all_reduce`: FSDP2 runs it in each backward's
    post-reduce, and verl never defers it over micro-batches). The reduce-scatters move the
    gradients at the trainer's reduce precision (`sharding.reduce_ratio`), the gathers BF16
    weights. 0 below ZeRO stage 3 or without data parallelism."""
    if par.zero < 3 or tokens <= 0:
        return 0.0
    link = call_cost(shard_link(dev, par, eff), eff.fsdp_call_s)  # a unit's call, as probed
    dense, experts = grad_bytes(m, par)  # BF16 bytes of the device's weights, gathered
    units = fsdp_units(m)  # each unit one call (`fsdp_calls`), its share of the bytes
    if experts > 0 and par.expert_zero_group == par.zero_group:  # gathered with their layer
        dense, experts = dense + experts, 0.0
    # a backward's reduce-scatter (one per unit) moves the gradients at the reduce precision
    scatters = units if collectives >= 3 else 0
    r = reduce_ratio(par)
    per_micro = ((fsdp_calls(m, collectives) - scatters) * all_gather(dense / units,
                                                                       par.zero_group, link)
                 + scatters * all_gather(dense / units * r, par.zero_group, link))
    if experts > 0:  # expert parallelism: a MoE layer's experts gather over their own group
        share = experts / m.moe_layers
        per_micro += m.moe_layers * (
            (collectives - (1 if scatters else 0)) * all_gather(share, par.expert_zero_group, link)
            + (all_gather(share * r, par.expert_zero_group, link) if scatters else 0.0))
    if collectives >= 3:
        per_micro += hsdp_all_reduce(m, dev, par, eff)
    return per_micro * tokens / min(tokens, micro)


def fsdp_units(m: ModelArch) -> int:
    """FSDP units of a model: each decoder layer and the root (embeddings, final norm, LM
    head), as FSDP2 is applied (executors/sharding.py `shard`; verl wraps each decoder layer,
    verl/utils/fsdp_utils.py `apply_fsdp2`). Each unit gathers and reduce-scatters with its own
    call, so a pass pays the per-call latency (`fsdp_call_s` where probed, else `coll_base_s`)
    once per unit."""
    return m.layers + 1


def fsdp_calls(m: ModelArch, collectives: int) -> int:
    """Calls of one micro-batch's ZeRO-3 traffic: `collectives` per unit (a forward's gather;
    forward + backward: gather, gather again, reduce-scatter), less the root's backward gather
    (FSDP2 keeps the root's parameters gathered from its forward to its backward:
    torch/distributed/fsdp/_fully_shard/_fsdp_state.py `_lazy_init`, the root's
    `post_forward_mesh_info` is None)."""
    return collectives * fsdp_units(m) - (1 if collectives >= 3 else 0)


def oversubscription(dev: DeviceType, ranks: int, eff: Efficiency) -> float:
    """How much a layout's `ranks` processes stretch on an emulated device's host: ranks /
    `host_cores` when they outnumber its cores (each rank then gets that share of a core for
    its compute, its collectives' polling and its framework work alike), else 1. Only for a
    host-backed device (its work is the host's) with known cores; a real GPU's ranks have a
    device each."""
    if not dev.host_backed or eff.host_cores <= 0:
        return 1.0
    return max(ranks / eff.host_cores, 1.0)


def weight_gather_time(m: ModelArch, dev: DeviceType, par: Parallel, tensors: int,
                       eff: Efficiency) -> float:
    """Once per RL step, after its optimizer steps: a sharded trainer gathers its full weights
    for the weight sync, one all-gather per tensor (`tensors`: `timing.weight_tensors`, a
    stage's share with pipeline stages) over the ranks that shard it, the ZeRO-3 group x TP
    (torch DTensor `full_tensor` per state-dict entry: executors/sharding.py `full_state`;
    verl's FSDP sync likewise iterates the state dict). Each call pays `gather_link`'s
    per-call cost; the bytes are the whole model's once. 0 for an unsharded trainer (one rank,
    or ZeRO below 3 without TP: every rank already holds the full weights)."""
    ranks = (par.zero_group if par.zero >= 3 else 1) * par.tp
    if ranks <= 1 or tensors <= 0:
        return 0.0
    calls = tensors / par.pp
    per_call = all_gather(m.params() * BYTES / tensors, ranks, gather_link(dev, ranks, eff))
    return oversubscription(dev, par.devices, eff) * calls * per_call
