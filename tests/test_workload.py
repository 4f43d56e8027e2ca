"""Workload traces: the shipped long-tailed trace, replay through a job, and recording from runs."""
from __future__ import annotations

import json

import numpy as np
import pytest
from calibdata import ROOT

from placer.base.errors import SpecError
from placer.calibrate.synthetic import (
    LongTail,
    longtail_rows,
    solve_sigma,
    summarize,
    top_decile_share,
)
from placer.spec.load import load_job
from placer.spec.sampling import draw, draw_lengths, rng
from traces.record import main as record_main
from traces.record import rows_from_trace
from traces.schema import Trace
from traces.workload import read_field, read_rows

SHIPPED = ROOT / "traces/workloads/longtail-synthetic.jsonl"
JOB = ROOT / "examples/longtail-replay.yaml"


def test_shipped_trace_is_what_the_generator_makes():
    rows = read_rows(SHIPPED)
    assert rows == longtail_rows(LongTail())  # `python -m placer.calibrate.synthetic` regenerates it exactly
    assert len(rows) >= 2000


def test_shipped_trace_has_the_cited_tail():
    s = summarize(read_rows(SHIPPED))
    assert s["top10_token_share"] == pytest.approx(0.5, abs=0.03)  # Seer: last 10% ~ 50%
    assert s["response_max"] <= LongTail.response_cap
    assert s["response_p99"] > 10 * s["response_p50"]  # a long tail, not a bump


def test_sigma_solves_the_tail_statement():
    sigma = solve_sigma(2048, 65536, 0.5)
    assert top_decile_share(2048, sigma, 65536) == pytest.approx(0.5, abs=1e-9)
    assert solve_sigma(1.0, 1e300, 0.5) == pytest.approx(1.2815515655, abs=1e-6)  # z_0.9 uncapped


def test_job_replays_the_trace_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # empirical paths resolve against the job file's folder
    job = load_job(JOB)
    resp, tool = job.lengths.response, job.environment.tool_latency_s
    file_resp = np.asarray(read_field(SHIPPED, "response_tokens"))
    file_tool = np.asarray(read_field(SHIPPED, "tool_latency_s"))
    assert resp.mean_value() == pytest.approx(file_resp.mean())
    assert resp.max_value() == file_resp.max()
    drawn = draw_lengths(resp, rng(job.seed, 1), 50_000)
    assert drawn.mean() == pytest.approx(file_resp.mean(), rel=0.03)
    for q in (0.5, 0.9, 0.99):
        assert np.quantile(drawn, q) == pytest.approx(np.quantile(file_resp, q), rel=0.05)
    lat = draw(tool, rng(job.seed, 2), 50_000)
    assert lat.mean() == pytest.approx(file_tool.mean(), rel=0.03)
    assert np.quantile(lat, 0.99) == pytest.approx(np.quantile(file_tool, 0.99), rel=0.08)


def _engine_trace(rows: list[dict], step: int = 0) -> Trace:
    """The events a continuous-batching engine would log for `rows`, one decode event per engine
    step (its live sequences each add one token), one tool event per call."""
    tr, t = Trace({"source": "test"}), 0.0
    turns = max(len(r["response_tokens"]) for r in rows)
    for turn in range(turns):
        live = [r for r in rows if len(r["response_tokens"]) > turn]
        for r in live:
            new = r["prompt_tokens"] if turn == 0 else r.get("tool_output_tokens", [0] * 9)[turn - 1]
            if new:
                tr.add("prefill", "prefill", t, 0.01, "gen:0", "e0", role="rollout", step=step,
                       sample_ids=[r["sample_id"]], tokens=new, batch=1, context=0)
            t += 0.01
        for k in range(max(r["response_tokens"][turn] for r in live)):
            ids = [r["sample_id"] for r in live if r["response_tokens"][turn] > k]
            tr.add("decode", "decode", t, 0.001, "gen:0", "e0", role="rollout", step=step,
                   sample_ids=ids, tokens=len(ids), batch=len(ids), context=0)
            t += 0.001
        for r in live:
            if turn < len(r["tool_latency_s"]):
                tr.add("tool", "tool", t, r["tool_latency_s"][turn], "cpu:0", "env0",
                       role="environment", step=step, sample_ids=[r["sample_id"]])
        t += 1.0
    return tr


def test_record_round_trip(tmp_path):
    src = [{"sample_id": i, "prompt_tokens": 10 + i, "response_tokens": [5 + 3 * i, 7 + i],
            "tool_latency_s": [0.25 * (i + 1)], "tool_output_tokens": [4 + i]} for i in range(6)]
    src.append({"sample_id": 6, "prompt_tokens": 3, "response_tokens": [40],
                "tool_latency_s": []})
    trace = _engine_trace(src, step=2)
    got = rows_from_trace(trace)
    want = [{"step": 2, "turns": len(r["response_tokens"]), **r} for r in src]
    assert sorted(got, key=lambda r: r["sample_id"]) == sorted(
        want, key=lambda r: r["sample_id"])
    path = tmp_path / "t.json"
    trace.write(path)
    assert record_main([str(path), "-o", str(tmp_path / "w.jsonl")]) == 0
    assert read_rows(tmp_path / "w.jsonl") == got
    assert read_field(tmp_path / "w.jsonl", "response_tokens")[:2] == [5.0, 7.0]


def test_record_uses_per_sample_lists_of_batched_events():
    tr = Trace()
    tr.add("prefill", "prefill", 0.0, 0.1, "gen:0", "e0", role="rollout", tokens=30, batch=2,
           sample_ids=["a", "b"], prompt_tokens=[10, 20])
    tr.add("decode", "decode", 0.1, 0.5, "gen:0", "e0", role="rollout", tokens=90, batch=2,
           sample_ids=["a", "b"], response_tokens=[50, 40])
    rows = rows_from_trace(tr)
    assert [(r["sample_id"], r["prompt_tokens"], r["response_tokens"]) for r in rows] == [
        ("a", 10, [50]), ("b", 20, [40])]


def test_record_refuses_traces_without_samples(tmp_path, capsys):
    tr = Trace()
    tr.add("train", "train", 0.0, 1.0, "gpu:0", "s0", role="actor", tokens=100)
    with pytest.raises(SpecError, match="no per-sample events"):
        rows_from_trace(tr, "x.json")
    bad = Trace()
    bad.add("decode", "decode", 0.0, 1.0, "gpu:0", "s0", sample_ids=[1, 2],
            response_tokens=[3])
    path = tmp_path / "bad.json"
    bad.write(path)
    assert record_main([str(path), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "args.response_tokens: per-sample list does not match" in capsys.readouterr().err


def test_recorded_rows_replay_through_a_job(tmp_path):
    rows = longtail_rows(LongTail(samples=40, turns=2, seed=3, response_median=16))
    rec = rows_from_trace(_engine_trace(rows))
    out = tmp_path / "recorded.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rec))
    job_text = JOB.read_text().replace("../traces/workloads/longtail-synthetic.jsonl",
                                       "recorded.jsonl")
    (tmp_path / "job.yaml").write_text(job_text)
    job = load_job(tmp_path / "job.yaml")
    want = np.mean([v for r in rows for v in r["response_tokens"]])
    assert job.lengths.response.mean_value() == pytest.approx(want)


def test_record_generate_events_of_the_executor():
    tr = Trace()
    tr.add("generate", "generate", 0.0, 0.2, "gpu:0", "r0", role="rollout", step=1, batch=2,
           tokens=11, sample_ids=["s0", "s1"], prompt_tokens=[12, 14], response_tokens=[8, 3])
    tr.add("tool", "tool", 0.3, 0.05, "cpu:0", "e0", role="environment", step=1,
           sample_ids=["s0"])
    tr.add("generate", "generate", 0.0, 0.2, "gpu:0", "r0", role="rollout", step=2, batch=2,
           tokens=10, sample_ids=["s0", "s1"])
    rows = rows_from_trace(tr)
    assert rows[:2] == [
        {"step": 1, "sample_id": "s0", "prompt_tokens": 12, "response_tokens": [8],
         "tool_latency_s": [0.05], "turns": 1},
        {"step": 1, "sample_id": "s1", "prompt_tokens": 14, "response_tokens": [3],
         "tool_latency_s": [], "turns": 1}]
    # without per-sample lists: tokens shared, and no prompt length is made up
    assert rows[2] == {"step": 2, "sample_id": "s0", "response_tokens": [5], "tool_latency_s": [],
                       "turns": 1}
