"""A pool's NVLink domain in the pricing of its collectives (`catalog.pool_scaleup`,
`layercomm.node_devices`): a pool inside one domain (a GB200 NVL72 rack) puts every group on
NVLink, whatever its width; a pool over several domains keeps its groups on NVLink only inside
one node, because the frameworks order ranks by node, not by rack. Each price is checked
against the alpha-beta closed form of its collective on the link it should run on."""
from __future__ import annotations

import pytest

from placer.cost.collectives import all_reduce
from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import (
    NODE_DEVICES,
    decode_tp_link,
    ep_exchange,
    grad_sync_time,
    host_devices,
    node_devices,
    pp_send,
    tp_link,
)
from placer.cost.sharding import BYTES, Parallel, grad_bytes
from placer.spec.catalog import Resolved, pool_scaleup, shipped_models
from placer.spec.hardware import DeviceKind, DeviceType, Pool

EFF = Efficiency()
GB200 = DeviceType(name="gb200-test", kind=DeviceKind.gpu, memory_gb=186, bf16_tflops=2500,
                   mem_bw_gbs=8000, intra_link_gbs=900, nic_gbs=50, can_train=True)
RACK = GB200.model_copy(update={"scaleup_devices": 72})  # a pool inside one NVL72 rack
TRAY = GB200.model_copy(update={"scaleup_devices": 4})  # a pool over two racks: one tray
MOE = shipped_models()["Qwen3-30B-A3B"]
# Megatron-Core's layout of r20/r23's trainer: TP 2, CP 2, PP 4, EP 16, ETP 1
TRAINER = Parallel(tp=2, pp=4, dp=4, zero=1, cp=2, ep=16)


def _nvlink() -> tuple[float, float, float]:
    """NVLink's per-hop latency, achieved bytes/s and per-call cost (`collectives.group_link`)."""
    return EFF.nvlink_hop_s, GB200.intra_link_gbs * EFF.link_eff * 1e9, EFF.coll_base_s


def _pool(nodes: int, domain: int | None) -> Pool:
    return Pool(name="gpu", device=GB200.name, devices_per_node=4, nodes=nodes,
                nvlink_domain=domain)


@pytest.mark.parametrize(("nodes", "domain", "scaleup"), [
    (16, 72, 72),  # 64 GPUs in one NVL72 rack: every group inside the domain
    (18, 72, 72),  # the whole rack
    (32, 64, 4),  # 128 GPUs over two racks of 64: only a tray is sure to be on NVLink
    (32, 72, 4),
    (16, None, None),  # no domain declared: the node of NODE_DEVICES, as before
])
def test_the_pool_sets_the_scaleup_span(nodes: int, domain: int | None, scaleup: int | None):
    assert pool_scaleup(_pool(nodes, domain)) == scaleup


def test_resolved_devices_carry_their_pools_domain():
    pool = _pool(16, 72)
    res = Resolved(job=None, devices={GB200.name: GB200}, models={})  # device_of(Pool) reads no job
    dev = res.device_of(pool)
    assert dev.scaleup_devices == 72 and node_devices(dev) == 72
    assert dev.host_devices == 4 and host_devices(dev) == 4  # the tray, not the rack
    assert res.device_of(pool) is dev  # one object per (device, span): caches keep hitting
    assert res.device_of(_pool(16, None)) is GB200 and node_devices(GB200) == NODE_DEVICES


def test_an_expert_all_to_all_inside_the_rack_runs_on_nvlink():
    """EP 16 over 4 trays of one rack: a dispatch and a combine, each an all-to-all of
    t * k * h * b bytes over 16 ranks on NVLink: base + 15 hops + 15/16 of the bytes."""
    tokens = 4096.0
    hop, bw, base = _nvlink()
    nbytes = tokens * MOE.experts_per_token * MOE.hidden * BYTES
    one = base + 15 * hop + 15 / 16 * nbytes / bw
    assert ep_exchange(MOE, RACK, TRAINER, tokens, EFF) == pytest.approx(2 * one)


def test_an_expert_all_to_all_over_two_racks_sends_across_the_network():
    """EP 16 over 4 trays placed by node, not rack: the worst group has one tray alone in its
    rack, so 3/4 of each token's k copies leave over the rank's NIC while its own tray's
    3 / 16 go over NVLink; the slower binds, plus a network hop per other tray."""
    tokens = 4096.0
    k, per_copy = MOE.experts_per_token, tokens * MOE.hidden * BYTES
    nic_bw, nvl_bw = GB200.nic_gbs * EFF.link_eff * 1e9, GB200.intra_link_gbs * EFF.link_eff * 1e9
    one = (EFF.coll_base_s + 3 * EFF.net_hop_s
           + max(k * 3 / 4 * per_copy / nic_bw, k * 3 / 16 * per_copy / nvl_bw))
    assert ep_exchange(MOE, TRAY, TRAINER, tokens, EFF) == pytest.approx(2 * one)


def test_the_gradient_reduction_inside_the_rack_runs_on_nvlink():
    """The distributed optimizer's reduce-scatter + all-gather (one all-reduce's traffic) of
    the dense gradients over dp * cp = 8 and the experts' over expert DP (64 / 16 / 4 = 1:
    none) on NVLink: the whole layout's 64 devices no longer send it to the NIC."""
    hop, bw, base = _nvlink()
    dense, _ = grad_bytes(MOE, TRAINER)
    ring = base + 2 * 7 * hop + 2 * 7 / 8 * dense / bw
    tree = base + 2 * 3 * hop + 2 * dense / bw
    assert (TRAINER.zero_group, TRAINER.expert_zero_group) == (8, 1)
    assert grad_sync_time(MOE, RACK, TRAINER, EFF) == pytest.approx(min(ring, tree))
    # over two racks the same group may straddle them: the NIC's rate
    nic_bw = GB200.nic_gbs * EFF.link_eff * 1e9
    assert grad_sync_time(MOE, TRAY, TRAINER, EFF) == pytest.approx(min(
        base + 2 * 7 * EFF.net_hop_s + 2 * 7 / 8 * dense / nic_bw,
        base + 2 * 3 * EFF.net_hop_s + 2 * dense / nic_bw))


def test_pipeline_sends_inside_the_rack_run_on_nvlink():
    """pp - 1 stage sends of t * h * b bytes each on NVLink (call, hop, bytes), where the
    16-device replica would otherwise leave a node of 8 for the NIC."""
    tokens = 8192.0
    hop, bw, base = _nvlink()
    nbytes = tokens * MOE.hidden * BYTES
    assert pp_send(MOE, RACK, TRAINER, tokens, EFF) == pytest.approx(
        3 * (base + hop + nbytes / bw))


def test_a_tp8_engine_over_two_racks_all_reduces_across_the_network():
    """A TP 8 engine is two trays: over two racks placed by node they may sit in different
    racks, so its all-reduces pay a network hop per step at the tray's 4 NICs (or NVLink's
    TP rate where lower); inside one rack, NVLink."""
    link = tp_link(TRAY, EFF, 8)
    assert link.alpha_s == EFF.net_hop_s
    assert link.gbs == pytest.approx(min(900 * EFF.tp_link_eff, 4 * 50 * EFF.link_eff))
    assert tp_link(RACK, EFF, 8).alpha_s == EFF.tp_hop_s
    assert all_reduce(1e6, 8, tp_link(TRAY, EFF, 8)) > all_reduce(1e6, 8, tp_link(RACK, EFF, 8))


def test_an_engine_wider_than_a_tray_leaves_the_custom_all_reduce():
    """vLLM's custom all-reduce opens its peers' buffers by CUDA IPC and turns itself off for
    a group over several hosts, NVLink domain or not: a TP 8 engine of two trays in one rack
    runs NCCL's in-node kernel on NVLink (`tp_link`: `tp_base_s`, `tp_hop_s`), a TP 4 engine
    of one tray the custom all-reduce (`engine_ar_base_s`); a node of 8 without a declared
    domain keeps the custom all-reduce at TP 8."""
    rack = RACK.model_copy(update={"host_devices": 4})
    two_trays = decode_tp_link(rack, EFF, 8)
    assert two_trays == tp_link(rack, EFF, 8)
    assert (two_trays.base_s, two_trays.alpha_s) == (EFF.tp_base_s, EFF.tp_hop_s)
    one_tray = decode_tp_link(rack, EFF, 4)
    assert (one_tray.base_s, one_tray.alpha_s) == (EFF.engine_ar_base_s, EFF.nvlink_hop_s)
    assert decode_tp_link(GB200, EFF, 8).base_s == EFF.engine_ar_base_s
    nbytes = 32 * 4096 * BYTES  # a decode step's all-reduce of 32 sequences
    assert all_reduce(nbytes, 8, two_trays) > all_reduce(nbytes, 8, decode_tp_link(GB200, EFF, 8))
