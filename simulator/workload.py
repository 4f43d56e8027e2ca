"""The work of one iteration, sample by sample: prompt length, response length per turn, and the
latency of every tool call between turns.

Drawn from the job's distributions through `placer.spec.sampling` (one independent generator per
(seed, iteration, stream), so that changing one draw never shifts another), set to the
distributions' means (variance off), or replayed from a JSONL workload trace (`traces.workload`:
one sample a line with `prompt_tokens`, `response_tokens` [per turn] and `tool_latency_s` [per
tool call]); a trace with fewer rows than an iteration needs is cycled in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer.base.errors import SpecError
from placer.cost.rolloutcost import generated_samples
from placer.spec.job import Job
from placer.spec.sampling import draw, draw_lengths, rng
from simulator.config import Workload as WorkloadConfig
from traces.workload import read_rows

STREAM_PROMPT, STREAM_RESPONSE, STREAM_TOOL = 1, 2, 3


@dataclass(frozen=True)
class Samples:
    """One iteration's samples. Lists (not arrays): the engine reads them one scalar at a time."""

    prompt: list[int]
    response: list[list[int]]  # [sample][turn]
    tool_s: list[list[float]]  # [sample][call], turns - 1 calls (empty without an environment)
    tool_output: int  # tokens a tool call returns into the context

    @property
    def n(self) -> int:
        return len(self.prompt)

    def response_tokens(self) -> int:
        return sum(sum(r) for r in self.response)

    def context_tokens(self) -> list[int]:
        """Final context of every sample: prompt, all responses and tool outputs."""
        return [p + sum(r) + len(t) * self.tool_output
                for p, r, t in zip(self.prompt, self.response, self.tool_s)]


def has_tools(job: Job) -> bool:
    return job.environment.kind != "none" and job.environment.turns > 1


def samples_for(job: Job, cfg: WorkloadConfig, seed: int, iteration: int,
                replay: list[dict] | None = None, stream: tuple[int, ...] = ()) -> Samples:
    """The samples `iteration` generates (over-provisioned: more than the batch): replayed if
    `replay` rows are given, else drawn or at means. `stream` extends every draw's generator
    key (a periodic validation's own draws, `simulator.validation`); empty: the step's."""
    if replay is not None:
        return _replayed(job, replay, iteration, cfg.response_scale)
    n, turns = generated_samples(job), job.environment.turns
    calls = turns - 1 if has_tools(job) else 0
    lengths, env = job.lengths, job.environment
    if cfg.lengths == "mean":
        p = np.full(n, max(round(lengths.prompt.mean_value()), 1), dtype=np.int64)
        r = np.full((n, turns), lengths.response.mean_value(), dtype=float)
    else:
        p = draw_lengths(lengths.prompt, rng(seed, iteration, STREAM_PROMPT, *stream), n)
        r = draw(lengths.response, rng(seed, iteration, STREAM_RESPONSE, *stream),
                 n * turns).reshape(n, turns)
    r = np.maximum(np.rint(r * cfg.response_scale), 1).astype(np.int64)
    if cfg.tool_latency == "mean":
        t = np.full((n, calls), env.tool_latency_s.mean_value())
    else:
        t = draw(env.tool_latency_s, rng(seed, iteration, STREAM_TOOL, *stream), n * calls).reshape(n, calls)
    return Samples(p.tolist(), r.tolist(), t.tolist(), env.tool_output_tokens if calls else 0)


def load_replay(path: str | Path, job: Job) -> list[dict]:
    """Rows of a workload trace, checked against the job (turns, tool calls); SpecError if not."""
    rows = read_rows(path)
    turns = job.environment.turns
    calls = turns - 1 if has_tools(job) else 0
    for i, row in enumerate(rows, 1):
        where = f"{path}:{i}"
        _ints(row, "prompt_tokens", 1, where)
        _ints(row, "response_tokens", turns, where)
        if calls:
            _nums(row, "tool_latency_s", calls, where)
    return rows


def _as_list(row: dict, key: str, where: str) -> list:
    if key not in row:
        raise SpecError(f"{where}: {key}: missing")
    v = row[key]
    return v if isinstance(v, list) else [v]


def _ints(row: dict, key: str, need: int, where: str) -> None:
    vals = _as_list(row, key, where)
    if len(vals) < need or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                   for v in vals):
        raise SpecError(f"{where}: {key}: expected {need} positive integer(s) (got {row[key]!r})")


def _nums(row: dict, key: str, need: int, where: str) -> None:
    vals = _as_list(row, key, where)
    if len(vals) < need or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                   and v >= 0 for v in vals):
        raise SpecError(f"{where}: {key}: expected {need} non-negative number(s) "
                        f"(got {row[key]!r})")


def _replayed(job: Job, rows: list[dict], iteration: int, scale: float) -> Samples:
    n, turns = generated_samples(job), job.environment.turns
    calls = turns - 1 if has_tools(job) else 0
    prompt, response, tools = [], [], []
    for k in range(n):
        row = rows[(iteration * n + k) % len(rows)]
        prompt.append(int(_as_list(row, "prompt_tokens", "")[0]))
        resp = _as_list(row, "response_tokens", "")[:turns]
        response.append([max(round(v * scale), 1) for v in resp])
        tools.append([float(v) for v in _as_list(row, "tool_latency_s", "")[:calls]]
                     if calls else [])
    return Samples(prompt, response, tools, job.environment.tool_output_tokens if calls else 0)
