"""The all-reduce's second public source (nccl-tests logs, scripts/extract_nccl_tests.py) and the
class by source (workflows/opsources.py): the parser against a log written here, the committed
file against the repository it came from, the shipped factors on the held-out source, each
source priced by the other's fit, and the host periods per harness on synthetic points."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from placer.cost.efficiency import Efficiency
from workflows.opdata import DATA, NCCL_TESTS, VIDUR, load, predict
from workflows.operators import main
from workflows.opfit import HOP_PER_BASE, all_reduce_modes
from workflows.opsources import harness, leave_one_source_out

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
    # Held out by source: Vidur's points priced by the factors fitted on nccl-tests' (H100
    # only: the A100 rings too), and the other way round. Over the points priced at or above
    # their harness's host period (the price is the prediction there) Vidur's meet the goal
    # (13.1% / 28.3%); the union fit moves no source's figure enough to replace the shipped
    # defaults (docs/cost-model.md).
    loso = sources["leave_one_source_out"]
    assert loso[VIDUR]["fitted_on"] == [NCCL_TESTS] and loso[NCCL_TESTS]["fitted_on"] == [VIDUR]
    gpu = loso[VIDUR]["priced_at_or_above_host_period"]
    assert gpu["n"] >= 20 and gpu["median_abs_error"] <= 0.15 and gpu["p90_abs_error"] <= 0.30
    assert loso[NCCL_TESTS]["graph launch"]["p90_abs_error"] <= 0.10
    union = sources["union_fit"]["factors"]
    assert set(union) == {"tp_base_s", "tp_hop_s", "nvls_base_s", "tp_link_eff"}
    assert all(v["shipped"] == getattr(EFF, k) for k, v in union.items())


def test_host_periods_are_kept_per_testbed() -> None:
    # Independent of the measurements: every all-reduce point priced with known factors,
    # small ones replaced by their harness's host period (Vidur's H100 harness 40 us,
    # nccl-tests' eager 35 us; graph replays never), give back the factors and one period
    # per harness, each point's own
    known = EFF.override({"tp_base_s": 8e-6, "tp_hop_s": 8e-6 * HOP_PER_BASE,
                          "tp_link_eff": 0.7, "nvls_base_s": 20e-6})
    period = {f"{VIDUR} eager H100-SXM": 40e-6, f"{VIDUR} eager A100-80G": 60e-6,
              f"{NCCL_TESTS} eager H100-SXM": 35e-6}
    ar = [p for p in load()[1] if p.cls == "all_reduce"]
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
