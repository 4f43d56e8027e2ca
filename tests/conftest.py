"""Fixtures shared by the test files, and the suite's settings.

`PLACER_STRICT_TRACES=1`: every trace the suite writes or reads through `TraceEvent.fields` must
use only the keys `traces.schema.EventArgs` names (outside the tests a foreign key is kept).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PLACER_STRICT_TRACES", "1")

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CliRun:
    plan: Path  # the plan file run
    out: Path  # its --out
    trace: Path  # its --trace
    doc: dict[str, Any]  # the JSON document it printed
    stderr: str
    listening: dict[str, str]  # every socket its process tree listened on -> process names


@pytest.fixture(scope="session")
def grpo_cli_run(tmp_path_factory: pytest.TempPathFactory) -> CliRun:
    """`placer execute` of the GRPO hand plan (tests/exec_util.py) through the real CLI, 2 steps,
    its listening sockets read while it runs (with `ss`): tests/test_execute_cli.py checks what
    it prints and writes, tests/test_listeners.py where it listened, and
    tests/test_execute_resume.py then continues its --out with --resume, so that the three share
    one Ray run. (The resume changes the --out in place; the other checks read only `doc`,
    `stderr`, `trace` and `listening`.)"""
    import shutil

    from exec_util import GRPO_LAYOUT, execute_cli, hand_plan  # lazy: the planner, when asked
    from listening import listening

    from placer.solve.planfile import save_plan
    d = tmp_path_factory.mktemp("cli-run")
    plan, out, trace = d / "plan.json", d / "out", d / "trace.json"
    save_plan(hand_plan(GRPO_LAYOUT), plan)
    seen: dict[str, str] = {}
    watch = (lambda pid: seen.update(listening(pid))) if shutil.which("ss") else None
    doc, stderr = execute_cli(plan, out, "--steps", "2", "--trace", str(trace), watch=watch)
    return CliRun(plan, out, trace, doc, stderr, seen)


@pytest.fixture(scope="session")
def placer_cmd() -> list[str]:
    """The `placer` console script next to this interpreter (else `python -m placer.cli`)."""
    script = Path(sys.executable).with_name("placer")
    return [str(script)] if script.exists() else [sys.executable, "-m", "placer.cli"]

