"""A fidelity report: every quantity measured in a run against the simulator's number for it."""
from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass
class Report:
    job: str
    predicted_s: float  # the plan's (cost model's) iteration time
    steps: dict[int, Pair]
    steady: list[int]  # steps in the steady mean
    stages: dict[str, Pair]
    roles: dict[str, Pair]
    lengths: dict[str, Any]
    inputs: dict[str, Any] = field(default_factory=dict)  # what the simulation replayed

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
        return {"job": self.job, "predicted_s": round(self.predicted_s, 6),
                "step": self.step.to_dict(), "steady_steps": self.steady,
                "steps": {str(k): v.to_dict() for k, v in sorted(self.steps.items())},
                "stages": {k: v.to_dict() for k, v in self.stages.items()},
                "roles": {k: v.to_dict() for k, v in sorted(self.roles.items())},
                "lengths": self.lengths, "inputs": self.inputs}

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
        lm, ls = self.lengths["measured"], self.lengths["simulated"]
        out.append(row("rollout makespan", Pair(lm["makespan_s"], ls["makespan_s"])))
        out.append(f"  {'s per response token':<26} {lm['slope_s_per_token']:>10.3g} "
                   f"{ls['slope_s_per_token']:>10.3g}")
        return out
