"""Refit of the operator-level factors on the measured operators (`python -m workflows.operators
--fit`): each fit minimises the sum of squared relative errors (predicted / measured - 1) of one
class (send/recv: of |log| errors), deterministically (closed-form least squares, grids for
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
  all_reduce      `tp_base_s`, `tp_hop_s`, `tp_link_eff` and `nvls_base_s` (the ring, or NVLS
                  where the device has NVLink SHARP and it is faster: each linear in the four)
                  by relative least squares on the points in the synchronised mode
                  (`all_reduce_modes`: the kernels of small messages are bimodal, the
                  collective itself or a peer's host launch period, and the split alternates
                  with the fit to a fixed point), the ring's per-step latency tied to its
                  per-call one at NCCL's ratio (`HOP_PER_BASE`); `nvlink_hop_s` stays (other
                  collectives')
  send_recv       `p2p_net_s` on the two-node points (`fit_send_recv`, |log| errors), each
                  device's pair on its testbed's NIC (`calibrate_nic`: a cluster setting)
  attention       the FlashAttention kernel's (placer/cost/flash.py) `attn_kernel_s`,
                  `attn_split_s`, `mfu_attention` and `attn_append_factor` on the prefill and
                  decode kernels together: a point is linear in (f, s, 1/e, a/e) (`fit_attention`),
                  a decode kernel's KV read on the decode class's bandwidth curve, as fitted
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from placer.cost.collectives import NCCL_SIMPLE_BASE_S, NCCL_SIMPLE_NVLINK_HOP_S
from placer.cost.efficiency import Efficiency
from placer.spec.catalog import shipped_devices
from workflows.opdata import VIDUR, Point, predict

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


AR_ZERO = {"tp_base_s": 0.0, "tp_call_s": 0.0, "tp_hop_s": 0.0, "tp_link_eff": 1.0,
           "nvls_base_s": 0.0}
AR_FACTORS = ("tp_base_s", "tp_hop_s", "nvls_base_s")
OFF = 1e3  # seconds: a per-call cost that takes one algorithm out of `min`
HOST_SPLIT = 1.3  # a first guess: measured above 1.3x the all-point fit is host-bound
# `tp_hop_s` / `tp_base_s`: NCCL's own model of its ring (Simple protocol, NVLink; the
# constants' source: placer/cost/collectives.py). Three rank counts cannot pin a per-call and
# a per-step latency apart: fitted freely on two of them, the third's kernels miss by up to
# 47% (p90); the free fit on all three lands at 2.6, NCCL's ratio is 2.47.
HOP_PER_BASE = NCCL_SIMPLE_NVLINK_HOP_S / NCCL_SIMPLE_BASE_S
MAX_ROUNDS = 50


@dataclass(frozen=True)
class AllReduceModes:
    """The all-reduce points split into their two modes: `host[i]` where point i's kernel
    spans its device's host launch period (`host_s[device]`, the median of the points in
    that mode), else the synchronised collective the factors price."""

    factors: dict[str, float]
    host_s: dict[str, float]
    host: tuple[bool, ...]


def _all_reduce_rows(ps: Sequence[Point], eff: Efficiency) -> tuple[np.ndarray, np.ndarray]:
    """Per point the seconds one unit of `tp_base_s`, `tp_hop_s`, `nvls_base_s` and 1 /
    `tp_link_eff` adds, for the ring and for NVLS (NaN where the device has none): each
    prices linearly in the four."""
    def at(**values: float) -> np.ndarray:
        return np.asarray([predict(p, eff.override({**AR_ZERO, **values})) for p in ps])

    ring0, nvls0 = at(nvls_base_s=OFF), at(tp_base_s=OFF)
    ring = [at(nvls_base_s=OFF, tp_base_s=1.0) - ring0,
            at(nvls_base_s=OFF, tp_hop_s=1.0) - ring0, np.zeros(len(ps)), ring0]
    has = nvls0 < OFF / 2
    nvls = [np.zeros(len(ps)), np.zeros(len(ps)), np.ones(len(ps)), nvls0]
    return np.asarray(ring).T, np.where(has[:, None], np.asarray(nvls).T, np.nan)


def _tied(ring: np.ndarray, nvls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows with the per-step column folded into the per-call one at `HOP_PER_BASE`
    (one latency factor, `tp_base_s`; the per-step column left at 0)."""
    ring = ring.copy()
    ring[:, 0] += HOP_PER_BASE * ring[:, 1]
    ring[:, 1] = 0.0
    return ring, nvls


def device_of(p: Point) -> str:
    """The testbed whose host launch period a point's host-bound mode lasts: its device
    (one source, eager calls: Vidur's)."""
    return p.device


def all_reduce_modes(points: Sequence[Point], eff: Efficiency,
                     testbed: Callable[[Point], str] = device_of) -> AllReduceModes:
    """The TP all-reduce's `tp_base_s`, `tp_hop_s`, `nvls_base_s` and `tp_link_eff`, fitted
    on the points in the synchronised mode, and which points are in the other mode. Vidur's
    harness times rank 0's kernels in a burst of eager calls: where rank 0 issues its call
    before a peer, its kernel waits for that peer's host to issue its own and lasts the host's
    launch period, whatever the size and rank count (A100 node ~60 us, H100 node ~40 us);
    where it issues last, the kernel is the collective itself, as in a training or serving
    step, whose ranks issue their calls ahead of the GPU. The split alternates to a fixed
    point: fit the factors by relative least squares on the synchronised points (each priced
    by the algorithm, ring or NVLS, that is faster at the current factors), set each device's
    host period to the median of its host-bound points, and put each point in the mode whose
    price (the collective, or the host period where that is longer) is nearer in log.
    `testbed` names the harness whose host period a point waits out (`host_s`' keys): the
    device for one source's eager kernels; source, launch mode and device where sources mix."""
    ps = [p for p in points if p.cls == "all_reduce"]
    ring, nvls = _tied(*_all_reduce_rows(ps, eff))
    theta0 = np.asarray([eff.tp_base_s, 0.0, eff.nvls_base_s, 1 / eff.tp_link_eff])
    theta, host_s, host = split_modes(ring, nvls, np.asarray([p.measured_s for p in ps]),
                                      [testbed(p) for p in ps], theta0)
    base, _, nvls_base, inv_eff = (float(x) for x in theta)
    return AllReduceModes({"tp_base_s": base, "tp_hop_s": HOP_PER_BASE * base,
                           "nvls_base_s": nvls_base,
                           "tp_link_eff": 1 / inv_eff}, host_s, tuple(bool(h) for h in host))


def split_modes(ring: np.ndarray, nvls: np.ndarray, m: np.ndarray, testbeds: Sequence[str],
                theta: np.ndarray) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
    """`all_reduce_modes`' alternating split on any linear form of the collective: `ring`
    and `nvls` hold per point the seconds one unit of each factor adds under each algorithm
    (NVLS NaN where it does not run), `m` the measured seconds. Each round fits, by relative
    least squares on the synchronised points, the factors whose column is non-zero there
    (each point on its faster algorithm at the current factors), and re-splits the modes.
    Returns the factors, each testbed's host period and the host-bound mask."""
    devices = np.asarray(testbeds)
    host = np.zeros(len(m), dtype=bool)
    host_s: dict[str, float] = {}
    for rnd in range(MAX_ROUNDS):
        rows = np.where((nvls @ theta < ring @ theta)[:, None], nvls, ring)
        use = ~host
        cols = [c for c in range(len(theta)) if rows[use, c].any()]
        theta = theta.copy()
        theta[cols] = _relative_lstsq(list(rows[use][:, cols].T), list(m[use]))
        sync = np.fmin(ring @ theta, nvls @ theta)  # NaN (no NVLS): the ring
        if rnd == 0:
            new = m > HOST_SPLIT * sync
        else:
            host_s = {str(d): float(np.median(m[host & (devices == d)]))
                      for d in sorted(set(devices[host]))}
            period = np.asarray([host_s.get(str(d), np.inf) for d in devices])
            new = np.abs(np.log(np.maximum(sync, period) / m)) < np.abs(np.log(sync / m))
        if rnd > 1 and (new == host).all():
            break
        host = new
    return theta, host_s, host


def fit_all_reduce(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    """The TP all-reduce's factors as shipped: fitted on Vidur's points (the defaults'
    sample). The fit on every source's points, and each source priced by the other's fit,
    are workflows/opsources.py's `union_fit` and `leave_one_source_out`."""
    return all_reduce_modes([p for p in points if p.source == VIDUR], eff).factors


def _send_terms(ps: Sequence[Point], eff: Efficiency) -> tuple[np.ndarray, np.ndarray]:
    """Per two-node send/recv point: the seconds its bytes take over its device's catalog
    NIC at `link_eff` (its price less `p2p_net_s`), and its measured seconds."""
    x = np.asarray([predict(p, eff.override({"p2p_net_s": 0.0})) for p in ps])
    return x, np.asarray([p.measured_s for p in ps])


def _log_cost(pred: np.ndarray, m: np.ndarray) -> float:
    return float(np.abs(np.log(pred / m)).sum())


def _nic_scale(base: float, x: np.ndarray, m: np.ndarray) -> float:
    """The factor k on the catalog NIC's time (the testbed's NIC runs at catalog / k) that
    prices these sends best at per-call `base`."""
    return _search(lambda k: _log_cost(base + k * x, m), 0.1, 10.0, 0.01)


def calibrate_nic(points: Sequence[Point], eff: Efficiency) -> float:
    """The NIC GB/s (`DeviceType.nic_gbs`) that prices one device's two-node send/recv
    points best at `eff` (least sum of |log(predicted / measured)|): a cluster's network as a
    user calibrates it, a property of that cluster and not a catalog default."""
    ps = [p for p in points if p.cls == "send_recv" and p.per_node == 1]
    devices = {p.device for p in ps}
    if len(devices) != 1:
        raise ValueError(f"calibrate_nic: the points must be one device's, got {sorted(devices)}")
    x, m = _send_terms(ps, eff)
    return shipped_devices()[devices.pop()].nic_gbs / _nic_scale(eff.p2p_net_s, x, m)


def fit_send_recv(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    """`p2p_net_s` on the two-node send/recv points, minimising the sum of |log(predicted /
    measured)| (a grid of 0.5 us, then a golden-section search) with each device's pair on
    its own testbed's NIC (`calibrate_nic`, refitted at every trial value): the network rate
    is that cluster's setting, so a testbed whose NIC runs below the catalog's (Vidur's A100
    pair: ~9.6 GB/s of 25) does not pass its shortfall into the per-call time. Priced on
    the catalog NICs instead, the fit gives 23.5 us; on each pair's own, 20.4 us."""
    ps = [p for p in points if p.cls == "send_recv" and p.per_node == 1]
    groups = [_send_terms([p for p in ps if p.device == d], eff)
              for d in sorted({p.device for p in ps})]

    def cost(base: float) -> float:
        return sum(_log_cost(base + _nic_scale(base, x, m) * x, m) for x, m in groups)

    return {"p2p_net_s": _search(cost, 0.0, 100e-6, 0.5e-6)}


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
    return {**layers, **fit_all_reduce(points, eff), **fit_send_recv(points, eff),
            **fit_attention(points, eff.override(layers))}


def fit_layers(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    """The layer classes' factors alone (prefill and decode): what a held-out model refits."""
    return {**fit_prefill(points, eff), **fit_decode(points, eff)}
