"""The rule reward's and the environment's actor processes start without torch (about 2 s of
CPU each): the modules their classes and arguments live in, and building the workers, import
no torch; nor the planner's plan file, pydantic or numpy (`executors.roles` took ~0.4 s of CPU
with them, ~0.07 s without: `executors.layouts`, and lazy imports where a worker needs them).
Each check runs in a fresh interpreter, as an actor process starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BUILD_WORKERS = """
from executors.roles import EnvWorker, RuleReward, RunConfig
from executors.sandbox import Limits
cfg = RunConfig(algorithm="grpo", arch={"vocab": 64}, model_dir="", seed=0, max_new_tokens=4,
                unsafe_sandbox=True)
RuleReward(cfg)
EnvWorker(cfg, 0, Limits(wall_s=5.0, cpu_s=2, per_item_s=1.0))
"""


HEAVY = ("placer.solve.planfile", "pydantic", "numpy")  # the planner's, not a scoring worker's


def _loaded(code: str, names: tuple[str, ...]) -> list[str]:
    """Which of the modules `names` running `code` in a fresh interpreter loaded."""
    check = code + (f"\nimport json, sys\nprint(json.dumps([n for n in {list(names)!r} "
                    "if n in sys.modules]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def _imports_torch(code: str) -> bool:
    return _loaded(code, ("torch",)) == ["torch"]


@pytest.mark.parametrize("module", [
    "executors.roles",  # RuleReward, EnvWorker, RunConfig
    "executors.samples",  # the batch the rule reward is sent
    "executors.task",  # the answers' targets
    "executors._sandbox_runner",  # the sandbox's interpreter
])
def test_a_torch_free_worker_module_imports_no_torch(module: str) -> None:
    assert not _imports_torch(f"import {module}")


def test_building_the_rule_reward_and_environment_workers_imports_no_torch() -> None:
    assert not _imports_torch(BUILD_WORKERS)


def test_the_check_sees_torch_where_it_is_imported() -> None:
    """The check itself can fail: a worker that holds a model does import torch."""
    assert _imports_torch("import executors.modelroles")


@pytest.mark.parametrize("code", ["import executors.roles", "import executors.task",
                                  BUILD_WORKERS], ids=["roles", "task", "build-workers"])
def test_a_scoring_worker_loads_no_planner_pydantic_or_numpy(code: str) -> None:
    assert _loaded(code, HEAVY) == []


def test_the_heavy_check_sees_what_the_run_plan_loads() -> None:
    """The check can fail: the run plan (the driver's) loads the plan file and its models."""
    assert _loaded("import executors.runplan", HEAVY) == list(HEAVY)
