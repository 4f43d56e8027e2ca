"""`placer execute --resume`: a run continues from its last checkpoint, and a `--out` left
half-written (a model folder missing its weights) does not break the runs that follow into it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from exec_util import GRPO_STEPS

from placer.cli import main


@pytest.mark.ray
def test_resume_continues_from_the_last_checkpoint(grpo_cli_run, capsys) -> None:
    """The suite's shared CLI run (tests/conftest.py) is the resume: it continued a copy of the
    shared API run's --out (ten steps, tests/test_exec_grpo.py), its weights file removed."""
    plan, out, first, again = grpo_cli_run.plan, grpo_cli_run.out, grpo_cli_run.first, \
        grpo_cli_run.doc
    assert [s.step for s in first.stats] == list(range(GRPO_STEPS))
    latest = json.loads((Path(first.out_dir) / "checkpoints" / "latest.json").read_text())
    assert latest["step"] == GRPO_STEPS - 1

    assert [s["step"] for s in again["steps"]] == [GRPO_STEPS, GRPO_STEPS + 1]
    # the trainer came back at the checkpoint's version, not at version 0
    assert [s["policy_versions"] for s in again["steps"]] == [[GRPO_STEPS], [GRPO_STEPS + 1]]
    assert again["ledger_balanced"], again["ledger_problems"]
    assert (out / "model-v0" / "model.safetensors").is_file()  # rebuilt, not loaded half-written
    # its set-up ends restoring the checkpoint (after the trainers' process group is formed)
    assert [p["phase"] for p in again["setup_phases"]][-2:] == [
        "forming the trainers' process group", f"restoring the checkpoint of step {GRPO_STEPS - 1}"]

    # finished: resuming it again is bad input, found before Ray starts
    last = GRPO_STEPS + 1
    assert main(["execute", str(plan), "--out", str(out), "--steps", str(last + 1),
                 "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--steps" in err[0] and f"already finished step {last}" in err[0]
