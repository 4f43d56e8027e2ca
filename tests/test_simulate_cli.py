"""`placer simulate`: table, --json, --trace, --plots; bad input exits 2 with one line."""
from __future__ import annotations

import json

from simplans import small_plan

from placer.cli import main
from placer.solve.planfile import save_plan
from traces.schema import read_trace


def _plan_file(tmp_path):
    path = tmp_path / "plan.json"
    save_plan(small_plan(), path)
    return path


def test_json_trace_and_plots(tmp_path, capsys):
    plan = _plan_file(tmp_path)
    trace, plots = tmp_path / "sim.json", tmp_path / "figs"
    rc = main(["simulate", str(plan), "--iterations", "2", "--seed", "1", "--trace", str(trace),
               "--plots", str(plots), "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)  # stdout is one JSON document
    assert doc["iterations"] == 2 and doc["iteration_s"]["mean"] > 0
    t = read_trace(trace)
    assert t.metadata["source"] == "simulate"
    cats = {e.cat for e in t.events}
    assert {"decode", "prefill", "tool", "transfer", "train", "forward"} <= cats
    assert sorted(p.name for p in plots.iterdir()) == [
        "response_vs_completion.png", "timeline.png", "utilization.png"]


def test_table_output(tmp_path, capsys):
    assert main(["simulate", str(_plan_file(tmp_path)), "--no-variance"]) == 0
    out = capsys.readouterr().out
    assert "predicted" in out and "why" in out


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


def test_plan_that_does_not_match_its_job(tmp_path, capsys):
    doc = json.loads(_plan_file(tmp_path).read_text())
    doc["roles"].pop("reference")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["simulate", str(bad)]) == 2
    assert "roles" in _err(capsys)


def test_corrupt_workload_trace(tmp_path, capsys):
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"prompt_tokens": 10, "response_tokens": [5, 5]}\n{not json\n')
    assert main(["simulate", str(_plan_file(tmp_path)), "--workload", str(wl)]) == 2
    assert "w.jsonl:2" in _err(capsys)


def test_workload_missing_tool_latencies(tmp_path, capsys):
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"prompt_tokens": 10, "response_tokens": [5, 5]}\n')
    assert main(["simulate", str(_plan_file(tmp_path)), "--workload", str(wl)]) == 2
    assert "tool_latency_s" in _err(capsys)


def test_workload_replay_runs(tmp_path, capsys):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt_tokens": 100, "response_tokens": [50 + i, 20],
                                      "tool_latency_s": [0.5]}) + "\n" for i in range(10)))
    assert main(["simulate", str(_plan_file(tmp_path)), "--workload", str(wl), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tool_calls"] == 128 * doc["iterations"]  # 128 samples, one call each


def test_bad_config_and_iterations(tmp_path, capsys):
    plan = _plan_file(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("stragglers: {fraction: 2}\n")
    assert main(["simulate", str(plan), "--config", str(cfg)]) == 2
    assert "stragglers.fraction" in _err(capsys)
    cfg.write_text("nonsense: 1\n")
    assert main(["simulate", str(plan), "--config", str(cfg)]) == 2
    assert "nonsense" in _err(capsys)
    assert main(["simulate", str(plan), "--iterations", "0"]) == 2
    assert "--iterations" in _err(capsys)


def test_missing_plan_file(tmp_path, capsys):
    assert main(["simulate", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in _err(capsys)


def test_default_reports_the_steady_state_with_an_interval(tmp_path, capsys):
    assert main(["simulate", str(_plan_file(tmp_path)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ss = doc["steady_state"]
    assert ss["iterations"] == doc["iterations"] >= 8  # more than one batch: an interval
    lo, hi = ss["ci95_s"]
    assert lo < ss["iteration_s"] < hi and ss["warmup_excluded"]
    assert ss["converged"] == (ss["rel_half_width"] <= ss["target_rel"])
    assert main(["simulate", str(_plan_file(tmp_path)), "--iterations", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 iteration(s)" in out and "steady state" in out and "95% CI" in out


def test_bad_ci_target_exits_2(tmp_path, capsys):
    for bad in ("0", "1.5", "nan"):
        assert main(["simulate", str(_plan_file(tmp_path)), "--ci", bad]) == 2
        assert "--ci" in capsys.readouterr().err
