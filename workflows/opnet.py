"""The all-reduces whose ranks span nodes (a TP group of 16 or 32), priced at the catalog's
network and at each testbed's own: part of `python -m workflows.operators`.

Across nodes an all-reduce's price (`layercomm.tp_all_reduce`: NCCL's ring and tree in its LL
and Simple protocols, `collectives.span_all_reduce`) reads two properties of the cluster's
network: the latency of one network step (`net_hop_s`; the default is NCCL's IB/RoCE figure,
hwLat[NET][RING][LL] 2.7 us, to which the network's NCCL net plugin adds its declared latency
and which protocols run: `DeviceType.network`, placer/cost/fabric.py) and each device's NIC
rate (`nic_gbs`, a node's NICs together carrying the bytes that cross it). Neither is the
device's: GCP's A3 Mega runs H100s behind GPUDirect-TCPXO (8 x 200 Gb/s per node, where the
catalog's H100 has a 400 Gb/s NIC each and the fabric's latency is the host's TCP stack's)
and AWS's P6-B200 behind EFA. A user sets them
per cluster, as the send/recv study does with `opfit.calibrate_nic`: the step latency as the
device's `net_hop_s` in a calibration profile, the NIC rate as the device's `nic_gbs`.

`cross_node_study` reports each testbed (a source, device and rank count) three times: at the
catalog's network (InfiniBand), on the network the testbed declares (`opdata.SOURCE_NETWORK`)
at its public figures, and held out on it: `net_hop_s` and `nic_gbs` calibrated
(`calibrate_fabric`) on every other message size and priced on the rest (two folds), so no
point is priced by a network fitted on it. The calibrated values are a property of that
testbed, never a default.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache, partial
from typing import Any

import numpy as np

from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import tp_all_reduce
from placer.spec.hardware import DeviceType
from workflows.opdata import Point, catalog_device, point_device
from workflows.opfit import _search
from workflows.opmodes import errors

# the calibration's search, in log10 of each value: the network step 0.3-1000 us, the NIC
# rate 1/8-8x the catalog's, a grid of 0.05 (12%), each value then refined (`_refine`)
HOP_LOG10_S = (-6.5, -3.0)
NIC_LOG10_SCALE = (-0.9, 0.9)
LOG_STEP = 0.05
BANDS = (("< 1 MiB", 0, 2**20), ("1-64 MiB", 2**20, 2**26), (">= 64 MiB", 2**26, math.inf))


def cross_node(points: Sequence[Point]) -> list[Point]:
    """The all-reduce points whose ranks span nodes (more ranks than a node holds)."""
    return [p for p in points if p.cls == "all_reduce" and 0 < p.per_node < p.tp]


def bench_of(p: Point) -> str:
    """The testbed a cross-node point ran on: its source, device and rank count."""
    return f"{p.source} {p.device} x{p.tp}"


def fabric_price(p: Point, eff: Efficiency, net_hop_s: float, nic_gbs: float,
                 dev: DeviceType | None = None) -> float:
    """Point `p` priced as `opdata.predict` prices it (on its testbed's declared network, or
    on `dev`'s), with `net_hop_s` per network step and `nic_gbs` per device (a cluster's
    settings) instead of the defaults."""
    on = (dev or point_device(p)).model_copy(update={"nic_gbs": nic_gbs})
    return tp_all_reduce(p.size, p.tp, on, eff.override({"net_hop_s": net_hop_s}))


def _log_cost(ps: Sequence[Point], eff: Efficiency) -> Callable[[float, float], float]:
    """Sum of |log(predicted / measured)| over `ps` at (log10 step latency, log10 NIC
    scale on the catalog's)."""
    nic = point_device(ps[0]).nic_gbs

    def cost(hop: float, scale: float) -> float:
        return float(sum(abs(math.log(fabric_price(p, eff, 10 ** hop, nic * 10 ** scale)
                                      / p.measured_s)) for p in ps))
    return cost


def calibrate_fabric(points: Sequence[Point], eff: Efficiency) -> tuple[float, float]:
    """The (`net_hop_s`, `nic_gbs`) that price one testbed's cross-node points best at `eff`
    (least sum of |log(predicted / measured)|): a grid in log space, then each value refined
    in turn with the other held (`opfit._search`), twice."""
    ps = list(points)
    if len({bench_of(p) for p in ps}) != 1:
        raise ValueError("calibrate_fabric: the points must be one testbed's, got "
                         f"{sorted({bench_of(p) for p in ps})}")
    cost = _log_cost(ps, eff)
    grid = [(h, s) for h in np.arange(HOP_LOG10_S[0], HOP_LOG10_S[1] + 1e-9, LOG_STEP)
            for s in np.arange(NIC_LOG10_SCALE[0], NIC_LOG10_SCALE[1] + 1e-9, LOG_STEP)]
    hop, scale = min(grid, key=lambda hs: cost(*hs))
    for _ in range(2):
        hop = _refine(partial(_swap, cost, scale), hop)
        scale = _refine(partial(cost, hop), scale)
    return 10 ** hop, point_device(ps[0]).nic_gbs * 10 ** scale


def _swap(cost: Callable[[float, float], float], scale: float, hop: float) -> float:
    return cost(hop, scale)


def _refine(cost: Callable[[float], float], best: float) -> float:
    """`best` refined within one grid step each way (`opfit._search`: a grid of a tenth of
    the step, then a golden-section search)."""
    return _search(cost, best - LOG_STEP, best + LOG_STEP, LOG_STEP / 10)


def held_out(ps: Sequence[Point], eff: Efficiency) -> tuple[list[float], list[tuple[float, float]]]:
    """Each point's error priced on the network calibrated on the testbed's other fold (every
    other message size: two folds), and the two folds' calibrated (`net_hop_s`, `nic_gbs`);
    the points in size order. Computed once per testbed and factors (`_held_out`): the
    operator document asks for it twice (this study, `opsources.harness_priced`)."""
    errs, fabrics = _held_out(tuple(sorted(ps, key=lambda p: p.size)), eff)
    return list(errs), list(fabrics)


@cache
def _held_out(ordered: tuple[Point, ...], eff: Efficiency
              ) -> tuple[tuple[float, ...], tuple[tuple[float, float], ...]]:
    errs = [0.0] * len(ordered)
    fabrics = []
    for fold in (0, 1):
        hop, nic = calibrate_fabric([p for i, p in enumerate(ordered) if i % 2 != fold], eff)
        fabrics.append((hop, nic))
        for i, p in enumerate(ordered):
            if i % 2 == fold:
                errs[i] = fabric_price(p, eff, hop, nic) / p.measured_s - 1
    return tuple(errs), tuple(fabrics)


def _summary(ps: Sequence[Point], errs: Sequence[float]) -> dict[str, Any]:
    """`opmodes.errors` over every point and over each size band."""
    out = {"all": errors([abs(e) for e in errs])}
    for name, lo, hi in BANDS:
        out[name] = errors([abs(e) for p, e in zip(ps, errs, strict=True) if lo <= p.size < hi])
    return out


def cross_node_study(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """Per testbed and over every cross-node point: the errors at the catalog's network
    (InfiniBand, `opdata.catalog_device`), on the network the testbed declares at its public
    figures (`opdata.SOURCE_NETWORK`, placer/cost/fabric.py: nothing fitted), and held out on
    that network with its step latency and NIC rate calibrated on the testbed's other sizes
    (`held_out`), by size band, with the calibrated values next to the defaults."""
    out: dict[str, Any] = {}
    every: list[Point] = []
    errs: dict[str, list[float]] = {"catalog": [], "declared": [], "held_out": []}
    for name in sorted({bench_of(p) for p in cross_node(points)}):
        ps = sorted((p for p in cross_node(points) if bench_of(p) == name), key=lambda p: p.size)
        dev = point_device(ps[0])
        mine = {"catalog": [fabric_price(p, eff, eff.net_hop_s, dev.nic_gbs, catalog_device(p))
                            / p.measured_s - 1 for p in ps],
                "declared": [fabric_price(p, eff, eff.net_hop_s, dev.nic_gbs) / p.measured_s - 1
                             for p in ps]}
        mine["held_out"], fabrics = held_out(ps, eff)
        out[name] = {**{k: _summary(ps, v) for k, v in mine.items()},
                     "network": str(dev.network),
                     "catalog_net_hop_s": eff.net_hop_s, "catalog_nic_gbs": dev.nic_gbs,
                     "calibrated_net_hop_s": [h for h, _ in fabrics],
                     "calibrated_nic_gbs": [g for _, g in fabrics]}
        every += ps
        for k, v in mine.items():
            errs[k] += v
    out["every testbed"] = {k: _summary(every, v) for k, v in errs.items()}
    return out


def _cell(c: dict[str, Any]) -> str:
    if not c["n"]:
        return "n=0"
    return f"n={c['n']:<3d} {c['median_abs_error']:6.1%} / {c['p90_abs_error']:6.1%}"


def render(study: dict[str, Any]) -> list[str]:
    """The text lines: per testbed, the catalog and held-out errors (median / p90 of |error|)
    over every point and by size band, and the calibrated network."""
    out = ["all_reduce across nodes (median / p90 |error|): at the catalog's network "
           "(InfiniBand), on the network the testbed declares (placer/cost/fabric.py's public "
           "figures, nothing fitted), and held out on it (net_hop_s and nic_gbs calibrated on "
           "every other size, priced on the rest):"]
    for name, t in study.items():
        out.append(f"  {name}" + (f" ({t['network']})" if "network" in t else ""))
        for label in ("catalog", "declared", "held_out"):
            cells = "  ".join(f"{band} {_cell(c)}" for band, c in t[label].items())
            out.append(f"    {label:9s} {cells}")
        if "calibrated_nic_gbs" in t:
            hops = "/".join(f"{h * 1e6:.1f}" for h in t["calibrated_net_hop_s"])
            nics = "/".join(f"{g:.1f}" for g in t["calibrated_nic_gbs"])
            out.append(f"    network   step {hops} us (catalog {t['catalog_net_hop_s'] * 1e6:.1f}), "
                       f"NIC {nics} GB/s per device (catalog {t['catalog_nic_gbs']:g})")
    return out
