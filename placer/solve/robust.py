"""Choosing among plans under the cost model's error band, and what the choice is sensitive to.

The alternatives are the ones `placer compare` lines up: the ILP's plan and every baseline's
(`placer.solve.baselines`), each assembled with its band (`assemble.error_band`). Two plans of
different shapes (colocated against split, H100 against H20) are compared with different
published runs, so their bands differ in width, and the plan with the best prediction need not
be the one with the best worst case.

- `ranks`: each plan's rank by predicted time, by the band's low end and by its high end.
- `robust_choice`: the plan whose band upper end (`hi`) is smallest (ties: the faster
  prediction, then the order given), recorded in the plan's `choice` with the plan the
  predicted-time rule would have picked.
- `sensitivity`: the chosen plan and the runner-up re-priced as fixed placements
  (`assemble.reprice`, no re-solving) at the ends of each input's plausible range: the length
  distributions' parameters +-`LENGTH_SPREAD`, and the efficiency-factor ranges the caller
  gives (`placer plan` gives the row factors' leave-one-out ranges,
  `placer.cost.factor_ranges`). An input whose end makes the other plan the faster is a flip,
  reported with both times.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.assemble import reprice
from placer.solve.baselines import baseline_assignments
from placer.solve.planfile import Choice, Plan
from placer.solve.planner import build_problem, plan_assignment
from placer.spec.distributions import Distribution
from placer.spec.job import Job

LENGTH_SPREAD = 0.25  # a length parameter's plausible range: its value x (1 -+ this)
RANK_KEYS = ("predicted", "lo", "hi")


def alternatives(px: Pricer, ilp: Plan, objective: str | None = None) -> dict[str, Plan | None]:
    """The ILP's plan (given) and every baseline's on the same cost table (None: a baseline that
    does not apply to the job), in `baselines.BASELINES` order after "ilp"."""
    problem = build_problem(px, objective)
    out: dict[str, Plan | None] = {"ilp": ilp}
    for name, a in baseline_assignments(problem).items():
        out[name] = None if a is None else plan_assignment(problem, a, name)
    return out


def _figures(p: Plan) -> dict[str, float]:
    lo, hi = p.predicted_iteration_s_band or (p.predicted_iteration_s,) * 2
    return {"predicted": p.predicted_iteration_s, "lo": lo, "hi": hi}


def ranks(plans: Mapping[str, Plan | None]) -> dict[str, dict[str, int]]:
    """Per applicable plan, its rank (1 = fastest) by predicted time, band low and band high
    end; equal figures share a rank (1 + how many are strictly smaller)."""
    figs = {n: _figures(p) for n, p in plans.items() if p is not None}
    return {n: {k: 1 + sum(g[k] < f[k] for g in figs.values()) for k in RANK_KEYS}
            for n, f in figs.items()}


def _order(plans: Mapping[str, Plan | None], key: str) -> list[str]:
    """Applicable plans by `key` (then predicted time, then the order given)."""
    names = list(plans)
    figs = {n: _figures(p) for n, p in plans.items() if p is not None}
    return sorted(figs, key=lambda n: (figs[n][key], figs[n]["predicted"], names.index(n)))


def robust_choice(plans: Mapping[str, Plan | None]) -> tuple[str, Plan]:
    """(name, plan) of the alternative with the smallest band upper end, the plan carrying a
    `choice` that names it, the alternatives and the predicted-time rule's pick with its band."""
    robust, plain = _order(plans, "hi")[0], _order(plans, "predicted")[0]
    chosen, fastest = plans[robust], plans[plain]
    assert chosen is not None and fastest is not None
    f = _figures(fastest)
    choice = Choice(rule="robust", chosen=robust,
                    candidates=[n for n, p in plans.items() if p is not None], plain=plain,
                    plain_predicted_s=f["predicted"], plain_band=(f["lo"], f["hi"]))
    return robust, chosen.model_copy(update={"choice": choice})


def runner_up(plans: Mapping[str, Plan | None], chosen: str) -> str | None:
    """The next plan by band upper end that is placed differently from `chosen` (None: none)."""
    mine = plans[chosen]
    assert mine is not None
    for n in _order(plans, "hi"):
        p = plans[n]
        if n != chosen and p is not None and (p.roles, p.slots) != (mine.roles, mine.slots):
            return n
    return None


@dataclass(frozen=True)
class Flip:
    """An input's range end at which the other of two plans is the faster: the input, the
    value there, and both plans' re-priced times."""

    input: str
    nominal: float
    value: float
    chosen_s: float
    other_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input, "nominal": self.nominal, "value": self.value,
                "chosen_s": self.chosen_s, "other_s": self.other_s}


def length_inputs(job: Job) -> dict[str, tuple[float, float, float]]:
    """input name -> (nominal, low end, high end) for every length distribution parameter
    (e.g. `lengths.response.median`): +-LENGTH_SPREAD; a sigma or std is a parameter too."""
    out: dict[str, tuple[float, float, float]] = {}
    for where, d in (("prompt", job.lengths.prompt), ("response", job.lengths.response)):
        names = {"fixed": ("value",), "normal": ("mean", "std"),
                 "lognormal": ("median", "sigma")}.get(d.kind, ())
        for n in names:
            v = getattr(d, n)
            if v:  # a zero std or sigma has no range to scale
                out[f"lengths.{where}.{n}"] = (v, v * (1 - LENGTH_SPREAD), v * (1 + LENGTH_SPREAD))
    return out


def _with_length(job: Job, name: str, value: float) -> Job:
    _, where, param = name.split(".")
    d: Distribution = getattr(job.lengths, where)
    if param in ("value", "mean", "median"):
        value = max(value, d.min)  # a centre below the distribution's floor means the floor
    lengths = job.lengths.model_copy(update={where: d.model_copy(update={param: value})})
    return job.model_copy(update={"lengths": lengths})


def _with_factor(calib: Calibration, name: str, value: float) -> Calibration:
    """`calib` with one efficiency factor set on every device type."""
    return replace(calib, default=calib.default.override({name: value}),
                   per_device={k: e.override({name: value}) for k, e in calib.per_device.items()},
                   written=None)


def sensitivity(chosen: Plan, other: Plan, calib: Calibration,
                factor_ranges: Mapping[str, tuple[float, float]] | None = None) -> list[Flip]:
    """The input range ends at which `other` and `chosen` swap which is faster than the other
    (re-priced fixed placements; see the module docstring). `factor_ranges`: efficiency factor
    -> (low, high), each set on every device type in turn."""
    job = chosen.spec

    def times(j: Job, c: Calibration) -> tuple[float, float]:
        return reprice(chosen, j, c).iteration_s, reprice(other, j, c).iteration_s

    base = times(job, calib)
    ahead = base[0] <= base[1]
    flips: list[Flip] = []
    for name, (nominal, lo, hi) in length_inputs(job).items():
        for v in (lo, hi):
            t = times(_with_length(job, name, v), calib)
            if (t[0] <= t[1]) != ahead:
                flips.append(Flip(name, nominal, v, *t))
    for name, (lo, hi) in (factor_ranges or {}).items():
        nominal = getattr(calib.default, name)
        for v in (lo, hi):
            t = times(job, _with_factor(calib, name, v))
            if (t[0] <= t[1]) != ahead:
                flips.append(Flip(f"efficiency.{name}", nominal, v, *t))
    return flips
