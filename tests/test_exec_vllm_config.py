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


def test_a_colocated_engine_starts_with_sleep_mode() -> None:
    colocated = {**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")}  # the actor's
    assert engine_args(run_config(resolve_plan(hand_plan(colocated)), model_dir="/m"),
                       0)["enable_sleep_mode"] is True
    apart = engine_args(run_config(resolve_plan(hand_plan(GRPO_LAYOUT)), model_dir="/m"), 0)
    assert "enable_sleep_mode" not in apart  # its own LPU slot: never sleeps


class FakeLLM:
    """The `vllm.LLM` methods the backend calls, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        def call(*args, **kw):
            self.calls.append((name, args, kw))
        return call


def _fake_rollout(colocated: bool):
    from executors.runplan import EngineGroup
    from executors.vllm_rollout import VllmRollout
    plan = hand_plan({**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")})
    cfg = run_config(resolve_plan(plan), model_dir="/m")
    cfg = cfg.for_engines(EngineGroup(tp=2, colocated=colocated))
    r = VllmRollout.__new__(VllmRollout)  # the engine without vLLM: a recording LLM
    super(VllmRollout, r).__init__(cfg, 0)
    r.llm = FakeLLM()
    return r


def test_every_refresh_drops_the_prefix_cache() -> None:
    """After the last tensor of a refresh (whole state, buckets, or the weight-sync group) the
    engine resets its prefix cache: KV from the old weights is never reused."""
    import torch
    r = _fake_rollout(colocated=False)
    r.load_weights({"w": torch.ones(2)}, 1)
    assert [c[0] for c in r.llm.calls] == ["collective_rpc", "reset_prefix_cache"]
    r.llm.calls.clear()
    for name in ("a", "b"):  # the group's tensors, each as it completes
        r._load_shard(0, name, torch.ones(3))
    assert r.llm.calls == []  # held for one load
    r._refreshed()
    assert [c[0] for c in r.llm.calls] == ["collective_rpc", "reset_prefix_cache"]
    assert [n for n, _ in r.llm.calls[0][2]["args"][0]] == ["a", "b"]
    assert not r.sleep_engine() and r.llm.calls[-1][0] == "reset_prefix_cache"  # not colocated


def test_a_colocated_engine_sleeps_for_training_and_wakes_once() -> None:
    r = _fake_rollout(colocated=True)
    assert r.sleep_engine() and not r.sleep_engine()
    assert r.wake_engine() and not r.wake_engine()
    assert [(c[0], c[2]) for c in r.llm.calls] == [("sleep", {"level": 1}), ("wake_up", {})]


# ---------------------------------------------------------------------- the API contract
# `vllm.LLM`'s methods and their parameters, read from vLLM's source at the pinned commit
# (github.com/vllm-project/vllm, vllm/entrypoints/llm.py, 0012cf691b7e69423244d2b1405f4b6832156e19:
# `reset_prefix_cache(self, device=None)`, `sleep(self, level=1)`, `wake_up(self, tags=None)`,
# `collective_rpc(self, method, timeout=None, args=(), kwargs=None)`, `generate(self, prompts,
# sampling_params=None, *, use_tqdm=True, lora_request=None, ...)`). vLLM is not installed here
# (the gpu extra): this table is the recorded source, and tests/test_exec_vllm.py runs the
# calls against the real engine on a GPU machine.
VLLM_COMMIT = "0012cf691b7e69423244d2b1405f4b6832156e19"
LLM_METHODS = {
    "generate": {"prompts", "sampling_params", "use_tqdm", "lora_request",
                 "prompt_adapter_request", "guided_options_request"},
    "collective_rpc": {"method", "timeout", "args", "kwargs"},
    "reset_prefix_cache": {"device"},
    "sleep": {"level"},
    "wake_up": {"tags"},
}


def llm_calls() -> list[tuple[str, set[str]]]:
    """Every `self.llm.METHOD(kw=...)` call in the backend's source: (method, keywords)."""
    import ast
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "executors" / "vllm_rollout.py"
    out = []
    for n in ast.walk(ast.parse(src.read_text())):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "llm"):
            out.append((n.func.attr, {k.arg for k in n.keywords if k.arg}))
    return out


def test_every_llm_call_names_a_method_of_the_pinned_vllm() -> None:
    calls = llm_calls()
    assert {c[0] for c in calls} == {"generate", "collective_rpc", "reset_prefix_cache", "sleep",
                                     "wake_up"}
    bad = [(m, kw - LLM_METHODS.get(m, set())) for m, kw in calls
           if m not in LLM_METHODS or kw - LLM_METHODS[m]]
    assert bad == [], f"calls vLLM {VLLM_COMMIT[:10]}'s LLM does not take: {bad}"
