"""Fit the cost model's named efficiency factors to an executed (or simulated) trace.

For a fixed event, every time the cost model prices is an affine function of a few unknowns: the
reciprocals of the efficiency factors (theta = 1/factor) and the additive overheads (theta =
seconds),

    pred_i(theta) = fixed_i + sum_k a_ik * theta_k

where a_ik = pred_i(theta_k = 1, other unknowns off) - fixed_i and fixed_i = pred_i(all unknowns
off) ("off": a factor at +inf, an overhead at 0; every other factor at its prior value). The
coefficients are found by probing `placer.cost.model` itself, so the fit never re-derives a
formula. The unknowns come in groups by the kind of event (`fit_events.GROUPS`: collective,
fitted first; inference; train; transfer; checkpoint), per device type. A decode event's steps
are compute-bound up to some step j and memory-bound after it; j is found at the current
estimate and the fit is repeated until no event's split moves.

Method: weighted least squares, each equation divided by its measured time (minimize
sum_i ((pred_i(theta) - y_i) / y_i)^2), so a 10 s event does not drown a 10 ms one. An unknown is
fitted only when at least `min_events` events give it a term of >= 1% of their time; every
subset of the candidate unknowns is solved and the largest whose solution is physical (factors >
0, overheads >= 0) and well conditioned wins; the others keep their prior, with the reason.
Reported per factor: value, prior, events, relative RMS of the residuals over its events, and
the relative standard error from the least-squares covariance.

Also here: the rule rewards' per-sample factors (placer/calibrate/fit_rule.py), the tool
latencies as a lognormal (maximum likelihood on the logs, with its Kolmogorov-Smirnov distance),
and an executed trace's `host_cores`. Each group's formulas and what `placer calibrate` leaves at
its prior: docs/cost-model.md, "Calibration"; how an event is priced: placer/calibrate/fit_events.py.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from placer.base.errors import SpecError
from placer.calibrate.fit_events import (
    FIRST_GROUPS,
    GROUP_OF,
    GROUPS,
    INV,
    OPTIONAL,
    OWN_TIMING,
    DecodeRun,
    EventContext,
    GenerateRun,
    price_event,
    probe_variants,
    switch_off,
)
from placer.calibrate.fit_rule import fit_rule_factors
from placer.cost.efficiency import SECTIONS, Calibration, Efficiency, FitReport, Overrides
from placer.solve.planfile import Plan, calibration_of
from traces.schema import Trace, TraceEvent

FITTED_CATEGORIES = (*GROUP_OF, "tool")
MIN_SHARE = 0.01  # an unknown is supported by an event when its term is >= 1% of the event's time
MAX_COND = 1e8  # condition number above which a subset of unknowns is not identifiable
MEASURED = "measured: the trace's metadata says it"  # host_cores (placer.cost.efficiency)


@dataclass(frozen=True)
class Row:
    """One event as an equation: measured ~ fixed + sum_k coef[k] * theta_k."""

    category: str
    device: str
    measured: float
    fixed: float
    coef: dict[str, float]
    split: int = -1  # decode: steps that are compute-bound (a prefix); -1 for other events


@dataclass(frozen=True)
class FactorFit:
    device: str
    name: str
    value: float
    prior: float
    events: int
    rel_rms: float | None
    rel_stderr: float | None
    status: str  # "fitted" or "prior: <why it kept its prior value>"

    def to_dict(self) -> dict[str, Any]:
        return {"value": _sig(self.value), "prior": _sig(self.prior), "events": self.events,
                "rel_rms": _sig(self.rel_rms), "rel_stderr": _sig(self.rel_stderr),
                "status": self.status}


@dataclass(frozen=True)
class ToolFit:
    distribution: dict[str, Any]
    events: int
    ks: float
    mean_measured_s: float
    mean_fitted_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"distribution": self.distribution, "events": self.events, "ks": _sig(self.ks),
                "mean_measured_s": _sig(self.mean_measured_s),
                "mean_fitted_s": _sig(self.mean_fitted_s)}


@dataclass(frozen=True)
class FitResult:
    factors: list[FactorFit]
    groups: dict[str, dict[str, Any]]  # "device/group" -> events, rel_rms
    tool: ToolFit | None
    skipped: dict[str, int]  # why -> events not used
    counts: dict[str, int]  # "category@device" -> events

    def fitted(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for f in self.factors:
            if f.status in ("fitted", MEASURED):
                out.setdefault(f.device, {})[f.name] = _sig(f.value)
        return out


@overload
def _sig(x: float, digits: int = 6) -> float: ...
@overload
def _sig(x: None, digits: int = 6) -> None: ...
@overload
def _sig(x: float | None, digits: int = 6) -> float | None: ...
def _sig(x: float | None, digits: int = 6) -> float | None:
    """`x` to `digits` significant digits (None stays None)."""
    return None if x is None else float(f"{x:.{digits}g}")


def _probe(f: Callable[[Efficiency], float], eff: Efficiency, unknowns: list[str]
           ) -> tuple[float, dict[str, float]]:
    """(fixed, coef): f's affine form in the unknowns around `eff` (see the docstring)."""
    base, *ones = probe_variants(eff, tuple(unknowns))
    fixed = f(base)
    return fixed, {n: f(one) - fixed for n, one in zip(unknowns, ones)}


def _row(category: str, device: str, measured: float, f: Callable[[Efficiency], float],
         eff: Efficiency) -> Row:
    unknowns = [n for n, _ in GROUPS[GROUP_OF[category]]]
    if not isinstance(f, (DecodeRun, GenerateRun)):
        fixed, coef = _probe(f, eff, unknowns)
        return Row(category, device, measured, fixed, coef)
    j, parts = f.parts(eff)
    fixed, coef = 0.0, {n: 0.0 for n in unknowns}
    for part, drop in parts:  # each part probed with the other side of max() switched off
        names = [n for n in unknowns if n != drop]
        part_fixed, part_coef = _probe(part, switch_off(eff, [drop]) if drop else eff, names)
        fixed += part_fixed
        for n, v in part_coef.items():
            coef[n] += v
    return Row(category, device, measured, fixed, coef, j)


Priced = tuple[int, TraceEvent, str, Callable[[Efficiency], float]]  # index, event, device, time


def build_rows(events: list[Priced], eff: Efficiency) -> list[Row]:
    return [_row(ev.cat, name, ev.dur_s, f, eff) for _, ev, name, f in events]


def _theta(eff: Efficiency, name: str, kind: str) -> float:
    v = float(getattr(eff, name))
    return 1.0 / v if kind == INV else v


def solve(rows: list[Row], group: str, prior: Efficiency, min_events: int
          ) -> tuple[dict[str, float], dict[str, str], np.ndarray, np.ndarray | None, list[str]]:
    """Weighted least squares over the best subset of supported unknowns.

    Returns (theta by unknown, why-not by unknown held at prior, relative residuals,
    covariance of the fitted thetas or None, fitted names in covariance order).
    """
    spec = GROUPS[group]
    names = [n for n, _ in spec]
    theta0 = {n: _theta(prior, n, k) for n, k in spec}
    y = np.array([r.measured for r in rows])
    A = np.array([[r.coef.get(n, 0.0) for n in names] for r in rows]) / y[:, None]
    rhs = (y - np.array([r.fixed for r in rows])) / y
    # a probe's or a checkpoint's events exist to time their unknown (the collective probe: all
    # latency, on a slow transport 100x the prior's; a checkpoint's fixed cost: a prior of 0):
    # each supports it, whatever the prior's share
    share = {n: (1.0 if group in OWN_TIMING else theta0[n]) for n in names}
    support = {n: int(np.sum(A[:, j] * share[n] >= MIN_SHARE)) for j, n in enumerate(names)}
    why = {n: f"prior: {support[n]} event(s) where it is >= {MIN_SHARE:.0%} of the time "
              f"(need {min_events})" for n in names if support[n] < min_events}
    cands = [n for n in names if n not in why]
    best = None
    for size in range(len(cands), 0, -1):
        for subset in itertools.combinations(cands, size):
            sol = _solve_subset(A, rhs, names, list(subset), theta0, spec)
            if sol is not None and (best is None or sol[1] < best[1]):
                best = sol
        if best is not None:
            break
    theta = dict(theta0)
    cov: np.ndarray | None = None
    fitted: list[str] = []
    if best is not None:
        values, _, fitted, cov = best
        theta.update(values)
    for n in cands:
        if n not in fitted:
            why[n] = "prior: not identifiable from these events (collinear, or a fit outside " \
                     "the physical range)"
    pred = A @ np.array([theta[n] for n in names])
    return theta, why, pred - rhs, cov, fitted


def _solve_subset(A: np.ndarray, rhs: np.ndarray, names: list[str], subset: list[str],
                  theta0: dict[str, float], spec: tuple[tuple[str, str], ...]
                  ) -> tuple[dict[str, float], float, list[str], np.ndarray] | None:
    """Least squares for the unknowns in `subset`, the others held at `theta0`: the values,
    the residual sum of squares, the subset and the covariance; None where the subset is
    under-determined, ill-conditioned or fits a negative (or, for an inverse, zero) value."""
    idx = [names.index(n) for n in subset]
    rest = [j for j in range(len(names)) if j not in idx]
    target = rhs - A[:, rest] @ np.array([theta0[names[j]] for j in rest])
    X = A[:, idx]
    if X.shape[0] <= len(idx):
        return None
    scale = np.linalg.norm(X, axis=0)
    if np.any(scale == 0) or np.linalg.cond(X / scale) > MAX_COND:
        return None
    sol, *_ = np.linalg.lstsq(X, target, rcond=None)
    kinds = dict(spec)
    for n, v in zip(subset, sol):
        if v < 0 or (kinds[n] == INV and v == 0):
            return None
    resid = X @ sol - target
    dof = X.shape[0] - len(idx)
    s2 = float(resid @ resid) / dof
    cov = s2 * np.linalg.inv(X.T @ X)
    return dict(zip(subset, map(float, sol))), float(resid @ resid), subset, cov


# ------------------------------------------------------------------------------ the whole fit
def _check_counts(source: str, counts: dict[str, int], min_events: int) -> None:
    """Refuse a kind of work (category on a device type) with too few events to fit it."""
    if not counts:
        raise SpecError(f"{source}: no events to fit: the trace has no "
                        f"{', '.join(FITTED_CATEGORIES)} events that a factor prices")
    few = {k: n for k, n in counts.items() if n < min_events}
    if few:
        listed = ", ".join(f"{k.replace('@', ' events on ')}: {n}" for k, n in sorted(few.items()))
        raise SpecError(f"{source}: too few events to fit ({listed}); need at least "
                        f"{min_events} of each kind (record more steps, or lower --min-events)")


def _fit_group(ctx: EventContext, device: str, group: str, events: list[Priced], min_events: int,
               known: dict[str, float] | None = None) -> tuple[list[FactorFit], dict[str, Any]]:
    """Fit one group's unknowns on one device type; `known`: factors fitted before (a
    `FIRST_GROUPS` group's), which the prior takes on."""
    prior = ctx.calib.for_device(ctx.res.devices[device]).override(known or {})
    current = prior
    splits: list[int] | None = None
    for _ in range(6):  # re-split decode events where the new estimate moves their regime
        rows = build_rows(events, current)
        theta, why, resid, cov, fitted = solve(rows, group, prior, min_events)
        current = _apply(prior, group, theta)
        now = [r.split for r in rows]
        if now == splits:
            break
        splits = now
    out = []
    for name, _ in GROUPS[group]:
        used = [k for k, r in enumerate(rows) if r.coef.get(name, 0.0) > 0]
        if not used:
            continue  # no event of this trace touches the factor: nothing to say about it
        supported = sum(1 for k in used
                        if rows[k].coef[name] * theta[name] >= MIN_SHARE * rows[k].measured)
        rms = se = None
        if name in fitted:
            assert cov is not None, "solve returns a covariance whenever it fitted a factor"
            rms = float(np.sqrt(np.mean(resid[used] ** 2)))
            k = fitted.index(name)
            se = float(math.sqrt(max(cov[k, k], 0.0)) / theta[name])
        out.append(FactorFit(device, name, getattr(current, name), getattr(prior, name),
                             supported, rms, se,
                             "fitted" if name in fitted else why.get(name, "prior")))
    summary = {"events": len(rows), "rel_rms": _sig(float(np.sqrt(np.mean(resid ** 2))))}
    return out, summary


def _apply(prior: Efficiency, group: str, theta: dict[str, float]) -> Efficiency:
    return prior.override({n: (1.0 / theta[n] if k == INV else theta[n])
                           for n, k in GROUPS[group]})


def _host_cores(trace: Trace, ctx: EventContext
                ) -> tuple[list[FactorFit], dict[str, dict[str, float]]]:
    """`host_cores` of the plan's host-backed device types from the trace's metadata
    (executors/run.py records the embedded cluster's cores; older traces `cpus`): known before
    any fit, since an oversubscribed host stretches every event the fit prices."""
    cores = trace.metadata.get("host_cores", trace.metadata.get("cpus"))
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        return [], {}
    factors, known = [], {}
    for dev in sorted({ctx.res.device_of(p).name for p in ctx.pools}):
        d = ctx.res.devices[dev]
        if d.host_backed:
            prior = ctx.calib.for_device(d).host_cores
            factors.append(FactorFit(dev, "host_cores", float(cores), prior, 0, None, None,
                                     MEASURED))
            known[dev] = {"host_cores": float(cores)}
    return factors, known


def fit_tool_latency(durations: list[float]) -> ToolFit:
    """Lognormal by the moments of the logs; KS distance to the empirical distribution."""
    x = np.sort(np.asarray([d for d in durations if d > 0], dtype=float))
    logs = np.log(x)
    mu, sigma = float(logs.mean()), float(logs.std())
    n = len(x)
    if sigma == 0.0:
        dist = {"kind": "fixed", "value": _sig(float(x[0]))}
        return ToolFit(dist, n, 0.0, float(x.mean()), float(x[0]))
    z = (logs - mu) / sigma
    cdf = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in z])
    ks = float(max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n)))
    dist = {"kind": "lognormal", "median": _sig(math.exp(mu)), "sigma": _sig(min(sigma, 10.0))}
    return ToolFit(dist, n, ks, float(x.mean()), math.exp(mu + sigma ** 2 / 2))


def fit_trace(trace: Trace, plan: Plan, source: str = "trace", min_events: int = 3) -> FitResult:
    """Fit every factor the trace's events support; SpecError on a kind with too few events."""
    if min_events < 2:
        raise SpecError(f"--min-events: need at least 2 events per kind (got {min_events})")
    ctx = EventContext(plan, source)
    by_key: dict[tuple[str, str], list[Priced]] = {}
    counts: dict[str, int] = {}
    skipped: dict[str, int] = {}
    tools: list[float] = []
    for i, ev in enumerate(trace.events):
        if ev.cat == "tool":
            if ev.dur_s > 0:
                tools.append(ev.dur_s)
            else:
                skipped["tool: zero duration"] = skipped.get("tool: zero duration", 0) + 1
            continue
        pr = price_event(ctx, i, ev) if ev.cat in GROUP_OF else None
        if pr is None:
            if ev.cat in GROUP_OF:
                why = f"{ev.cat}: no factor prices it (rule reward, no model, or no size)"
                skipped[why] = skipped.get(why, 0) + 1
            continue
        if ev.dur_s <= 0:  # nothing measured: no equation (and log-free, so no crash either)
            why = f"{ev.cat}: zero duration"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        by_key.setdefault((pr[0], GROUP_OF[ev.cat]), []).append((i, ev, pr[0], pr[2]))
        counts[f"{ev.cat}@{pr[0]}"] = counts.get(f"{ev.cat}@{pr[0]}", 0) + 1
    if tools:
        counts["tool"] = len(tools)
    for key in [k for k in by_key if k[1] in OPTIONAL]:  # too rare to fit: the prior stays
        n = len(by_key[key])
        if n < min_events:
            del by_key[key], counts[f"{key[1]}@{key[0]}"]
            why = f"{key[1]}: {n} on {key[0]}, fewer than {min_events}: prior kept"
            skipped[why] = skipped.get(why, 0) + n
    _check_counts(source, counts, min_events)
    factors, known = _host_cores(trace, ctx)
    groups = {}
    # the collective probe first: train and forward events then price their collectives at the
    # measured latency, so that their own fit does not absorb it into train_overhead_s
    for (device, group), evs in sorted(by_key.items(),
                                       key=lambda kv: (kv[0][1] not in FIRST_GROUPS, kv[0])):
        f, summary = _fit_group(ctx, device, group, evs, min_events, known.get(device))
        factors += f
        groups[f"{device}/{group}"] = summary
        if group in FIRST_GROUPS:
            known.setdefault(device, {}).update({x.name: x.value for x in f
                                                 if x.status == "fitted"})
    for dev, name, value, n, rel in fit_rule_factors(trace, plan, min_events):
        prior = getattr(ctx.calib.for_device(ctx.res.devices[dev]), name)
        factors.append(FactorFit(dev, name, value, prior, n, rel, rel / math.sqrt(n), "fitted"))
    tool = fit_tool_latency(tools) if tools else None
    return FitResult(factors, groups, tool, skipped, counts)


# ---------------------------------------------------------------------------------- profile
def fitted_calibration(result: FitResult, plan: Plan, provenance: Mapping[str, str]
                       ) -> Calibration:
    """The calibration profile of a fit: the plan's own calibration, with the fitted factors per
    device type on top, and a `fit` report (`FitReport`) that says where they came from
    (`provenance`: trace, plan, trace_source, method) and how good each one is."""
    prior = calibration_of(plan).overrides
    devices = {name: dict(v or {}) for name, v in (prior.devices or {}).items()}
    for dev, values in result.fitted().items():
        devices.setdefault(dev, {}).update(values)
    factors: dict[str, dict[str, Any]] = {}
    for f in result.factors:
        factors.setdefault(f.device, {})[f.name] = f.to_dict()
    fit: dict[str, Any] = {**provenance, "counts": dict(sorted(result.counts.items())),
                           "factors": factors, "groups": result.groups}
    if result.tool is not None:
        fit["tool_latency_s"] = result.tool.to_dict()
    if result.skipped:
        fit["skipped"] = dict(sorted(result.skipped.items()))
    return Calibration.of(Overrides(dict(prior.default or {}), devices, SECTIONS),
                          FitReport.from_dict(fit))
