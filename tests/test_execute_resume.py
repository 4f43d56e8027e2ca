"""`placer execute --resume`: a run continues from its last checkpoint, and a `--out` left
half-written (a model folder missing its weights) does not break the runs that follow into it."""
from __future__ import annotations

import json

import pytest
from exec_util import execute_cli

from placer.cli import main


@pytest.mark.ray
def test_resume_continues_from_the_last_checkpoint(grpo_cli_run, capsys) -> None:
    """The first run is the suite's shared CLI run (tests/conftest.py: 2 steps); this test is
    the one that continues its --out."""
    plan, out, first = grpo_cli_run.plan, grpo_cli_run.out, grpo_cli_run.doc
    assert [s["step"] for s in first["steps"]] == [0, 1]
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 1
    (out / "model-v0" / "model.safetensors").unlink()  # a half-written --out: weights missing

    again, _ = execute_cli(plan, out, "--steps", "4", "--resume")
    assert [s["step"] for s in again["steps"]] == [2, 3]
    # the trainer came back at the checkpoint's version, not at version 0
    assert [s["policy_versions"] for s in again["steps"]] == [[2], [3]]
    assert again["ledger_balanced"], again["ledger_problems"]
    assert (out / "model-v0" / "model.safetensors").is_file()  # rebuilt, not loaded half-written
    # its set-up ends restoring the checkpoint (after the trainers' process group is formed)
    assert [p["phase"] for p in again["setup_phases"]][-2:] == [
        "forming the trainers' process group", "restoring the checkpoint of step 1"]

    # finished: resuming it again is bad input, found before Ray starts
    assert main(["execute", str(plan), "--out", str(out), "--steps", "4", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--steps" in err[0] and "already finished step 3" in err[0]
