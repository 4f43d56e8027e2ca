"""An all-reduce whose group spans nodes at NCCL's algorithm and protocol bandwidths: NCCL's
tuner (github.com/NVIDIA/nccl src/graph/tuning.cc `ncclTopoTuneModel`, commit
5067397c2676d5aed50042fc39e5c8ee96eb0027) prices each of {ring, tree} x {LL, Simple} as
latency + bytes / algorithm bandwidth, with
  ring  busBw = the graph's rate; LL: min(busBw x .5, llMaxBw); algBw = busBw x n / (2 (n - 1))
  tree  busBw = .92 x the graph's rate; LL: min(busBw / 3.8, llMaxBw); algBw = busBw x .5
llMaxBw (x86 Intel, multi-node) 39.0 GB/s at 2 nodes, 20.4 beyond; Simple's step latencies
hwLat[NET][*][SIMPLE] 14 us, hwLat[NVLINK][TREE][SIMPLE] 4.0 us, hwLat[NVLINK][RING][SIMPLE]
3.4 us and the proxy overhead x 3 (3 us). A tree across two nodes sends each byte over the
network once per node, so there the node's NICs count twice. The closed forms below are
written from those constants, independently of `collectives`."""
from __future__ import annotations

import pytest

from placer.cost.collectives import Link, all_reduce, span_all_reduce
from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import tp_all_reduce, tp_link
from placer.spec.hardware import DeviceKind, DeviceType

US = 1e-6
GIB = 2**30
EFF = Efficiency()
# NCCL's own latencies, the link's anchors: the LL ring's network step 2.7 us and the Simple
# ring's NVLink step 3.4 us; a call's base 8.4 us
NET_LL, NVL_SIMPLE, BASE = 2.7, 3.4, 8.4


def _link(intra_gbs: float, net_gbs: float) -> Link:
    """8-rank nodes with NCCL's step latencies, an in-node rate and a node's NICs together."""
    return Link(NET_LL * US, min(intra_gbs, net_gbs), BASE * US, 8, NVL_SIMPLE * US,
                intra_gbs, net_gbs)


def test_two_nodes_of_large_messages_take_the_tree_when_the_nics_bind_the_ring() -> None:
    """OCI-like: NVLink 240 GB/s, NICs 160 GB/s a node. 16 ranks, 8 GiB. Ring Simple: 8.4 +
    28 x max(3.4, 3) + 2 x 14 = 131.6 us + 8 GiB / (160 x 16 / 30); tree Simple: 8.4 + 2 x (7
    x 4.0 + 1 x 14) = 92.4 us + 8 GiB / (.92 x min(240, 2 x 160) x .5) -- 110.4 GB/s against
    the ring's 85.3, so the tree is the price."""
    nbytes = 8 * GIB
    ring = 131.6 * US + nbytes / (160e9 * 16 / 30)
    tree = 92.4 * US + nbytes / (0.92 * 240e9 * 0.5)
    assert tree < ring
    assert all_reduce(nbytes, 16, _link(240, 160)) == pytest.approx(tree)


def test_the_ring_wins_where_nvlink_outruns_the_nics_by_enough() -> None:
    """A3-like catalog: NVLink 360, NICs 320. Tree .92 x min(360, 640) x .5 = 165.6 GB/s,
    ring 320 x 16 / 30 = 170.7: the ring."""
    nbytes = 8 * GIB
    ring = 131.6 * US + nbytes / (320e9 * 16 / 30)
    assert all_reduce(nbytes, 16, _link(360, 320)) == pytest.approx(ring)


def test_beyond_two_nodes_the_tree_sends_each_byte_twice_over_the_network() -> None:
    """32 ranks on 4 nodes, NVLink 720, NICs 320: tree .92 x min(720, 320) x .5 = 147.2 GB/s,
    ring 320 x 32 / 62 = 165.2: the ring, whose Simple latency is 8.4 + 2 x 28 x 3.4 + 2 x 3
    x 14 = 282.8 us."""
    nbytes = 16 * GIB
    ring = (8.4 + 2 * 28 * 3.4 + 2 * 3 * 14) * US + nbytes / (320e9 * 32 / 62)
    tree = (8.4 + 2 * (7 * 4.0 + 2 * 14)) * US + nbytes / (0.92 * 320e9 * 0.5)
    assert ring < tree
    assert span_all_reduce(nbytes, 32, 4, _link(720, 320)) == pytest.approx(ring)


def test_mid_sizes_run_ll_at_its_capped_bandwidth() -> None:
    """128 KiB on 2 nodes (NVLink 240, NICs 160): tree LL = 8.4 + 2 (7 x 3.4 + 5.0) = 66.0 us
    + 128 KiB / (min(.92 x 240 / 3.8, 39) x .5) = 72.8 us beats the Simple tree (92.4 us + 128
    KiB / 110.4 GB/s) and the LL ring (8.4 + 28 x 3.4 + 2 x 2.7 = 109.0 us + ...); at 1 MiB
    LL's 19.4 GB/s has lost to the Simple tree (120 us against 101.9)."""
    def tree(nbytes: float) -> tuple[float, float]:
        return (66.0 * US + nbytes / (min(0.92 * 240 / 3.8, 39.0) * 0.5 * 1e9),
                92.4 * US + nbytes / 110.4e9)

    assert all_reduce(2**17, 16, _link(240, 160)) == pytest.approx(tree(2**17)[0])
    assert all_reduce(2**20, 16, _link(240, 160)) == pytest.approx(tree(2**20)[1])
    assert tree(2**17)[0] < tree(2**17)[1] and tree(2**20)[1] < tree(2**20)[0]


def test_ll_is_capped_lower_beyond_two_nodes() -> None:
    """At 4 nodes LL's cap is 20.4 GB/s: a 256 KiB call on the LL tree, 8.4 + 2 (7 x 3.4 + 2
    x 5.0) = 76.0 us + 256 KiB / (20.4 x .5 GB/s)."""
    nbytes = 2**18
    want = 76.0 * US + nbytes / (20.4e9 * 0.5)
    assert span_all_reduce(nbytes, 32, 4, _link(720, 320)) == pytest.approx(want)


def test_a_tp_group_across_nodes_prices_the_fastest_algorithm_and_protocol() -> None:
    """`tp_all_reduce` across nodes is `span_all_reduce` on `tp_link`'s link: never above any
    of the four candidates, and growing with the message."""
    h100 = DeviceType(name="h100-test", kind=DeviceKind.gpu, memory_gb=80, bf16_tflops=989,
                      mem_bw_gbs=3350, intra_link_gbs=450, nic_gbs=50, can_train=True)
    link = tp_link(h100, EFF, 16)
    sizes = [2**k for k in range(10, 34, 2)] + [8 * GIB]
    prices = [tp_all_reduce(b, 16, h100, EFF) for b in sizes]
    assert prices == sorted(prices)
    assert all(t == pytest.approx(span_all_reduce(b, 16, 2, link)) for b, t in zip(sizes, prices))
    # at 8 GiB the NICs (8 x 50 x link_eff) bind the ring, NVLink (450 x link_eff) the tree
    ring = 8 * GIB / (min(450, 400) * EFF.link_eff * 1e9 * 16 / 30)
    tree = 8 * GIB / (0.92 * 450 * EFF.link_eff * 1e9 * 0.5)
    assert prices[-1] >= min(ring, tree)
    assert prices[-1] < min(ring, tree) + 200 * US
