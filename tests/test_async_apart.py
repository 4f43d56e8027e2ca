"""A framework whose asynchronous pipeline keeps generation off the policy's devices
(`FrameworkProfile.async_apart`): NeMo-RL's async GRPO asserts that its vLLM generation is not
colocated with the policy (nemo_rl/algorithms/grpo.py `async_grpo_train` 4177-4179 at
7ea279ab: colocated async GRPO only with the Megatron generation backend; v0.6.0 2448-2450: not
at all). The ILP never puts the actor and rollout of such a job in one slot, the baselines that
would are not applicable, and a recorded placement that does is refused naming the field."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from placer.base.errors import Infeasible
from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.baselines import baseline_assignments
from placer.solve.ilp_solve import solve
from placer.solve.planner import build_problem, plan_job
from placer.solve.problem import Assignment, keeps_apart
from placer.spec.catalog import resolve
from placer.spec.framework import PROFILES
from placer.spec.load import job_from_dict


def _spec(framework: str, mode: str = "async", pool: dict | None = None) -> dict:
    return {
        "name": "apart", "algorithm": "grpo", "framework": framework,
        "models": {"policy": "Qwen3-4B", "reward": "rule"},
        "batch": {"prompts": 8, "samples_per_prompt": 4},
        "lengths": {"prompt": {"kind": "fixed", "value": 128},
                    "response": {"kind": "fixed", "value": 128}},
        "pipeline": {"mode": mode, "max_staleness": 1},
        "cluster": {"pools": [{"name": "h", "device": "H100-SXM", "devices_per_node": 8,
                               "nodes": 1, **(pool or {})},
                              {"name": "cpu", "device": "cpu-node", "devices_per_node": 1,
                               "nodes": 1}]},
    }


def _problem(framework: str, mode: str = "async", pool: dict | None = None):
    return build_problem(Pricer(resolve(job_from_dict(_spec(framework, mode, pool))),
                                Calibration()))


def test_only_nemo_rl_keeps_an_async_policy_and_engine_apart() -> None:
    nemo = PROFILES["nemo-rl"]
    assert nemo.apart_roles(async_steps=True) == (Role.ACTOR, Role.ROLLOUT)
    assert nemo.apart_roles(async_steps=False) == ()
    for name in ("native", "verl", "verl-megatron", "openrlhf", "miles", "easyr1"):
        assert PROFILES[name].apart_roles(async_steps=True) == ()


def test_the_ilp_never_puts_an_async_nemo_rl_actor_and_rollout_in_one_slot() -> None:
    one_gpu = {"devices_per_node": 1}
    native = solve(_problem("native", pool=one_gpu), time_limit_s=20).assignment
    # one GPU: the actor and rollout share it, the only placement there is...
    assert native.slot_of[Role.ACTOR] == native.slot_of[Role.ROLLOUT]
    # ... which NeMo-RL's async GRPO refuses to run
    with pytest.raises(Infeasible, match="pipeline.mode async"):
        plan_job(Pricer(resolve(job_from_dict(_spec("nemo-rl", pool=one_gpu))), Calibration()),
                 time_limit_s=20)
    problem = _problem("nemo-rl")
    a = solve(problem, time_limit_s=20).assignment
    assert a.slot_of[Role.ACTOR] != a.slot_of[Role.ROLLOUT]
    shared = Assignment(a.choice, {**a.slot_of, Role.ROLLOUT: a.slot_of[Role.ACTOR]})
    assert keeps_apart(problem, a) and not keeps_apart(problem, shared)
    assert keeps_apart(_problem("nemo-rl", "sync"), shared)


def test_baselines_that_share_the_slot_are_not_applicable() -> None:
    problem = _problem("nemo-rl")
    made = baseline_assignments(problem)
    assert made["colocated"] is None
    assert all(keeps_apart(problem, a) for a in made.values() if a is not None)
    assert baseline_assignments(_problem("native"))["colocated"] is not None


def test_a_recorded_colocated_async_placement_exits_2_naming_the_field(tmp_path: Path) -> None:
    spec = _spec("nemo-rl")
    spec["current"] = {"source": "hand", "colocate": [["actor", "rollout"]],
                       "roles": {"actor": {"pool": "h", "devices": 4},
                                 "rollout": {"pool": "h", "devices": 4},
                                 "reference": {"pool": "h", "devices": 4},
                                 "reward": {"pool": "cpu", "devices": 1}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    run = subprocess.run([sys.executable, "-m", "placer.cli", "compare", str(path),
                          "--time-limit", "5"], capture_output=True, text=True, check=False)
    assert run.returncode == 2, run.stderr
    assert "job.current.colocate.0" in run.stderr and "Traceback" not in run.stderr
    assert "async" in run.stderr
