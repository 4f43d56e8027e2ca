"""Refit of the operator-level factors on the measured operators (`python -m workflows.operators
--fit`): each fit minimises the sum of squared relative errors (predicted / measured - 1) of one
class (the all-reduce: of |log| errors), deterministically (closed-form least squares, grids for
the non-linear factors), and reads the model only through `opdata.predict`, so it fits the
functions the planner prices with.

  prefill_linear  `mfu_prefill` (c) and `prefill_half_ridge` (h): a point prices at
                  X1 / c + (h / c) X2, X1 its time at c = 1, h = 0 and X2 what h = 1 adds:
                  linear least squares in (1/c, h/c)
  decode          `decode_bw_eff` (e), `decode_bw_half_batch` (b0), `decode_tp_bw_loss` (l):
                  the weight read prices at (1/e) Y1 + (b0/e) Y2 for a given l (Y1 at e = 1,
                  b0 = 0; Y2 what b0 = 1 adds): least squares per l on a grid, then a
                  golden-section search around the best (the FLOP floor is off while fitting: at <= 64 tokens
                  the read bounds every point)
  all_reduce      `tp_link_eff` (grid, then golden section) and `tp_base_s` (grid, 0-100 us)
                  minimising the sum of |log(predicted / measured)| instead: NCCL kernel
                  times of small messages are bimodal (the same call 7 or 40 us, as the
                  ranks arrive), and squares let the fast mode pull the base below most
                  calls; `nvlink_hop_s` stays (shared with every NVLink collective, and
                  too noisy to separate here)
  attention       the FlashAttention kernel's (placer/cost/flash.py) `attn_kernel_s`,
                  `attn_split_s`, `mfu_attention` and `attn_append_factor` on the prefill and
                  decode kernels together: a point is linear in (f, s, 1/e, a/e) (`fit_attention`),
                  a decode kernel's KV read on the decode class's bandwidth curve, as fitted
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from placer.cost.efficiency import Efficiency
from workflows.opdata import Point, predict

NO_FLOOR = 1e9  # a `decode_flops_eff` that takes the FLOP floor out of a decode price


def _relative_lstsq(columns: list[list[float]], measured: list[float]) -> np.ndarray:
    """theta minimising sum((columns . theta) / measured - 1)^2."""
    m = np.asarray(measured)
    a = np.asarray(columns).T / m[:, None]
    theta, *_ = np.linalg.lstsq(a, np.ones(len(m)), rcond=None)
    return np.asarray(theta)


def _sse(pred: Sequence[float], measured: Sequence[float]) -> float:
    return float(np.sum((np.asarray(pred) / np.asarray(measured) - 1.0) ** 2))


def _grid(lo: float, hi: float, step: float) -> np.ndarray:
    return lo + step * np.arange(round((hi - lo) / step) + 1)


GOLDEN = (5 ** 0.5 - 1) / 2


def _search(cost: Callable[[float], float], lo: float, hi: float, step: float) -> float:
    """The value of least cost: the best of a grid of `step`, then a golden-section search
    within one step of it (to step / 1000)."""
    best = float(min(_grid(lo, hi, step), key=cost))
    a, b = max(lo, best - step), min(hi, best + step)
    while b - a > step / 1000:
        c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
        if cost(c) <= cost(d):
            b = d
        else:
            a = c
    mid = (a + b) / 2
    return mid if cost(mid) <= cost(best) else best


def fit_prefill(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    ps = [p for p in points if p.cls == "prefill_linear"]
    flat = eff.override({"mfu_prefill": 1.0, "prefill_half_ridge": 0.0})
    ridge = eff.override({"mfu_prefill": 1.0, "prefill_half_ridge": 1.0})
    x1 = [predict(p, flat) for p in ps]
    x2 = [predict(p, ridge) - a for p, a in zip(ps, x1, strict=True)]
    inv_c, h_over_c = _relative_lstsq([x1, x2], [p.measured_s for p in ps])
    if h_over_c < 0:  # no ridge term: the ceiling alone
        (inv_c,), h_over_c = _relative_lstsq([x1], [p.measured_s for p in ps]), 0.0
    return {"mfu_prefill": float(1 / inv_c), "prefill_half_ridge": float(h_over_c / inv_c)}


def _decode_at(ps: Sequence[Point], eff: Efficiency, loss: float) -> tuple[float, float, float]:
    """(sse, decode_bw_eff, decode_bw_half_batch) best for this `decode_tp_bw_loss`."""
    base = {"decode_flops_eff": NO_FLOOR, "decode_bw_eff": 1.0, "decode_tp_bw_loss": loss}
    y1 = [predict(p, eff.override({**base, "decode_bw_half_batch": 0.0})) for p in ps]
    y2 = [predict(p, eff.override({**base, "decode_bw_half_batch": 1.0})) - a
          for p, a in zip(ps, y1, strict=True)]
    measured = [p.measured_s for p in ps]
    inv_e, half_over_e = _relative_lstsq([y1, y2], measured)
    if half_over_e < 0:
        (inv_e,), half_over_e = _relative_lstsq([y1], measured), 0.0
    pred = [inv_e * a + half_over_e * b for a, b in zip(y1, y2, strict=True)]
    return _sse(pred, measured), float(1 / inv_e), float(half_over_e / inv_e)


def fit_decode(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    ps = [p for p in points if p.cls == "decode"]
    loss = _search(lambda x: _decode_at(ps, eff, x)[0], 0.0, 0.5, 0.02)
    _, e, half = _decode_at(ps, eff, loss)
    return {"decode_bw_eff": e, "decode_bw_half_batch": half, "decode_tp_bw_loss": loss}


BASE_GRID_S = _grid(0.0, 100e-6, 0.05e-6)  # tp_base_s candidates: 0-100 us


def _all_reduce_at(ps: Sequence[Point], eff: Efficiency, link_eff: float) -> tuple[float, float]:
    """(cost, tp_base_s) best for this `tp_link_eff`: the base is added to every call, so
    one pricing per point serves every base on the grid."""
    no_base = eff.override({"tp_base_s": 0.0, "tp_call_s": 0.0, "tp_link_eff": link_eff})
    g = np.asarray([predict(p, no_base) for p in ps])
    m = np.asarray([p.measured_s for p in ps])
    costs = np.abs(np.log((g[None, :] + BASE_GRID_S[:, None]) / m[None, :])).sum(axis=1)
    best = int(np.argmin(costs))
    return float(costs[best]), float(BASE_GRID_S[best])


def fit_all_reduce(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    ps = [p for p in points if p.cls == "all_reduce"]
    link = _search(lambda x: _all_reduce_at(ps, eff, x)[0], 0.05, 3.0, 0.01)
    return {"tp_base_s": _all_reduce_at(ps, eff, link)[1], "tp_link_eff": link}


ATTENTION = ("attn_kernel_s", "attn_split_s", "mfu_attention", "attn_append_factor")


def fit_attention(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    """The FlashAttention kernel's factors on the attention points, by linear least squares:
    a point prices at f X_f + s X_s + (1/e) X_c + (a/e) X_a + X_0 (f `attn_kernel_s`, s
    `attn_split_s`, e `mfu_attention`, a `attn_append_factor`; X_0 what no factor scales: a
    decode kernel's KV read), each column read off `predict` at unit factors."""
    ps = [p for p in points if p.cls == "attention"]
    zero = {"attn_kernel_s": 0.0, "attn_split_s": 0.0, "mfu_attention": 1.0,
            "attn_append_factor": 0.0}

    def at(**values: float) -> np.ndarray:
        return np.asarray([predict(p, eff.override({**zero, **values})) for p in ps])

    base = at()
    scores = at(mfu_attention=0.5) - base  # the FLOP terms at e = 1 (twice at e = 0.5)
    cols = [at(attn_kernel_s=1.0) - base, at(attn_split_s=1.0) - base, scores,
            at(attn_append_factor=1.0) - base]
    m = np.asarray([p.measured_s for p in ps])
    a = np.asarray(cols).T / m[:, None]
    theta, *_ = np.linalg.lstsq(a, 1.0 - (base - scores) / m, rcond=None)
    f, split, inv_e, append_over_e = (float(x) for x in theta)
    return {"attn_kernel_s": f, "attn_split_s": split, "mfu_attention": 1 / inv_e,
            "attn_append_factor": append_over_e / inv_e}


def fit_all(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    """Every operator-level factor, fitted on `points` (each class on its own)."""
    layers = fit_layers(points, eff)
    return {**layers, **fit_all_reduce(points, eff),
            **fit_attention(points, eff.override(layers))}


def fit_layers(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    """The layer classes' factors alone (prefill and decode): what a held-out model refits."""
    return {**fit_prefill(points, eff), **fit_decode(points, eff)}
