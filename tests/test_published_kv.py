"""The KV pool of the DAPO 7B colocated rows (r01-r03, verl on H20) is not what binds them.

Row r01 (32 H20) is published 2.16x row r02 (64 H20) where the model prices ~1.45x. One candidate
was the rollout's KV pool: eight TP4 engines each run 1,024 samples, and vLLM's v1 scheduler
preempts the newest running request (recomputing it later) when the pool is full
(vllm/v1/core/sched/scheduler.py @b4622cf9, `schedule`: `self.running.pop()`,
`num_computed_tokens = 0`). The model's engine replay (`placer.cost.admission`) does the same;
these tests pin what it finds with the runs' own gpu_memory_utilization (0.80): r01's critical
engine admits all its samples at once and its peak KV stays a small share of the pool (no
preemption), while the same engine with responses long enough to fill the pool does preempt
and pays the recompute, so the mechanism is live and the finding is not an artefact of it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

import placer.cost.admission as admission
from placer.cost.calibration import calibration_from_dict
from workflows.published import predict_row
from workflows.published_rows import ROWS

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "published"
SOURCE = calibration_from_dict({"default": {"kv_mem_fraction": 0.80}})  # the runs' setting


@dataclasses.dataclass
class Replay:
    cap: int
    max_seqs: int
    seqs: int
    peak: int = 0  # KV tokens in use at the end of the fullest decode run
    batch: int = 0  # largest decode batch
    preempted: int = 0
    recompute: int = 0  # tokens prefilled again by the preempted sequences


def _replays(monkeypatch: pytest.MonkeyPatch, row: str, median: int | None,
             tmp: Path) -> list[Replay]:
    """Every engine replay pricing `row` runs (with its response median set to `median`)."""
    seen: list[Replay] = []
    engine = admission.engine

    def traced(st: Any, kv: Any, prompt: Any, response: Any, weight: list[int],
               tool_output: int, hooks: admission.Hooks, start: float) -> Any:
        rec = Replay(kv.tokens, kv.max_seqs, sum(weight))
        seen.append(rec)

        def decode(_t: float, _d: float, batch: int, steps: int, c0: int) -> None:
            rec.peak = max(rec.peak, c0 + batch * steps)
            rec.batch = max(rec.batch, batch)

        def preempt(_t: float, seqs: int, ctx: int) -> None:
            rec.preempted += seqs
            rec.recompute += seqs * ctx

        hooks.decode, hooks.preempt = decode, preempt
        return engine(st, kv, prompt, response, weight, tool_output, hooks, start)

    monkeypatch.setattr(admission, "engine", traced)
    r = next(r for r in ROWS if r.name.startswith(row))
    job = yaml.safe_load((EXAMPLES / r.file).read_text())
    if median is not None:
        job["lengths"]["response"]["median"] = median
    (tmp / r.file).write_text(yaml.safe_dump(job))
    predict_row(r, SOURCE, folder=tmp)
    return seen


def test_r01_runs_every_sample_at_once_far_below_its_kv_pool(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _replays(monkeypatch, "r01", None, tmp_path)
    critical = max(seen, key=lambda r: r.seqs)
    # 8,192 samples over 8 engines, verl's max_num_seqs 1,024: all admitted in the first wave
    assert critical.seqs == 1024 and critical.max_seqs == 1024
    assert critical.batch == 1024
    # (96 GB x 0.80 - weights - engine) / 14,336 B a token a GPU: ~4.95M tokens an engine
    assert 4.5e6 < critical.cap < 5.4e6, critical
    # a synchronous batch's KV peaks at N max_t (prompt + t) P(response > t): ~11% of the pool
    assert critical.peak < 0.2 * critical.cap, critical
    assert all(r.preempted == 0 for r in seen), seen


def test_the_same_engine_preempts_once_responses_fill_its_pool(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a response median of 9,216 (12x the row's) fills the pool: the newest sequences are
    # preempted and prefill their whole context again when readmitted
    seen = _replays(monkeypatch, "r01", 9216, tmp_path)
    critical = max(seen, key=lambda r: r.seqs)
    assert critical.peak == critical.cap, critical
    assert critical.preempted > 0 and critical.recompute > 10 * critical.preempted, critical
    # r02's engines hold half as many samples: the same lengths leave room
    seen = _replays(monkeypatch, "r02", 9216, tmp_path)
    critical = max(seen, key=lambda r: r.seqs)
    assert critical.seqs == 512 and critical.peak < 0.7 * critical.cap, critical
    assert all(r.preempted == 0 for r in seen), seen
