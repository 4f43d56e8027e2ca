"""Trace files as the Chrome trace format and Perfetto expect them (traces/schema.py).

Numeric process and thread ids named by `process_name` / `thread_name` metadata events, complete
events that nest or are disjoint on every track (checked over written files: a simulated run and
an executed one), the executor's tool events carrying real durations, and an executed run's trace
naming the plan it ran so that `placer calibrate TRACE` needs no --plan.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.cli import main
from placer.cost.calibration import load_calibration
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from simulator.api import simulate_plan
from traces.schema import Trace, nesting_problems, read_trace

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def plan() -> Plan:
    return plan_job(Pricer(resolve(load_job(ROOT / "examples" / "tiny-agent.yaml")), Calibration()))


def _check_file(path: Path) -> Trace:
    """The raw file: numeric ids, each named once by a metadata event; then read back: names
    restored and every track properly nested."""
    doc = json.loads(path.read_text())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    assert slices and all(isinstance(e["pid"], int) and isinstance(e["tid"], int) for e in slices)
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert {e["pid"] for e in slices} == set(procs)
    assert {(e["pid"], e["tid"]) for e in slices} == set(threads)
    assert len(set(procs.values())) == len(procs)  # one id per process name
    trace = read_trace(path)
    assert {e.pid for e in trace.events} == set(procs.values())
    assert nesting_problems(trace) == []
    return trace


def test_a_simulated_trace_is_numeric_named_and_nested(plan, tmp_path) -> None:
    path = tmp_path / "sim.json"
    sim = simulate_plan(plan, iterations=2, seed=3, trace_path=path)
    back = _check_file(path)
    assert [(e.pid, e.tid, e.name) for e in back.events] == [
        (e.pid, e.tid, e.name) for e in sim.trace.events]


def test_an_executed_trace_nests_its_steps(plan, tmp_path) -> None:
    """One process, no Ray: each `step N` slice starts with its own sync stage, so the stages
    (sync, rollout, score, train) nest inside it; the tool events carry their durations."""
    from executors.run import execute  # lazy: torch only here
    result = execute(plan, 2, tmp_path / "out", local=True)
    result.trace.write(tmp_path / "run.json")
    trace = _check_file(tmp_path / "run.json")
    for step in (0, 1):
        ours = [e for e in trace.events if e.fields.step == step and e.pid == "driver"]
        (slice_,) = [e for e in ours if e.cat == "step"]
        stages = [e for e in ours if e.cat == "stage"]
        assert {e.name for e in stages} >= {"sync", "rollout", "score", "train"}
        assert slice_.ts_s == min(e.ts_s for e in stages)
        assert all(e.end_s <= slice_.end_s + 1e-6 for e in stages)
    tools = trace.of("tool")
    assert tools and all(e.dur_s > 0 for e in tools)
    # one `rl` counter per step on the driver's process, at the step's end, read back
    rl = [c for c in trace.counters if c.name == "rl" and c.pid == "driver"]
    steps = sorted(trace.of("step"), key=lambda e: e.ts_s)
    assert len(rl) == 2 and all(c.ts_s >= s.end_s - 1e-3 for c, s in zip(rl, steps))
    assert all(c.values["grad_norm"] > 0 and c.values["entropy"] > 0 for c in rl)


def test_counters_round_trip_and_bad_values_are_refused(tmp_path) -> None:
    """Counter events (`ph: "C"`) are written after the complete events, on a numbered and
    named process, and read back; a non-number or non-finite value is a TraceError."""
    from traces.schema import TraceError
    tr = Trace()
    tr.add("step 0", "step", 0.0, 1.0, "driver", "loop")
    tr.count("rl", 1.0, "driver", kl=0.25, grad_norm=2)
    tr.write(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert [e["ph"] for e in doc["traceEvents"]][:2] == ["X", "C"]
    back = read_trace(tmp_path / "t.json")
    (c,) = back.counters
    assert (c.name, c.ts_s, c.pid, c.values) == ("rl", 1.0, "driver", {"kl": 0.25,
                                                                        "grad_norm": 2.0})
    with pytest.raises(TraceError, match="args.kl"):
        tr.count("rl", 2.0, "driver", kl=float("nan"))
    doc["traceEvents"][1]["args"] = {"kl": "high"}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"traceEvents.1: counter 'rl': args.kl"):
        read_trace(tmp_path / "bad.json")


def test_the_nesting_check_finds_an_overlap() -> None:
    tr = Trace()
    tr.add("step 0", "step", 0.002, 1.0, "driver", "loop")
    tr.add("rollout", "stage", 0.0, 0.5, "driver", "loop")  # begins before its step
    tr.add("train", "stage", 0.6, 0.3, "driver", "loop")
    tr.add("other track", "stage", 0.0, 5.0, "driver", "loop1")
    (problem,) = nesting_problems(tr)
    assert "driver/loop: step 'step 0'" in problem and "rollout" in problem


def test_tool_events_without_their_own_times_share_the_call() -> None:
    """A sandbox batch that failed as a whole returns no per-answer times: each answer's event
    gets an equal share of the call's wall time, in order, never a zero."""
    from executors.rollouts import _call_times
    timing = {"t0": 100.0, "dur": 0.3}
    got = _call_times([{"status": "error"}, {"status": "ok", "ts": 100.2, "dur": 0.05},
                       {"status": "error", "dur": 0.0}], timing)
    assert got == [pytest.approx((100.0, 0.1)), (100.2, 0.05), pytest.approx((100.2, 0.1))]


def test_execute_names_its_plan_and_calibrate_finds_it(tmp_path, capsys) -> None:
    """`placer execute JOB.yaml --trace T.json` saves the plan it made as T.plan.json and the
    trace names it; then `placer calibrate T.json` runs without --plan."""
    from test_fidelity import executed

    from placer.commands.execute import name_plan, plan_beside
    job = ROOT / "examples" / "tiny-cpu.yaml"
    plan = plan_job(Pricer(resolve(load_job(job)), Calibration()))
    trace_path = tmp_path / "runs" / "t.json"
    trace_path.parent.mkdir()
    trace = executed(plan)
    name_plan(trace, plan, str(job), str(trace_path))
    trace.write(trace_path)
    assert plan_beside(str(trace_path)).is_file()
    assert read_trace(trace_path).metadata["plan_path"] == "t.plan.json"
    out = tmp_path / "p.yaml"
    assert main(["calibrate", str(trace_path), "-o", str(out)]) == 0
    assert "plan: " in capsys.readouterr().err and load_calibration(out) is not None
    name_plan(trace, plan, str(tmp_path / "given.json"), str(trace_path))  # a plan file given
    assert trace.metadata["plan_path"] == str((tmp_path / "given.json").resolve())


def test_async_steps_overlap_on_two_driver_tracks(tmp_path) -> None:
    """In async mode step N+1's sync and rollout run during step N: the driver's slices go on
    two tracks (loop0, loop1), so that each still nests, and the steps do overlap."""
    from exec_util import job_dict

    from executors.run import execute
    from placer.spec.load import job_from_dict
    job = job_from_dict(job_dict(pipeline={"mode": "async", "max_staleness": 1}))
    plan = plan_job(Pricer(resolve(job), Calibration()))
    execute(plan, 3, tmp_path / "out", local=True).trace.write(tmp_path / "run.json")
    trace = _check_file(tmp_path / "run.json")
    steps = sorted((e for e in trace.events if e.cat == "step"), key=lambda e: e.fields.step or 0)
    assert [e.tid for e in steps] == ["loop0", "loop1", "loop0"]
    assert steps[1].ts_s < steps[0].end_s  # overlapping steps, each on its own track
