"""`placer calibrate`: exit codes, one JSON document with --json, profiles other commands accept."""
from __future__ import annotations

import json

import pytest
import yaml
from calibdata import ROOT, TRUTH, hand_plan

from placer.calibrate.synthetic import cost_model_trace
from placer.cli import main
from placer.cost.calibration import load_calibration
from placer.solve.planfile import save_plan


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("calib")
    plan = hand_plan()
    save_plan(plan, d / "plan.json")
    # 20 events per kind: forward events are the trainer's passes (`mfu_score`), so the engine's
    # factors (decode_bw_eff and step_overhead_s, a weakly separated pair) rest on prefill and
    # decode events alone
    trace = cost_model_trace(plan, TRUTH, seed=4, noise=0.02, per_kind=20)
    trace.write(d / "trace.json")
    trace.metadata["plan_path"] = "plan.json"
    trace.write(d / "with-path.json")
    trace.metadata = {"source": "execute", "plan": json.loads(plan.to_json())}
    trace.write(d / "embedded.json")
    return d


def test_json_is_one_document_and_profile_is_accepted(run_files, tmp_path, capsys):
    out = tmp_path / "profile.yaml"
    rc = main(["calibrate", str(run_files / "trace.json"), "--plan", str(run_files / "plan.json"),
               "-o", str(out), "--json"])
    cap = capsys.readouterr()
    assert rc == 0
    doc = json.loads(cap.out)  # exactly one JSON document on stdout
    assert doc["profile"] == str(out)
    assert doc["devices"]["L40S"]["decode_bw_eff"] == pytest.approx(0.55, rel=0.05)
    assert doc["fit"]["factors"]["H100-SXM"]["mfu_train"]["events"] >= 3
    calib = load_calibration(out)  # plan/simulate read profiles through this
    assert calib.per_device["H100-SXM"].mfu_train == pytest.approx(0.30, rel=0.05)
    assert main(["validate", "--calibration", str(out),
                 str(ROOT / "examples/ppo-llama8b-hetero.yaml")]) == 0


def test_human_table_and_default_output_path(run_files, capsys):
    rc = main(["calibrate", str(run_files / "trace.json"), "--plan", str(run_files / "plan.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "mfu_train" in out and "decode_bw_eff" in out and "tool latency" in out
    default = run_files / "trace.calibration.yaml"
    assert f"wrote {default}" in out and default.is_file()
    assert load_calibration(default).per_device["L40S"].link_eff == pytest.approx(0.6, rel=0.05)


@pytest.mark.parametrize("name", ["with-path.json", "embedded.json"])
def test_plan_from_trace_metadata(run_files, tmp_path, name, capsys):
    out = tmp_path / "p.json"
    assert main(["calibrate", str(run_files / name), "-o", str(out), "--json"]) == 0
    assert json.loads(out.read_text())["devices"]["H100-SXM"]["mfu_train"] == pytest.approx(
        0.3, rel=0.05)


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_missing_plan_exits_2(run_files, capsys):
    assert main(["calibrate", str(run_files / "trace.json")]) == 2
    assert "metadata names no plan" in _error(capsys)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not a JSON trace"),
    ('{"events": []}', "traceEvents: expected a list"),
    ('{"traceEvents": [{"ph": "X", "name": "d", "ts": 0}]}', "traceEvents.0: bad event"),
])
def test_corrupt_trace_exits_2(run_files, tmp_path, capsys, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert main(["calibrate", str(bad), "--plan", str(run_files / "plan.json")]) == 2
    assert message in _error(capsys)
    assert not (tmp_path / "bad.calibration.yaml").exists()


def test_too_few_events_exits_2(run_files, capsys):
    rc = main(["calibrate", str(run_files / "trace.json"), "--plan", str(run_files / "plan.json"),
               "--min-events", "50"])
    assert rc == 2
    assert "too few events to fit" in _error(capsys)


def test_plan_that_does_not_exist_exits_2(run_files, capsys):
    assert main(["calibrate", str(run_files / "trace.json"), "--plan", "nowhere.json"]) == 2
    assert "nowhere.json" in _error(capsys)


def test_stage_fit_from_the_cli_on_an_executed_run(tmp_path, capsys, planned_example):
    """An executed run (hand-written in the executor's format, known stage times): `placer
    calibrate` without --plan (the trace names it) fits the events AND the stages, and the
    simulated stages then match the measured ones; --events-only leaves the stages out."""
    from test_fidelity import SCORE, SYNC, executed

    plan = planned_example(ROOT / "examples" / "tiny-cpu.yaml")
    save_plan(plan, tmp_path / "run.plan.json")
    trace = executed(plan)
    trace.metadata["plan_path"] = "run.plan.json"
    trace.write(tmp_path / "run.json")
    out = tmp_path / "profile.yaml"
    assert main(["calibrate", str(tmp_path / "run.json"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "stage factor" in text and "emu-gpu.sync_latency_s" in text
    doc = yaml.safe_load(out.read_text())
    stages = doc["fit"]["stages"]
    assert stages["emu-gpu.sync_latency_s"]["simulated_s"] == pytest.approx(SYNC, rel=0.01)
    assert stages["laptop-cpu.sandbox_batch_s"]["measured_s"] > SCORE  # environment + score
    assert load_calibration(out).per_device["emu-gpu"].sync_latency_s == pytest.approx(
        stages["emu-gpu.sync_latency_s"]["value"])
    assert main(["calibrate", str(tmp_path / "run.json"), "-o", str(out), "--events-only",
                 "--json"]) == 0
    assert "stages" not in json.loads(capsys.readouterr().out)["fit"]


def test_a_trace_that_is_not_an_executed_run_gets_the_event_fit_only(run_files, capsys):
    assert main(["calibrate", str(run_files / "embedded.json"), "-o",
                 str(run_files / "e.yaml")]) == 0
    assert "stage fit skipped" in capsys.readouterr().err


def test_the_table_shows_measured_values_and_fits_long_factor_names(tmp_path, capsys,
                                                                     planned_example):
    """A measured factor (the host's cores, from the trace's metadata) shows its value, not
    "(prior)"; a factor name longer than the column (checkpoint_overhead_s) keeps the columns
    aligned."""
    from test_fidelity import executed

    plan = planned_example(ROOT / "examples" / "tiny-cpu.yaml")
    save_plan(plan, tmp_path / "run.plan.json")
    trace = executed(plan, steps=4)
    for s in range(4):  # a checkpoint after every step, as the executor saves by default
        trace.add("checkpoint", "checkpoint", s + 0.9, 0.02, "driver", "loop", step=s)
    trace.metadata.update(plan_path="run.plan.json", host_cores=2)
    trace.write(tmp_path / "run.json")
    assert main(["calibrate", str(tmp_path / "run.json"), "-o", str(tmp_path / "p.yaml"),
                 "--events-only"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  emu-gpu ")]
    cores = next(ln for ln in rows if " host_cores " in ln)
    assert cores.split()[3] == "2"  # device, factor, prior, then the value
    assert any(" checkpoint_overhead_s " in ln for ln in rows)
    # every row's prior column ends at the same place as the header's
    ends = {ln.index(ln.split()[2]) + len(ln.split()[2]) for ln in rows}
    assert len(ends) == 1
