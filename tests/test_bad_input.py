"""Broken job files: each exits 2 with one line naming the field and the value, never a traceback.

Every file under tests/bad_jobs/ is run through `placer validate` twice: in-process through
`placer.cli.main` (fast, pins the message) and as a real subprocess (the console script, as a user
runs it: exit status, stderr, stdout).
"""
from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from placer.base.errors import EXIT_BAD_INPUT
from placer.cli import main

HERE = Path(__file__).resolve().parent
BAD = HERE / "bad_jobs"

# file stem -> (field path, bad value) that the one-line message must name ("" when the mistake
# has no value: a missing key, an empty file).
EXPECT: dict[str, tuple[str, str]] = {
    "malformed_yaml": ("line 3, column 43", "expected ',' or ']'"),
    "tab_indent": ("line 4, column 1", "'\\t'"),
    "empty": ("the file is empty", ""),
    "top_level_list": ("top level", "got list"),
    "unknown_top_key": ("colour: unknown key", "expected one of name, algorithm"),
    "unknown_nested_key": ("batch.minibatches: unknown key", "mini_batches"),
    "wrong_type": ("batch.prompts", "'many'"),
    "bool_for_number": ("batch.prompts", "True"),
    "list_for_mapping": ("batch", "[8, 4]"),
    "negative_size": ("batch.prompts", "-8"),
    "zero_size": ("cluster.pools.0.nodes", "got 0"),
    "infinite_value": ("lengths.prompt.value", "inf"),
    "unknown_device": ("cluster.pools.0.device", "'H300'"),
    "unknown_model": ("models.policy", "'GPT-5'"),
    "unknown_algorithm": ("algorithm", "'dpo'"),
    "bad_enum": ("pipeline.mode", "'sometimes'"),
    "missing_required": ("batch: Field required", ""),
    "batch_not_divisible": ("batch.mini_batches", "2 does not divide the 9 samples"),
    "grpo_one_sample": ("batch.samples_per_prompt", "got 1"),
    "critic_on_grpo": ("models.critic", "'grpo'"),
    "async_without_staleness": ("pipeline", "max_staleness"),
    "distribution_missing_param": ("lengths.response", "needs sigma"),
    "cap_below_min": ("lengths.response", "cap 20 is below min 50"),
    "context_too_long": ("lengths", "1e+12 tokens"),
    "empirical_trace_missing": ("lengths.response.path", "no-such-trace.jsonl"),
    "duplicate_pools": ("cluster", "['gpu']"),
    "nvlink_misaligned": ("cluster.pools.0.nvlink_domain", "3 does not align"),
    "lpu_can_train": ("catalog.devices.0", "can_train"),
    "heads_not_dividing": ("catalog.models.0", "hidden 100 is not divisible by heads 3"),
    "turns_without_env": ("environment.turns", "3 turns"),
    "cluster_file_missing": ("cluster", "no-such-cluster.yaml: no such file"),
    "cpu_pool_cores_as_devices": ("cluster.pools.1.devices_per_node", "cores_per_node: 64"),
    "kl_bad_place": ("kl.in", "'both'"),
    "kl_bad_estimator": ("kl.estimator", "'k4'"),
    "kl_field_name": ("kl.where: unknown key", "expected one of coef, in, estimator"),
    "zero_temperature": ("sampling.temperature", "got 0"),
    "judge_on_rule": ("reward_model.kind", "'rule'"),
    "judge_without_verdict": ("reward_model", "kind 'generative' needs verdict"),
    "images_without_vision": ("lengths.images_per_prompt", "'tiny-llama' has no vision encoder"),
    "agent_without_turn": ("agents.members.verifier", "takes no turn"),
    "agent_turn_unknown": ("agents.turns.2", "'critic' is no agent"),
    "agent_shared_models_differ": ("agents.shared_engines.0.agents",
                                   "'verifier' runs 'tiny-llama-rm'"),
}
FILES = sorted(BAD.glob("*.yaml"))
JSON_TOO = ("malformed_yaml", "empty", "unknown_nested_key", "negative_size", "unknown_device")


def test_every_bad_file_has_an_expectation() -> None:
    assert {f.stem for f in FILES} == set(EXPECT)
    assert len(EXPECT) >= 15


def _check_message(stem: str, path: Path, stderr: str) -> None:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith(f"placer: error: {path}: "), line
    field, value = EXPECT[stem]
    assert field in line and value in line, line


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_bad_job_in_process(path: Path, capsys) -> None:
    assert main(["validate", str(path)]) == EXIT_BAD_INPUT
    out = capsys.readouterr()
    assert out.out == ""
    _check_message(path.stem, path, out.err)


def _run_cli(placer_cmd: list[str], args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([*placer_cmd, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def _through_the_real_cli(placer_cmd: list[str], files: list[Path]) -> None:
    """One subprocess per file (two at a time): the console script, exit 2, one stderr line, and
    nothing on stdout, with and without --json."""
    runs = [(path, flags) for path in files for flags in ([], ["--json"])
            if not flags or path.stem in JSON_TOO]
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(lambda r: _run_cli(placer_cmd, ["validate", str(r[0]), *r[1]]), runs))
    for (path, _), proc in zip(runs, procs):
        assert proc.returncode == EXIT_BAD_INPUT, (path.stem, proc.stderr)
        assert proc.stdout == "", (path.stem, proc.stdout)
        _check_message(path.stem, path, proc.stderr)


def test_bad_jobs_through_the_real_cli(placer_cmd: list[str]) -> None:
    """The files that also run with --json: a YAML error, an empty file, an unknown key, a bad
    value and an unknown catalog name, each through the console script with and without it."""
    _through_the_real_cli(placer_cmd, [p for p in FILES if p.stem in JSON_TOO])


@pytest.mark.slow  # every message: test_bad_job_in_process; the console script: the test above
def test_every_bad_job_through_the_real_cli(placer_cmd: list[str]) -> None:
    _through_the_real_cli(placer_cmd, FILES)


def test_a_bad_file_among_good_ones_stops_with_exit_2(capsys) -> None:
    good = HERE.parent / "examples" / "tiny-cpu.yaml"
    assert main(["validate", str(good), str(BAD / "negative_size.yaml"), "--json"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1


def test_bad_calibration_file_exits_2(tmp_path: Path, capsys) -> None:
    cal = tmp_path / "cal.yaml"
    cal.write_text("default: {mfu_train: fast}\n")
    good = HERE.parent / "examples" / "tiny-cpu.yaml"
    assert main(["validate", str(good), "--calibration", str(cal)]) == 2
    err = capsys.readouterr().err
    assert "default.mfu_train" in err and "'fast'" in err and "Traceback" not in err
