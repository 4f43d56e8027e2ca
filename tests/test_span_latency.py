"""A TP all-reduce whose group spans nodes pays NCCL's hierarchical per-call latency, not one
network step per rank: NCCL's tuner (github.com/NVIDIA/nccl src/graph/tuning.cc
`ncclTopoTuneModel`, commit 5067397c2676d5aed50042fc39e5c8ee96eb0027) prices its LL-protocol
all-reduce of n ranks over `nodes` nodes of ppn ranks as
  ring  baseLat + 2 (n - nodes) max(hwLat[NVLINK][RING], netOverhead) + 2 (nodes - 1) hwLat[NET][RING]
  tree  baseLat + 2 ((ppn - 1) hwLat[NVLINK][TREE] + log2i(nodes) hwLat[NET][TREE])
with hwLat[NET][RING][LL] 2.7 us, hwLat[NET][TREE][LL] 5.0 us, netOverhead 1 us. The closed
forms below are written from those constants, independently of `collectives`."""
from __future__ import annotations

import pytest

from placer.cost.collectives import Link, all_reduce, ring_all_reduce
from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import decode_comm, decode_tp_link, tp_all_reduce, tp_link
from placer.cost.sharding import BYTES, Parallel
from placer.spec.catalog import shipped_models
from placer.spec.hardware import DeviceKind, DeviceType

EFF = Efficiency()
US = 1e-6
H100 = DeviceType(name="h100-test", kind=DeviceKind.gpu, memory_gb=80, bf16_tflops=989,
                  mem_bw_gbs=3350, intra_link_gbs=450, nic_gbs=50, can_train=True)
# NCCL's own LL-protocol figures (tuning.cc): base latencies and per-step hardware latencies
TREE_BASE, RING_BASE, NVLINK_LL, NET_RING_LL, NET_TREE_LL, NET_OVERHEAD = 6.8, 6.6, 0.6, 2.7, 5.0, 1.0


def _nccl_link(base_us: float) -> Link:
    """A link of 8-rank nodes carrying NCCL's LL step latencies, its bytes free (an empty
    call: LL's own bandwidth cap, llMaxBws, prices any byte whatever the link's rate)."""
    return Link(NET_RING_LL * US, 1e30, base_us * US, 8, NVLINK_LL * US)


@pytest.mark.parametrize(("ranks", "nodes"), [(16, 2), (32, 4), (64, 8)])
def test_a_small_cross_node_all_reduce_costs_nccls_tree_latency(ranks: int, nodes: int) -> None:
    """16 ranks on 2 nodes: 6.8 + 2 (7 x 0.6 + 1 x 5.0) = 25.2 us; 32 on 4: 35.2 us; 64 on
    8: 45.2 us (one network step per rank would be 6.8 + 2 log2(n) x 2.7: 28.4, 33.8, 39.2)."""
    depth = {2: 1, 4: 2, 8: 3}[nodes]
    nccl = TREE_BASE + 2 * ((ranks // nodes - 1) * NVLINK_LL + depth * NET_TREE_LL)
    assert all_reduce(0, ranks, _nccl_link(TREE_BASE)) == pytest.approx(nccl * US)
    assert {16: 25.2, 32: 35.2, 64: 45.2}[ranks] == pytest.approx(nccl)


def test_a_cross_node_ring_crosses_the_network_once_per_node_boundary() -> None:
    """NCCL's ring of 16 ranks over 2 nodes: 6.6 + 28 x max(0.6, 1.0) + 2 x 2.7 = 40.0 us (30
    network steps would be 87.6); the tree (25.0 us at this base) is the faster."""
    link = _nccl_link(RING_BASE)
    ring = RING_BASE + 2 * (16 - 2) * max(NVLINK_LL, NET_OVERHEAD) + 2 * (2 - 1) * NET_RING_LL
    assert ring == pytest.approx(40.0)
    assert ring_all_reduce(8, 16, link) == pytest.approx(ring * US)
    assert all_reduce(0, 16, link) == pytest.approx((RING_BASE + 2 * (7 * 0.6 + 5.0)) * US)


def test_a_group_that_does_not_fill_its_nodes_takes_nccls_integer_ranks_per_node() -> None:
    """12 ranks on nodes of 8: 2 nodes, 12 // 2 = 6 ranks each (NCCL's nRanks / nNodes)."""
    link = _nccl_link(TREE_BASE)
    assert all_reduce(0, 12, link) == pytest.approx((TREE_BASE + 2 * (5 * 0.6 + 5.0)) * US)
    ring = RING_BASE + 2 * 10 * NET_OVERHEAD + 2 * NET_RING_LL
    assert ring_all_reduce(8, 12, _nccl_link(RING_BASE)) == pytest.approx(ring * US)


def test_one_rank_per_node_exposes_the_tree_network_latency_in_the_ring() -> None:
    """NCCL: "with ppn=1 latencies are fully exposed, use the Tree network latency": a ring of
    4 single-rank nodes takes 2 x 3 network steps of 5.0 us."""
    link = Link(NET_RING_LL * US, 1e30, RING_BASE * US, 1, NVLINK_LL * US)
    assert ring_all_reduce(8, 4, link) == pytest.approx((RING_BASE + 6 * NET_TREE_LL) * US)


def test_a_link_without_nodes_keeps_one_step_latency_per_hop() -> None:
    """In a node (or a strided group whose layout the link does not know) every step pays the
    link's own hop: the ring 2 (n - 1), the tree 2 ceil(log2 n)."""
    flat = Link(2.7 * US, 1e30, 6.6 * US)
    assert ring_all_reduce(8, 16, flat) == pytest.approx((6.6 + 30 * 2.7) * US)
    assert all_reduce(8, 16, flat) == pytest.approx((6.6 + 8 * 2.7) * US)
    assert all_reduce(8, 8, _nccl_link(6.6)) == pytest.approx((6.6 + 6 * 2.7) * US)


def test_tp16_across_two_nodes_pays_the_in_node_ring_steps_and_one_network_tree_level() -> None:
    """The engine's TP 16 over two 8-GPU nodes: the TP call's `tp_base_s`, 2 x 7 in-node steps
    at the TP ring's own `tp_hop_s` (what the same group pays per step inside one node) and
    2 network steps at NCCL's tree latency (`net_hop_s` x 5.0 / 2.7)."""
    want = EFF.tp_base_s + 2 * (7 * EFF.tp_hop_s + EFF.net_hop_s * NET_TREE_LL / NET_RING_LL)
    assert tp_all_reduce(2.0, 16, H100, EFF) == pytest.approx(want, rel=1e-4)
    link = tp_link(H100, EFF, 32)
    assert (link.node_ranks, link.intra_alpha_s) == (8, EFF.tp_hop_s)
    want32 = EFF.tp_base_s + 2 * (7 * EFF.tp_hop_s + 2 * EFF.net_hop_s * NET_TREE_LL / NET_RING_LL)
    assert tp_all_reduce(2.0, 32, H100, EFF) == pytest.approx(want32, rel=1e-4)


def test_decode_and_layer_all_reduces_across_nodes_price_the_same_call() -> None:
    """A decode step's cross-node all-reduces run on `tp_link`, as the operator pricing and the
    training / prefill passes do: 2 per layer, each `tp_all_reduce` of batch x h x b bytes."""
    m = shipped_models()["Qwen3-8B"]
    batch = 64
    assert decode_tp_link(H100, EFF, 16) == tp_link(H100, EFF, 16)
    one = tp_all_reduce(batch * m.hidden * BYTES, 16, H100, EFF)
    assert decode_comm(m, H100, Parallel(tp=16), batch, EFF) == pytest.approx(2 * m.layers * one)


def test_in_node_tp_all_reduces_are_unchanged() -> None:
    """A TP 8 group stays one node: the ring's 2 x 7 `tp_hop_s` steps (or NVLS), no network."""
    plain = H100.model_copy(update={"nvlink_sharp": False})
    want = EFF.tp_base_s + 14 * EFF.tp_hop_s + 2 * 7 / 8 * 1e6 / (450 * EFF.tp_link_eff * 1e9)
    assert tp_all_reduce(1e6, 8, plain, EFF) == pytest.approx(want)
