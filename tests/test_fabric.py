"""The scale-out network a collective across nodes runs on (placer/cost/fabric.py,
`DeviceType.network`): the net plugin's declared latency on every network step (twice in
Simple) and the protocols NCCL runs, priced alike by the operator study and the planner."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from placer.cost.collectives import (
    NET_TREE_HOP_RATIO,
    SIMPLE_NET_HOP_RATIO,
    Link,
    span_latency_s,
)
from placer.cost.efficiency import Efficiency
from placer.cost.fabric import FABRICS, fabric
from placer.cost.layercomm import layer_comm, span_link, tp_all_reduce, tp_link
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.catalog import shipped_devices
from placer.spec.hardware import DeviceType, Network

EFF = Efficiency()
H100 = shipped_devices()["H100-SXM"]


def on(net: Network) -> DeviceType:
    return H100.model_copy(update={"network": net})


def test_every_network_has_figures_and_the_catalog_runs_infiniband() -> None:
    assert set(FABRICS) == set(Network)
    assert all(d.network is Network.infiniband for d in shipped_devices().values())
    assert fabric(H100).plugin_s == 0.0 and fabric(H100).ll
    assert FABRICS[Network.efa].plugin_s == pytest.approx(35e-6)
    assert not FABRICS[Network.tcpxo].ll
    with pytest.raises(ValidationError, match="network"):
        DeviceType(**{**H100.model_dump(), "network": "myrinet"})


@pytest.mark.parametrize("nbytes", [8, 2 ** 16, 2 ** 24, 2 ** 30])
@pytest.mark.parametrize("ranks", [4, 8, 16, 32])
def test_roce_prices_as_infiniband_and_a_node_reads_no_network(nbytes: int, ranks: int) -> None:
    ib = tp_all_reduce(nbytes, ranks, H100, EFF)
    assert tp_all_reduce(nbytes, ranks, on(Network.roce), EFF) == ib
    if ranks <= 8:
        assert all(tp_all_reduce(nbytes, ranks, on(n), EFF) == ib for n in Network)
    else:
        assert tp_all_reduce(nbytes, ranks, on(Network.efa), EFF) > ib


def test_the_plugin_latency_enters_each_network_step_as_nccl_adds_it() -> None:
    # tuning.cc: interLat += latencyInter (and again in Simple): a ring of 32 ranks over 4
    # nodes crosses the network 2 (4 - 1) times, a tree 2 log2i(4) times
    base = Link(EFF.net_hop_s, 40.0, EFF.tp_base_s, 8, EFF.tp_hop_s, 300.0, 320.0)
    plug = Link(EFF.net_hop_s, 40.0, EFF.tp_base_s, 8, EFF.tp_hop_s, 300.0, 320.0, 35e-6)
    a, b = span_latency_s(32, 4, base), span_latency_s(32, 4, plug)
    assert b["ring_ll"] - a["ring_ll"] == pytest.approx(6 * 35e-6)
    assert b["tree_ll"] - a["tree_ll"] == pytest.approx(4 * 35e-6)
    assert b["ring_simple"] - a["ring_simple"] == pytest.approx(6 * 70e-6)
    assert b["tree_simple"] - a["tree_simple"] == pytest.approx(4 * 70e-6)
    assert a["tree_ll"] == pytest.approx(EFF.tp_base_s + 2 * (7 * EFF.tp_hop_s + 2 * (
        EFF.net_hop_s * NET_TREE_HOP_RATIO)))


def test_a_network_without_ll_offers_simple_alone() -> None:
    link = tp_link(on(Network.tcpxo), EFF, 16)
    assert not link.ll
    lat = span_latency_s(16, 2, link)
    assert set(lat) == {"ring_simple", "tree_simple"}
    ib = span_latency_s(16, 2, tp_link(H100, EFF, 16))
    assert lat["tree_simple"] == ib["tree_simple"]
    # a small call pays Simple's latency: dearer than LL's
    assert tp_all_reduce(8, 16, on(Network.tcpxo), EFF) == pytest.approx(min(lat.values()))
    assert tp_all_reduce(8, 16, on(Network.tcpxo), EFF) > tp_all_reduce(8, 16, H100, EFF)


def test_the_planner_prices_the_same_network() -> None:
    # a TP group of 16 (two nodes) in a pass, and a data-parallel group's NIC step
    m = ModelArch(name="m", layers=4, hidden=4096, heads=32, kv_heads=8, mlp=14336,
                  vocab=128256)
    par = Parallel(tp=16)
    assert layer_comm(m, on(Network.efa), par, 4096, EFF) > layer_comm(m, H100, par, 4096, EFF)
    assert span_link(H100, 16, EFF).alpha_s == EFF.net_hop_s
    assert span_link(on(Network.efa), 16, EFF).alpha_s == pytest.approx(EFF.net_hop_s + 35e-6)
    assert span_link(on(Network.tcpxo), 16, EFF).alpha_s == pytest.approx(
        EFF.net_hop_s * SIMPLE_NET_HOP_RATIO)
    assert span_link(on(Network.efa), 8, EFF) == span_link(H100, 8, EFF)  # NVLink
