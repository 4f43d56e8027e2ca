"""Collective communication as latency + size / bandwidth (the alpha-beta model), NCCL-style.

A collective over n ranks moving a message of B bytes costs a fixed launch latency, a per-hop
latency alpha for each step its algorithm takes, and the bytes each rank must send over its
link's achieved bandwidth (Hockney's alpha-beta model; the per-algorithm counts are Thakur,
Rabenseifner & Gropp 2005, "Optimization of collective communication operations in MPICH", and
Patarasuk & Yuan 2009 for the bandwidth-optimal ring):

  all-reduce      ring  base + 2(n-1)*alpha + 2(n-1)/n * B/bw
                  tree  base + 2*ceil(log2 n)*alpha + 2 * B/bw   (pipelined reduce + broadcast:
                        NCCL's double binary tree, Sanders, Speck & Traeff 2009; NCCL 2.4 blog)
  all-gather      ring  base + (n-1)*alpha + (n-1)/n * B/bw      (B: the gathered output)
  reduce-scatter  ring  base + (n-1)*alpha + (n-1)/n * B/bw      (B: the input)
  broadcast       ring  base + (n-1)*alpha + B/bw   (pipelined chain)
                  tree  base + ceil(log2 n)*alpha + B/bw   (pipelined tree)
  all-to-all      pairwise  base + (n-1)*alpha + (n-1)/n * B/bw   (B: one rank's send buffer)

Like NCCL's tuner, every call takes the faster algorithm for its size and rank count; n = 1 is
free. A message of one token still pays `base + hops * alpha`: that is what bounds a TP decode
all-reduce at batch 1.

Latency defaults are NCCL's own tuning model (`src/graph/tuning.cc`, `baseLat` / `hwLat`, LL
protocol, microseconds): 6.6 us base per ring call; per hop 0.6 us over NVLink and 2.7 us over the
network (ring) -- the figures NCCL uses to choose algorithms, and in line with nccl-tests'
~10-20 us small-message all-reduce on 8 NVLink GPUs. Bandwidths are the device's link figures
(catalog) times the achieved fraction `link_eff` (`placer.cost.model.Efficiency`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

NCCL_BASE_S = 6.6e-6  # NCCL tuning.cc baseLat, ring LL: fixed cost of one collective call
NVLINK_HOP_S = 0.6e-6  # NCCL tuning.cc hwLat[NVLINK], ring/tree LL: one step over NVLink
NET_HOP_S = 2.7e-6  # NCCL tuning.cc hwLat[NET], ring LL: one step over the node NIC (IB/RoCE)


@dataclass(frozen=True)
class Link:
    """What one rank sees of a collective's slowest link: per-hop latency and achieved GB/s."""

    alpha_s: float  # latency of one algorithm step (a hop)
    gbs: float  # achieved bandwidth per rank, GB/s (1e9 bytes/s), one direction
    base_s: float = NCCL_BASE_S  # fixed cost per call (launch, synchronisation)

    def bytes_s(self, nbytes: float) -> float:
        return nbytes / (self.gbs * 1e9)


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Sum a `nbytes` buffer over n ranks (every rank ends with the sum): min(ring, tree)."""
    if n <= 1:
        return 0.0
    ring = link.base_s + 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * link.bytes_s(nbytes)
    tree = link.base_s + 2 * _log2(n) * link.alpha_s + 2 * link.bytes_s(nbytes)
    return min(ring, tree)


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


def group_link(intra_gbs: float, nic_gbs: float, ranks: int, per_node: int, link_eff: float,
               intra_hop_s: float = NVLINK_HOP_S, net_hop_s: float = NET_HOP_S,
               base_s: float = NCCL_BASE_S) -> Link:
    """The link a group of `ranks` ranks runs on: NVLink when it fits in one node of
    `per_node` devices, else the NIC (the slowest hop of a ring that crosses nodes)."""
    if ranks <= per_node:
        return Link(intra_hop_s, intra_gbs * link_eff, base_s)
    return Link(net_hop_s, nic_gbs * link_eff, base_s)
