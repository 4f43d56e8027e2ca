"""Trace recording: events are kept as plain tuples while the simulation runs and become
`traces.schema.TraceEvent`s only when the trace is asked for (hundreds of thousands of events at
the large scale; building dataclasses on the hot path would cost more than the simulation).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traces.schema import Trace, TraceEvent

# A row's args: a dict, or (keys, values) from the hot path, made a dict on export.
Args = dict[str, Any] | tuple[tuple[str, ...], tuple[Any, ...]]


@dataclass
class Recorder:
    record_tools: bool = True
    rows: list[tuple[str, str, float, float, str, str, Args]] = field(default_factory=list)

    def add(self, name: str, cat: str, ts: float, dur: float, pid: str, tid: str,
            **args: Any) -> None:
        self.rows.append((name, cat, ts, dur, pid, tid, args))

    def add_fields(self, name: str, cat: str, ts: float, dur: float, pid: str, tid: str,
                   keys: tuple[str, ...], values: tuple[Any, ...]) -> None:
        """Hot-path variant: `args` kept as (constant keys, values), made a dict on export."""
        self.rows.append((name, cat, ts, dur, pid, tid, (keys, values)))

    def shifted(self, start: float, end: float, offset: float) -> list[tuple]:
        """Rows that begin in [start, end), moved by `offset` (replaying an iteration's events
        at a later wall time after a failure), cut at `end`."""
        out = []
        for name, cat, ts, dur, pid, tid, args in self.rows:
            if start <= ts < end:
                out.append((name, cat, ts + offset, min(dur, end - ts), pid, tid, args))
        return out

    def to_trace(self, metadata: dict[str, Any], rows: list[tuple] | None = None) -> Trace:
        src = self.rows if rows is None else rows
        events = [TraceEvent(n, c, ts, d, p, t, a if isinstance(a, dict) else dict(zip(*a)))
                  for n, c, ts, d, p, t, a in src]
        events.sort(key=lambda e: (e.ts_s, e.pid, e.tid))
        return Trace(metadata=dict(metadata), events=events)
