"""Operator-level fidelity (`python -m workflows.operators`): Vidur's measured kernels load with
their provenance, every point is priced by the cost model's own pieces, the JSON has its shape,
the classes meet the issue's goals (median |error| <= 15%, p90 <= 30%) where the model reaches
them and are bounded at their measured figures where it does not, and the refit recovers known
factors from points generated with them."""
from __future__ import annotations

import contextlib
import io
import json
import math
import re
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from placer.cost.efficiency import Efficiency
from placer.cost.flash import prefill_kernel_time
from placer.cost.generation import decode_step_line, forward_time, prefill_line
from placer.cost.layercomm import NODE_DEVICES, p2p_link, stage_send
from placer.cost.sharding import Parallel
from placer.spec.catalog import shipped_devices
from workflows.opdata import (
    ALL_REDUCE_FILES,
    CLASSES,
    DATA,
    LAYER_CLASSES,
    NCCL_TESTS,
    SOURCES,
    VIDUR,
    attention_layer,
    load,
    predict,
)
from workflows.operators import class_errors, main, rows
from workflows.opfit import HOP_PER_BASE, all_reduce_modes, calibrate_nic, fit_all, fit_attention

EFF = Efficiency()
FITTED = ("mfu_prefill", "prefill_half_ridge", "decode_bw_eff", "decode_bw_half_batch",
          "decode_tp_bw_loss", "tp_base_s", "tp_hop_s", "tp_link_eff", "nvls_base_s", "p2p_net_s",
          "attn_kernel_s", "attn_split_s", "mfu_attention", "attn_append_factor")


@pytest.fixture(scope="module")
def json_doc() -> dict:
    """`python -m workflows.operators --json`'s document, run once (in-process, through `main`)
    for the tests that read its parts: every point priced and each held-out refit run once."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--json"]) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def fit_doc() -> dict:
    """`--json --fit`'s document, run once: the refit on every point (`fit_all`) and the
    leave-one-model-out refits."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--json", "--fit"]) == 0
    return json.loads(out.getvalue())


def test_the_data_carries_its_provenance() -> None:
    provs, points = load()
    assert [p.file for p in provs] == ["layers.csv", "all_reduce.csv", "send_recv.csv",
                                       *ALL_REDUCE_FILES.values(), "attention.csv"]
    for p in provs:
        if p.file in ALL_REDUCE_FILES.values():  # the other all-reduce sources: test_opsources
            assert "licence " in p.lines[0]
            if p.commit:  # a repository file, else an issue thread cited by its address
                assert p.lines[0].startswith("source: github.com/") and " commit " in p.lines[0]
            else:
                assert p.lines[0].startswith("source: https://github.com/")
            continue
        assert p.lines[0].startswith("source: github.com/microsoft/vidur commit ")
        assert re.fullmatch(r"[0-9a-f]{40}", p.commit)
        assert any(ln.startswith("paths: data/profiling/") for ln in p.lines)
        assert any("ms" in ln for ln in p.lines)  # the unit of every time
    assert sum(f.stat().st_size for f in DATA.glob("*.csv")) < 300_000
    counts = {c: sum(p.cls == c for p in points) for c in CLASSES}
    assert all(counts[c] >= 50 for c in CLASSES), counts
    # Vidur's points cover both devices, TP 1-8 and the token and size ranges (the other
    # all-reduce sources' devices: tests/test_opsources.py)
    layer = [p for p in points if p.cls in LAYER_CLASSES]
    assert {p.device for p in points if p.source == VIDUR} == {"A100-80G", "H100-SXM"}
    # attention: one A100 layer shape at TP 2, prefill chunks after a KV context and decode
    # batches of sequences holding one
    att = [p for p in points if p.cls == "attention"]
    assert {(p.device, p.hidden, p.heads, p.kv_heads, p.tp) for p in att} == {
        ("A100-80G", 8192, 64, 8, 2)}
    assert {p.kind for p in att} == {"prefill", "decode"}
    pre = [p for p in att if p.kind == "prefill"]
    assert min(p.size for p in pre) == 128 and max(p.size for p in pre) == 4096
    assert {p.context for p in pre} == {0, 512, 1024, 2048, 3072}
    dec = [p for p in att if p.kind == "decode"]
    assert {p.size for p in dec} == {1, 2, 4, 8, 16, 32, 64, 128}
    assert max(p.context for p in dec) == 4032
    assert {p.tp for p in layer} == {1, 2, 4, 8}
    assert min(p.size for p in layer) == 1 and max(p.size for p in layer) == 4096
    ar = [p for p in points if p.cls == "all_reduce" and p.source == VIDUR]
    assert {p.tp for p in ar} == {2, 4, 8} and all(p.per_node == p.tp for p in ar)
    assert min(p.size for p in ar) <= 4096 and max(p.size for p in ar) >= 64 * 2 ** 20


def test_every_point_is_priced() -> None:
    _, points = load()
    for p in points:
        t = predict(p, EFF)
        assert math.isfinite(t) and t > 0, p
    # the price follows the factor its class names (a check that each class reaches its piece)
    slower = replace(EFF, mfu_prefill=EFF.mfu_prefill / 2, decode_bw_eff=EFF.decode_bw_eff / 2,
                     mfu_attention=EFF.mfu_attention / 2,
                     tp_base_s=EFF.tp_base_s * 2, tp_link_eff=EFF.tp_link_eff / 2,
                     coll_base_s=EFF.coll_base_s * 2, p2p_net_s=EFF.p2p_net_s * 2)
    assert all(predict(p, slower) > predict(p, EFF) for p in points)


def test_json_document_shape(json_doc: dict) -> None:
    doc = json_doc
    assert set(doc) == {"sources", "classes", "classes_by_source", "attention_held_out",
                        "all_reduce_modes", "all_reduce_device_held_out", "all_reduce_sweep",
                        "all_reduce_sources", "all_reduce_cross_node", "send_recv_by_link", "rows"}
    # the cross-node study (workflows/opnet.py): three testbeds and their union, each at the
    # catalog's network, on the network it declares (placer/cost/fabric.py's public figures)
    # and held out on it. A regression guard, bounds as found: 19.4% / 73.0% at the catalog's
    # network; declared 18.9% / 61.9% (the four B200 nodes on EFA 34.2% / 74.0% -> 20.1% /
    # 28.0%; A3 Mega on TCPXO, Simple alone, 67.6% / 74.9% -> 50.0% / 74.9%); held out 10.9% /
    # 39.0% over the 79 points. Held out was 8.5% / 29.2% while A3 Mega was priced with NCCL's
    # LL protocol, which its TCPXO profile turns off: with LL the two calibrated values could
    # give its small calls LL's latency and its 1-64 MiB calls Simple's 5x larger one; on
    # Simple alone no step latency and NIC rate price both (its 1-64 MiB calls run 3-6x the
    # price: a per-size throughput of that network the model does not hold)
    cross = doc["all_reduce_cross_node"]
    assert set(cross) == {"oci-2node A100-40G x16", "a3mega-2node H100-SXM x16",
                          "mle-torch B200 x32", "every testbed"}
    union = cross["every testbed"]
    assert union["catalog"]["all"]["n"] == union["held_out"]["all"]["n"] == 79
    assert union["declared"]["all"]["n"] == 79
    assert union["held_out"]["all"]["median_abs_error"] < 0.11
    assert union["held_out"]["all"]["p90_abs_error"] < 0.40
    assert union["declared"]["all"]["p90_abs_error"] < 0.62
    assert union["catalog"]["all"]["median_abs_error"] < 0.20
    efa = cross["mle-torch B200 x32"]
    assert efa["network"] == "efa"
    assert efa["declared"]["all"]["p90_abs_error"] < 0.29 < efa["catalog"]["all"]["p90_abs_error"]
    tcpxo = cross["a3mega-2node H100-SXM x16"]
    assert tcpxo["network"] == "tcpxo"
    assert tcpxo["declared"]["< 1 MiB"]["median_abs_error"] < 0.51 < tcpxo["catalog"][
        "< 1 MiB"]["median_abs_error"]
    assert list(doc["classes_by_source"]) == list(SOURCES)
    assert list(doc["classes_by_source"][VIDUR]) == list(CLASSES)
    assert all(list(doc["classes_by_source"][src]) == ["all_reduce"] for src in ALL_REDUCE_FILES)
    assert sum(s["all_reduce"]["n"] for s in doc["classes_by_source"].values()) == doc[
        "classes"]["all_reduce"]["n"]
    assert set(doc["attention_held_out"]) == {"in_sample", "leave_one_context_out",
                                              "half_sizes_out"}
    assert doc["attention_held_out"]["in_sample"] == doc["classes"]["attention"]
    assert list(doc["classes"]) == list(CLASSES)
    for c in doc["classes"].values():
        assert set(c) == {"n", "median_abs_error", "p90_abs_error"}
    assert doc["classes"]["attention"]["n"] == 65
    assert len(doc["rows"]) == len(load()[1])
    assert set(doc["rows"][0]) == {"cls", "device", "model", "tp", "size", "per_node",
                                   "measured_s", "predicted_s", "error", "kind", "context",
                                   "source", "launch"}
    assert {r["source"] for r in doc["rows"]} == set(SOURCES)
    r = doc["rows"][0]
    assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)


def test_text_report_has_a_table_per_class(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    for c in CLASSES:
        assert f"\n{c}\n" in out
    assert "measured" in out and "predicted" in out and "error" in out


def test_class_errors_at_the_defaults() -> None:
    # A regression guard: the defaults were fitted on these same points (in-sample; the
    # attention class's held-out figures: test_attention_with_its_fitted_factors_held_out;
    # the all-reduce's: test_all_reduce_by_mode; send/recv's: test_send_recv_by_link).
    # prefill_linear 7.9% / 27.4%, decode 9.3% / 20.7%, attention 8.3% / 23.0% (the
    # FlashAttention kernel model, placer/cost/flash.py). The all-reduce misses the goal
    # (median <= 15%, p90 <= 30%) over every point: 21.2% / 75.3%, its kernels below ~4 MiB
    # being bimodal (the collective, or a peer's host launch period; no model of the size,
    # rank count and device can put 90% of them within 30%), and the factors pricing the
    # synchronised collective a step sees. send/recv 13.3% / 56.3%: the A100 node pair's
    # network runs at ~9.5 GB/s of the catalog's 25 (its testbed's: test_send_recv_by_link;
    # the catalog NIC is the default, so the class prices it there), and an A100 node's
    # small NVLink sends take 13-17 us where an H100 node's take 6-8. Neither class's tail
    # follows from a planner input (tests/test_opmodes.py: the all-reduce's modes flip between
    # sizes 8-32 KiB apart in Vidur's dense sweep; its held-out figures by device and by size).
    # The bounds hold over Vidur's points. The all-reduce class also holds six public sources'
    # points, held out from the defaults (tests/test_opsources.py): over Vidur's and
    # nccl-tests' in-node H100 points 17.4% / 62.8% (155); over all seven sources, with the
    # two- and four-node runs whose network latency and GiB-size bandwidth the cross-node price
    # misses, 25.6% / 78.8% (296).
    _, points = load()
    errs = class_errors(rows([p for p in points if p.source == VIDUR], EFF))
    bounds = {"prefill_linear": (0.15, 0.30), "decode": (0.15, 0.30),
              "all_reduce": (0.22, 0.76), "send_recv": (0.15, 0.57), "attention": (0.15, 0.30)}
    for cls, (median, p90) in bounds.items():
        c = errs[cls]
        assert c.median_abs_error is not None and c.p90_abs_error is not None
        assert c.median_abs_error <= median and c.p90_abs_error <= p90, (cls, c)
    both = class_errors(rows([p for p in points if p.source in (VIDUR, NCCL_TESTS)],
                             EFF))["all_reduce"]
    assert both.n == 155 and both.median_abs_error is not None and both.p90_abs_error is not None
    assert both.median_abs_error <= 0.18 and both.p90_abs_error <= 0.63, both
    every = class_errors(rows(points, EFF))["all_reduce"]
    assert every.n == 296 and every.median_abs_error is not None
    assert every.p90_abs_error is not None  # a regression guard, bounds as found
    assert every.median_abs_error <= 0.27 and every.p90_abs_error <= 0.80, every


def test_all_reduce_by_mode(json_doc: dict) -> None:
    # The all-reduce class split by mode (`opfit.all_reduce_modes`): every point is in one of
    # the two, a device's host launch period is one figure whatever the size and rank count
    # (measured: A100 node 58 us, H100 node 40 us), the synchronised points meet the goal
    # in-sample (13.4% / 21.0%) and with each rank count held out (priced by factors fitted
    # on the other two: 15.8% / 25.7%; 14.9% / 47.0% before the ring's per-step latency was
    # tied to its per-call one at NCCL's ratio, opfit.HOP_PER_BASE: fitted freely on two
    # rank counts, the third's extrapolated badly).
    # Split by the price instead of the measured time (no measured value chooses a point's
    # mode), held out: the 29 points priced at or above their host period, which the price
    # predicts, meet the goal's p90 (14.9% / 22.0%); every one priced below its period lies
    # within [price, period] +-30% (that interval is the prediction: the launch phase picks).
    doc = json_doc
    modes = doc["all_reduce_modes"]
    assert set(modes) == {"host_period_s", "synchronised", "host_bound",
                          "synchronised_rank_count_held_out", "gpu_bound_rank_count_held_out",
                          "below_host_period"}
    gpu, below = modes["gpu_bound_rank_count_held_out"], modes["below_host_period"]
    vidur_n = doc["classes_by_source"][VIDUR]["all_reduce"]["n"]  # the split is Vidur's harness
    assert gpu["n"] + below["n"] == vidur_n and gpu["n"] >= 25
    assert gpu["median_abs_error"] <= 0.15 and gpu["p90_abs_error"] <= 0.30, gpu
    assert below["share_within_band"] >= 0.95 and below["median_period_over_price"] > 1
    assert modes["synchronised"]["n"] + modes["host_bound"]["n"] == vidur_n
    assert modes["synchronised"]["n"] >= 40 and modes["host_bound"]["n"] >= 40
    assert 50e-6 <= modes["host_period_s"]["A100-80G"] <= 70e-6
    assert 35e-6 <= modes["host_period_s"]["H100-SXM"] <= 45e-6
    assert modes["synchronised"]["median_abs_error"] <= 0.14
    assert modes["synchronised"]["p90_abs_error"] <= 0.22
    assert modes["host_bound"]["median_abs_error"] <= 0.10
    held = modes["synchronised_rank_count_held_out"]
    assert held["median_abs_error"] <= 0.16 and held["p90_abs_error"] <= 0.30, held


def test_all_reduce_modes_leave_a_synchronised_set_alone() -> None:
    # Independent of the measurements: all-reduce points priced with known factors, a third
    # of them replaced by a host period of 50 us where that is longer, give back the factors
    # (the ring's and NVLS's: the H100 points take the faster of the two)
    # and exactly the replaced points as host-bound.
    known = EFF.override({"tp_base_s": 8e-6, "tp_hop_s": 8e-6 * HOP_PER_BASE,
                          "tp_link_eff": 0.7, "nvls_base_s": 20e-6})
    ar = [p for p in load()[1] if p.cls == "all_reduce" and p.tp <= p.per_node]  # in a node
    sync = [predict(p, known) for p in ar]
    hosted = [i % 3 == 0 and t < 30e-6 for i, t in enumerate(sync)]
    pts = [replace(p, measured_s=50e-6 if h else t) for p, t, h in zip(ar, sync, hosted,
                                                                       strict=True)]
    modes = all_reduce_modes(pts, EFF)
    assert modes.host == tuple(hosted) and any(hosted)
    assert modes.host_s == {d: pytest.approx(50e-6)  # each device with a replaced point
                            for d in {p.device for p, h in zip(ar, hosted, strict=True) if h}}
    for name in ("tp_base_s", "tp_hop_s", "tp_link_eff", "nvls_base_s"):
        assert modes.factors[name] == pytest.approx(getattr(known, name), rel=1e-6), name


def test_the_defaults_are_the_fit(fit_doc: dict) -> None:
    # a regression guard: the shipped factors are the refit's values, rounded (`--fit` reports
    # `fit_all` on every point as each factor's "after")
    fitted = {k: v["after"] for k, v in fit_doc["fit"]["factors"].items()}
    assert set(fitted) == set(FITTED)
    for name in FITTED:
        assert getattr(EFF, name) == pytest.approx(fitted[name], rel=0.01, abs=1e-9), name


def test_fit_recovers_known_factors_from_synthetic_points() -> None:
    # Independent of the measurements: points measured as the model prices them with known
    # factors (every shape, TP, token count and size of the data set) give those factors back.
    known = Efficiency(mfu_prefill=0.55, prefill_half_ridge=0.8, decode_bw_eff=0.62,
                       decode_bw_half_batch=0.3, decode_tp_bw_loss=0.09, tp_base_s=12e-6,
                       tp_hop_s=12e-6 * HOP_PER_BASE, tp_link_eff=0.7, nvls_base_s=20e-6,
                       p2p_net_s=15e-6,
                       attn_kernel_s=9e-6,
                       attn_split_s=3e-6, mfu_attention=0.45, attn_append_factor=2.0)
    _, points = load()
    synthetic = [replace(p, measured_s=predict(p, known)) for p in points]
    fitted = fit_all(synthetic, EFF)
    assert set(fitted) == set(FITTED)
    for name in FITTED:
        assert fitted[name] == pytest.approx(getattr(known, name), rel=2e-3), name
    assert {f.name for f in fields(Efficiency)} >= set(FITTED)


def test_layer_classes_meet_the_goal_held_out(fit_doc: dict) -> None:
    # `--fit` reports the factors, the in-sample errors and the honest figure: each model's
    # layers priced by factors fitted on the other models (leave-one-model-out; measured
    # 7.9% / 29.0% prefill, 10.8% / 23.1% decode), which meets the goal
    doc = fit_doc
    assert set(doc["fit"]) == {"factors", "classes", "leave_one_model_out",
                               "attention_leave_one_context_out"}
    assert set(doc["fit"]["factors"]) == set(FITTED)
    held = doc["fit"]["leave_one_model_out"]
    assert set(held) == set(LAYER_CLASSES)
    for cls in LAYER_CLASSES:
        assert held[cls]["n"] == doc["classes"][cls]["n"]  # every model's points held out once
        assert held[cls]["median_abs_error"] <= 0.15 and held[cls]["p90_abs_error"] <= 0.30, (
            cls, held[cls])


VIDUR_MIRROR = Path("/work/.mirror/microsoft+vidur/repo")


@pytest.mark.skipif(not VIDUR_MIRROR.is_dir(), reason="no local copy of Vidur")
def test_the_extraction_reproduces_the_committed_data(tmp_path: Path) -> None:
    # scripts/extract_operators.py run on Vidur gives the committed files byte for byte
    script = Path(__file__).resolve().parent.parent / "scripts" / "extract_operators.py"
    done = subprocess.run([sys.executable, str(script), "--source", str(VIDUR_MIRROR),
                           "--out", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    for f in DATA.glob("*.csv"):
        if f.name not in ALL_REDUCE_FILES.values():  # the other extractors': test_opsources
            assert (tmp_path / f.name).read_text() == f.read_text(), f.name


def test_the_extraction_refuses_a_folder_that_is_not_vidur(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parent.parent / "scripts" / "extract_operators.py"
    done = subprocess.run([sys.executable, str(script), "--source", str(tmp_path / "none"),
                           "--out", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "--source" in done.stderr and "Traceback" not in done.stderr


def test_attention_priced_by_the_forward_and_the_decode_step() -> None:
    # The attention kernels are priced with the pieces the model's steps use: a prefill
    # chunk by `flash.prefill_kernel_time` (Vidur's kernel also appends the chunk's keys),
    # which prices an engine forward's attention and `prefill_line`'s per-context slope; a
    # decode batch's time grows with its KV at `decode_step_line`'s k (one layer of the data's
    # shape).
    _, points = load()
    m, par = attention_layer(8192, 64, 8), Parallel(tp=2)
    dev = shipped_devices()["A100-80G"]
    pre = {(p.size, p.context): p for p in points if p.cls == "attention" and p.kind == "prefill"}
    for (size, ctx), p in pre.items():
        assert predict(p, EFF) == prefill_kernel_time(m, dev, par, size, 2 * ctx + size, EFF,
                                                      chunk=size, append=True)
    engine = [prefill_kernel_time(m, dev, par, 512, seq, EFF) for seq in (0.0, 1.0, 4096.0)]
    assert engine[1] - engine[0] == pytest.approx(prefill_line(m, dev, par, 512, EFF)[1],
                                                  rel=1e-9)
    assert engine[2] - engine[0] == pytest.approx(4096 * (engine[1] - engine[0]), rel=1e-9)
    fwd = [forward_time(m, dev, par, 512, seq, EFF) for seq in (0.0, 4096.0)]
    assert fwd[1] - fwd[0] == pytest.approx(engine[2] - engine[0], rel=1e-9)
    dec = {(p.size, p.context): p for p in points if p.cls == "attention" and p.kind == "decode"}
    per_kv = (predict(dec[(8, 2048)], EFF) - predict(dec[(8, 1024)], EFF)) / (8 * 1024)
    assert per_kv == pytest.approx(decode_step_line(m, dev, par, 8, EFF)[1], rel=1e-9)


def test_attention_with_its_fitted_factors_held_out(json_doc: dict) -> None:
    # The honest figures of the attention factors: each KV context's kernels priced by
    # factors fitted on the other contexts' (measured 9.0% / 24.5%), and every other chunk
    # size / decode batch priced by factors fitted on the rest (8.8% / 25.0%); in-sample 8.3%
    # / 23.0%. Both meet the goal (median <= 15%, p90 <= 30%).
    doc = json_doc
    for h in (doc["attention_held_out"]["leave_one_context_out"],
              doc["attention_held_out"]["half_sizes_out"]):
        assert h["n"] == doc["classes"]["attention"]["n"]
        assert h["median_abs_error"] <= 0.15 and h["p90_abs_error"] <= 0.30, h
    fitted = fit_attention(load()[1], EFF)
    assert 0.5 < fitted["mfu_attention"] < 0.7  # a FlashAttention-2 tile's share of peak
    assert 5e-6 < fitted["attn_kernel_s"] < 2e-5
    assert 2.0 < fitted["attn_append_factor"] < 4.0


def test_send_recv_by_link(json_doc: dict) -> None:
    # The send/recv class by link: the H100 node pair's network runs near the catalog's NIC
    # (calibrated 46-47 GB/s of 50), the A100 pair's at ~9.5 GB/s of the catalog's 25 (one
    # 200 Gb/s HDR NIC per GPU): a property of that testbed's network, which a user sets as
    # the device's `nic_gbs` (a per-cluster setting, calibrated), not a catalog default.
    # Held out (`p2p_net_s` fitted on the other device's pair, the NIC on every other size):
    # the A100 pair 4.9% / 21.7%, where the catalog's NIC leaves it 48.7% / 60.8% fast; the
    # H100 pair 17.0% / 36.5% (its small sends take 17-20 us, the A100 pair's 24-27 us: the
    # per-call time differs by testbed too).
    by_link = json_doc["send_recv_by_link"]
    a100, h100 = (by_link[f"{d} two_nodes, testbed NIC held out"]
                  for d in ("A100-80G", "H100-SXM"))
    assert all(r < 0.5 * a100["catalog_nic_gbs"] for r in a100["calibrated_nic_gbs"])
    assert all(0.85 * h100["catalog_nic_gbs"] < r < 1.05 * h100["catalog_nic_gbs"]
               for r in h100["calibrated_nic_gbs"])
    assert a100["median_abs_error"] <= 0.10 and a100["p90_abs_error"] <= 0.25, a100
    assert h100["median_abs_error"] <= 0.20 and h100["p90_abs_error"] <= 0.40, h100
    assert by_link["A100-80G two_nodes"]["median_abs_error"] >= 0.4
    assert sum(v["n"] for k, v in by_link.items() if "testbed" not in k) == 60


def test_nic_calibration_recovers_a_known_rate() -> None:
    # Independent of the measurements: two-node sends priced on a known 12 GB/s NIC give
    # that rate back.
    _, points = load()
    pair = [p for p in points if p.cls == "send_recv" and p.per_node == 1
            and p.device == "A100-80G"]
    slow = shipped_devices()["A100-80G"].model_copy(update={"nic_gbs": 12.0})
    synthetic = [replace(p, measured_s=stage_send(p.size, p2p_link(slow, 2 * NODE_DEVICES, EFF)))
                 for p in pair]
    assert calibrate_nic(synthetic, EFF) == pytest.approx(12.0, rel=1e-3)
