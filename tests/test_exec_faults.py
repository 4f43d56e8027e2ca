"""Recovery: actors killed mid-step (ray.kill, and SIGKILL to the worker process); the run
completes and the sample ledger balances.

Faults, each injected right after the role's work of that step was dispatched (in flight):
  step 1  rollout      ray.kill        -> restarted, weights re-synced, its samples re-run
  step 2  environment  SIGKILL         -> restarted, its tool calls re-run
  step 3  actor rank 1 SIGKILL         -> every trainer rank restarts, the process group is
                                          re-formed, the step-1 checkpoint (every 2 steps) is
                                          reloaded, and steps 2 and 3 run again
"""
from __future__ import annotations

import pytest
from exec_util import GRPO_LAYOUT, hand_plan, run_module

from executors.context import Fault

STEPS = 4
pytestmark = pytest.mark.ray
FAULTS = [Fault(1, "rollout", "ray.kill"), Fault(2, "environment", "signal"),
          Fault(3, "actor", "signal", rank=1)]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_module(hand_plan(GRPO_LAYOUT), STEPS, tmp_path_factory.mktemp("faults"),
                      faults=list(FAULTS), checkpoint_every=2)


def test_run_completes_and_ledger_balances(result) -> None:
    assert [s.step for s in result.stats] == list(range(STEPS))
    assert result.ledger_ok, result.ledger_problems
    assert [s.versions for s in result.stats] == [[s] for s in range(STEPS)]


def test_in_flight_samples_were_rerun(result) -> None:
    steps = result.ledger.to_dict()["steps"]
    assert len(steps["1"]["reruns"]) == 32  # the single rollout worker held all 32 samples
    env = [e for e in result.trace.of("restart") if e.name == "restart environment0"]
    assert [e.args["step"] for e in env] == [2]  # the environment batch ran again


def test_trainer_resumed_from_checkpoint(result) -> None:
    assert result.ledger.rolled_back == [2, 3]  # lost with the trainer, run again
    restarts = [e for e in result.trace.of("restart") if e.name == "restart training"]
    assert len(restarts) == 1 and restarts[0].args["resumed_from"] == 1
    kinds = sorted(e.args["kind"] for e in result.trace.of("failure"))
    assert kinds == ["ray.kill", "signal", "signal"]
