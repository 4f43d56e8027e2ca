"""Can the all-reduce kernels' two modes be predicted? Vidur's harness times rank 0's NCCL kernels
in a burst of eager calls (vidur/profiling/collectives/collectives_wrapper.py: a barrier, then a
kineto-profiled burst of 11 `all_reduce` calls, the median kernel kept). A kernel is the
collective itself where rank 0 issues its call after its peers, or lasts a peer's host launch
period where rank 0 runs ahead (`opfit.all_reduce_modes`). A plan prices the first: a step
issues its collectives ahead of the GPU. The class figure (`workflows.operators`) covers every
point at that price, and misses its p90 goal on the points in the second mode.

This module asks whether anything the planner knows (device, rank count, message size) picks
the mode, on Vidur's dense sweep (all_reduce_sweep.csv: ~350 sizes per node group up to 8 MiB,
8 KiB apart to 1 MiB and 32 KiB above (vidur/profiling/utils `get_collectives_sizes_to_profile`,
swept in size order), each measured once, the class's 15 sizes among them):

  neighbour flips  two neighbouring sizes are the same collective to any model of size, rank
                   count and device; where their modes differ as often as two independent
                   draws would (2 p (1 - p) for a share p in the host mode), nothing smooth in
                   those inputs predicts the mode. Fewer flips than that: the mode runs in
                   stretches of consecutive measurements (Vidur sweeps sizes in order), a
                   state of the harness over time, still not of the inputs
  held out by size the sweep's other sizes are out of the sample the factors were fitted on
                   (the class's 15 sizes per group): their errors, over every point and over
                   the points priced at or above their device's host period (which the price
                   predicts: `operators.all_reduce_split`)
  by device        the factors fitted on one device's class points (`all_reduce_modes`)
                   predict the other's: A100 from H100 and H100 from A100 (an A100-only fit
                   sees no NVLS kernel, so the H100's NVLS per-call is NCCL's own tuner
                   figure, `collectives.NCCL_NVLS_NVLINK_S`)
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from placer.cost.collectives import NCCL_NVLS_NVLINK_S
from placer.cost.efficiency import Efficiency
from workflows.opdata import VIDUR, Point, load, load_sweep, predict
from workflows.opfit import all_reduce_modes


def errors(errs: Sequence[float]) -> dict[str, Any]:
    """n, median and 90th percentile (linear interpolation) of |error|, as the classes'."""
    if not len(errs):
        return {"n": 0, "median_abs_error": None, "p90_abs_error": None}
    return {"n": len(errs), "median_abs_error": float(np.median(errs)),
            "p90_abs_error": float(np.percentile(errs, 90))}


def _host_mode(price: float, period: float, measured: float) -> bool:
    """The mode nearer the measurement in log (`opfit.all_reduce_modes`' rule)."""
    return bool(abs(np.log(max(price, period) / measured)) < abs(np.log(price / measured)))


def group_modes(ps: Sequence[Point], eff: Efficiency, period: float,
                fit_sizes: set[int]) -> dict[str, Any]:
    """One (device, rank count) group of the sweep at `eff`, in size order: its points,
    those priced below `period`, their host-mode share and neighbour flip rate (and an
    independent draw's, 2 p (1 - p)), and |error| over every point, without the host mode,
    and over the points priced at or above `period` whose size is not in `fit_sizes`."""
    ps = sorted(ps, key=lambda p: p.size)
    price = np.asarray([predict(p, eff) for p in ps])
    m = np.asarray([p.measured_s for p in ps])
    err = np.abs(price / m - 1)
    below = price < period
    host = np.asarray([_host_mode(t, period, x) for t, x in zip(price, m, strict=True)])
    hb = host[below]
    share = float(hb.mean()) if hb.size else 0.0
    out_of_fit = np.asarray([p.size not in fit_sizes for p in ps])
    return {"n": len(ps), "below_period": int(below.sum()),
            "host_share_below_period": share,
            "neighbour_flip_rate": float((hb[1:] != hb[:-1]).mean()) if hb.size > 1 else 0.0,
            "independent_flip_rate": 2 * share * (1 - share),
            "all_points": errors(list(err)),
            "without_host_mode": errors(list(err[~host])),
            "priced_at_or_above_period_held_out_by_size": errors(
                list(err[~below & out_of_fit]))}


def sweep_study(eff: Efficiency) -> dict[str, Any]:
    """Per (device, rank count) group of the dense sweep and over all of them: the modes'
    share and neighbour flips, and the errors at `eff` over every point, without the
    host-mode points (selected by the measured time: for comparison), and held out by size
    over the points priced at or above their device's host period (the class fit's)."""
    _, points = load()
    ar = [p for p in points if p.cls == "all_reduce" and p.source == VIDUR]
    period = all_reduce_modes(ar, eff).host_s
    _, sweep = load_sweep()
    groups: dict[str, Any] = {}
    errs: dict[str, list[float]] = {"all_points": [], "without_host_mode": [], "held": []}
    for dev, n in sorted({(p.device, p.tp) for p in sweep}):
        ps = [p for p in sweep if p.device == dev and p.tp == n]
        fit = {p.size for p in ar if p.device == dev and p.tp == n}
        g = group_modes(ps, eff, period[dev], fit)
        groups[f"{dev} x{n}"] = g
        for p in ps:
            t, e = predict(p, eff), abs(predict(p, eff) / p.measured_s - 1)
            errs["all_points"].append(e)
            if not _host_mode(t, period[dev], p.measured_s):
                errs["without_host_mode"].append(e)
            if t >= period[dev] and p.size not in fit:
                errs["held"].append(e)
    return {"groups": groups, "host_period_s": period,
            "all_points": errors(errs["all_points"]),
            "without_host_mode": errors(errs["without_host_mode"]),
            "priced_at_or_above_period_held_out_by_size": errors(errs["held"])}


def device_held_out(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """Each device's class points priced by the all-reduce factors fitted on the other
    device's (`all_reduce_modes`): over every point, over those priced at or above the
    device's own host period (a property of the harness's host, not a pricing factor: from
    the device's own points), and without its host-mode points (selected by the measured
    time, for comparison)."""
    ar = [p for p in points if p.cls == "all_reduce" and p.source == VIDUR]
    out: dict[str, Any] = {}
    pooled: dict[str, list[float]] = {"all": [], "gpu": [], "sync": []}
    for dev in sorted({p.device for p in ar}):
        train, test = [p for p in ar if p.device != dev], [p for p in ar if p.device == dev]
        factors = dict(all_reduce_modes(train, eff).factors)
        if not any(p.device == "H100-SXM" for p in train):
            factors["nvls_base_s"] = NCCL_NVLS_NVLINK_S  # no NVLS kernel to fit it on
        priced = eff.override(factors)
        period = all_reduce_modes(test, eff).host_s[dev]
        errs: dict[str, list[float]] = {"all": [], "gpu": [], "sync": []}
        for p in test:
            t = predict(p, priced)
            e = abs(t / p.measured_s - 1)
            errs["all"].append(e)
            if t >= period:
                errs["gpu"].append(e)
            if not _host_mode(t, period, p.measured_s):
                errs["sync"].append(e)
        for k, v in errs.items():
            pooled[k] += v
        out[dev] = {"fitted_on": sorted({p.device for p in train}),
                    "factors": factors, **_labelled(errs)}
    out["both"] = _labelled(pooled)
    return out


def _labelled(errs: dict[str, list[float]]) -> dict[str, Any]:
    return {"all_points": errors(errs["all"]),
            "priced_at_or_above_period": errors(errs["gpu"]),
            "without_host_mode": errors(errs["sync"])}


def _line(name: str, c: dict[str, Any]) -> str:
    if not c["n"]:
        return f"  {name:44s} n=0"
    return (f"  {name:44s} n={c['n']:<5d} median |error| {c['median_abs_error']:.1%}, "
            f"p90 {c['p90_abs_error']:.1%}")


def render_study(sweep: dict[str, Any], by_device: dict[str, Any]) -> list[str]:
    """The text lines: held out by device first, then the sweep."""
    out = ["all_reduce held out by device (factors fitted on the other device's points):"]
    for dev in (d for d in by_device if d != "both"):
        out.append(_line(f"{dev}, all points", by_device[dev]["all_points"]))
        out.append(_line(f"{dev}, priced >= host period",
                         by_device[dev]["priced_at_or_above_period"]))
        out.append(_line(f"{dev}, without host mode (by measured)",
                         by_device[dev]["without_host_mode"]))
    out.append("all_reduce dense sweep (sizes 8-32 KiB apart; host mode below the period: share, "
               "neighbour flips vs independent draws):")
    for name, g in sweep["groups"].items():
        out.append(f"  {name:14s} n={g['n']:<4d} below period {g['below_period']:<4d} host "
                   f"{g['host_share_below_period']:.0%}, flips {g['neighbour_flip_rate']:.0%} "
                   f"vs {g['independent_flip_rate']:.0%}; all points "
                   f"{g['all_points']['median_abs_error']:.1%} / "
                   f"{g['all_points']['p90_abs_error']:.1%}")
    out.append(_line("sweep, priced >= period, held out by size",
                     sweep["priced_at_or_above_period_held_out_by_size"]))
    out.append(_line("sweep, all points", sweep["all_points"]))
    out.append(_line("sweep, without host mode (by measured)", sweep["without_host_mode"]))
    return out



BANDS = (0, 2 ** 16, 2 ** 20, 2 ** 23, 2 ** 25, 2 ** 27)  # bytes: <=64 KiB ... <=128 MiB


def _band(size: int) -> str:
    hi = next(b for b in BANDS[1:] if size <= b)
    return f"<={hi // 2 ** 10} KiB" if hi < 2 ** 20 else f"<={hi // 2 ** 20} MiB"


def residual_table(points: Sequence[Point], eff: Efficiency) -> list[dict[str, Any]]:
    """The collectives' residuals (predicted / measured - 1) per device, rank count (send/recv:
    one node or two), and size band: points, median signed error, the band's extreme, and
    (all-reduce) how many lie nearer the host period than the price."""
    ar = [p for p in points if p.cls == "all_reduce" and p.source == VIDUR]
    period = all_reduce_modes(ar, eff).host_s
    cells: dict[tuple[str, str, int, str, str], list[tuple[float, bool]]] = {}
    for p in points:
        if p.cls not in ("all_reduce", "send_recv") or p.source != VIDUR:
            continue
        t = predict(p, eff)
        link = "2 nodes" if p.per_node == 1 else "1 node"
        host = p.cls == "all_reduce" and _host_mode(t, period[p.device], p.measured_s)
        key = (p.cls, p.device, p.tp, link, _band(p.size))
        cells.setdefault(key, []).append((t / p.measured_s - 1, host))
    out = []
    for (cls, dev, n, link, band), v in cells.items():
        e = np.asarray([x for x, _ in v])
        out.append({"cls": cls, "device": dev, "ranks": n, "link": link, "band": band,
                    "n": len(v), "median_error": float(np.median(e)),
                    "worst_error": float(e[np.argmax(np.abs(e))]),
                    "host_mode": sum(h for _, h in v)})
    return out


def render_residuals(table: Sequence[dict[str, Any]]) -> list[str]:
    out = [f"  {'class':10s} {'device':9s} {'ranks':>5s} {'link':7s} {'size':>10s} {'n':>3s} "
           f"{'median':>7s} {'worst':>7s} {'host mode':>9s}"]
    out += [f"  {r['cls']:10s} {r['device']:9s} {r['ranks']:5d} {r['link']:7s} {r['band']:>10s} "
            f"{r['n']:3d} {r['median_error']:+7.1%} {r['worst_error']:+7.1%} "
            f"{r['host_mode'] if r['cls'] == 'all_reduce' else '':>9}"
            for r in table]
    return out
