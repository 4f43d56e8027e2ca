"""The all-reduce class by public source: does the TP all-reduce's latency-bandwidth model hold on
measurements its factors were not fitted on?

Two sources time the same NCCL collective inside a node in different harnesses:

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
              Held out from the shipped factors. A graph replay is the collective alone, as a
              step that issues its collectives ahead of the GPU pays it; an eager small call is
              paced by the host launching N kernels (the ~23 us floor): the same harness mode
              as Vidur's host-bound kernels, here in every small call rather than in stretches.

Per source (`by_source`): the errors at the given factors over every point, per launch mode,
and over the points priced at or above their harness's host period (the price is the
prediction there: the GPU, not a host, is the bottleneck). A host period is a property of the
harness, not a pricing factor: it comes from that source's own points
(`opfit.all_reduce_modes` keyed by `harness`). `leave_one_source_out` prices each source with
the four factors fitted on the other's points; `union_fit` fits them on both (in-sample).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from placer.cost.efficiency import Efficiency
from workflows.opdata import SOURCES, VIDUR, Point, predict
from workflows.opfit import all_reduce_modes
from workflows.opmodes import errors

FACTORS = ("tp_base_s", "tp_hop_s", "nvls_base_s", "tp_link_eff")


def harness(p: Point) -> str:
    """The harness whose host launch period a point may wait out: source, launch mode, device."""
    return f"{p.source} {p.launch} {p.device}"


def _all_reduce(points: Sequence[Point], source: str | None = None) -> list[Point]:
    return [p for p in points
            if p.cls == "all_reduce" and (source is None or p.source == source)]


def host_periods(points: Sequence[Point], eff: Efficiency) -> dict[str, float]:
    """Each harness's host launch period, from its own points (`all_reduce_modes`)."""
    out: dict[str, float] = {}
    for src in SOURCES:
        ps = _all_reduce(points, src)
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
    """|error| of the prices `price` of `ps`: every point, each launch mode, and the points
    priced at or above their harness's host period."""
    err = [abs(t / p.measured_s - 1) for t, p in zip(price, ps, strict=True)]
    out = {"all_points": errors(err)}
    for launch in sorted({p.launch for p in ps}):
        out[f"{launch} launch"] = errors([e for e, p in zip(err, ps, strict=True)
                                          if p.launch == launch])
    out["priced_at_or_above_host_period"] = errors(
        [e for e, t, p in zip(err, price, ps, strict=True) if t >= period.get(harness(p), 0.0)])
    return out


def by_source(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """Each source's all-reduce points at `eff` (the shipped factors: fitted on Vidur's)."""
    period = host_periods(points, eff)
    return {src: {"factors_fitted_on_it": src == VIDUR,
                  **source_errors(_all_reduce(points, src), eff, period)}
            for src in SOURCES if _all_reduce(points, src)}


def leave_one_source_out(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """Each source priced by the four factors fitted on the other sources' points (held out);
    host periods, a property of each harness, from the priced source's own points."""
    period = host_periods(points, eff)
    out: dict[str, Any] = {}
    for src in SOURCES:
        test = _all_reduce(points, src)
        train = [p for p in _all_reduce(points) if p.source != src]
        if not test or not train:
            continue
        factors = all_reduce_modes(train, eff, harness).factors
        out[src] = {"fitted_on": sorted({p.source for p in train}), "factors": factors,
                    **source_errors(test, eff.override(factors), period)}
    return out


def union_fit(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """The four factors fitted on every source's points, next to the shipped ones, and each
    source's errors at them (in-sample)."""
    factors = all_reduce_modes(_all_reduce(points), eff, harness).factors
    period = host_periods(points, eff)
    fitted = eff.override(factors)
    return {"factors": {k: {"shipped": getattr(eff, k), "union": factors[k]} for k in FACTORS},
            **{src: source_errors(_all_reduce(points, src), fitted, period)
               for src in SOURCES if _all_reduce(points, src)}}


def study(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """The `all_reduce_sources` section of `python -m workflows.operators --json`."""
    return {"host_period_s": host_periods(points, eff),
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
    """The text lines: held out first (the shipped factors on nccl-tests, each source from
    the other's fit), then the in-sample figures."""
    periods = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in doc["host_period_s"].items())
    out = [f"all_reduce by source (host launch periods, from each harness's own points: "
           f"{periods}):"]
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
    out.append("  fitted on both sources (in-sample): " + ", ".join(
        f"{k} {v['shipped']:.4g} -> {v['union']:.4g}" for k, v in u["factors"].items()))
    for src in (s for s in u if s != "factors"):
        out.append(f"  {src} at the union fit (in-sample):")
        out += _block(u[src])
    return out
