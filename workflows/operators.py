"""Operator-level fidelity: the cost model's own pricing functions against measured kernel times
(Vidur's public profiles of A100 and H100 nodes, extracted by scripts/extract_operators.py into
workflows/data/operators/, whose headers name the source commit, paths and units).

A run-level error mixes every factor; an operator is priced by one piece of the model, so its
error says which factor is off. The classes:

  prefill_linear  one decoder layer without its attention kernel (every kernel Vidur's mlp.csv
                  times: the QKV, O, gate/up and down GEMMs and the norms, rope, activation and
                  residual add between them) at pass sizes of >= PREFILL_MIN_TOKENS tokens,
                  priced as an engine forward prices its GEMMs (`roofline.matmul_time` at
                  `mfu_prefill`, `prefill_half_ridge`: the ceiling absorbs the elementwise
                  kernels, as it does in `generation.forward_time`)
  decode          the same layer at decode batches of <= DECODE_MAX_TOKENS sequences, priced
                  as a decode step prices its matmuls (`generation.decode_matmul_time`: the
                  weight read at `decode_bw_eff`, its batch and TP curve, or the FLOP floor)
  attention       one layer's FlashAttention kernel on an A100 at TP 2 (Vidur's first
                  published attention profile, commit e2d00e9; its later per-model files are
                  absent from the mirror): prefill chunks after a KV context, priced by the
                  kernel model an engine forward prices its attention with
                  (`flash.prefill_kernel_time`: score FLOPs at `mfu_attention` over the share
                  of the SMs the grid fills, the chunk's own keys appended at
                  `attn_append_factor`), and decode batches, priced as a decode step reads
                  their KV (`generation.decode_attention_time`: the decode bandwidth curve);
                  either adds the kernel's fixed time (`flash.kernel_floor`: `attn_kernel_s`,
                  and `attn_split_s` where the grid splits its keys)
  all_reduce      one NCCL all-reduce over the 2-8 ranks of one node (a TP group), priced by
                  `layercomm.tp_all_reduce`: a ring (`tp_base_s`, `tp_hop_s`, `tp_link_eff`),
                  or NCCL's NVLS where the node's NVSwitches reduce and it is faster
                  (`nvls_base_s`).
                  Vidur's kernels below ~4 MiB are bimodal (`all_reduce_modes`: a kernel is
                  the collective, or waits out a peer's host launch period, ~60 us on its
                  A100 node and ~40 us on its H100 node, whatever the size); the factors
                  price the synchronised collective, as a step runs it, and the class figure
                  covers every point at that price. `all_reduce_split` splits the points by
                  the price, held out by rank count: priced at or above the host period,
                  the price is the prediction; below it, the model bounds the kernel by
                  [price, period] and the ranks' launch phase, which no input sets, picks
                  the mode. workflows/opmodes.py tests that on Vidur's dense sweep (~350
                  sizes per group up to 8 MiB): sizes 8-32 KiB apart flip mode, so no model
                  of size, rank count and device predicts it; it also prices each device
                  with factors fitted on the other, and the sweep's other sizes held out
  send_recv       one send/recv between two ranks of a node or of two nodes, priced by
                  `layercomm.stage_send` (`pp_send`'s piece) on `p2p_link` (two nodes: the
                  call's `p2p_net_s`) over the catalog's NIC; `send_recv_split` also prices
                  each two-node pair held out on its testbed's NIC (`opfit.calibrate_nic`:
                  Vidur's A100 pair runs at ~9.5 GB/s of the catalog's 25, a property of that
                  network, which a user sets per cluster as the device's `nic_gbs`)

A second source times the all-reduce: nccl-tests logs of one 8x H100 NVSwitch host
(scripts/extract_nccl_tests.py; 2/4/6 ranks, 8 B-8 GiB, eager calls and CUDA-graph replays).
Every row names its source and launch mode; the class figures cover every source's points,
`classes_by_source` each source's. The all-reduce factors are Vidur's fit, so nccl-tests'
figures are held out; `all_reduce_sources` (workflows/opsources.py) gives them per launch mode,
each source priced by the other's fit, and the fit on both; `all_reduce_cross_node`
(workflows/opnet.py) the groups that span nodes, at the catalog's network and held out on each
testbed's own (its network step latency and NIC rate calibrated on the other sizes). The
mode studies below (`all_reduce_modes`, the sweep, `--residuals`) are of Vidur's harness and
its points.

Error = predicted / measured - 1. The attention class also reports its held-out errors
(`attention_held_out`: in-sample, each KV context priced by factors fitted on the others,
and half the chunk sizes / decode batches priced by factors fitted on the other half).
`all_reduce_modes` reports the all-reduce class by mode, with the synchronised points held out
by rank count; `all_reduce_device_held_out` and `all_reduce_sweep` (workflows/opmodes.py) by
device and by size. `--residuals` prints the collectives' residuals per device, rank count and
size band. `--fit` refits the factors of every class on these points (workflows/opfit.py)
and prints them with the classes' errors after (in-sample), the layer classes'
leave-one-model-out errors and the attention class's leave-one-context-out error (held out).

    python -m workflows.operators [--json] [--fit] [--residuals]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import NODE_DEVICES, p2p_link, stage_send
from placer.spec.catalog import shipped_devices
from workflows.opdata import CLASSES, LAYER_CLASSES, SOURCES, VIDUR, Point, load, predict
from workflows.opfit import all_reduce_modes, calibrate_nic, fit_all, fit_attention, fit_layers, fit_send_recv
from workflows.opmodes import device_held_out, render_residuals, render_study, residual_table, sweep_study
from workflows.opnet import cross_node_study
from workflows.opnet import render as render_cross_node
from workflows.opsources import render as render_sources
from workflows.opsources import study as source_study


@dataclass(frozen=True)
class Row:
    cls: str
    device: str
    model: str
    tp: int
    size: int
    per_node: int
    measured_s: float
    predicted_s: float
    error: float
    kind: str = ""  # attention: prefill or decode
    context: int = 0  # attention: KV tokens (before the chunk, or of each decode sequence)
    source: str = VIDUR  # the public source that measured it (opdata.SOURCES)
    launch: str = "eager"  # collectives: host-launched calls, or a CUDA graph's replay


@dataclass(frozen=True)
class ClassError:
    n: int
    median_abs_error: float | None
    p90_abs_error: float | None


def rows(points: Sequence[Point], eff: Efficiency) -> list[Row]:
    out = []
    for p in points:
        pred = predict(p, eff)
        out.append(Row(p.cls, p.device, p.model, p.tp, p.size, p.per_node, p.measured_s, pred,
                       pred / p.measured_s - 1, p.kind, p.context, p.source, p.launch))
    return out


def class_errors(rs: Sequence[Row]) -> dict[str, ClassError]:
    """Per class: points, median and 90th percentile (linear interpolation) of |error|."""
    out = {}
    for cls in CLASSES:
        errs = np.abs([r.error for r in rs if r.cls == cls])
        out[cls] = (ClassError(len(errs), float(np.median(errs)), float(np.percentile(errs, 90)))
                    if len(errs) else ClassError(0, None, None))
    return out


def classes_by_source(rs: Sequence[Row]) -> dict[str, dict[str, ClassError]]:
    """`class_errors` over each source's points (the classes it has points in)."""
    return {src: {k: v for k, v in class_errors([r for r in rs if r.source == src]).items()
                  if v.n}
            for src in SOURCES if any(r.source == src for r in rs)}


def leave_one_model_out(points: Sequence[Point], eff: Efficiency) -> dict[str, ClassError]:
    """The layer classes' errors with each model's points priced by factors fitted on the
    other models' (`opfit.fit_layers`): the held-out figure of the layer factors."""
    held: list[Row] = []
    for model in sorted({p.model for p in points if p.model}):
        fitted = eff.override(fit_layers([p for p in points if p.model != model], eff))
        held += rows([p for p in points if p.model == model], fitted)
    return {k: v for k, v in class_errors(held).items() if k in LAYER_CLASSES}


def _attention_held_out(points: Sequence[Point], eff: Efficiency,
                        fold: Callable[[Point], int]) -> ClassError:
    """The attention class's error with each fold's kernels priced by the attention factors
    (`opfit.fit_attention`) fitted on the other folds' (the attention data hold one shape on
    one device, so the folds split its sizes or its KV contexts)."""
    att = [p for p in points if p.cls == "attention"]
    held: list[Row] = []
    for k in sorted({fold(p) for p in att}):
        fitted = eff.override(fit_attention([p for p in att if fold(p) != k], eff))
        held += rows([p for p in att if fold(p) == k], fitted)
    return class_errors(held)["attention"]


def _rank(points: Sequence[Point], p: Point, key: Callable[[Point], int]) -> int:
    """`key(p)`'s place among the values of its kind's points (prefill or decode)."""
    return sorted({key(q) for q in points if q.cls == "attention" and q.kind == p.kind}).index(
        key(p))


def leave_one_context_out(points: Sequence[Point], eff: Efficiency) -> ClassError:
    """Held out: each KV context's kernels (its place among its kind's five contexts) priced
    by factors fitted on the other contexts'."""
    return _attention_held_out(points, eff,
                               lambda p: _rank(points, p, lambda q: q.context))


def half_sizes_out(points: Sequence[Point], eff: Efficiency) -> ClassError:
    """Held out: the kernels of every other chunk size or decode batch priced by factors
    fitted on the rest, and the other way round (two folds, half the shapes each)."""
    return _attention_held_out(points, eff,
                               lambda p: _rank(points, p, lambda q: q.size) % 2)


def attention_held_out(points: Sequence[Point], eff: Efficiency) -> dict[str, ClassError]:
    """The attention factors' held-out figures, next to the in-sample one (the shipped
    factors are the fit on every point): leave-one-context-out and half the shapes out."""
    return {"in_sample": class_errors(rows(points, eff))["attention"],
            "leave_one_context_out": leave_one_context_out(points, eff),
            "half_sizes_out": half_sizes_out(points, eff)}


def _mode_errors(points: Sequence[Point], eff: Efficiency,
                 host_s: dict[str, float]) -> tuple[list[float], list[float]]:
    """|error| of each all-reduce point priced at `eff`, split by the mode it is nearer
    (`opfit.all_reduce_modes`' rule): (synchronised, host-bound against its host period)."""
    sync: list[float] = []
    host: list[float] = []
    for p in points:
        t, period = predict(p, eff), host_s.get(p.device, float("inf"))
        if abs(np.log(max(t, period) / p.measured_s)) < abs(np.log(t / p.measured_s)):
            host.append(abs(period / p.measured_s - 1))
        else:
            sync.append(abs(t / p.measured_s - 1))
    return sync, host


def _errors(errs: Sequence[float]) -> ClassError:
    return (ClassError(len(errs), float(np.median(errs)), float(np.percentile(errs, 90)))
            if len(errs) else ClassError(0, None, None))


def all_reduce_split(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """The all-reduce class by mode (the class figure covers every point; this says why it
    misses the goal): each device's host launch period, the synchronised points' errors at
    `eff`, the host-bound points' errors against their host period, and the synchronised
    points' errors with each rank count priced by factors fitted on the other two (held
    out)."""
    ar = [p for p in points if p.cls == "all_reduce" and p.source == VIDUR]
    modes = all_reduce_modes(ar, eff)
    sync, host = _mode_errors(ar, eff, modes.host_s)
    held: list[float] = []
    for k in sorted({p.tp for p in ar}):
        fitted = all_reduce_modes([p for p in ar if p.tp != k], eff)
        held += _mode_errors([p for p in ar if p.tp == k], eff.override(fitted.factors),
                             fitted.host_s)[0]
    return {"host_period_s": modes.host_s, "synchronised": asdict(_errors(sync)),
            "host_bound": asdict(_errors(host)),
            "synchronised_rank_count_held_out": asdict(_errors(held)),
            **_by_price(ar, eff)}


def _by_price(ar: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """The all-reduce points split by the model's own price, not by the measured time: with
    each rank count held out (factors and host periods fitted on the other two), a point whose
    collective prices at or above its device's host period cannot wait out a peer's launch
    (the GPU is the bottleneck of the burst), so the price is the prediction: its errors. A
    point priced below the period is in either mode by the phase of the ranks' launches,
    which no input fixes: the model bounds it by [price, period], and the share of those
    points measured inside that interval (widened by `BAND_SLACK` each way) is reported."""
    gpu: list[float] = []
    inside: list[bool] = []
    width: list[float] = []
    for k in sorted({p.tp for p in ar}):
        fitted = all_reduce_modes([p for p in ar if p.tp != k], eff)
        priced = eff.override(fitted.factors)
        for p in (q for q in ar if q.tp == k):
            t, period = predict(p, priced), fitted.host_s.get(p.device, 0.0)
            if t >= period:
                gpu.append(abs(t / p.measured_s - 1))
            else:
                inside.append(t / (1 + BAND_SLACK) <= p.measured_s <= period * (1 + BAND_SLACK))
                width.append(period / t)
    return {"gpu_bound_rank_count_held_out": asdict(_errors(gpu)),
            "below_host_period": {
                "n": len(inside),
                "share_within_band": sum(inside) / len(inside) if inside else None,
                "median_period_over_price": float(np.median(width)) if width else None}}


BAND_SLACK = 0.3  # the class goal's p90 bound: a point within it of [price, period] is "inside"


def _two_node_send(p: Point, eff: Efficiency, nic_gbs: float) -> float:
    """A two-node send/recv point priced as `opdata.predict` prices it, on a NIC of
    `nic_gbs` (the device's per-cluster setting) instead of the catalog's."""
    dev = shipped_devices()[p.device].model_copy(update={"nic_gbs": nic_gbs})
    return stage_send(p.size, p2p_link(dev, 2 * NODE_DEVICES, eff))


def send_recv_split(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """The send/recv class by link and device at `eff` (the two-node pairs on the catalog's
    NIC), and each device's two-node pairs held out: `p2p_net_s` fitted on the other
    devices' pairs (`opfit.fit_send_recv`), the pair's own NIC calibrated on every other
    message size and priced on the rest (two folds), the calibrated rate next to the
    catalog's."""
    sr = [p for p in points if p.cls == "send_recv"]
    out: dict[str, Any] = {}
    for dev in sorted({p.device for p in sr}):
        for label, two in (("one_node", False), ("two_nodes", True)):
            ps = [p for p in sr if p.device == dev and (p.per_node == 1) == two]
            out[f"{dev} {label}"] = asdict(_errors([abs(r.error) for r in rows(ps, eff)]))
        pair = sorted((p for p in sr if p.device == dev and p.per_node == 1),
                      key=lambda p: p.size)
        others = eff.override(fit_send_recv([p for p in sr if p.device != dev], eff))
        held: list[float] = []
        rates = []
        for fold in (0, 1):
            gbs = calibrate_nic([p for i, p in enumerate(pair) if i % 2 != fold], others)
            rates.append(gbs)
            held += [abs(_two_node_send(p, others, gbs) / p.measured_s - 1)
                     for i, p in enumerate(pair) if i % 2 == fold]
        out[f"{dev} two_nodes, testbed NIC held out"] = {
            **asdict(_errors(held)), "catalog_nic_gbs": shipped_devices()[dev].nic_gbs,
            "calibrated_nic_gbs": [round(r, 2) for r in rates],
            "p2p_net_s_from_others": others.p2p_net_s}
    return out


def document(eff: Efficiency, fit: Callable[[Sequence[Point], Efficiency],
                                             dict[str, float]] | None = None) -> dict[str, Any]:
    """The JSON document: sources, per-class errors and rows at `eff`; with `fit`, the
    factors it fits on the points, the classes' errors at them (in-sample), the layer
    classes' leave-one-model-out errors and the attention class's leave-one-context-out
    error."""
    provs, points = load()
    rs = rows(points, eff)
    doc: dict[str, Any] = {
        "sources": {p.file: list(p.lines) for p in provs},
        "classes": {k: asdict(v) for k, v in class_errors(rs).items()},
        "classes_by_source": {src: {k: asdict(v) for k, v in cs.items()}
                              for src, cs in classes_by_source(rs).items()},
        "attention_held_out": {k: asdict(v) for k, v in attention_held_out(points, eff).items()},
        "all_reduce_modes": all_reduce_split(points, eff),
        "all_reduce_device_held_out": device_held_out(points, eff),
        "all_reduce_sweep": sweep_study(eff),
        "all_reduce_sources": source_study(points, eff),
        "all_reduce_cross_node": cross_node_study(points, eff),
        "send_recv_by_link": send_recv_split(points, eff),
        "rows": [asdict(r) for r in rs]}
    if fit is not None:
        values = fit(points, eff)
        after = eff.override(values)
        doc["fit"] = {"factors": {k: {"before": getattr(eff, k), "after": v}
                                  for k, v in values.items()},
                      "classes": {k: asdict(v)
                                  for k, v in class_errors(rows(points, after)).items()},
                      "leave_one_model_out": {
                          k: asdict(v) for k, v in leave_one_model_out(points, eff).items()},
                      "attention_leave_one_context_out": asdict(
                          leave_one_context_out(points, after))}
    return doc


def _size(r: dict[str, Any]) -> str:
    if r["cls"] in ("prefill_linear", "decode"):
        return f"{r['size']} tok"
    if r["cls"] == "attention":
        return (f"{r['size']}+{r['context']}" if r["kind"] == "prefill"
                else f"{r['size']}x{r['context']}")
    b = r["size"]
    if b >= 2**30:
        return f"{b / 2**30:.0f} GiB"
    return (f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB" if b >= 2**10
            else f"{b} B")


def _class_line(name: str, c: dict[str, Any]) -> str:
    if not c["n"]:
        return f"{name:15s} n=0"
    return (f"{name:40s} n={c['n']:<4d} median |error| {c['median_abs_error']:.1%}, "
            f"p90 {c['p90_abs_error']:.1%}")


def _all_reduce_lines(modes: dict[str, Any]) -> list[str]:
    """The all-reduce class by mode, held-out figures first."""
    periods = ", ".join(f"{d} {s * 1e6:.0f} us" for d, s in modes["host_period_s"].items())
    below = modes["below_host_period"]
    share = below["share_within_band"]
    out = ["all_reduce by mode (a kernel of Vidur's burst is the collective, or waits out a "
           f"peer's host launch: {periods});",
           "the factors price the collective, as a step runs it. Held out (each TP priced by "
           "factors and host periods fitted on the other two), split by the price:",
           "  " + _class_line("priced >= host period", modes["gpu_bound_rank_count_held_out"])
           + "  (the price is the prediction)",
           f"  {'priced < host period':40s} n={below['n']:<4d} "
           + (f"{share:.0%} measured within [price, period] +-{BAND_SLACK:.0%} (period / "
              f"price: median {below['median_period_over_price']:.1f}x)"
              if share is not None else "")
           + "; the ranks' launch phase, which no input sets, picks the mode"]
    labels = {"synchronised_rank_count_held_out": "synchronised, TP held out",
              "synchronised": "synchronised (in-sample)",
              "host_bound": "host-bound vs host period"}
    out.append("  split by the measured time (which mode is nearer), for comparison:")
    return out + ["  " + _class_line(labels[k], modes[k]) for k in labels]


def _send_recv_lines(by_link: dict[str, Any]) -> list[str]:
    """The send/recv class by link; two-node pairs also on their testbed's calibrated NIC."""
    out = ["send_recv by link (two nodes: the catalog NIC; 'testbed NIC held out': p2p_net_s "
           "fitted on the other device's pair, the NIC rate calibrated on every other size, "
           "priced on the rest):"]
    for k, v in by_link.items():
        line = "  " + _class_line(k, v)
        if "calibrated_nic_gbs" in v:
            line += (f"  NIC {'/'.join(f'{r:.1f}' for r in v['calibrated_nic_gbs'])} GB/s "
                     f"calibrated vs {v['catalog_nic_gbs']:g} catalog, p2p_net_s "
                     f"{v['p2p_net_s_from_others'] * 1e6:.1f} us")
        out.append(line)
    return out


def render(doc: dict[str, Any]) -> str:
    out = []
    for cls in CLASSES:
        out.append(f"\n{cls}")
        rs = [r for r in doc["rows"] if r["cls"] == cls]
        if not rs:
            out.append("  no measured points (see the module docstring)")
            continue
        out.append(f"  {'source':10s} {'device':9s} {'model':38s} {'TP/ranks':>8s} "
                   f"{'size':>11s} {'measured':>10s} {'predicted':>10s} {'error':>7s}")
        for r in rs:
            where = r["model"] or ("2 nodes" if r["per_node"] == 1 else "")
            if r["kind"]:
                where = ("prefill: tokens+KV" if r["kind"] == "prefill"
                         else "decode: sequences x KV each")
            if r["launch"] == "graph":
                where = "CUDA graph replay"
            out.append(f"  {r['source']:10s} {r['device']:9s} {where:38s} {r['tp']:8d} "
                       f"{_size(r):>11s} "
                       f"{r['measured_s'] * 1e3:8.4f}ms {r['predicted_s'] * 1e3:8.4f}ms "
                       f"{r['error']:+7.1%}")
    out.append("\nper class (error = predicted / measured - 1):")
    out += ["  " + _class_line(k, v) for k, v in doc["classes"].items()]
    for src, cs in doc["classes_by_source"].items():
        out.append(f"per class, {src}'s points:")
        out += ["  " + _class_line(k, v) for k, v in cs.items()]
    out.append("attention, in-sample (the shipped factors are fitted on these points) and held "
               "out (priced by factors fitted without them):")
    labels = {"in_sample": "in-sample", "leave_one_context_out": "each KV context held out",
              "half_sizes_out": "half the sizes held out"}
    out += ["  " + _class_line(labels[k], v) for k, v in doc["attention_held_out"].items()]
    out += render_study(doc["all_reduce_sweep"], doc["all_reduce_device_held_out"])
    out += _all_reduce_lines(doc["all_reduce_modes"])
    out += render_sources(doc["all_reduce_sources"])
    out += render_cross_node(doc["all_reduce_cross_node"])
    out += _send_recv_lines(doc["send_recv_by_link"])
    if "fit" in doc:
        out.append("\nfitted on these points (in-sample):")
        out += [f"  {k:22s} {v['before']:.6g} -> {v['after']:.6g}"
                for k, v in doc["fit"]["factors"].items()]
        out.append("per class after the fit (in-sample):")
        out += ["  " + _class_line(k, v) for k, v in doc["fit"]["classes"].items()]
        out.append("layer classes, each model priced by factors fitted on the others:")
        out += ["  " + _class_line(k, v)
                for k, v in doc["fit"]["leave_one_model_out"].items()]
        out.append("attention, each KV context priced by factors fitted on the others:")
        out.append("  " + _class_line("attention", doc["fit"]["attention_leave_one_context_out"]))
    out.append("\nsources: " + "; ".join(
        f"{f}: {lines[0]}" for f, lines in doc["sources"].items()))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workflows.operators",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--fit", action="store_true",
                    help="refit the GEMM, decode-bandwidth, TP all-reduce, two-node send and "
                         "attention factors on the points")
    ap.add_argument("--residuals", action="store_true",
                    help="print the collectives' residuals per device, rank count and size band")
    args = ap.parse_args(argv)
    if args.residuals:
        table = residual_table(load()[1], Efficiency())
        print(json.dumps(table, indent=1) if args.json else "\n".join(render_residuals(table)))
        return 0
    doc = document(Efficiency(), fit_all if args.fit else None)
    print(json.dumps(doc, indent=1) if args.json else render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
