"""The result of a simulation: its metrics (`simulator.metrics.SimMetrics`), the run's record,
the timeline of failures and checkpoints, and the plan it simulated; the Chrome trace is built
from it on first use."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from placer.solve.planfile import Plan
from simulator.faults import Timeline
from simulator.iteration import RunRecord
from simulator.metrics import SimMetrics, iteration_durations
from simulator.recorder import Recorder
from traces.schema import Trace


@dataclass
class SimResult:
    metrics: SimMetrics
    run: RunRecord
    timeline: Timeline
    plan: Plan
    seed: int
    _rec: Recorder = field(repr=False, default_factory=Recorder)

    @cached_property
    def trace(self) -> Trace:
        """The run as a Chrome trace (traces/ schema); built on first use."""
        meta = {"source": "simulate", "job": self.plan.spec.name, "seed": self.seed,
                "iterations": self.metrics.iterations, "mode": self.plan.mode,
                "emulated": False, "predicted_iteration_s": self.plan.predicted_iteration_s}
        if not self.timeline.failures and not self.timeline.checkpoints:
            return self._rec.to_trace(meta)
        return self._rec.to_trace(meta, _wall_rows(self))


def _wall_rows(r: SimResult) -> list[tuple]:
    """Replay each attempt's events at its wall time; add failure, restart, checkpoint events."""
    durs = iteration_durations(r.run, r.plan.pipeline)
    starts = [0.0]
    for d in durs[:-1]:
        starts.append(starts[-1] + d)
    rows: list[tuple] = []
    for a in r.timeline.attempts:
        s = starts[a.iteration]
        rows += r._rec.shifted(s, s + a.dur_s, a.start_s - s)
    restart = r.metrics.restart_s
    for t, lost in r.timeline.failures:
        rows.append(("failure", "failure", t, 0.0, "job", "faults", {"lost_s": lost}))
        rows.append(("restart", "restart", t, restart, "job", "faults", {}))
    for t in r.timeline.checkpoints:
        rows.append(("checkpoint", "checkpoint", t, r.metrics.checkpoint_s, "job",
                     "faults", {}))
    return rows
