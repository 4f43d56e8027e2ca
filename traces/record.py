"""Record a workload trace (JSONL, traces/workload.py) from an executed or simulated event trace.

Each sample of each step becomes one row:

    {"step": 0, "sample_id": 17, "prompt_tokens": 212, "response_tokens": [803, 95],
     "tool_latency_s": [1.7], "tool_output_tokens": [64], "turns": 2}

so that a later job replays the run's real lengths and latencies (`{kind: empirical, path: ...,
field: response_tokens}`).

How per-sample values come out of batched events (args per traces/schema.py):
  * an event's `sample_ids` are the samples it covers; `args.step` (default 0) tells steps apart;
  * prefill and decode `tokens` are shared equally by the event's samples, unless the event
    carries per-sample lists aligned with `sample_ids` (`prompt_tokens` on prefill,
    `response_tokens` on decode). Equal shares are exact for decode events of one engine step (each
    live sequence adds one token) or of a lockstep run, and for prefills of equal prompts;
  * a `generate` event (one whole turn of generation, as the executor writes) is a prefill and a
    decode: per-sample `prompt_tokens` / `response_tokens` lists when it has them, else its
    `tokens` shared equally as responses and no prompt length (the row then has no
    `prompt_tokens`, so replaying that field names the gap instead of replaying zeros);
  * a `tool` event ends a turn of each of its samples, its duration is the call's latency; the
    next turn's prefill is the tool output;
  * turns are told apart by time: a sample's events are taken in order of their start.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from placer.base.errors import SpecError
from placer.base.roles import Role
from traces.schema import EventArgs, Trace, TraceError, TraceEvent, read_trace
from traces.workload import write_rows

CATS = ("prefill", "decode", "generate", "tool")


@dataclass
class _Sample:
    prompt: float | None = None  # None: no event told the prompt's length
    responses: list[float] = field(default_factory=lambda: [0.0])
    tools: list[float] = field(default_factory=list)
    outputs: list[float] = field(default_factory=list)
    decoded: bool = False  # has the current turn produced tokens yet

    def add(self, cat: str, value: float) -> None:
        if cat == "tool":
            self.tools.append(value)
            self.responses.append(0.0)
            self.outputs.append(0.0)
            self.decoded = False
        elif cat == "decode":
            self.responses[-1] += value
            self.decoded = True
        elif not self.tools:  # prefill of the first turn: the prompt
            self.prompt = (self.prompt or 0.0) + value
        else:  # prefill after a tool call: its output enters the context
            self.outputs[-1] += value


def _per_sample(ev: TraceEvent, i: int, source: str, ids: list, key: str,
                total: float | None) -> list[float] | None:
    """Values of `key` for each sample: the event's per-sample list, else `total` shared equally,
    else None (the event does not say)."""
    per: list[float] | None = getattr(_fields(ev, i, source), key)
    if per is not None:
        if len(per) != len(ids) or not all(v >= 0 for v in per):
            raise SpecError(f"{source}: traceEvents.{i} ({ev.cat}): args.{key}: per-sample list "
                            f"does not match sample_ids ({len(per)} values for {len(ids)} samples)")
        return per
    if total is None:
        return None
    if total < 0:
        raise SpecError(f"{source}: traceEvents.{i} ({ev.cat}): args.tokens: expected a "
                        f"non-negative number (got {total!r})")
    return [total / len(ids)] * len(ids)


def _fields(ev: TraceEvent, i: int, source: str) -> EventArgs:
    """The event's typed args; a SpecError naming the file and the event otherwise."""
    try:
        return ev.fields
    except TraceError as e:
        raise SpecError(f"{source}: traceEvents.{i}: {e}") from None


def _shares(ev: TraceEvent, i: int, source: str) -> list[tuple[Any, str, float]]:
    """(sample id, part, value) for every sample the event covers; a `generate` event (a whole
    turn's generation) gives a prefill part (when it says its prompts) and a decode part."""
    ids = _fields(ev, i, source).sample_ids
    if not ids:
        return []
    if ev.cat == "tool":
        return [(s, "tool", ev.dur_s) for s in ids]
    out: list[tuple[Any, str, float]] = []
    tokens = ev.fields.tokens
    if ev.cat in ("prefill", "generate"):
        vals = _per_sample(ev, i, source, ids, "prompt_tokens",
                           tokens if ev.cat == "prefill" else None)
        out += [(s, "prefill", v) for s, v in zip(ids, vals or [])]
    if ev.cat in ("decode", "generate"):
        vals = _per_sample(ev, i, source, ids, "response_tokens", tokens)
        out += [(s, "decode", v) for s, v in zip(ids, vals or [])]
    return out


def rows_from_trace(trace: Trace, source: str = "trace") -> list[dict[str, Any]]:
    """Workload rows, ordered by step and sample id."""
    timeline: dict[tuple[int, Any], list[tuple[float, int, str, float]]] = defaultdict(list)
    for i, ev in enumerate(trace.events):
        if ev.cat not in CATS or ev.args.get("role") == Role.REWARD:
            continue  # a generative judge's generation reads a sample: it is not one
        shares = _shares(ev, i, source)
        step = ev.fields.step or 0
        for sid, part, value in shares:
            # order within a sample: by start; at one start, prefill, decode, then the tool call
            timeline[(step, sid)].append((ev.ts_s, ("prefill", "decode", "tool").index(part),
                                          part, value))
    if not timeline:
        raise SpecError(f"{source}: no per-sample events (prefill, decode, generate or tool "
                        "events with args.sample_ids) to record")
    return [_row(step, sid, evs) for (step, sid), evs
            in sorted(timeline.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))]


def _row(step: int, sid: Any, evs: list[tuple[float, int, str, float]]) -> dict[str, Any]:
    s = _Sample()
    for _, _, part, value in sorted(evs, key=lambda e: (e[0], e[1])):
        s.add(part, value)
    if not s.decoded and len(s.responses) > 1:  # a trailing tool call opened no new turn
        s.responses.pop()
        s.outputs.pop()
    row: dict[str, Any] = {"step": step, "sample_id": sid}
    if s.prompt is not None:  # left out when unknown: a replay of it then names the gap
        row["prompt_tokens"] = round(s.prompt)
    row |= {"response_tokens": [round(r) for r in s.responses],
            "tool_latency_s": [round(t, 6) for t in s.tools], "turns": len(s.responses)}
    if any(s.outputs):
        row["tool_output_tokens"] = [round(o) for o in s.outputs]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traces.record",
                                 description="write a workload trace (JSONL) from an event trace")
    ap.add_argument("trace", metavar="TRACE.json")
    ap.add_argument("-o", "--out", required=True, metavar="workload.jsonl")
    args = ap.parse_args(argv)
    try:
        rows = rows_from_trace(read_trace(args.trace), args.trace)
    except SpecError as e:
        print(f"traces.record: error: {e}", file=sys.stderr)
        return 2
    write_rows(args.out, rows)
    print(f"wrote {args.out}: {len(rows)} samples, "
          f"{sum(r['turns'] for r in rows)} turns, {sum(len(r['tool_latency_s']) for r in rows)} "
          "tool calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
