"""The vllm backend's engine settings come from the plan and the job, and a missing log-prob is
an error (CPU-only: vLLM itself is exercised by tests/test_exec_vllm.py on a GPU machine, which
scripts/gpu_check.sh runs). Importing the backend never imports vLLM."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from exec_util import GRPO_LAYOUT, hand_plan

from executors.roles import run_config
from executors.runplan import resolve_plan
from executors.vllm_rollout import behaviour_logprobs, engine_args
from placer.cost.sharding import Parallel


def test_engine_args_follow_the_plan_and_the_job() -> None:
    layout = {**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")}
    plan = hand_plan(layout)
    cfg = run_config(resolve_plan(plan), model_dir="/m")
    r = plan.roles["rollout"]
    args = engine_args(cfg, rank=1)
    assert args["tensor_parallel_size"] == 2 == r.tp
    assert args["distributed_executor_backend"] == "mp"
    assert args["max_model_len"] == plan.resolved().job.max_context + 1 == 12 + 8 + 1
    frac = r.memory_gb / plan.resolved().device_of(r.pool).memory_gb
    assert args["gpu_memory_utilization"] == pytest.approx(min(max(frac, 0.05), 0.95))
    assert args["seed"] == cfg.seed + 1 and args["model"] == "/m"


def test_missing_log_probs_are_an_error_not_zeros() -> None:
    step = {5: SimpleNamespace(logprob=-0.5), 9: SimpleNamespace(logprob=-2.0)}
    assert behaviour_logprobs("s0", [5, 9], [step, step]) == [-0.5, -2.0]
    with pytest.raises(RuntimeError, match="vllm returned 0 log-probs for 2 tokens of sample s0"):
        behaviour_logprobs("s0", [5, 9], None)
    with pytest.raises(RuntimeError, match=r"no log-prob for token 1 \(7\) of sample s1"):
        behaviour_logprobs("s1", [5, 7], [step, step])


def test_importing_the_backend_does_not_import_vllm() -> None:
    code = "import sys, executors.vllm_rollout; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
