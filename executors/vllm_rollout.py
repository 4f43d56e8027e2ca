"""The `vllm` rollout backend: a vLLM engine inside the rollout actor (the `gpu` extra).

The engine is configured from the plan and the job (`engine_args`): the rollout role's tensor
parallel size (`tensor_parallel_size`; above 1 the engine's workers are processes on the
actor's bundle GPUs), the job's longest context (`max_model_len`: prompt, every turn's response
and tool output, with BOS), and the share of device memory the plan priced for the role
(`gpu_memory_utilization` = the plan's memory_gb / the device's memory, clamped). It loads the
same model directory the torch workers load (the run's version 0: a built model or the job's
checkpoint folder). Weight sync goes through vLLM's weight-loading API: a worker extension
(`WeightSync`) runs `model.load_weights` on every engine worker via `LLM.collective_rpc`, so
each refresh's tensors, bucket by bucket as they complete (`executors.reshard`; under Ray from the
weight-sync group, `executors.syncgroup`), replace the engine's in place (each TP worker keeps
its shard); then `reset_prefix_cache` drops the KV the old weights computed. A colocated engine
(`EngineGroup.colocated`) starts with `enable_sleep_mode` and sleeps (`sleep(level=1)`) while
the trainer trains, waking (`wake_up`) before the refresh.

Log-probs: every generated token's sampled log-prob comes back from the engine (`logprobs=0`:
the sampled token's own); a missing one is an error (`behaviour_logprobs`), never a zero, since
the trainer's importance weights (`executors.rl`, OFF_POLICY) divide by them.

vLLM is imported only when this backend is chosen; importing this module never loads it.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch

from executors import rl
from executors.engine_common import EngineRollout, checked_logprobs, engine_mem_fraction
from executors.roles import RunConfig, _timing


class WeightSync:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): receives new weights."""

    def update_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        model = self.model_runner.model  # type: ignore[attr-defined]
        loaded = model.load_weights(weights=weights)
        return len(loaded) if loaded is not None else len(weights)


def engine_args(cfg: RunConfig, rank: int) -> dict[str, Any]:
    """The `vllm.LLM` keyword arguments of rollout replica `rank` (plan and job, see above)."""
    args: dict[str, Any] = dict(
        model=cfg.model_dir, tokenizer=cfg.model_dir, dtype="bfloat16", seed=cfg.seed + rank,
        enforce_eager=True, max_model_len=cfg.max_model_len,
        tensor_parallel_size=cfg.engines.tp,
        gpu_memory_utilization=engine_mem_fraction(cfg),
        worker_extension_cls="executors.vllm_rollout.WeightSync")
    if cfg.engines.colocated:  # sleeps while the trainer on its devices trains
        args["enable_sleep_mode"] = True
    if cfg.engines.tp > 1:  # TP workers as processes on this actor's GPUs
        args["distributed_executor_backend"] = "mp"
    return args


def behaviour_logprobs(sample_id: str, tokens: list[int], steps: list[Any] | None) -> list[float]:
    """The sampled tokens' log-probs from vLLM's per-step dicts (token id -> Logprob);
    RuntimeError when absent (`engine_common.checked_logprobs`)."""
    def logprob(step: Any, t: int) -> float | None:
        return None if step is None or t not in step else float(step[t].logprob)
    return checked_logprobs("vllm", sample_id, tokens, steps,
                            "SamplingParams.logprobs must be set", logprob)


class VllmRollout(EngineRollout):
    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, rank)
        # The engine in this process: collective_rpc then calls the worker directly.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM  # lazy: vLLM (gpu extra), after the environment is set
        self.llm = LLM(**engine_args(cfg, rank))

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> dict:
        t0 = time.time()
        self.llm.collective_rpc("update_weights", args=(list(state.items()),))
        self._refreshed()
        self.version = version
        return _timing(t0, version=version)

    def _refreshed(self) -> None:
        """Every tensor in: drop the prefix cache, whose KV the old weights computed (prefix
        caching is on by default; `LLM.reset_prefix_cache` names this RLHF case)."""
        super()._refreshed()
        self.llm.reset_prefix_cache()

    def _sleep(self) -> None:
        self.llm.sleep(level=1)  # weights to host memory, KV cache dropped

    def _wake(self) -> None:
        self.llm.wake_up()

    def _load_part(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """A refresh's tensors as they complete (`executors.reshard`), whole: vLLM's loaders cut
        each TP worker's shard (the split `reshard.engine_shard` follows)."""
        self.llm.collective_rpc("update_weights", args=(tensors,))

    def generate(self, ids: list[str], groups: list[str], contexts: list[list[int]],
                 seeds: list[int], limits: list[int] | None = None) -> tuple[rl.Samples, dict]:
        """As `executors.roles.Rollout.generate`: continue each context by up to `limits[i]`."""
        from vllm import SamplingParams  # lazy: vLLM (gpu extra)
        t0 = time.time()
        limits = limits or [self.cfg.max_new_tokens] * len(ids)
        sp = [SamplingParams(temperature=self.cfg.temperature, max_tokens=max(lim, 1),
                             logprobs=0, seed=int(seed), stop_token_ids=[self.cfg.codec.eos],
                             skip_special_tokens=False) for seed, lim in zip(seeds, limits)]
        outs = self.llm.generate([{"prompt_token_ids": c} for c in contexts], sp, use_tqdm=False)
        outputs = []
        for sid, o in zip(ids, outs):
            c = o.outputs[0]
            toks = list(c.token_ids)
            outputs.append((toks, behaviour_logprobs(sid, toks, c.logprobs)))
        return self._samples(t0, ids, groups, contexts, outputs)
