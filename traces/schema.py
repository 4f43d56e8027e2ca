"""The trace schema shared by the simulator and the executor: Chrome trace event format.

A trace is `{"traceEvents": [...], "metadata": {...}}` and opens in Perfetto (ui.perfetto.dev) or
chrome://tracing. Every event is a complete event (`ph: "X"`) with microsecond `ts` and `dur`;
`pid` names a pool and node ("gpu:0"), `tid` a slot or device or worker ("slot0", "env3").
`args` carries the fields the calibration and fidelity tools read:

  role            actor | rollout | reference | reward | critic | environment
  step            iteration index
  policy_version  version of the weights the work used
  devices         device ids (pool:node:index) the work ran on
  sample_ids      samples the event covers
  tokens          tokens processed (prefill/decode/train/forward)
  batch, context  decode and prefill batch size and KV context tokens

Event names (`cat`): step, stage, generate, prefill, decode, tool, forward, train, transfer, reward,
checkpoint, failure, restart (a recovery), straggler (a re-issued call, on the slow worker's track) and
tail (what a tail policy dropped or carried). Metadata says where it came from (`source`: simulate | execute), the plan's job
name, the seed, and whether devices were emulated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATEGORIES = ("step", "prefill", "decode", "tool", "forward", "train", "transfer", "reward",
              "checkpoint", "failure", "restart", "stage", "generate", "straggler", "tail")


from placer.errors import SpecError


class TraceError(SpecError):
    """A corrupt or foreign trace file; `str()` names the file and what is wrong."""


@dataclass(frozen=True)
class TraceEvent:
    name: str
    cat: str
    ts_s: float
    dur_s: float
    pid: str
    tid: str
    args: dict[str, Any] = field(default_factory=dict)

    def to_chrome(self) -> dict[str, Any]:
        return {"name": self.name, "cat": self.cat, "ph": "X", "ts": self.ts_s * 1e6,
                "dur": self.dur_s * 1e6, "pid": self.pid, "tid": self.tid, "args": self.args}

    @property
    def end_s(self) -> float:
        return self.ts_s + self.dur_s


@dataclass
class Trace:
    """Events plus metadata; built by a run, written once, atomically."""

    metadata: dict[str, Any] = field(default_factory=dict)
    events: list[TraceEvent] = field(default_factory=list)

    def add(self, name: str, cat: str, ts_s: float, dur_s: float, pid: str, tid: str,
            **args: Any) -> None:
        self.events.append(TraceEvent(name, cat, ts_s, dur_s, pid, tid, args))

    def of(self, cat: str) -> list[TraceEvent]:
        return [e for e in self.events if e.cat == cat]

    def to_chrome(self) -> dict[str, Any]:
        return {"traceEvents": [e.to_chrome() for e in self.events],
                "displayTimeUnit": "ms", "metadata": self.metadata}

    def write(self, path: str | Path) -> None:
        from placer.plan import atomic_write_text  # noqa: PLC0415
        atomic_write_text(path, json.dumps(self.to_chrome()))


def read_trace(path: str | Path) -> Trace:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise TraceError(f"{p}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{p}: not a JSON trace: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{p}: traceEvents: expected a list of events (Chrome trace format)")
    events = []
    for i, ev in enumerate(data["traceEvents"]):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue  # metadata or instant events from other tools are ignored
        try:
            events.append(TraceEvent(str(ev["name"]), str(ev.get("cat", "")), float(ev["ts"]) / 1e6,
                                     float(ev["dur"]) / 1e6, str(ev["pid"]), str(ev["tid"]),
                                     dict(ev.get("args") or {})))
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"{p}: traceEvents.{i}: bad event ({type(e).__name__}: {e})") from None
        if events[-1].dur_s < 0:
            raise TraceError(f"{p}: traceEvents.{i}.dur: negative duration ({ev['dur']})")
    return Trace(dict(data.get("metadata") or {}), events)
