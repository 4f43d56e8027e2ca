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
                  covers every point
  send_recv       one send/recv between two ranks of a node or of two nodes, priced by
                  `layercomm.stage_send` (`pp_send`'s piece) on `p2p_link` (two nodes: the
                  call's `p2p_net_s`)

Error = predicted / measured - 1. The attention class also reports its held-out errors
(`attention_held_out`: in-sample, each KV context priced by factors fitted on the others,
and half the chunk sizes / decode batches priced by factors fitted on the other half).
`all_reduce_modes` reports the all-reduce class by mode, with the synchronised points held out
by rank count. `--fit` refits the factors of every class on these points (workflows/opfit.py)
and prints them with the classes' errors after (in-sample), the layer classes'
leave-one-model-out errors and the attention class's leave-one-context-out error (held out).

    python -m workflows.operators [--json] [--fit]
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
from workflows.opdata import CLASSES, LAYER_CLASSES, Point, load, predict
from workflows.opfit import all_reduce_modes, fit_all, fit_attention, fit_layers


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
                       pred / p.measured_s - 1, p.kind, p.context))
    return out


def class_errors(rs: Sequence[Row]) -> dict[str, ClassError]:
    """Per class: points, median and 90th percentile (linear interpolation) of |error|."""
    out = {}
    for cls in CLASSES:
        errs = np.abs([r.error for r in rs if r.cls == cls])
        out[cls] = (ClassError(len(errs), float(np.median(errs)), float(np.percentile(errs, 90)))
                    if len(errs) else ClassError(0, None, None))
    return out


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
    ar = [p for p in points if p.cls == "all_reduce"]
    modes = all_reduce_modes(ar, eff)
    sync, host = _mode_errors(ar, eff, modes.host_s)
    held: list[float] = []
    for k in sorted({p.tp for p in ar}):
        fitted = all_reduce_modes([p for p in ar if p.tp != k], eff)
        held += _mode_errors([p for p in ar if p.tp == k], eff.override(fitted.factors),
                             fitted.host_s)[0]
    return {"host_period_s": modes.host_s, "synchronised": asdict(_errors(sync)),
            "host_bound": asdict(_errors(host)),
            "synchronised_rank_count_held_out": asdict(_errors(held))}


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
        "attention_held_out": {k: asdict(v) for k, v in attention_held_out(points, eff).items()},
        "all_reduce_modes": all_reduce_split(points, eff),
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
    return f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB"


def _class_line(name: str, c: dict[str, Any]) -> str:
    if not c["n"]:
        return f"{name:15s} n=0"
    return (f"{name:26s} n={c['n']:<4d} median |error| {c['median_abs_error']:.1%}, "
            f"p90 {c['p90_abs_error']:.1%}")


def render(doc: dict[str, Any]) -> str:
    out = []
    for cls in CLASSES:
        out.append(f"\n{cls}")
        rs = [r for r in doc["rows"] if r["cls"] == cls]
        if not rs:
            out.append("  no measured points (see the module docstring)")
            continue
        out.append(f"  {'device':9s} {'model':38s} {'TP/ranks':>8s} {'size':>11s} "
                   f"{'measured':>10s} {'predicted':>10s} {'error':>7s}")
        for r in rs:
            where = r["model"] or ("2 nodes" if r["per_node"] == 1 else "")
            if r["kind"]:
                where = ("prefill: tokens+KV" if r["kind"] == "prefill"
                         else "decode: sequences x KV each")
            out.append(f"  {r['device']:9s} {where:38s} {r['tp']:8d} {_size(r):>11s} "
                       f"{r['measured_s'] * 1e3:8.4f}ms {r['predicted_s'] * 1e3:8.4f}ms "
                       f"{r['error']:+7.1%}")
    out.append("\nper class (error = predicted / measured - 1):")
    out += ["  " + _class_line(k, v) for k, v in doc["classes"].items()]
    out.append("attention, in-sample (the shipped factors are fitted on these points) and held "
               "out (priced by factors fitted without them):")
    labels = {"in_sample": "in-sample", "leave_one_context_out": "each KV context held out",
              "half_sizes_out": "half the sizes held out"}
    out += ["  " + _class_line(labels[k], v) for k, v in doc["attention_held_out"].items()]
    modes = doc["all_reduce_modes"]
    out.append("all_reduce by mode (a kernel of Vidur's burst either is the synchronised "
               "collective or waits out a peer's host launch: "
               + ", ".join(f"{d} {s * 1e6:.0f} us" for d, s in modes["host_period_s"].items())
               + "); the factors price the synchronised one, as a step runs it:")
    labels = {"synchronised": "synchronised (in-sample)",
              "synchronised_rank_count_held_out": "synchronised, TP held out",
              "host_bound": "host-bound vs host period"}
    out += ["  " + _class_line(labels[k], modes[k]) for k in labels]
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
    args = ap.parse_args(argv)
    doc = document(Efficiency(), fit_all if args.fit else None)
    print(json.dumps(doc, indent=1) if args.json else render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
