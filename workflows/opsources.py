"""The all-reduce class by public source: does the TP all-reduce's latency-bandwidth model hold on
measurements its factors were not fitted on?

Seven public sources time the collective in different harnesses (every one beyond Vidur's is
held out from the shipped factors; each file's header names its commit and licence):

  vidur       Vidur's profiles (A100 and H100 nodes, 2/4/8 ranks, 4 KiB-128 MiB): rank 0's kernel,
              timed by kineto in a burst of eager calls. Below the host launch period a kernel is
              the collective or waits out a peer's launch, in stretches of the in-order sweep
              (workflows/opmodes.py). The shipped factors (`tp_base_s`, `tp_hop_s`,
              `nvls_base_s`, `tp_link_eff`) are the fit on these points: their figure is
              in-sample.
  nccl-tests  nccl-tests `all_reduce_perf` logs of one 8x H100 SXM5 NVSwitch host
              (github.com/waynehacking8/nccl-collectives-bench; 2/4/6 ranks, 8 B-8 GiB; see
              scripts/extract_nccl_tests.py): the mean of 50 back-to-back calls, launched
              `eager` by one thread that drives every GPU, or replayed from a CUDA `graph`.
              A graph replay is the collective alone, as a step that issues its collectives
              ahead of the GPU pays it; an eager small call is paced by the host launching N
              kernels (the ~23 us floor): the same harness mode as Vidur's host-bound kernels.
  oci-2node   nccl-tests, 16 ranks on two OCI BM.GPU4.8 nodes (8x A100-SXM4-40GB each, RoCE
              cluster network; github.com/oracle-quickstart/oci-hpc-oke's README, 8 B-8 GiB,
              scripts/extract_nccl_multinode.py), one MPI process per GPU, eager.
  a3mega-2node nccl-tests, 16 ranks on two Google Cloud A3 Mega VMs (8x H100 each,
              GPUDirect-TCPXO over Ethernet; github.com/lessizzmore/create-a3mega-ztan-fork).
  mle-torch   the ml-engineering book's all_reduce_bench.py (github.com/stas00/ml-engineering;
              scripts/extract_mle_all_reduce.py): one torch.distributed call after a barrier,
              one process per GPU, 32 KiB-16 GiB, on an 8x H200 node, an 8x B200 node and 4
              B200 nodes (32 ranks, EFA); times from the tables' bus bandwidth.
  mle-nccl-tests the same book's nccl-tests 8 GiB sweeps over 4-8 ranks of an H200 and a B200
              node (NCCL's default algorithm).
  h20-issue   one 8x H20 node's nccl-tests sweep (1 MiB-2 GiB, one thread, eager) posted in
              github.com/NVIDIA/nccl-tests/issues/306, transcribed into its file.

What the held-out sources show (shipped factors; `python -m workflows.operators`):
  - in a node, at the bandwidth end (>= 64 MiB) the price holds on devices it was not fitted on:
    the H20 node -7.5% to -11.3% (-11% to -21% below: priced fast at every size), B200 rings
    and NVLS (nccl-tests 4-8 ranks, 8 GiB) within -5% to +7%, B200 0.5-16 GiB (torch) -10% to
    +8%; H200, which the catalog links like H100 (450 GB/s), runs faster than
    priced: +16% to +21% at 5-8 ranks and 8 GiB (NVLS at 414-473 GB/s bus bandwidth where
    `tp_link_eff` prices 358-392), +7% to +23% at 128 MiB-16 GiB (torch);
  - below ~16 MiB each harness's per-call floor rules, not the collective: 38-40 us for the
    torch benchmark on H200 and 47-58 us on B200 (priced 25-34 us, -30% to -50%); B200's
    4-64 MiB calls run at 77-400 GB/s bus bandwidth where NVLS is priced at 217-674 (-41% to
    -65%): NCCL on that node (AWS's tuner plugin) does not reach NVLS's rate until ~128 MiB;
  - across nodes `layercomm.tp_all_reduce` (a group of more than 8 ranks: NCCL's ring and
    tree in its LL and Simple protocols, `collectives.span_all_reduce`) misses where the
    testbed's network is not the catalog's. Below 1 MiB OCI's RoCE calls (35-73 us) sit around
    NCCL's own latency, priced 40-67 us: -19% to +15%; A3 Mega's TCPXO (122-171 us) and 4 B200
    nodes' EFA (358-505 us up to 16 MiB) pay their network stack's latency, which NCCL's tuner
    takes from its net plugin, not its tables: at the catalog's network -62% to -73% and -60%
    to -80%. Each testbed declares its network (`opdata.SOURCE_NETWORK`, priced by
    placer/cost/fabric.py's public figures, nothing fitted): EFA's plugin declares 35 us a
    network step (twice in Simple), which brings the 4 B200 nodes to 20.1% / 28.0% (their two
    calls below 1 MiB -44% / -33%); TCPXO runs NCCL's Simple protocol alone, so A3 Mega's small
    calls pay Simple's latency, -49% to -63% (its 1-32 MiB calls, 207-1054 us, stay -67% to
    -83%: a per-size throughput of that network no latency explains). At >= 1 GiB the
    two-node tree (each byte over the network once) prices OCI +8% to +15% and A3 Mega -5% to
    +6%; 4 B200 nodes' EFA outruns 8 NICs x `link_eff` (+20% to +25%); OCI's 8-512 MiB calls
    ran NCCL's ring where the tree is priced (-17% to -19%). workflows/opnet.py prices each
    testbed on its own network (step latency and NIC rate calibrated on the other sizes).
Priced as each measurement ran, every setting held out (`harness_priced`: an eager in-node
call at max(price, its harness's host period, `period_at_price` on the harness's other points);
a call across nodes on its testbed's network calibrated on the testbed's other sizes; graph
replays at the price), the class is 10.2% / 47.1% (median / p90) over all 296 points: in a
node 9.8% / 52.3% (the misses: Vidur's kernels that ran synchronised below the period, which
no input tells apart, H100 rings of 2 ranks at >= 256 MiB, +35% to +55%, and the 8-rank NVLS
calls of 1-64 MiB that NCCL runs below NVLS's rate, -34% to -58%), across nodes 10.9% / 39.0%
(8.5% / 29.2% while A3 Mega was priced with LL, which its network does not run: the two
calibrated values then gave its small calls LL's latency and its mid sizes Simple's).
So a TP group spanning nodes is priced within ~20% at the catalog's network from ~512 MiB up,
and on OCI's RoCE fabric within 22% at every size; on EFA at its plugin's declared latency
within 28% at p90; TCPXO's remaining latency is the testbed's network setting
(workflows/opnet.py: held out on it, 10.9% / 39.0% over the three testbeds); an H200
node's large all-reduces are ~20% faster than an H100's price. These are reported; no
factor is refitted on them.

Per source (`by_source`): the errors at the given factors over every point, per launch mode,
per node count, by size (below and at or above 64 MiB, where bandwidth rules), and over the
points priced at or above their harness's host period (the price is the prediction there: the
GPU, not a host, is the bottleneck). A host period is a property of an in-node harness, not a
pricing factor: it comes from that source's own in-node points (`opfit.all_reduce_modes` keyed
by `harness`); a two-node call has none (its floor is the network's). `leave_one_source_out`
prices each source's in-node points with the four in-node factors fitted on the other sources'
in-node points; `union_fit` fits them on every source's in-node points (in-sample).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from placer.cost.efficiency import Efficiency
from workflows.opdata import SOURCES, VIDUR, Point, catalog_device, predict
from workflows.opfit import HOST_SPLIT, MAX_ROUNDS, all_reduce_modes
from workflows.opmodes import errors
from workflows.opnet import bench_of, fabric_price, held_out

FACTORS = ("tp_base_s", "tp_hop_s", "nvls_base_s", "tp_link_eff")
BANDWIDTH_BYTES = 64 * 2 ** 20  # at or above it a call's bytes, not its latency, set its time


def harness(p: Point) -> str:
    """The harness whose host launch period a point may wait out: source, launch mode, device."""
    return f"{p.source} {p.launch} {p.device}"


def nodes(p: Point) -> int:
    """The nodes a collective's ranks span."""
    return -(-p.tp // p.per_node)


def host_period(p: Point, period: dict[str, float]) -> float:
    """The host launch period point `p` may wait out: its in-node harness's (0 across nodes,
    where the network, not a host, sets the floor)."""
    return period.get(harness(p), 0.0) if nodes(p) == 1 else 0.0


def _all_reduce(points: Sequence[Point], source: str | None = None,
                in_node: bool = False) -> list[Point]:
    return [p for p in points
            if p.cls == "all_reduce" and (source is None or p.source == source)
            and (not in_node or nodes(p) == 1)]


def host_periods(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    """Each in-node harness's host launch period, from its own points (`all_reduce_modes`)."""
    out: dict[str, float] = {}
    for src in SOURCES:
        ps = _all_reduce(points, src, in_node=True)
        if ps:
            out.update(all_reduce_modes(ps, eff, harness).host_s)
    return out


def source_errors(ps: Sequence[Point], eff: Efficiency,
                  period: dict[str, float]) -> dict[str, Any]:
    """|error| of `ps` at `eff`: every point, each launch mode, and the points priced at or
    above their harness's host period (a harness with no host-bound point: every point)."""
    return price_errors(ps, [predict(p, eff) for p in ps], period)


def price_errors(ps: Sequence[Point], price: Sequence[float],
                 period: dict[str, float]) -> dict[str, Any]:
    """|error| of the prices `price` of `ps`: every point, each launch mode, node count and
    side of `BANDWIDTH_BYTES`, and the points priced at or above their harness's host period."""
    err = [abs(t / p.measured_s - 1) for t, p in zip(price, ps, strict=True)]
    out = {"all_points": errors(err)}
    splits: tuple[tuple[str, Callable[[Point], object], Callable[[object], str]], ...] = (
        ("launch", lambda p: p.launch, lambda k: f"{k} launch"),
        ("nodes", nodes, lambda k: f"{k} node{'s' if k != 1 else ''}"),
        ("size", lambda p: p.size >= BANDWIDTH_BYTES,
         lambda k: f"sizes {'>=' if k else '<'} 64 MiB"))
    for _, key, label in splits:
        for k in sorted({key(p) for p in ps}, key=str):
            out[label(k)] = errors([e for e, p in zip(err, ps, strict=True) if key(p) == k])
    out["priced_at_or_above_host_period"] = errors(
        [e for e, t, p in zip(err, price, ps, strict=True) if t >= host_period(p, period)])
    return out


def by_source(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """Each source's all-reduce points at `eff` (the shipped factors: fitted on Vidur's)."""
    period = host_periods(points, eff)
    return {src: {"factors_fitted_on_it": src == VIDUR,
                  **source_errors(_all_reduce(points, src), eff, period)}
            for src in SOURCES if _all_reduce(points, src)}


def leave_one_source_out(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """Each source's in-node points priced by the four in-node factors fitted on the other
    sources' in-node points (held out); host periods, a property of each harness, from the
    priced source's own points."""
    period = host_periods(points, eff)
    out: dict[str, Any] = {}
    for src in SOURCES:
        test = _all_reduce(points, src, in_node=True)
        train = [p for p in _all_reduce(points, in_node=True) if p.source != src]
        if not test or not train:
            continue
        factors = all_reduce_modes(train, eff, harness).factors
        out[src] = {"fitted_on": sorted({p.source for p in train}), "factors": factors,
                    **source_errors(test, eff.override(factors), period)}
    return out


def union_fit(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """The four factors fitted on every source's in-node points, next to the shipped ones, and
    each source's in-node errors at them (in-sample)."""
    factors = all_reduce_modes(_all_reduce(points, in_node=True), eff, harness).factors
    period = host_periods(points, eff)
    fitted = eff.override(factors)
    return {"factors": {k: {"shipped": getattr(eff, k), "union": factors[k]} for k in FACTORS},
            **{src: source_errors(_all_reduce(points, src, in_node=True), fitted, period)
               for src in SOURCES if _all_reduce(points, src, in_node=True)}}


def period_at_price(price: np.ndarray, m: np.ndarray) -> float:
    """A harness's host launch period at fixed prices (the factors are not refitted): the
    median of its host-bound points, a point host-bound where max(price, period) is nearer
    its measured time in log than the price alone, alternated to a fixed point from the
    points measured above `HOST_SPLIT` x their price; 0 where no point is host-bound."""
    host = m > HOST_SPLIT * price
    period = 0.0
    for _ in range(MAX_ROUNDS):
        if not host.any():
            return 0.0
        period = float(np.median(m[host]))
        new = np.abs(np.log(np.maximum(price, period) / m)) < np.abs(np.log(price / m))
        if (new == host).all():
            break
        host = new
    return period


def held_out_period(p: Point, points: Sequence[Point], eff: Efficiency,
                    price: Callable[[Point], float] | None = None) -> float:
    """The host launch period of `p`'s harness (`period_at_price` at `eff`) from the
    harness's other points (the point held out); 0 for a graph replay or a call across
    nodes (the network, not a host, sets its floor). `price`: the points' prices where the
    caller has them (`harness_priced` prices each point once), else `predict` at `eff`."""
    if p.launch != "eager" or nodes(p) > 1:
        return 0.0
    at = price or (lambda q: predict(q, eff))
    rest = [q for q in _all_reduce(points, p.source, in_node=True)
            if q != p and harness(q) == harness(p)]
    return period_at_price(np.asarray([at(q) for q in rest]),
                           np.asarray([q.measured_s for q in rest])) if rest else 0.0


def harness_priced(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """The class priced as each measurement ran, every setting held out: an eager in-node call
    in a burst waits out its harness's host launch period where that is longer than the
    collective (the `max(price, period)` a host-bound call lasts), the period fitted on the
    harness's other points; a call across nodes on its testbed's network, the step latency and
    NIC rate calibrated on the testbed's other sizes (`opnet.held_out`); graph replays at the
    price. The shipped factors; every point of the class (`across_nodes_declared`: the calls
    across nodes on their testbed's declared network at its public figures instead,
    `across_nodes_catalog` at the catalog's network). Vidur's kernels that ran in the
    synchronised mode below the period are priced at the period here: no input picks their
    mode (workflows/opmodes.py), so they are this figure's misses."""
    ps = _all_reduce(points)
    price = {p: predict(p, eff) for p in ps}
    err = {p: abs(max(price[p], held_out_period(p, points, eff, price.__getitem__))
                  / p.measured_s - 1) for p in ps if nodes(p) == 1}
    across = [p for p in ps if nodes(p) > 1]
    for bench in sorted({bench_of(p) for p in across}):
        on = [p for p in across if bench_of(p) == bench]
        errs, _ = held_out(on, eff)
        err.update(zip(sorted(on, key=lambda p: p.size), (abs(e) for e in errs), strict=True))
    return {"all_points": errors([err[p] for p in ps]),
            "in_node": errors([err[p] for p in ps if nodes(p) == 1]),
            "across_nodes": errors([err[p] for p in across]),
            "across_nodes_declared": errors([abs(price[p] / p.measured_s - 1) for p in across]),
            "across_nodes_catalog": errors([abs(fabric_price(
                p, eff, eff.net_hop_s, catalog_device(p).nic_gbs, catalog_device(p))
                / p.measured_s - 1) for p in across])}


def study(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """The `all_reduce_sources` section of `python -m workflows.operators --json`."""
    return {"host_period_s": host_periods(points, eff),
            "harness_priced": harness_priced(points, eff),
            "shipped_factors": by_source(points, eff),
            "leave_one_source_out": leave_one_source_out(points, eff),
            "union_fit": union_fit(points, eff)}


def _line(name: str, c: dict[str, Any]) -> str:
    if not c["n"]:
        return f"    {name:36s} n=0"
    return (f"    {name:36s} n={c['n']:<4d} median |error| {c['median_abs_error']:.1%}, "
            f"p90 {c['p90_abs_error']:.1%}")


def _block(errs: dict[str, Any]) -> list[str]:
    return [_line(k.replace("_", " "), v) for k, v in errs.items()
            if isinstance(v, dict) and "n" in v]


def render(doc: dict[str, Any]) -> list[str]:
    """The text lines: held out first (the shipped factors on the nccl-tests sources, each
    source's in-node points from the others' fit), then the in-sample figures."""
    periods = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in doc["host_period_s"].items())
    out = [f"all_reduce by source (host launch periods, from each harness's own points: "
           f"{periods}):",
           "  every point priced as it ran, each setting held out (an eager in-node call at "
           "max(price, its harness's host period fitted on the harness's other points); a call "
           "across nodes on its testbed's network, calibrated on the testbed's other sizes):"]
    out += _block(doc["harness_priced"])
    for src, v in doc["shipped_factors"].items():
        out.append(f"  {src}, shipped factors ("
                   + ("fitted on it: in-sample" if v["factors_fitted_on_it"] else "held out")
                   + "):")
        out += _block(v)
    for src, v in doc["leave_one_source_out"].items():
        f = v["factors"]
        out.append(f"  {src}, factors fitted on {', '.join(v['fitted_on'])} (held out): "
                   f"tp_base_s {f['tp_base_s'] * 1e6:.2f} us, nvls_base_s "
                   f"{f['nvls_base_s'] * 1e6:.1f} us, tp_link_eff {f['tp_link_eff']:.3f}")
        out += _block(v)
    u = doc["union_fit"]
    out.append("  fitted on every source's in-node points (in-sample): " + ", ".join(
        f"{k} {v['shipped']:.4g} -> {v['union']:.4g}" for k, v in u["factors"].items()))
    for src in (s for s in u if s != "factors"):
        out.append(f"  {src} at the union fit (in-sample):")
        out += _block(u[src])
    return out
