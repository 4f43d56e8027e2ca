"""`placer execute --resume`: a run continues from its last checkpoint, and a `--out` left
half-written (a model folder missing its weights) does not break the runs that follow into it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from exec_util import GRPO_LAYOUT, ROOT, hand_plan

from placer.cli import main
from placer.planfile import save_plan


def _execute(plan: Path, out: Path, *extra: str) -> dict:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    p = subprocess.run([sys.executable, "-m", "placer.cli", "execute", str(plan), "--json",
                        "--out", str(out), *extra], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc: dict = json.loads(p.stdout)
    return doc


@pytest.mark.ray
def test_resume_continues_from_the_last_checkpoint(tmp_path, capsys) -> None:
    plan, out = tmp_path / "plan.json", tmp_path / "out"
    save_plan(hand_plan(GRPO_LAYOUT), plan)
    first = _execute(plan, out, "--steps", "2")
    assert [s["step"] for s in first["steps"]] == [0, 1]
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 1
    (out / "model-v0" / "model.safetensors").unlink()  # a half-written --out: weights missing

    again = _execute(plan, out, "--steps", "4", "--resume")
    assert [s["step"] for s in again["steps"]] == [2, 3]
    # the trainer came back at the checkpoint's version, not at version 0
    assert [s["policy_versions"] for s in again["steps"]] == [[2], [3]]
    assert again["ledger_balanced"], again["ledger_problems"]
    assert (out / "model-v0" / "model.safetensors").is_file()  # rebuilt, not loaded half-written

    # finished: resuming it again is bad input, found before Ray starts
    assert main(["execute", str(plan), "--out", str(out), "--steps", "4", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--steps" in err[0] and "already finished step 3" in err[0]
