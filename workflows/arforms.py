"""Which bandwidth term should the TP all-reduce's price carry? Forms grounded in what NCCL runs
inside a node, each fitted on one public source and priced on the other (held out).

The shipped price (`placer.cost.layercomm.tp_all_reduce`) is the faster of a ring, moving
2 (n - 1) / n of the buffer per rank, and, on a device with NVLink SHARP, NVLS, moving the
buffer once whatever the rank count: both at one `tp_link_eff` of the NVLink rate. What
NCCL itself runs and how its tuner prices it (NVIDIA/nccl):

  * NVLS is off for a communicator of two or fewer GPUs up to NCCL 2.28
    (src/transport/nvls.cc `ncclNvlsInit`: `gpuCount <= 2`, e.g. v2.18.3-1 =
    ea38312273e5b9a19a224c9ff4c10b7fcf441eaf), allowed from two GPUs in 2.29
    (v2.29.2-1 = ebd1e929285881cb4df02c3459588a2e12b2d8c0: `gpuCount < 2`): a 2-rank call
    runs the ring in every 2-rank log here (Vidur's, nccl-tests' 2.18.3 scaling run).
  * The tuner gives NVLS its own bus bandwidth, `bwIntra` x `nvlsEfficiency` (0.85 on
    Hopper) x (nChannels - 1) / nChannels x 2 for an all-reduce, apart from the ring's
    (src/graph/tuning.cc, `ncclTopoTuneModel`, at v2.29.2-1).
  * Its conversion from bus to algorithm bandwidth: NCCL 2.18.3 multiplies NVLS by a fixed
    5/6 (the rate a call moves its buffer at does not depend on n: the shipped form); 2.29.2
    by nRanks / (2 (nRanks - 1)), as for the ring (tuning.cc, "Convert bus BW to algorithm
    BW"): the call's time grows with 2 (n - 1) / n.

Forms (`FORMS`): `shipped` (one efficiency, NVLS from two ranks: where ring and NVLS move the
same bytes the ring's smaller per-call cost wins, so it is the ring at two ranks too);
`nvls_eff` (a ring efficiency and a separate NVLS one, NVLS only above two ranks);
`nvls_busbw` (one efficiency, NVLS's time 2 (n - 1) / n of the buffer, 2.29's conversion);
`nvls_eff_busbw` (both). Each is fitted with `opfit.split_modes` (the shipped split of the
host-bound kernels) and scored as workflows/opsources.py scores the shipped one, on the two
in-node A100/H100 sources the study was made on (`FORM_SOURCES`; the later sources, H200/B200
nodes and runs across nodes, are held out against the shipped form in workflows/opsources.py).
`python -m workflows.arforms [--json]`.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from placer.cost.efficiency import Efficiency
from placer.spec.catalog import shipped_devices
from workflows.opdata import NCCL_TESTS, VIDUR, Point, load
from workflows.opfit import HOP_PER_BASE, split_modes
from workflows.opmodes import errors
from workflows.opsources import harness, host_periods, price_errors

FORM_SOURCES = (VIDUR, NCCL_TESTS)  # each fitted on the other


@dataclass(frozen=True)
class Form:
    """A linear price of the all-reduce in [tp_base_s, nvls_base_s, 1 / ring efficiency,
    1 / NVLS efficiency]: `separate_eff` False ties the two efficiencies; `nvls_min_ranks`
    the fewest ranks NVLS runs at; `nvls_bytes` the buffer fraction an NVLS call's time
    moves at n ranks."""

    separate_eff: bool
    nvls_min_ranks: int
    nvls_bytes: Callable[[int], float]


def _once(n: int) -> float:
    return 1.0


def _busbw(n: int) -> float:
    return 2 * (n - 1) / n


FORMS = {"shipped": Form(False, 2, _once), "nvls_eff": Form(True, 3, _once),
         "nvls_busbw": Form(False, 2, _busbw), "nvls_eff_busbw": Form(True, 3, _busbw)}


def rows(ps: Sequence[Point], form: Form) -> tuple[np.ndarray, np.ndarray]:
    """Per point the seconds one unit of each factor adds, as the ring and as NVLS (NaN
    where NVLS does not run): a ring call pays `tp_base_s` and 2 (n - 1) hops of
    `HOP_PER_BASE` x it, NVLS its own per-call cost."""
    devs = shipped_devices()
    ring, nvls = [], []
    for p in ps:
        dev, n = devs[p.device], p.tp
        at_eff1 = p.size / (dev.intra_link_gbs * 1e9)
        ring.append([1 + HOP_PER_BASE * 2 * (n - 1), 0.0, 2 * (n - 1) / n * at_eff1, 0.0])
        runs = dev.nvlink_sharp and n >= form.nvls_min_ranks
        nvls.append([0.0, 1.0, 0.0, form.nvls_bytes(n) * at_eff1] if runs else [np.nan] * 4)
    r, v = np.asarray(ring), np.asarray(nvls)
    if not form.separate_eff:
        r[:, 2] += r[:, 3]
        v[:, 2] += v[:, 3]
        r[:, 3] = v[:, 3] = 0.0
    return r, v


def fit(ps: Sequence[Point], form: Form, eff: Efficiency) -> np.ndarray:
    """The form's factors on `ps`, host-bound kernels split off per harness."""
    ring, nvls = rows(ps, form)
    theta0 = np.asarray([eff.tp_base_s, eff.nvls_base_s, 1 / eff.tp_link_eff,
                         1 / eff.tp_link_eff if form.separate_eff else 0.0])
    with np.errstate(invalid="ignore"):  # `nvls_busbw` on nccl-tests' points passes through
        theta, _, _ = split_modes(ring, nvls, np.asarray([p.measured_s for p in ps]),  # a
                                  [harness(p) for p in ps], theta0)  # negative price on the way
    return theta


def score(ps: Sequence[Point], form: Form, theta: np.ndarray,
          period: dict[str, float]) -> dict[str, Any]:
    """|error| of `ps` at the form's factors: every point, each launch mode, the points
    priced at or above their harness's host period, and the eager calls of 128 MiB and up
    by rank count (the bandwidth term alone)."""
    ring, nvls = rows(ps, form)
    price = np.fmin(ring @ theta, nvls @ theta)
    err = [abs(t / p.measured_s - 1) for t, p in zip(price, ps, strict=True)]
    out = price_errors(ps, [float(t) for t in price], period)
    for n in sorted({p.tp for p in ps}):
        out[f"{n} ranks, >= 128 MiB"] = errors(
            [e for e, p in zip(err, ps, strict=True) if p.tp == n and p.size >= 2 ** 27])
    return out


def factors(form: Form, theta: np.ndarray) -> dict[str, float]:
    """The fitted factors by name (`nvls_link_eff`: the separate NVLS efficiency)."""
    base, nvls_base, inv_ring, inv_nvls = (float(x) for x in theta)
    out = {"tp_base_s": base, "nvls_base_s": nvls_base, "tp_link_eff": 1 / inv_ring}
    if form.separate_eff:
        out["nvls_link_eff"] = 1 / inv_nvls
    return out


def study(points: Sequence[Point], eff: Efficiency) -> dict[str, Any]:
    """Per form: each source priced at the factors fitted on the other (held out)."""
    ar = [p for p in points if p.cls == "all_reduce"]
    period = host_periods(points, eff)
    out: dict[str, Any] = {}
    for name, form in FORMS.items():
        out[name] = {}
        for src in FORM_SOURCES:
            test = [p for p in ar if p.source == src]
            train = [p for p in ar if p.source != src and p.source in FORM_SOURCES]
            theta = fit(train, form, eff)
            out[name][src] = {"fitted_on": sorted({p.source for p in train}),
                              "factors": factors(form, theta),
                              **score(test, form, theta, period)}
    return out


def render(doc: dict[str, Any]) -> list[str]:
    """The text lines: per form, each source at the other's fit."""
    lines = ["all_reduce bandwidth forms, each source priced by the other's fit (held out):"]
    for name, by_src in doc.items():
        lines.append(f"  {name}:")
        for src, v in by_src.items():
            f = ", ".join(f"{k} {x * 1e6:.2f} us" if k.endswith("_s") else f"{k} {x:.3f}"
                          for k, x in v["factors"].items())
            lines.append(f"    {src} (fitted on {', '.join(v['fitted_on'])}: {f})")
            lines += [f"      {k:34s} n={c['n']:<3d} median {c['median_abs_error']:.1%}, "
                      f"p90 {c['p90_abs_error']:.1%}"
                      for k, c in v.items() if isinstance(c, dict) and c.get("n")]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workflows.arforms", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the study as JSON")
    args = ap.parse_args(argv)
    _, points = load()
    doc = study(points, Efficiency())
    print(json.dumps(doc, indent=1) if args.json else "\n".join(render(doc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
