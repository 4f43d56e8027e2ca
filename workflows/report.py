"""A fidelity report: every quantity measured in a run against the simulator's number for it.

Typed, with a JSON form: `Report.to_dict()` is the document `placer fidelity --json` prints
(seconds to 6 decimals, errors to 4), `Report.from_dict()` reads one back. The JSON form rounds,
so a report read back equals the one written when its numbers were already at that precision
(and always writes the same document again).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pair:
    """One quantity, measured and simulated; error = simulated / measured - 1."""

    measured: float
    simulated: float

    @property
    def error(self) -> float | None:
        return None if self.measured <= 0 else self.simulated / self.measured - 1.0

    def to_dict(self) -> dict[str, Any]:
        err = self.error
        return {"measured_s": round(self.measured, 6), "simulated_s": round(self.simulated, 6),
                "error": None if err is None else round(err, 4)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Pair:
        return cls(d["measured_s"], d["simulated_s"])


Point = tuple[int, float, float]  # (step, response tokens, finish seconds after the rollout began)


@dataclass(frozen=True)
class LengthRelation:
    """Per sample, response tokens against when its generation finished: the rollout's
    makespan (mean over steps of the last finish), the least-squares slope in seconds per
    response token, and the points (None when there is no sample)."""

    makespan_s: float
    slope_s_per_token: float
    samples: int
    points: tuple[Point, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"makespan_s": self.makespan_s,
                               "slope_s_per_token": self.slope_s_per_token,
                               "samples": self.samples}
        if self.points is not None:
            out["points"] = [list(p) for p in self.points]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LengthRelation:
        pts = d.get("points")
        return cls(d["makespan_s"], d["slope_s_per_token"], d["samples"],
                   None if pts is None else tuple((int(s), x, t) for s, x, t in pts))


@dataclass(frozen=True)
class Lengths:
    """The length relation of the executed run and of its simulation (steady steps)."""

    measured: LengthRelation
    simulated: LengthRelation

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured.to_dict(), "simulated": self.simulated.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Lengths:
        return cls(LengthRelation.from_dict(d["measured"]),
                   LengthRelation.from_dict(d["simulated"]))


@dataclass(frozen=True)
class ReplayInputs:
    """What the simulation replayed: the run's samples and steps, what the trace did not say
    (notes) and which calibration priced it ("given", or "the plan's own")."""

    samples_replayed: int
    steps: int
    notes: tuple[str, ...]
    calibration: str

    def to_dict(self) -> dict[str, Any]:
        return {"samples_replayed": self.samples_replayed, "steps": self.steps,
                "notes": list(self.notes), "calibration": self.calibration}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplayInputs:
        return cls(d["samples_replayed"], d["steps"], tuple(d["notes"]), d["calibration"])


@dataclass(frozen=True)
class Report:
    job: str
    predicted_s: float  # the plan's (cost model's) iteration time
    steps: dict[int, Pair]
    steady: list[int]  # steps in the steady mean
    stages: dict[str, Pair]
    roles: dict[str, Pair]
    lengths: Lengths
    inputs: ReplayInputs | None = None  # what the simulation replayed (JSON: {} when unknown)

    @property
    def step(self) -> Pair:
        """Mean step time over the steady steps."""
        ms = [self.steps[s].measured for s in self.steady]
        ss = [self.steps[s].simulated for s in self.steady]
        return Pair(sum(ms) / len(ms), sum(ss) / len(ss))

    def line(self) -> str:
        """The one-line summary `make demo` prints."""
        st = self.step
        pred_err = self.predicted_s / st.measured - 1 if st.measured > 0 else float("nan")
        return (f"fidelity {self.job}: step time predicted {self.predicted_s:.3f} s "
                f"({pred_err:+.1%}) | simulated {st.simulated:.3f} s ({st.error:+.1%}) | "
                f"measured {st.measured:.3f} s (mean of steps "
                f"{','.join(map(str, self.steady))})")

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (`placer fidelity --json`); `step` is the steady mean."""
        return {"job": self.job, "predicted_s": round(self.predicted_s, 6),
                "step": self.step.to_dict(), "steady_steps": self.steady,
                "steps": {str(k): v.to_dict() for k, v in sorted(self.steps.items())},
                "stages": {k: v.to_dict() for k, v in self.stages.items()},
                "roles": {k: v.to_dict() for k, v in sorted(self.roles.items())},
                "lengths": self.lengths.to_dict(),
                "inputs": {} if self.inputs is None else self.inputs.to_dict()}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        """The report a `to_dict()` document describes (its `step` is recomputed)."""
        return cls(d["job"], d["predicted_s"],
                   {int(k): Pair.from_dict(v) for k, v in d["steps"].items()},
                   list(d["steady_steps"]),
                   {k: Pair.from_dict(v) for k, v in d["stages"].items()},
                   {k: Pair.from_dict(v) for k, v in d["roles"].items()},
                   Lengths.from_dict(d["lengths"]),
                   ReplayInputs.from_dict(d["inputs"]) if d["inputs"] else None)

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))

    def table(self) -> list[str]:
        def row(name: str, p: Pair) -> str:
            err = "-" if p.error is None else f"{p.error:+.1%}"
            return f"  {name:<26} {p.measured:>10.4f} {p.simulated:>10.4f} {err:>8}"
        out = [f"  {'':<26} {'measured':>10} {'simulated':>10} {'error':>8}"]
        out += [row(f"step {k}" + ("" if k in self.steady else " (warm-up)"), v)
                for k, v in sorted(self.steps.items())]
        out.append(row("step (steady mean)", self.step))
        out += [row(f"stage {k}", v) for k, v in self.stages.items()]
        out += [row(f"role {k}", v) for k, v in sorted(self.roles.items())]
        lm, ls = self.lengths.measured, self.lengths.simulated
        out.append(row("rollout makespan", Pair(lm.makespan_s, ls.makespan_s)))
        out.append(f"  {'s per response token':<26} {lm.slope_s_per_token:>10.3g} "
                   f"{ls.slope_s_per_token:>10.3g}")
        return out
