"""The scale-out network a collective across nodes runs on, as NCCL sees it: what each network
step costs beyond NCCL's own table and which protocols run (`DeviceType.network`, a property of
the cluster that a user sets per device type, as `nic_gbs`).

NCCL prices a step that crosses nodes at its table's network latency (src/graph/tuning.cc
hwLatencies[NET]: ring LL 2.7 us, tree LL 5.0 us, Simple 14 us; `collectives.NET_HOP_S` and
the ratios beside it) plus the latency its transport or net plugin declares for the NIC,
`ncclNetProperties_t.latency`, which the tuner adds to every network step and a second time in
the Simple protocol for its flush (tuning.cc `ncclTopoTuneModel`: `interLat +=
graphs[a]->latencyInter; if (p == NCCL_PROTO_SIMPLE) interLat += graphs[a]->latencyInter`,
search.cc `graph->latencyInter = net->net.latency`; github.com/NVIDIA/nccl commit
5067397c2676d5aed50042fc39e5c8ee96eb0027). Each network here is those two facts, from public
sources, never fitted to a measurement:

  infiniband, roce  NCCL's own IB verbs transport (RoCE runs on it too) declares none
                    (src/transport/net_ib/init.cc `props->latency = 0; // Not set`, same commit)
  efa               AWS's aws-ofi-nccl plugin declares 35 us on P5en, P6-B200, P6-B300 and later
                    P-series instances (75 us on P4d and P5, 150 on P3dn), src/platform-aws.cpp
                    `platform_data_map` (github.com/aws/aws-ofi-nccl commit
                    2daf7d303aa139a03140aa530957d10521e4478d); the default is the current
                    generation's
  tcpxo             Google Cloud A3 Mega's GPUDirect-TCPXO: its NCCL environment profiles set
                    NCCL_PROTO=Simple (or Simple,LL128 from plugin v1.0.8; LL is in neither),
                    github.com/GoogleCloudPlatform/container-engine-accelerators
                    gpudirect-tcpxo/best-practice.md (commit
                    3aa66cbe8011f3d6c893eed7bbe441cb796fc656), so a small call pays Simple's
                    latencies; the FasTrak plugin's declared latency is not public (its source
                    is not), so none is added: a cluster that measures it calibrates
                    `net_hop_s` (workflows/opnet.py shows how)

LL128 is left out everywhere, as in `collectives` (NCCL enables it by default only on some
platforms).
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.spec.hardware import DeviceType, Network


@dataclass(frozen=True)
class Fabric:
    """One network's figures: the net plugin's declared latency (s), which NCCL adds to each
    network step (twice in Simple), and whether NCCL's LL protocol runs on it."""

    plugin_s: float
    ll: bool
    source: str


FABRICS: dict[Network, Fabric] = {
    Network.infiniband: Fabric(0.0, True, "NCCL net_ib: props->latency = 0 (nccl 5067397c)"),
    Network.roce: Fabric(0.0, True, "NCCL net_ib (RoCE on IB verbs): props->latency = 0"),
    Network.efa: Fabric(35e-6, True, "aws-ofi-nccl platform-aws.cpp p5en/p6-b200: latency "
                                     "35.0 (commit 2daf7d30)"),
    Network.tcpxo: Fabric(0.0, False, "GCP gpudirect-tcpxo best-practice.md: NCCL_PROTO=Simple "
                                      "or Simple,LL128 (commit 3aa66cbe)"),
}


def fabric(dev: DeviceType) -> Fabric:
    """The figures of the network `dev`'s nodes are on (`DeviceType.network`)."""
    return FABRICS[dev.network]
