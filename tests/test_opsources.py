"""The all-reduce's second public source (nccl-tests logs, scripts/extract_nccl_tests.py) and the
class by source (workflows/opsources.py): the parser against a log written here, the committed
file against the repository it came from, the shipped factors on the held-out source, each
source priced by the other's fit, and the host periods per harness on synthetic points."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from placer.cost.efficiency import Efficiency
from placer.spec.catalog import shipped_devices
from workflows.opdata import (
    A3MEGA,
    ALL_REDUCE_FILES,
    DATA,
    DECLARED_DEVICES,
    H20_ISSUE,
    MLE_NCCL,
    MLE_TORCH,
    NCCL_TESTS,
    OCI,
    VIDUR,
    load,
    predict,
)
from workflows.operators import main
from workflows.opfit import HOP_PER_BASE, all_reduce_modes
from workflows.opsources import harness, held_out_period, leave_one_source_out, period_at_price

EFF = Efficiency()
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
MIRROR = Path("/work/.mirror/waynehacking8+nccl-collectives-bench/repo")
LOG = """# nccl-tests version 2.18.3 nccl-headers=22902 nccl-library=22902
# nThread 1 nGpus 4 minBytes 8 maxBytes 16 step: 2(factor) iters: 50 graph: 1 unalign: 0
#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong
     8      2  float  sum  -1  16.08  0.00  0.00  0  15.53  0.00  0.00  0
    16      4  float  sum  -1  15.33  0.00  0.00  0  15.44  0.00  0.00  0
### GPUS=2
 268435456  67108864  float  sum  -1  893.11  300.56  300.56  0  895.81  299.66  299.66  0
# Avg bus bandwidth    : 328.549
"""  # nccl-tests' layout, its columns' padding narrowed


@pytest.fixture(scope="module")
def extractor() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module("extract_nccl_tests")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def sources() -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--json"]) == 0
    return json.loads(out.getvalue())["all_reduce_sources"]


def test_the_parser_reads_in_place_times_and_rank_counts(extractor: ModuleType) -> None:
    # the in-place time column (the 10th), ranks from the nGpus header or a block marker
    assert extractor.parse(LOG) == [(4, 8, 15.53), (4, 16, 15.44), (2, 268435456, 895.81)]
    with pytest.raises(ValueError, match="rank count"):
        extractor.parse(LOG.split("### GPUS=2\n")[1])


def test_the_points_carry_their_source_and_launch_mode() -> None:
    ar = [p for p in load()[1] if p.cls == "all_reduce" and p.source == NCCL_TESTS]
    assert len(ar) == 65 and {p.device for p in ar} == {"H100-SXM"}
    assert {(p.tp, p.launch) for p in ar} == {(4, "eager"), (2, "eager"), (6, "eager"),
                                             (4, "graph")}
    assert min(p.size for p in ar) == 8 and max(p.size for p in ar) == 8 * 2 ** 30
    assert all(p.per_node == 8 for p in ar)


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no local copy of nccl-collectives-bench")
def test_the_extraction_reproduces_the_committed_file(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / "extract_nccl_tests.py"), "--source",
                           str(MIRROR), "--out", str(tmp_path)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    name = "all_reduce_nccl_tests.csv"
    assert (tmp_path / name).read_text() == (DATA / name).read_text()


def test_the_extraction_refuses_a_folder_that_is_not_the_source(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / "extract_nccl_tests.py"), "--source",
                           str(tmp_path / "none"), "--out", str(tmp_path)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2 and "--source" in done.stderr and "Traceback" not in done.stderr


def test_the_shipped_factors_on_the_held_out_source(sources: dict) -> None:
    # The shipped all-reduce factors were fitted on Vidur's points only, so nccl-tests' are
    # held out. Its CUDA-graph replays (the collective alone, as a step pays it: 4 ranks,
    # 8 B - 16 MiB) are priced within 3.4% (median) / 6.7% (p90). Its eager calls miss: below
    # ~1 MiB one thread's launch of 4 kernels sets a 23 us floor the GPU's 15 us collective
    # hides under (-32% to -38%), and 2-rank rings of 256 MiB - 8 GiB run at ~347 GB/s where
    # the one `tp_link_eff` prices 224 GB/s (+35% to +55%): 32.1% / 40.2% over the eager 43.
    held = sources["shipped_factors"][NCCL_TESTS]
    assert held["factors_fitted_on_it"] is False
    assert sources["shipped_factors"][VIDUR]["factors_fitted_on_it"] is True
    graph = held["graph launch"]
    assert graph["n"] == 22
    assert graph["median_abs_error"] <= 0.05 and graph["p90_abs_error"] <= 0.10, graph
    assert held["all_points"]["n"] == 65 and held["eager launch"]["n"] == 43
    assert held["all_points"]["median_abs_error"] <= 0.10
    assert 0.30 <= held["eager launch"]["median_abs_error"] <= 0.35  # the harness floor
    assert 20e-6 <= sources["host_period_s"][f"{NCCL_TESTS} eager H100-SXM"] <= 26e-6


def test_each_source_priced_by_the_others_fit(sources: dict) -> None:
    # Held out by source: each in-node source's points priced by the four in-node factors
    # fitted on the other in-node sources' (the two-node runs fit no in-node factor). Over the
    # points priced at or above their harness's host period (the price is the prediction
    # there) Vidur's meet the goal (10.8% / 24.0%, from nccl-tests', the ml-engineering book's
    # and the H20 issue's H100/H200/B200/H20 points; 13.1% / 28.3% from nccl-tests' alone);
    # nccl-tests' graph replays 6.1% / 9.4% (3.3% / 6.8% from Vidur's alone: the H200/B200
    # points pull `tp_link_eff` up). The union fit moves no source's figure enough to replace the shipped
    # defaults (docs/cost-model.md).
    loso = sources["leave_one_source_out"]
    in_node = [VIDUR, NCCL_TESTS, MLE_TORCH, MLE_NCCL, H20_ISSUE]
    assert sorted(loso) == sorted(in_node)  # the two-node-only sources have no in-node point
    for src in in_node:
        assert loso[src]["fitted_on"] == sorted(s for s in in_node if s != src)
    gpu = loso[VIDUR]["priced_at_or_above_host_period"]
    assert gpu["n"] >= 20 and gpu["median_abs_error"] <= 0.15 and gpu["p90_abs_error"] <= 0.30
    assert loso[NCCL_TESTS]["graph launch"]["p90_abs_error"] <= 0.12
    union = sources["union_fit"]["factors"]
    assert set(union) == {"tp_base_s", "tp_hop_s", "nvls_base_s", "tp_link_eff"}
    assert all(v["shipped"] == getattr(EFF, k) for k, v in union.items())


def test_host_periods_are_kept_per_testbed() -> None:
    # Independent of the measurements: every in-node all-reduce point priced with known factors,
    # small ones replaced by their harness's host period (Vidur's H100 harness 40 us,
    # nccl-tests' eager 35 us; graph replays never), give back the factors and one period
    # per harness, each point's own
    known = EFF.override({"tp_base_s": 8e-6, "tp_hop_s": 8e-6 * HOP_PER_BASE,
                          "tp_link_eff": 0.7, "nvls_base_s": 20e-6})
    period = {f"{VIDUR} eager H100-SXM": 40e-6, f"{VIDUR} eager A100-80G": 60e-6,
              f"{NCCL_TESTS} eager H100-SXM": 35e-6}
    ar = [p for p in load()[1] if p.cls == "all_reduce" and p.tp <= p.per_node]
    pts = []
    for i, p in enumerate(ar):
        t, host = predict(p, known), period.get(harness(p), 0.0)
        pts.append(replace(p, measured_s=host if i % 2 == 0 and t < host / 1.6 else t))
    modes = all_reduce_modes(pts, EFF, harness)
    for k in ("tp_base_s", "nvls_base_s", "tp_link_eff"):
        assert modes.factors[k] == pytest.approx(getattr(known, k), rel=1e-3), k
    assert modes.host_s == pytest.approx(period)


def test_leave_one_source_out_fits_without_the_priced_source() -> None:
    # a source whose points are scaled 3x moves only the other source's held-out factors
    pts = list(load()[1])
    scaled = [replace(p, measured_s=3 * p.measured_s) if p.source == NCCL_TESTS else p
              for p in pts]
    a, b = leave_one_source_out(pts, EFF), leave_one_source_out(scaled, EFF)
    assert a[NCCL_TESTS]["factors"] == b[NCCL_TESTS]["factors"]
    assert a[VIDUR]["factors"] != b[VIDUR]["factors"]


# The public sources beyond nccl-tests' H100 host (scripts/extract_nccl_multinode.py,
# scripts/extract_mle_all_reduce.py), all held out from the shipped factors.
MIRRORS = Path("/work/.mirror")
MULTI_LOG = """nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 graph: 0
#  Rank  0 Group  0 Pid   11 on host-a device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   12 on host-a device  1 [0000:05:00] NVIDIA H100 80GB HBM3
  Rank  2 Group  0 Pid   13 on host-b device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid   14 on host-b device  1 [0000:05:00] NVIDIA H100 80GB HBM3
     8      2  float  sum  -1  123.2  0.00  0.00  0  122.3  0.00  0.00  0
    16      4  float  sum  -1  135.8  0.00  0.00  0  123.5  0.00  0.00  0
"""  # nccl-tests' layout, one MPI process per GPU, its columns' padding narrowed
BOOK = """Here is the same sweep on an 8x H200 node, using this repo's benchmark:

| payload |    busbw   |    algbw   |
| ------: | ---------: | ---------: |
|   32KiB |   0.92GBps |   0.48GBps |
|    1GiB | 463.58GBps | 264.90GBps |

text after the table
"""
COUNTS = {NCCL_TESTS: 65, OCI: 31, A3MEGA: 31, MLE_TORCH: 57, MLE_NCCL: 10, H20_ISSUE: 12}


def _script(name: str) -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))


def test_the_multinode_parser_counts_ranks_and_nodes() -> None:
    # ranks and nodes from the `Rank N ... on HOST` lines (with or without the leading #),
    # the in-place time (the 10th column)
    multi = _script("extract_nccl_multinode")
    assert multi.parse(MULTI_LOG) == (4, 2, [(8, 122.3), (16, 123.5)])
    with pytest.raises(ValueError, match="Rank"):
        multi.parse(MULTI_LOG.split("\n", 5)[5])


def test_the_book_parser_derives_times_from_bus_bandwidth() -> None:
    # time = bytes x 2 (n-1)/n / busbw (GB/s = 1e9 B/s); a row printed below 1.00 GB/s is
    # dropped (its rounding alone moves the time by more than 1%)
    mle = _script("extract_mle_all_reduce")
    table = mle.Table("Here is the same sweep on an 8x H200 node", 1, "H200", 8, 8)
    [(ranks, nbytes, ms)] = mle.points(BOOK, table)
    assert (ranks, nbytes) == (8, 2 ** 30)
    assert ms == pytest.approx(2 ** 30 * 1.75 / 463.58e9 * 1e3)
    with pytest.raises(ValueError, match="no line"):
        mle.points(BOOK, mle.Table("absent sentence", 1, "H200", 8, 8))


def test_every_public_source_is_loaded_and_priced_finite() -> None:
    ar = [p for p in load()[1] if p.cls == "all_reduce"]
    for src, n in COUNTS.items():
        ps = [p for p in ar if p.source == src]
        assert len(ps) == n, src
        assert all(math.isfinite(predict(p, EFF)) and predict(p, EFF) > 0 for p in ps), src
    devices = {src: {(p.device, p.tp) for p in ar if p.source == src} for src in COUNTS}
    assert devices[OCI] == {("A100-40G", 16)} and devices[A3MEGA] == {("H100-SXM", 16)}
    assert devices[MLE_TORCH] == {("H200", 8), ("B200", 8), ("B200", 32)}
    assert devices[MLE_NCCL] == {(d, n) for d in ("H200", "B200") for n in range(4, 9)}
    assert devices[H20_ISSUE] == {("H20", 8)}
    # the A100 40GB is declared from its datasheet (not a catalog device), linked as the 80GB
    assert "A100-40G" in DECLARED_DEVICES and "A100-40G" not in shipped_devices()
    assert DECLARED_DEVICES["A100-40G"]["intra_link_gbs"] == (
        shipped_devices()["A100-80G"].intra_link_gbs)
    assert set(ALL_REDUCE_FILES) == set(COUNTS)


@pytest.mark.parametrize(("script", "repos"), [
    ("extract_nccl_multinode.py", ("oracle-quickstart+oci-hpc-oke",
                                   "lessizzmore+create-a3mega-ztan-fork")),
    ("extract_mle_all_reduce.py", ("stas00+ml-engineering",))])
def test_the_extractions_reproduce_the_committed_files(tmp_path: Path, script: str,
                                                       repos: tuple[str, ...]) -> None:
    if not all((MIRRORS / r / "repo").is_dir() for r in repos):
        pytest.skip(f"no local copy of {', '.join(repos)}")
    flag = ["--mirrors", str(MIRRORS)] if "multinode" in script else [
        "--source", str(MIRRORS / repos[0] / "repo")]
    done = subprocess.run([sys.executable, str(SCRIPTS / script), *flag, "--out",
                           str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    written = sorted(f.name for f in tmp_path.glob("*.csv"))
    assert written and all((tmp_path / f).read_text() == (DATA / f).read_text()
                           for f in written)


@pytest.mark.parametrize(("script", "flag"), [("extract_nccl_multinode.py", "--mirrors"),
                                              ("extract_mle_all_reduce.py", "--source")])
def test_the_extractions_refuse_a_missing_source(tmp_path: Path, script: str,
                                                 flag: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / script), flag, str(tmp_path / "none"),
                           "--out", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and flag in done.stderr and "Traceback" not in done.stderr


def test_the_public_sources_held_out(sources: dict) -> None:
    # A regression guard, bounds as found: the shipped factors (fitted on Vidur's A100/H100
    # kernels) on the public sources they never saw. In a node the bandwidth end holds on
    # new devices: the H20 node (nccl-tests issue 306) 11.1% / 19.1%, the book's nccl-tests
    # 8 GiB sweeps (H200, B200, 4-8 ranks) 7.6% / 19.9%
    # (H200 runs 16-21% faster than its H100-like NVLink prices), its torch benchmark's
    # >= 64 MiB calls 17.5% / 27.3%; below that each harness's per-call floor rules. Across
    # nodes (workflows/opsources.py's docstring), with NCCL's hierarchical cross-node latency
    # (collectives.span_tree_steps_s; before it 35.7% / 54.6%, 78.9% / 82.8%, 34.3% / 76.5%):
    # OCI's two A100 nodes 12.9% / 49.2%, A3 Mega's two H100 nodes over TCPXO 67.8% / 76.9%,
    # the torch benchmark (one node and four B200 nodes) 34.3% / 72.8%; with NCCL's algorithm
    # and protocol bandwidths across nodes (collectives.span_all_reduce: the two-node tree, LL's
    # ramp) 13.8% / 19.0%, 67.6% / 74.9%, 34.2% / 66.1%.
    held = sources["shipped_factors"]
    bounds = {OCI: ("all_points", 31, 0.14, 0.20), A3MEGA: ("all_points", 31, 0.68, 0.75),
              MLE_TORCH: ("all_points", 57, 0.35, 0.67), MLE_NCCL: ("all_points", 10, 0.08, 0.20),
              H20_ISSUE: ("all_points", 12, 0.12, 0.20)}
    for src, (key, n, median, p90) in bounds.items():
        c = held[src][key]
        assert held[src]["factors_fitted_on_it"] is False
        assert c["n"] == n and c["median_abs_error"] <= median and c["p90_abs_error"] <= p90, src
    big = held[MLE_TORCH]["sizes >= 64 MiB"]
    assert big["n"] == 27 and big["median_abs_error"] <= 0.18 and big["p90_abs_error"] <= 0.29
    assert held[MLE_TORCH]["1 node"]["n"] == 40 and held[MLE_TORCH]["4 nodes"]["n"] == 17
    assert held[OCI]["2 nodes"]["n"] == 31 and "1 node" not in held[OCI]
    # a two-node call has no host period: every one is scored as the price's prediction
    assert held[OCI]["priced_at_or_above_host_period"] == held[OCI]["all_points"]


def test_the_cross_node_price_misses_both_ends() -> None:
    # The systematic finding, point by point. Below 1 MiB OCI's RoCE calls (35-73 us) sit
    # around NCCL's own hierarchical latency (`tp_all_reduce`: the in-node ring's steps and a
    # network tree level, 39.8 us at 16 ranks), -20% to +15%; A3 Mega's TCPXO and the four B200
    # nodes' EFA calls still cost more than 1.25x the price (their network stack's latency,
    # which NCCL's tuner takes from its net plugin, not from its own tables). At >= 1 GiB the
    # two-node tree (each byte over the network once) prices OCI +8% to +15% and A3 Mega -5%
    # to +6%; four B200 nodes' EFA outruns 8 NICs x `link_eff` (+20% to +25%: +18% to +20%
    # before the testbed declared EFA, whose plugin latency, 35 us per network step and twice
    # in Simple, placer/cost/fabric.py, adds ~0.4 ms to a 4-node call; its two calls below
    # 1 MiB moved -77%/-74% -> -44%/-33%). Before NCCL's algorithm bandwidths every >= 1 GiB
    # call was priced above 1.15x (the in-node ring's NVLink rate), and before the
    # hierarchical latency every small call below 0.8x.
    cross = [p for p in load()[1] if p.cls == "all_reduce" and p.tp > p.per_node]
    assert {p.source for p in cross} == {OCI, A3MEGA, MLE_TORCH}
    small = [p for p in cross if p.size < 2 ** 20]
    large = [p for p in cross if p.size >= 2 ** 30]
    assert len(small) == 36 and len(large) == 13
    oci = [predict(p, EFF) / p.measured_s - 1 for p in small if p.source == OCI]
    assert len(oci) == 17 and -0.20 < min(oci) and max(oci) < 0.16
    assert all(predict(p, EFF) < 0.8 * p.measured_s for p in small if p.source != OCI)
    err = {src: [predict(p, EFF) / p.measured_s - 1 for p in large if p.source == src]
           for src in (OCI, A3MEGA, MLE_TORCH)}
    assert all(0.05 < e < 0.16 for e in err[OCI]) and all(abs(e) < 0.07 for e in err[A3MEGA])
    assert all(0.19 < e < 0.26 for e in err[MLE_TORCH])


def test_the_host_period_at_fixed_prices_recovers_a_planted_period() -> None:
    # Independent of the measurements: prices on a ramp, every other point below 40 us
    # replaced by a 40 us host period (with +-5% jitter); the period comes back, and a
    # harness with no point above its price has none
    price = np.geomspace(5e-6, 400e-6, 40)
    jitter = np.where(np.arange(40) % 3 == 0, 0.95, 1.05)
    m = np.where((np.arange(40) % 2 == 0) & (price < 40e-6), 40e-6 * jitter, price)
    assert period_at_price(price, m) == pytest.approx(40e-6, rel=0.06)
    assert period_at_price(price, price) == 0.0


def test_the_harness_priced_class_holds_each_point_out_of_its_period() -> None:
    # a point's period is fitted without it: a synthetic harness of two points, one host-bound
    # at 50 us, gives the host-bound point no period (its sibling is synchronised) and the
    # synchronised one the 50 us period; graph replays and two-node calls get none
    ar = [p for p in load()[1] if p.cls == "all_reduce"]
    p0 = next(p for p in ar if p.source == NCCL_TESTS and p.launch == "eager" and p.size == 8)
    p1 = next(p for p in ar if p.source == NCCL_TESTS and p.launch == "eager" and p.size == 16)
    fast, slow = replace(p0, measured_s=predict(p0, EFF)), replace(p1, measured_s=50e-6)
    assert held_out_period(fast, [fast, slow], EFF) == pytest.approx(50e-6)
    assert held_out_period(slow, [fast, slow], EFF) == 0.0
    graph = next(p for p in ar if p.launch == "graph")
    two_nodes = next(p for p in ar if p.tp > p.per_node)
    assert held_out_period(graph, ar, EFF) == held_out_period(two_nodes, ar, EFF) == 0.0


def test_the_harness_priced_class_covers_every_point(sources: dict) -> None:
    # the figure prices every all-reduce point, in node and across; it is no worse in node
    # than the price alone (a period only lifts a call the price puts below it)
    hp = sources["harness_priced"]
    n_all = sum(1 for p in load()[1] if p.cls == "all_reduce")
    assert hp["all_points"]["n"] == n_all
    assert hp["in_node"]["n"] + hp["across_nodes"]["n"] == n_all
    alone = [abs(predict(p, EFF) / p.measured_s - 1) for p in load()[1]
             if p.cls == "all_reduce" and p.tp <= p.per_node]
    assert hp["in_node"]["median_abs_error"] < float(np.median(alone))
