"""The trace schema shared by the simulator and the executor: Chrome trace event format.

A trace is `{"traceEvents": [...], "metadata": {...}}` and opens in Perfetto (ui.perfetto.dev) or
chrome://tracing. Every event is a complete event (`ph: "X"`) with microsecond `ts` and `dur`;
its process is a pool and node ("gpu:0"), its thread a slot or device or worker ("slot0", "env3"):
in memory `TraceEvent.pid`/`tid` are those names; in the file they are numbers, named by
`process_name`/`thread_name` metadata events (`ph: "M"`), as the format defines. On every track
(pid, tid) complete events nest or are disjoint, so Perfetto draws them as a stack.
`args` carries the fields the calibration, fidelity and recording tools read; `EventArgs` is their
one definition (name, type, meaning), and `TraceEvent.fields` is the typed view readers use. The
common ones:

  role            actor | rollout | reference | reward | critic | environment (`Role`)
  step            iteration index
  policy_version  version of the weights the work used
  devices         device ids (pool:node:index) the work ran on
  sample_ids      samples the event covers
  tokens          tokens processed (prefill/decode/train/forward)
  batch, context  decode and prefill batch size and KV context tokens

A key `EventArgs` does not name is kept (a trace from another tool still reads), but it is an
error when `PLACER_STRICT_TRACES=1` (the test suite sets it): the schema is the one convention
every writer follows.

Counter events (`ph: "C"`, `CounterEvent`): numbers sampled over time, one Perfetto track per
series. The executor writes one `rl` counter per step on the driver's process, at the step's
end: the series `RL_SERIES` names (clip and truncation fractions, KL, entropy, gradient norm,
response lengths and rewards). Complete events come first in the file, counters after them.

Event names (`cat`): step, stage, generate, prefill, decode, tool, forward, train, transfer,
reward, checkpoint, failure, restart (a recovery), straggler (a re-issued call, on the slow
worker's track), tail (what a tail policy dropped or carried), collective (the trainers'
timed collective probe, executors/collprobe.py) and encode (a vision encoder's run inside a
pass, executors/vlm.py). Metadata says where it came from
(`source`: simulate | execute), the plan's job name, the seed, and whether devices were emulated.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.base.inputs import load_json, read_text
from placer.base.roles import Role

STRICT_ENV = "PLACER_STRICT_TRACES"  # "1": a key EventArgs does not name is an error

CATEGORIES = ("step", "prefill", "decode", "tool", "forward", "train", "transfer", "reward",
              "checkpoint", "failure", "restart", "stage", "generate", "straggler", "tail",
              "collective", "encode")


RL_SERIES = {
    "clip_frac": "fraction of response tokens whose PPO ratio was clipped",
    "tis_truncated": "fraction of response tokens whose importance weight hit its cap",
    "kl": "mean per-token KL estimate to the reference (the job's estimator)",
    "entropy": "mean per-token entropy of the policy at the rollout's temperature",
    "grad_norm": "policy gradient norm before clipping, mean over the step's optimizer steps",
    "response_len_mean": "response tokens per sample, mean",
    "response_len_min": "response tokens per sample, min",
    "response_len_max": "response tokens per sample, max",
    "reward_mean": "reward per sample, mean",
    "reward_min": "reward per sample, min",
    "reward_max": "reward per sample, max",
}


class TraceError(SpecError):
    """A corrupt or foreign trace file; `str()` names the file and what is wrong."""


def _f(help: str) -> Any:
    return Field(None, description=help)


class EventArgs(BaseModel):
    """The `args` of a trace event: every key a writer (executor, simulator, synthetic traces)
    puts there and a reader (recorder, calibration, fidelity) takes out. All optional: an event
    carries the keys its kind needs. Values are checked for type only; the readers that price
    an event check ranges with their own messages (`placer.calibrate.fit_events`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    # what and when
    role: Role | None = _f("role that did the work")
    step: int | None = _f("iteration index")
    policy_version: int | None = _f("version of the weights the work used (null: none)")
    round: int | None = _f("executor: generation round within a step (multi-turn, partial)")
    turn: int | None = _f("executor: the sample's turn a tool call ends")
    minibatch: int | None = _f("simulator: mini-batch index of a training or forward step")
    # where
    devices: list[str] | None = _f("device ids (pool:node:index) the work ran on")
    os_pid: int | None = _f("executor: process id of the worker")
    replica: str | int | None = _f("rollout replica a weight-sync flow feeds")
    pool: str | None = _f("executor: the pool of a split role's worker (its part's pool)")
    part: int | None = _f("executor: index of a split role's part the worker belongs to")
    swapped: bool | None = _f("executor: whether a colocated engine's sleep or wake changed "
                              "its state (transfer)")
    # how much
    sample_ids: list[int | str] | None = _f("samples the event covers")
    tokens: float | None = _f("tokens processed (prefill, decode, train, forward)")
    batch: float | None = _f("sequences in the batch (prefill, decode, generate)")
    context: float | None = _f("KV context tokens over the batch (prefill, decode)")
    span: float | None = _f("attention span a prefill's tokens are priced at: over its new "
                            "tokens, the mean of 2 * context - new (prefill; absent: the "
                            "sequences' mean)")
    steps: float | None = _f("decode steps of the run (decode, generate) or optimizer steps")
    prompt_tokens: list[float] | None = _f("per sample, aligned with sample_ids: context "
                                           "prefilled (generate, prefill)")
    response_tokens: list[float] | None = _f("per sample, aligned with sample_ids: tokens "
                                             "generated (generate, decode)")
    reward: float | None = _f("step: mean reward of its samples")
    # weight sync and copies
    bytes: float | None = _f("bytes moved (transfer)")
    gb: float | None = _f("gigabytes moved (transfer, simulator)")
    gbs: float | None = _f("link bandwidth, GB/s (transfer)")
    src: str | None = _f("sender (transfer)")
    dst: str | None = _f("receiver, pool:node (transfer)")
    calls: int | None = _f("weight sync: sequential calls (buckets) of each sender's stream; "
                             "collective probe: calls timed")
    senders: int | None = _f("weight sync: parallel sender streams (pipeline stages)")
    backend: str | None = _f("weight sync: how the bytes went (gloo, nccl: the weight-sync "
                             "group; in-process: call arguments)")
    control_bytes: int | None = _f("weight sync: pickled bytes of the refresh's control "
                                   "messages (all Ray's object store carried for it)")
    sync_source: str | None = _f("weight sync: where the senders read the weights (kept copy: "
                                 "gathered at the step's end and kept on the host, as the plan's "
                                 "host memory allows; gathered: from the shards as they stream)")
    round_trips: int | None = _f("weight sync: the driver's sequential waits on Ray calls for "
                                 "the refresh (calls issued together count once)")
    collective: str | None = _f("collective probe: the kind timed (all_reduce, fsdp_unit, "
                                "...; executors/collprobe.py)")
    ranks: int | None = _f("collective probe: ranks of the group")
    gathers: int | None = _f("executor train: full-weight gathers for the sync it includes")
    links: list[str] | None = _f("simulator: links a weight-sync flow crosses")
    # environments
    wait_s: float | None = _f("tool call: seconds queued before a CPU slot took it")
    status: str | None = _f("tool call: the sandbox's status (ok, error, timeout, ...)")
    call: str | None = _f("tool call: what ran (tool call, verify); encode: the pass it ran in")
    images: int | None = _f("encode: images the vision encoder encoded")
    reasons: dict[str, str] | None = _f("reward: why a sample lost reward, by sample id (the "
                                        "code task: a failing test, a timeout, a crash)")
    # failures, stragglers, recoveries and tails
    kind: str | None = _f("failure: how the worker was killed")
    error: str | None = _f("failure or restart: the error that caused it")
    lost_s: float | None = _f("simulator failure: work lost since the last checkpoint (s)")
    resumed_from: int | None = _f("restart: the checkpoint step it resumed from")
    reason: str | None = _f("cluster restart: what changed")
    nodes: dict[str, int] | None = _f("cluster restart: alive nodes per pool")
    moves: list[str] | None = _f("cluster restart: roles whose actors changed (placer.solve.moves)")
    kept: int | list[str] | None = _f("cluster restart: actors kept; overprovision: samples kept")
    detected_at: float | None = _f("cluster restart: when the change was seen (epoch s)")
    recovery_s: float | None = _f("cluster restart: seconds to recover")
    replan_s: float | None = _f("cluster restart: seconds re-planning")
    groups_s: float | None = _f("cluster restart: seconds creating placement groups")
    actors_s: float | None = _f("cluster restart: seconds creating actors")
    straggler: bool | None = _f("straggler marker")
    slow_worker: str | None = _f("straggler: the worker that missed its deadline")
    reissued_to: str | None = _f("straggler: the worker the call was re-issued to")
    deadline_s: float | None = _f("straggler: the call's deadline (s)")
    winner: str | None = _f("straggler: which copy finished first (original, reissue)")
    cut: list[str] | None = _f("partial rollouts: samples cut at the step's end")
    carried_tokens: int | None = _f("partial rollouts: tokens carried into the next step")
    validation: bool | None = _f("a periodic validation's work (Job.validation: its stage, "
                                 "refit, onload and generation), not the step's own batch")

    def unknown(self) -> list[str]:
        """Keys the schema does not name."""
        return sorted(self.model_extra or {})


def strict_traces() -> bool:
    return os.environ.get(STRICT_ENV, "") == "1"


@dataclass(frozen=True)
class TraceEvent:
    name: str
    cat: str
    ts_s: float
    dur_s: float
    pid: str
    tid: str
    args: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def fields(self) -> EventArgs:
        """`args` checked against the schema (`EventArgs`), typed; TraceError naming the event
        and the key otherwise. Built on first use (a simulation records many events and reads
        few). `args` itself stays as written: it is what the trace file holds."""
        try:
            out = EventArgs.model_validate(self.args)
        except ValidationError as e:
            err = e.errors()[0]
            key = ".".join(str(x) for x in err["loc"])
            raise TraceError(f"event {self.cat} {self.name!r}: args.{key}: {err['msg']} "
                             f"(got {err.get('input')!r:.80})") from None
        if strict_traces() and out.unknown():
            raise TraceError(f"event {self.cat} {self.name!r}: args: unknown keys "
                             f"{', '.join(out.unknown())} (traces/schema.py EventArgs names "
                             "every key)")
        return out

    def to_chrome(self, pid: int | None = None, tid: int | None = None) -> dict[str, Any]:
        """The Chrome event; `pid`/`tid` are the numbers `Trace.to_chrome` gave the names."""
        return {"name": self.name, "cat": self.cat, "ph": "X", "ts": self.ts_s * 1e6,
                "dur": self.dur_s * 1e6, "pid": self.pid if pid is None else pid,
                "tid": self.tid if tid is None else tid, "args": self.args}

    @property
    def end_s(self) -> float:
        return self.ts_s + self.dur_s


@dataclass(frozen=True)
class CounterEvent:
    """A counter event (`ph: "C"`): the values of named series at `ts_s`, on process `pid`."""

    name: str
    ts_s: float
    pid: str
    values: dict[str, float]

    def to_chrome(self, pid: int) -> dict[str, Any]:
        return {"name": self.name, "ph": "C", "ts": self.ts_s * 1e6, "pid": pid, "tid": 0,
                "args": self.values}


def _counter_values(name: str, values: Any) -> dict[str, float]:
    """A counter's values checked: a mapping of series names to finite numbers."""
    if not isinstance(values, dict):
        raise TraceError(f"counter {name!r}: args: expected a mapping of series to numbers")
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise TraceError(f"counter {name!r}: args.{k}: expected a finite number (got {v!r:.40})")
    return {str(k): float(v) for k, v in values.items()}


@dataclass
class Trace:
    """Events, counters and metadata; built by a run, written once, atomically."""

    metadata: dict[str, Any] = field(default_factory=dict)
    events: list[TraceEvent] = field(default_factory=list)
    counters: list[CounterEvent] = field(default_factory=list)

    def add(self, name: str, cat: str, ts_s: float, dur_s: float, pid: str, tid: str,
            **args: Any) -> None:
        self.events.append(TraceEvent(name, cat, ts_s, dur_s, pid, tid, args))

    def count(self, name: str, ts_s: float, pid: str, **values: float) -> None:
        """A counter event: each value a series of counter `name` on process `pid`."""
        self.counters.append(CounterEvent(name, ts_s, pid, _counter_values(name, values)))

    def of(self, cat: str) -> list[TraceEvent]:
        return [e for e in self.events if e.cat == cat]

    def to_chrome(self) -> dict[str, Any]:
        """The Chrome trace document. Process and thread ids are numbers (the format's, and
        Perfetto's, expectation): processes (pool:node) numbered from 1 in order of first
        appearance, threads (workers) from 1 within each process; `process_name` and
        `thread_name` metadata events (`ph: "M"`) name them. The metadata events come after
        the complete events, so `traceEvents.N` in a message is the N-th event a reader keeps."""
        pids: dict[str, int] = {}
        tids: dict[tuple[str, str], int] = {}
        per_pid: dict[str, int] = {}  # threads numbered so far in each process
        out = []
        for e in self.events:
            pid = pids.setdefault(e.pid, len(pids) + 1)
            tid = tids.get((e.pid, e.tid))
            if tid is None:
                tid = tids[(e.pid, e.tid)] = per_pid[e.pid] = per_pid.get(e.pid, 0) + 1
            out.append(e.to_chrome(pid, tid))
        out += [c.to_chrome(pids.setdefault(c.pid, len(pids) + 1)) for c in self.counters]
        out += [{"name": "process_name", "ph": "M", "pid": n, "tid": 0, "args": {"name": name}}
                for name, n in pids.items()]
        out += [{"name": "thread_name", "ph": "M", "pid": pids[p], "tid": n, "args": {"name": t}}
                for (p, t), n in tids.items()]
        return {"traceEvents": out, "displayTimeUnit": "ms", "metadata": self.metadata}

    def check(self) -> None:
        """Every event's args against the schema (TraceError otherwise)."""
        for e in self.events:
            e.fields  # noqa: B018 - validates (and caches the typed view)

    def write(self, path: str | Path) -> None:
        """Write the file atomically; under `PLACER_STRICT_TRACES=1` (the tests) check every event
        against the schema first. Validating each of a large simulation's ~10^5 events costs more
        than simulating them, and readers validate what they read anyway."""
        if strict_traces():
            self.check()
        atomic_write_text(path, json.dumps(self.to_chrome()))


def nesting_problems(trace: Trace, eps_s: float = 1e-6, limit: int = 10) -> list[str]:
    """Where complete events on one track (pid, tid) overlap without one containing the other
    (Perfetto then draws them wrongly): one line each, at most `limit`. `eps_s` absorbs the
    rounding of microsecond timestamps."""
    tracks: dict[tuple[str, str], list[TraceEvent]] = {}
    for e in trace.events:
        tracks.setdefault((e.pid, e.tid), []).append(e)
    out: list[str] = []
    for (pid, tid), evs in sorted(tracks.items()):
        stack: list[TraceEvent] = []
        for e in sorted(evs, key=lambda e: (e.ts_s, -e.dur_s)):
            while stack and e.ts_s >= stack[-1].end_s - eps_s:
                stack.pop()  # ended before this one starts
            if stack and e.end_s > stack[-1].end_s + eps_s:
                top = stack[-1]
                out.append(f"{pid}/{tid}: {e.cat} {e.name!r} [{e.ts_s:.6f}, {e.end_s:.6f}] "
                           f"overlaps {top.cat} {top.name!r} [{top.ts_s:.6f}, {top.end_s:.6f}]")
                if len(out) >= limit:
                    return out
            stack.append(e)
    return out


def _names(events: list[Any]) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """Process and thread names from the metadata events (`process_name`, `thread_name`), keyed
    by the ids as strings; a trace without them keeps its ids as names."""
    procs: dict[str, str] = {}
    threads: dict[tuple[str, str], str] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "M" or not isinstance(ev.get("args"), dict):
            continue
        name = ev["args"].get("name")
        if not isinstance(name, str):
            continue
        if ev.get("name") == "process_name":
            procs[str(ev.get("pid"))] = name
        elif ev.get("name") == "thread_name":
            threads[(str(ev.get("pid")), str(ev.get("tid")))] = name
    return procs, threads


def read_trace(path: str | Path) -> Trace:
    p = Path(path)
    text = read_text(p, "trace")  # bounded size, no binary data, UTF-8
    try:
        data = load_json(text, str(p))  # no NaN, Infinity or overflowing numbers
    except SpecError as e:
        raise TraceError(f"not a JSON trace: {e}") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise TraceError(f"{p}: not a JSON trace: {str(e).splitlines()[0][:120]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{p}: traceEvents: expected a list of events (Chrome trace format)")
    procs, threads = _names(data["traceEvents"])
    events, counters = [], []
    for i, ev in enumerate(data["traceEvents"]):
        if isinstance(ev, dict) and ev.get("ph") == "C":
            counters.append(_read_counter(p, i, ev, procs))
            continue
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue  # metadata or instant events from other tools are ignored
        try:
            pid, tid = str(ev["pid"]), str(ev["tid"])
            events.append(TraceEvent(str(ev["name"]), str(ev.get("cat", "")), float(ev["ts"]) / 1e6,
                                     float(ev["dur"]) / 1e6, procs.get(pid, pid),
                                     threads.get((pid, tid), tid), dict(ev.get("args") or {})))
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"{p}: traceEvents.{i}: bad event ({type(e).__name__}: {e})") from None
        if events[-1].dur_s < 0:
            raise TraceError(f"{p}: traceEvents.{i}.dur: negative duration ({ev['dur']})")
        if not (math.isfinite(events[-1].ts_s) and math.isfinite(events[-1].dur_s)):
            raise TraceError(f"{p}: traceEvents.{i}: ts and dur must be finite numbers (got "
                             f"ts {ev['ts']!r:.40}, dur {ev['dur']!r:.40})")
    meta = data.get("metadata") or {}
    if not isinstance(meta, dict):
        raise TraceError(f"{p}: metadata: expected a mapping (got {type(meta).__name__} "
                         f"{meta!r:.60})")
    return Trace(dict(meta), events, counters)


def _read_counter(p: Path, i: int, ev: dict[str, Any], procs: dict[str, str]) -> CounterEvent:
    """Counter event `i` of file `p` (TraceError naming it when malformed)."""
    try:
        name, ts, pid = str(ev["name"]), float(ev["ts"]) / 1e6, str(ev["pid"])
        values = _counter_values(name, ev.get("args") or {})
    except TraceError as e:  # before ValueError, which it is
        raise TraceError(f"{p}: traceEvents.{i}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise TraceError(f"{p}: traceEvents.{i}: bad counter ({type(e).__name__}: {e})") from None
    if not math.isfinite(ts):
        raise TraceError(f"{p}: traceEvents.{i}.ts: expected a finite number (got {ev['ts']!r:.40})")
    return CounterEvent(name, ts, procs.get(pid, pid), values)
