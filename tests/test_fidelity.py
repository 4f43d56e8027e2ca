"""Fidelity (workflows/fidelity.py, workflows/fidelity_heldout.py, `placer fidelity`).

Executed traces here are written by hand in the executor's format (executors/loop.py: `stage`
events from the driver, `generate`/`train`/`forward`/`transfer`/`reward` events per worker, a
`step` event per step), with known stage times, so every number the report derives from them is
known in advance. No Ray: the executor's own tests run it; this file checks the comparison.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placer.base.errors import SpecError
from placer.cost.calibration import calibration_from_dict
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.planfile import Plan, save_plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from traces.schema import Trace
from workflows.fidelity import fidelity, measured_spans, measured_stages, role_times, write_figures
from workflows.fidelity_heldout import event_profile
from workflows.report import Report
from workflows.stagefit import stage_calibrate

ROOT = Path(__file__).resolve().parent.parent
SYNC, ROLLOUT, ENV, SCORE, TRAIN, OTHER = 0.05, 0.12, 0.5, 0.02, 0.1, 0.03
STEP_S = SYNC + ROLLOUT + ENV + SCORE + TRAIN + OTHER


@pytest.fixture(scope="module")
def plan(planned_example) -> Plan:
    return planned_example(ROOT / "examples" / "tiny-cpu.yaml")


def executed(plan: Plan, steps: int = 3, response: int = 8, gen_s: float = 0.11,
             per_sample: bool = True) -> Trace:
    """A trace as executors/loop.py writes it, with the stage times above."""
    n = plan.resolved().job.batch.samples
    workers = plan.roles["rollout"].dp
    tr = Trace(metadata={"source": "execute", "job": "tiny-cpu"})
    t = 0.0
    for s in range(steps):
        ids = [f"{s}-{k:02d}" for k in range(n)]
        tr.add("sync", "stage", t, SYNC, "driver", "loop", step=s, policy_version=s)
        for w in range(workers):
            tr.add("weight sync", "transfer", t + 0.01, 0.002, "gpu:0", f"rollout{w}", step=s,
                   role="rollout", bytes=328960, src="actor0", devices=["gpu:0:0", "gpu:0:1"])
        t0 = t + SYNC
        tr.add("rollout", "stage", t0, ROLLOUT, "driver", "loop", step=s)
        for w in range(workers):
            mine = ids[w * n // workers:(w + 1) * n // workers]
            extra = ({"response_tokens": [response] * len(mine), "prompt_tokens": [12] * len(mine)}
                     if per_sample else {})
            tr.add("generate", "generate", t0 + 0.005, gen_s, "gpu:0", f"rollout{w}", step=s,
                   role="rollout", sample_ids=mine, tokens=response * len(mine),
                   batch=len(mine), devices=["gpu:0:0", "gpu:0:1"], **extra)
        ts = t0 + ROLLOUT + ENV
        tr.add("score", "stage", ts, SCORE, "driver", "loop", step=s)
        tr.add("reward", "reward", ts + 0.001, 0.001, "cpu:0", "reward0", step=s, role="reward",
               sample_ids=ids, tokens=0)
        tr.add("reference", "forward", ts + 0.001, 0.01, "lpu:0", "reference0", step=s,
               role="reference", sample_ids=ids, tokens=n * 20, devices=["lpu:0:0"])
        tt = ts + SCORE
        tr.add("train", "stage", tt, TRAIN, "driver", "loop", step=s)
        for r in range(plan.roles["actor"].dp):
            tr.add("train actor", "train", tt + 0.005, 0.09, "gpu:0", f"actor{r}", step=s,
                   role="actor", sample_ids=ids[:n // 2], tokens=n * 10, devices=[f"gpu:0:{r}"])
        tr.add(f"step {s}", "step", t, STEP_S, "driver", "loop", step=s)  # sync nests in it
        t = t0 + STEP_S - SYNC
    return tr


def test_measured_side_reads_the_executor_format(plan):
    tr = executed(plan)
    spans = measured_spans(tr)
    assert list(spans) == [0, 1, 2]
    for a, b in spans.values():
        assert b - a == pytest.approx(STEP_S)
    st = measured_stages(tr, spans)[1]
    assert st["sync"] == pytest.approx(SYNC) and st["rollout"] == pytest.approx(ROLLOUT)
    assert st["environment"] == pytest.approx(ENV) and st["train"] == pytest.approx(TRAIN)
    assert st["other"] == pytest.approx(OTHER)
    roles = role_times(tr)[1]
    assert roles["rollout"] == pytest.approx(0.11) and roles["sync"] == pytest.approx(0.002)
    assert roles["actor"] == pytest.approx(0.09)


def test_dispatch_is_not_weight_sync(plan):
    """The single controller's batch dispatch (the simulator's `<role> dispatch`, an unsized
    transfer) is its own row; a role's onload stays the role's; `sync` is the weight push only."""
    tr = executed(plan)
    tr.add("actor dispatch", "transfer", 0.30, 0.03, "gpu", "train", step=1, role="actor",
           policy_version=1)
    tr.add("actor dispatch", "transfer", 0.40, 0.02, "gpu", "train", step=1, role="actor",
           policy_version=1)  # score and train passes on one slot: they add up
    tr.add("reference dispatch", "transfer", 0.30, 0.04, "lpu", "ref", step=1,
           role="reference", policy_version=1)  # another slot: side by side
    tr.add("onload", "transfer", 0.35, 0.004, "lpu:0", "reference0", step=1, role="reference")
    roles = role_times(tr)[1]
    assert roles["sync"] == pytest.approx(0.002)  # the weight pushes alone
    assert roles["dispatch"] == pytest.approx(0.05)
    assert roles["reference"] == pytest.approx(0.01 + 0.004)
    assert roles["actor"] == pytest.approx(0.09)
    # a simulated run: every transfer of the simulator's trace lands in its row
    sim_roles = role_times(fidelity(plan, executed(plan))[1].trace)
    for step, names in sim_roles.items():
        assert "sync" in names and "dispatch" in names, (step, names)


def test_report_lines_up_steps_and_is_json(plan):
    rep, sim = fidelity(plan, executed(plan))
    assert sorted(rep.steps) == [0, 1, 2] and rep.steady == [1, 2]
    assert len(sim.run.iterations) == 3
    for s, p in rep.steps.items():
        assert p.measured == pytest.approx(STEP_S)
        rec = sim.run.iterations[s]
        assert p.simulated == pytest.approx(rec.end - rec.start)
        assert p.error == pytest.approx(p.simulated / p.measured - 1)
    assert rep.lengths.measured.samples == 2 * plan.resolved().job.batch.samples
    assert rep.lengths.measured.makespan_s == pytest.approx(0.005 + 0.11)
    doc = json.loads(rep.to_json())
    assert doc["step"]["measured_s"] == pytest.approx(STEP_S, abs=1e-5)
    assert "fidelity tiny-cpu" in rep.line()
    # the JSON form reads back to the report at its precision (seconds to 6 decimals; a report
    # already at that precision reads back equal: tests/test_typed_results.py)
    back = Report.from_json(rep.to_json())
    assert back.steady == rep.steady and back.lengths == rep.lengths and back.inputs == rep.inputs
    for got, want in ((back.steps, rep.steps), (back.stages, rep.stages), (back.roles, rep.roles)):
        assert list(got) == list(want) or sorted(got) == sorted(want)
        for k, p in want.items():
            assert (got[k].measured, got[k].simulated) == pytest.approx(
                (p.measured, p.simulated), abs=1e-6)


def test_replayed_lengths_drive_the_simulation(plan):
    """The simulation uses the run's recorded response lengths, not the job's."""
    short, _ = fidelity(plan, executed(plan, response=4))
    long, _ = fidelity(plan, executed(plan, response=64))
    assert long.stages["rollout"].simulated > short.stages["rollout"].simulated
    assert long.lengths.simulated.makespan_s > short.lengths.simulated.makespan_s


def test_missing_prompt_lengths_are_noted(plan):
    rep, _ = fidelity(plan, executed(plan, per_sample=False))
    assert rep.inputs is not None
    assert any("no recorded prompt length" in n for n in rep.inputs.notes)


def test_stage_calibration_matches_the_stages_it_fits(plan):
    tr = executed(plan)
    calib = stage_calibrate(plan, tr, calibration_from_dict({"default": {}, "devices": {}}))
    rep, _ = fidelity(plan, tr, calib)
    s = rep.stages
    assert s["sync"].simulated == pytest.approx(SYNC, rel=0.01)
    env_score = s["score"].simulated + (s["environment"].simulated if "environment" in s else 0)
    assert env_score == pytest.approx(ENV + SCORE, rel=0.01)
    assert s["train"].simulated == pytest.approx(TRAIN + OTHER, rel=0.01)  # "other" goes here
    assert calib.fit is not None
    assert set(calib.fit.stages) == {"emu-gpu.sync_latency_s", "laptop-cpu.sandbox_batch_s",
                                     "emu-gpu.train_overhead_s"}


def test_stage_calibration_fits_tool_calls_of_a_multi_turn_run(tmp_path):
    """examples/tiny-agent.yaml run for 3 steps (one process): its tool calls cost more than
    their own run (one sandbox start per batch); the stage fit finds `tool_overhead_s` and the
    simulated rollout stage then matches the measured one (in-sample: fitted on this run)."""
    from executors.run import execute  # lazy: torch only for the one test that executes
    plan = plan_job(Pricer(resolve(load_job(ROOT / "examples" / "tiny-agent.yaml")), Calibration()))
    tr = execute(plan, 3, tmp_path, local=True).trace
    calib = stage_calibrate(plan, tr, event_profile(plan, tr, "tiny-agent run"))
    assert calib.fit is not None
    fit = calib.fit.stages["laptop-cpu.tool_overhead_s"]
    assert fit.stage == "rollout" and fit.value > 0
    assert fit.simulated_s == pytest.approx(fit.measured_s, rel=0.02)


def test_figures_are_written(plan, tmp_path):
    tr = executed(plan)
    rep, sim = fidelity(plan, tr)
    paths = write_figures(rep, sim, tr, tmp_path)
    assert [p.name for p in paths] == ["fidelity_timelines.png", "fidelity_steps.png",
                                       "fidelity_lengths.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_refuses_a_trace_that_is_not_an_executed_run(plan):
    tr = executed(plan)
    no_steps = Trace(tr.metadata, [e for e in tr.events if e.cat != "step"])
    with pytest.raises(SpecError, match="no `step` events"):
        fidelity(plan, no_steps)


def test_refuses_a_plan_with_another_batch(plan):
    job = plan.job | {"batch": plan.job["batch"] | {"prompts": 16}}
    other = plan.model_copy(update={"job": job})
    with pytest.raises(SpecError, match="recorded samples"):
        fidelity(other, executed(plan))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "placer.cli", "fidelity", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_cli_json_and_bad_input(plan, tmp_path):
    save_plan(plan, tmp_path / "plan.json")
    executed(plan).write(tmp_path / "trace.json")
    ok = _cli(str(tmp_path / "plan.json"), str(tmp_path / "trace.json"), "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert set(doc) >= {"step", "steps", "stages", "roles", "lengths"}
    (tmp_path / "bad.json").write_text("{not json")
    for args in ([str(tmp_path / "plan.json"), str(tmp_path / "bad.json")],
                 [str(tmp_path / "plan.json"), str(tmp_path / "missing.json")],
                 [str(tmp_path / "trace.json"), str(tmp_path / "trace.json")]):
        bad = _cli(*args)
        assert bad.returncode == 2, bad.stderr
        assert "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


@pytest.mark.parametrize("argv", [["-m", "workflows.demo", "--steps", "2"],
                                  ["-m", "workflows.fidelity_heldout", "--out", "{tmp}", "--reuse"],
                                  ["-m", "workflows.fidelity_heldout", "--out", "{tmp}",
                                   "--runs", "tp 2,tp 3"]])
def test_entry_points_refuse_bad_arguments(argv, tmp_path):
    """`make demo` and the held-out table say what is wrong in one line (exit 2)."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_environment_inside_the_score_stage(plan):
    """Executors that run the environment inside `score` leave no gap: score holds it, and the
    reward+environment role (environment: the stage less the reward events) is the whole stage."""
    tr = executed(plan)
    events = []
    for e in tr.events:  # stretch each score stage back over the environment's gap
        if e.cat == "stage" and e.name == "score":
            e = type(e)(e.name, e.cat, e.ts_s - ENV, e.dur_s + ENV, e.pid, e.tid, e.args)
        events.append(e)
    tr = Trace(tr.metadata, events)
    rep, _ = fidelity(plan, tr)
    assert "environment" not in rep.stages
    assert rep.stages["score"].measured == pytest.approx(ENV + SCORE)
    assert rep.roles["reward+environment"].measured == pytest.approx(ENV + SCORE)


def test_heldout_reuse_writes_its_table_and_figure(plan, tmp_path):
    """`python -m workflows.fidelity_heldout --reuse` on two runs of the plan (the base and its
    rerun): heldout.md, heldout.json and heldout.png, whose bars and labels are the table's rows."""
    from workflows.fidelity_heldout import figure, run_heldout
    for run, gen_s in (("base", 0.11), ("base_again", 0.2)):
        (tmp_path / run).mkdir()
        save_plan(plan, tmp_path / run / "plan.json")
        executed(plan, gen_s=gen_s).write(tmp_path / run / "trace.json")
    rows = run_heldout(tmp_path, 3, "unused with --reuse", reuse=True, note=print, moe_job=None)
    assert [r.run for r in rows] == ["base", "base again"]
    assert (tmp_path / "heldout.md").read_text().count("\n| base") == 2
    png = tmp_path / "heldout.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    fig = figure(rows, "tiny-cpu")
    ax = fig.axes[0]
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == sorted(round(v, 6) for r in rows for v in
                            (r.measured_s, r.predicted_s, r.event_s, r.stage_s))
    errors = {t.get_text() for t in ax.texts}
    assert errors == {f"{e:+.1%}" for r in rows for e in (r.event_error, r.stage_error)}
