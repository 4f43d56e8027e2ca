"""Trace recording: events are kept in columns while the simulation runs and become
`traces.schema.TraceEvent`s only when the trace is asked for (hundreds of thousands of events at
the large scale; building dataclasses on the hot path would cost more than the simulation).

Why columns and not a tuple per event: a tuple is an object the cyclic garbage collector tracks,
and three per event (the row, its args pair, its values) made 1.75 million of them at 65,536
samples; the first collection after the run scanned them all (about 1.3 s, a sixth of the
simulation) and every later full collection again (their values hold the `Role` enum, which keeps
them tracked). Columns are a handful of lists of floats and strings, whatever the event count.
`rows` still gives the events as 7-tuples (name, cat, ts, dur, pid, tid, args), built on demand
for the figures and the trace.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traces.schema import Trace, TraceEvent

# A row's args: a dict, or (keys, values) from the hot path, made a dict on export.
Args = dict[str, Any] | tuple[tuple[str, ...], tuple[Any, ...]]
Row = tuple[str, str, float, float, str, str, Args]


@dataclass
class Recorder:
    record_tools: bool = True
    names: list[str] = field(default_factory=list)
    cats: list[str] = field(default_factory=list)
    ts: list[float] = field(default_factory=list)
    dur: list[float] = field(default_factory=list)
    pids: list[str] = field(default_factory=list)
    tids: list[str] = field(default_factory=list)
    keys: list[Any] = field(default_factory=list)  # an event's args dict, or its constant keys
    offsets: list[int] = field(default_factory=list)  # where its values start in `values`
    values: list[Any] = field(default_factory=list)  # every hot-path event's values, flat

    def __len__(self) -> int:
        return len(self.ts)

    def add(self, name: str, cat: str, ts: float, dur: float, pid: str, tid: str,
            **args: Any) -> None:
        self._head(name, cat, ts, dur, pid, tid)
        self.keys.append(args)
        self.offsets.append(-1)

    def add_fields(self, name: str, cat: str, ts: float, dur: float, pid: str, tid: str,
                   keys: tuple[str, ...], values: tuple[Any, ...]) -> None:
        """Hot-path variant: `args` kept as (constant keys, values), made a dict on export."""
        self.names.append(name)  # `_head` inlined: ~800,000 calls at 65,536 samples
        self.cats.append(cat)
        self.ts.append(ts)
        self.dur.append(dur)
        self.pids.append(pid)
        self.tids.append(tid)
        self.keys.append(keys)
        self.offsets.append(len(self.values))
        self.values.extend(values)

    def _head(self, name: str, cat: str, ts: float, dur: float, pid: str, tid: str) -> None:
        self.names.append(name)
        self.cats.append(cat)
        self.ts.append(ts)
        self.dur.append(dur)
        self.pids.append(pid)
        self.tids.append(tid)

    def args(self, k: int) -> Args:
        keys, off = self.keys[k], self.offsets[k]
        if off < 0:
            return keys
        return keys, tuple(self.values[off:off + len(keys)])

    def row(self, k: int) -> Row:
        return (self.names[k], self.cats[k], self.ts[k], self.dur[k], self.pids[k], self.tids[k],
                self.args(k))

    @property
    def rows(self) -> list[Row]:
        """Every event as a 7-tuple, in recording order (built on each call)."""
        return [self.row(k) for k in range(len(self))]

    def cut(self, start: int, tid: str, now: float) -> None:
        """End at `now` the events of thread `tid` recorded from index `start` on that run past
        it (an engine interrupted mid-operation)."""
        ts, dur, tids = self.ts, self.dur, self.tids
        for k in range(start, len(ts)):
            if tids[k] == tid and ts[k] + dur[k] > now:
                dur[k] = max(now - ts[k], 0.0)

    def shifted(self, start: float, end: float, offset: float) -> list[Row]:
        """Rows that begin in [start, end), moved by `offset` (replaying an iteration's events
        at a later wall time after a failure), cut at `end`."""
        out = []
        for k, t in enumerate(self.ts):
            if start <= t < end:
                out.append((self.names[k], self.cats[k], t + offset, min(self.dur[k], end - t),
                            self.pids[k], self.tids[k], self.args(k)))
        return out

    def to_trace(self, metadata: dict[str, Any], rows: list[Row] | None = None) -> Trace:
        src = (self.row(k) for k in range(len(self))) if rows is None else rows
        events = [TraceEvent(n, c, ts, d, p, t, a if isinstance(a, dict) else dict(zip(*a)))
                  for n, c, ts, d, p, t, a in src]
        events.sort(key=lambda e: (e.ts_s, e.pid, e.tid))
        return Trace(metadata=dict(metadata), events=events)
