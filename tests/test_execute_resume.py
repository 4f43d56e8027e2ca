"""`placer execute --resume`: a run continues from its last checkpoint, and a `--out` left
half-written (a model folder missing its weights) does not break the runs that follow into it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from exec_util import GRPO_STEPS

from executors.ckptindex import read_latest, write_latest
from executors.run import resume_point
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


def _checkpoint(out: Path, step: int) -> dict[str, Path]:
    """The files of a checkpoint of `step` in `out` (their contents stand in for weights)."""
    d = out / "checkpoints"
    d.mkdir(parents=True)
    files = {k: d / f"{k}-{step:06d}.{ext}" for k, ext in
             (("actor", "pt"), ("critic", "pt"), ("carry", "json"))}
    for k, f in files.items():
        f.write_text(k)
    return files


def test_a_moved_output_folder_resumes_from_its_own_files(tmp_path) -> None:
    """latest.json names its files relative to the output folder: a copy resumes after the
    original is gone, and reads the copy's files, not the original's."""
    first, moved = tmp_path / "first", tmp_path / "elsewhere" / "moved"
    files = _checkpoint(first, 3)
    write_latest(first, 3, str(files["actor"]), str(files["critic"]), None)
    stored = json.loads((first / "checkpoints" / "latest.json").read_text())
    assert stored["actor"] == "checkpoints/actor-000003.pt" and stored["carry"] is None
    shutil.copytree(first, moved)
    shutil.rmtree(first)
    assert resume_point(moved, 6) == 4
    latest = read_latest(moved)
    assert latest["actor"] == str(moved / "checkpoints" / "actor-000003.pt")
    assert Path(latest["critic"]).read_text() == "critic"


def test_an_index_of_absolute_paths_still_reads(tmp_path) -> None:
    """An output folder written when latest.json held absolute paths resumes as before."""
    files = _checkpoint(tmp_path, 2)
    (tmp_path / "checkpoints" / "latest.json").write_text(json.dumps(
        {"step": 2, **{k: str(f) for k, f in files.items()}}))
    assert resume_point(tmp_path, 5) == 3
    assert read_latest(tmp_path)["carry"] == str(files["carry"])
