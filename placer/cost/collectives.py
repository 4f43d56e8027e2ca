"""Collective communication as latency + size / bandwidth (the alpha-beta model), NCCL-style.

A collective over n ranks moving B bytes costs a fixed launch latency (`coll_base_s`), a per-hop
latency for each step its algorithm takes, and the bytes each rank sends over its link's achieved
bandwidth (`link_eff`). All-reduce and broadcast take the faster of ring and tree for their size
and rank count, as NCCL's tuner does; an all-reduce whose group spans nodes takes NCCL's
hierarchical step latencies (`span_ring_steps_s`, `span_tree_steps_s`): only the steps that
cross the network pay its latency, the others an in-node hop, and the call runs the fastest of
ring and tree in NCCL's LL and Simple protocols at their own bandwidths (`span_all_reduce`:
the tree across two nodes sends each byte over the network once); all-gather, reduce-scatter and
all-to-all are rings or pairwise exchanges; n = 1 is free. A one-token message still pays its
latencies: that bounds a TP decode all-reduce at batch 1.

The per-algorithm formulas and the latency defaults' source (NCCL's src/graph/tuning.cc):
docs/cost-model.md, "Collectives and layer communication".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

NCCL_BASE_S = 6.6e-6  # NCCL tuning.cc baseLat, ring LL: fixed cost of one collective call
NVLINK_HOP_S = 0.6e-6  # NCCL tuning.cc hwLat[NVLINK], ring/tree LL: one step over NVLink
NET_HOP_S = 2.7e-6  # NCCL tuning.cc hwLat[NET], ring LL: one step over the node NIC (IB/RoCE)
# NCCL's own cost model of its ring all-reduce in the Simple protocol (the one that carries
# large messages) on NVLink: baseLat[RING][SIMPLE] 8.4 us per call plus hwLat[NVLINK][RING]
# [SIMPLE] 3.4 us per step; and of its NVLS all-reduce inside a node, hwLat[NVLINK][NVLS]
# [SIMPLE] 23 us a call whatever the rank count (github.com/NVIDIA/nccl src/graph/tuning.cc,
# commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2; the ring's two figures are the same in
# the 2020 file, commit 01afd20a77b5804e0ecf1042509dd9d20ebf9e93). The TP all-reduce's fit
# (workflows/opfit.py) keeps the ring's per-step to per-call ratio, 3.4 / 8.4.
NCCL_SIMPLE_BASE_S = 8.4e-6
NCCL_SIMPLE_NVLINK_HOP_S = 3.4e-6
NCCL_NVLS_NVLINK_S = 23e-6
# NCCL's latency of an all-reduce whose ranks span nodes (tuning.cc `ncclTopoTuneModel`, commit
# 5067397c2676d5aed50042fc39e5c8ee96eb0027), LL protocol (the one small calls run): a ring of
# n ranks over `nodes` nodes takes 2 (n - 1) steps of which 2 (nodes - 1) cross the network at
# hwLat[NET][RING][LL] (2.7 us, `NET_HOP_S`) and the rest stay in a node at max(hwLat[NVLINK],
# the network proxy's post overhead: `getNetOverhead`, 1 us on Intel and other CPUs); a tree
# takes 2 ((n / nodes - 1) in-node steps + log2i(nodes) network steps), its network step at
# hwLat[NET][TREE][LL], 5.0 us: NET_TREE_HOP_RATIO of the ring's. With one rank per node the
# ring's network steps take the tree's latency too ("with ppn=1 latencies are fully exposed").
NET_OVERHEAD_S = 1.0e-6
NET_TREE_HOP_RATIO = 5.0 / 2.7
# The same tuner's protocols and algorithm bandwidths across nodes (commit 5067397c, as above):
# a call takes the fastest of {ring, tree} x {LL, Simple} (LL128, enabled by default only on
# some platforms, is left out). Bandwidths are bus bandwidths per rank: LL runs at half the
# ring's (`busBw * .5`) and 1 / 3.8 of the tree's, each capped at llMaxBws (x86 Intel hosts,
# the multi-node rows: 39.0 GB/s at 2 nodes, 20.4 beyond); a tree all-reduce at .92 of its
# graph's; the algorithm bandwidth is the bus bandwidth x n / (2 (n - 1)) for the ring and x
# .5 for the tree. Simple's step latencies: hwLat[NET][*][SIMPLE] 14 us (SIMPLE_NET_HOP_RATIO
# of the ring's LL network step), hwLat[NVLINK][TREE][SIMPLE] 4.0 us against the ring's 3.4
# (`tp_hop_s`' anchor, SIMPLE_TREE_NVLINK_RATIO), and the network proxy's overhead x 3.
LL_RING_BW = 0.5
LL_TREE_BW = 1.0 / 3.8
TREE_ALL_REDUCE_BW = 0.92
LL_MAX_BW_GBS = (39.0, 20.4)  # llMaxBws, Intel x86: 2 nodes, more than 2
SIMPLE_NET_HOP_RATIO = 14.0 / 2.7
SIMPLE_TREE_NVLINK_RATIO = 4.0 / 3.4
SIMPLE_NET_OVERHEAD = 3.0


@dataclass(frozen=True)
class Link:
    """What one rank sees of a collective's slowest link: per-hop latency and achieved GB/s."""

    alpha_s: float  # latency of one algorithm step (a hop); across nodes, a network step
    gbs: float  # achieved bandwidth per rank, GB/s (1e9 bytes/s), one direction
    base_s: float = NCCL_BASE_S  # fixed cost per call (launch, synchronisation)
    # a group of consecutive ranks (a TP group) that spans nodes: its ranks per node and the
    # latency of a step between two ranks of one node, for NCCL's hierarchical all-reduce
    # latency (`span_ring_steps_s`, `span_tree_steps_s`); 0: every step is alpha_s
    node_ranks: int = 0
    intra_alpha_s: float = 0.0
    # such a group's in-node rate per rank and its node's NICs together (GB/s), which NCCL's
    # tree across nodes loads differently from the ring (`span_all_reduce`); 0: `gbs` for both
    intra_gbs: float = 0.0
    net_gbs: float = 0.0
    # the network's own figures (`placer.cost.fabric`): the latency its NCCL net plugin
    # declares, which NCCL adds to every network step (twice in Simple), and whether NCCL's LL
    # protocol runs on it
    plugin_s: float = 0.0
    ll: bool = True

    def bytes_s(self, nbytes: float) -> float:
        return nbytes / (self.gbs * 1e9)


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def _nodes(n: int, link: Link) -> int:
    """Nodes a group of n consecutive ranks spans on `link`; 1 where the link carries no node
    size or the group fits one node's ranks (every step then at the link's `alpha_s`)."""
    return -(-n // link.node_ranks) if 0 < link.node_ranks < n else 1


def all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Sum a `nbytes` buffer over n ranks (every rank ends with the sum): min(ring, tree)."""
    if n <= 1:
        return 0.0
    nodes = _nodes(n, link)
    if nodes > 1:
        return span_all_reduce(nbytes, n, nodes, link)
    tree = link.base_s + 2 * _log2(n) * link.alpha_s + 2 * link.bytes_s(nbytes)
    return min(ring_all_reduce(nbytes, n, link), tree)


def span_ring_steps_s(n: int, nodes: int, net_s: float, intra_s: float,
                      plugin_s: float = 0.0) -> float:
    """The step latencies of NCCL's ring all-reduce of n ranks over `nodes` nodes: 2 (nodes - 1)
    network steps at `net_s` plus the net plugin's declared `plugin_s`, the other 2 (n - nodes)
    at max(`intra_s`, `NET_OVERHEAD_S`) (NCCL's tuning.cc; `NET_TREE_HOP_RATIO`'s comment)."""
    net = (net_s * NET_TREE_HOP_RATIO if n == nodes else net_s) + plugin_s
    return 2 * (n - nodes) * max(intra_s, NET_OVERHEAD_S) + 2 * (nodes - 1) * net


def span_tree_steps_s(n: int, nodes: int, net_s: float, intra_s: float,
                      plugin_s: float = 0.0) -> float:
    """The step latencies of NCCL's tree all-reduce of n ranks over `nodes` nodes: up and down
    a chain through each node's n / nodes ranks at `intra_s` and a tree across the nodes,
    log2i(nodes) deep, at the tree's network step (`net_s` x `NET_TREE_HOP_RATIO`, plus the
    net plugin's declared `plugin_s`)."""
    depth = nodes.bit_length() - 1  # NCCL's log2i: floor(log2(nodes))
    return 2 * ((n // nodes - 1) * intra_s + depth * net_s * NET_TREE_HOP_RATIO + depth * plugin_s)


def span_bus_gbs(nodes: int, link: Link) -> dict[str, float]:
    """Bus bandwidth per rank (GB/s) of each algorithm and protocol of an all-reduce
    whose ranks span `nodes` nodes (NCCL's tuner; the constants' comment). The ring's graph runs at
    the slower of the in-node rate and the node's NICs (`gbs`). The tree is a chain through
    each node's ranks, which carries every byte up and down (the x .5 of its algorithm
    bandwidth), and a tree across the nodes: at two nodes each node sends each byte over the
    network once (the two trees swap roles, half the buffer each), so the NICs bind at twice
    their rate there (NCCL's tuner takes the tree's in-node rate, `bwIntra`, up to two nodes),
    beyond two an inner node sends it twice (`bwInter`)."""
    intra = link.intra_gbs or link.gbs
    net = (link.net_gbs or link.gbs) * (2 if nodes == 2 else 1)
    tree = TREE_ALL_REDUCE_BW * min(intra, net)
    cap = LL_MAX_BW_GBS[0 if nodes <= 2 else 1]
    return {"ring_ll": min(LL_RING_BW * link.gbs, cap), "ring_simple": link.gbs,
            "tree_ll": min(LL_TREE_BW * tree, cap), "tree_simple": tree}


def span_latency_s(n: int, nodes: int, link: Link) -> dict[str, float]:
    """Per-call latency of each algorithm and protocol of that all-reduce: LL's hierarchical
    steps as `span_ring_steps_s` / `span_tree_steps_s` price them; Simple's at NCCL's Simple
    step latencies, scaled from the link's LL network step and in-node ring step. Every network
    step adds the net plugin's declared latency (`Link.plugin_s`), Simple's twice (NCCL's
    flush); a network without LL (`Link.ll` false) offers Simple alone."""
    net = net_step_s(link.alpha_s, link.plugin_s, ll=False)  # Simple's network step
    intra = link.intra_alpha_s
    ring_simple = (2 * (n - nodes) * max(intra, SIMPLE_NET_OVERHEAD * NET_OVERHEAD_S)
                   + 2 * (nodes - 1) * net)
    depth = nodes.bit_length() - 1
    tree_simple = 2 * ((n // nodes - 1) * intra * SIMPLE_TREE_NVLINK_RATIO + depth * net)
    steps = {"ring_simple": ring_simple, "tree_simple": tree_simple}
    if link.ll:
        steps |= {"ring_ll": span_ring_steps_s(n, nodes, link.alpha_s, intra, link.plugin_s),
                  "tree_ll": span_tree_steps_s(n, nodes, link.alpha_s, intra, link.plugin_s)}
    return {k: link.base_s + v for k, v in steps.items()}


def span_all_reduce(nbytes: float, n: int, nodes: int, link: Link) -> float:
    """An all-reduce of n ranks over `nodes` nodes as NCCL's tuner prices it: the fastest of
    ring and tree in LL and Simple, each its latency (`span_latency_s`) plus the buffer over
    its algorithm bandwidth (`span_bus_gbs` x n / (2 (n - 1)) for the ring, x .5 for the
    tree)."""
    lat, bus = span_latency_s(n, nodes, link), span_bus_gbs(nodes, link)
    per_alg = {"ring": n / (2 * (n - 1)), "tree": 0.5}
    return min(lat[k] + nbytes / (bus[k] * per_alg[k.split("_")[0]] * 1e9) for k in lat)


def ring_all_reduce(nbytes: float, n: int, link: Link) -> float:
    """`all_reduce` as a ring: 2 (n - 1) steps, each rank sending 2 (n - 1) / n of the buffer.
    NCCL's trees span nodes; inside one node a tree is a chain through the node's GPUs (NCCL
    2.4, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA developer blog,
    2019), which saves no step over the ring, so a group inside one node runs the ring."""
    if n <= 1:
        return 0.0
    nodes = _nodes(n, link)
    steps = (2 * (n - 1) * link.alpha_s if nodes == 1
             else span_ring_steps_s(n, nodes, link.alpha_s, link.intra_alpha_s, link.plugin_s))
    return link.base_s + steps + 2 * (n - 1) / n * link.bytes_s(nbytes)


def all_gather(nbytes: float, n: int, link: Link) -> float:
    """Gather n shards into a `nbytes` buffer on every rank (ring)."""
    if n <= 1:
        return 0.0
    return link.base_s + (n - 1) * link.alpha_s + (n - 1) / n * link.bytes_s(nbytes)


def reduce_scatter(nbytes: float, n: int, link: Link) -> float:
    """Sum a `nbytes` buffer over n ranks, each keeping 1/n of the result (ring)."""
    return all_gather(nbytes, n, link)


def broadcast(nbytes: float, n: int, link: Link) -> float:
    """Copy `nbytes` from one rank to the n-1 others, pipelined: min(chain, tree)."""
    if n <= 1:
        return 0.0
    ring = link.base_s + (n - 1) * link.alpha_s + link.bytes_s(nbytes)
    tree = link.base_s + _log2(n) * link.alpha_s + link.bytes_s(nbytes)
    return min(ring, tree)


def all_to_all(nbytes: float, n: int, link: Link) -> float:
    """Every rank sends 1/n of its `nbytes` buffer to each other rank (pairwise exchange)."""
    if n <= 1:
        return 0.0
    return link.base_s + (n - 1) * link.alpha_s + (n - 1) / n * link.bytes_s(nbytes)


def net_step_s(net_hop_s: float, plugin_s: float = 0.0, ll: bool = True) -> float:
    """One network step of a collective priced with a single step latency (`group_link`'s
    rings): NCCL's LL network step `net_hop_s` plus the net plugin's declared `plugin_s`, or
    where the network runs no LL, Simple's (`SIMPLE_NET_HOP_RATIO` of it, the plugin's latency
    twice: `span_latency_s`)."""
    return net_hop_s + plugin_s if ll else net_hop_s * SIMPLE_NET_HOP_RATIO + 2 * plugin_s


def group_link(intra_gbs: float, nic_gbs: float, ranks: int, per_node: int, link_eff: float,
               intra_hop_s: float = NVLINK_HOP_S, net_hop_s: float = NET_HOP_S,
               base_s: float = NCCL_BASE_S) -> Link:
    """The link a group of `ranks` ranks runs on: NVLink when it fits in one node of
    `per_node` devices, else the NIC (the slowest hop of a ring that crosses nodes). Every
    step of a collective on the NIC link pays `net_hop_s`: the groups that all-reduce on it
    (data-parallel gradients, HSDP's replicas) are strided over the layout, so how many of
    their ranks share a node, which NCCL's hierarchical latency needs, is not the link's."""
    if ranks <= per_node:
        return Link(intra_hop_s, intra_gbs * link_eff, base_s)
    return Link(net_hop_s, nic_gbs * link_eff, base_s)
