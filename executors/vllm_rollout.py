"""The `vllm` rollout backend: a vLLM engine inside the rollout actor (the `gpu` extra).

The engine loads the same model directory the torch workers load (config, safetensors,
tokenizer written by `executors.model.save_model_dir`). Weight sync goes through vLLM's
weight-loading API: a worker extension (`WeightSync`) runs `model.load_weights` on the engine's
worker via `LLM.collective_rpc`, so each step's weights replace the engine's in place (no reload,
no restart). vLLM is imported only when this backend is chosen; this module is never imported on
machines without it.
"""
from __future__ import annotations

import os
import time

import torch

from executors import rl
from executors.model import EOS
from executors.roles import RunConfig, Worker, _timing


class WeightSync:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): receives new weights."""

    def update_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        model = self.model_runner.model  # type: ignore[attr-defined]
        loaded = model.load_weights(weights=weights)
        return len(loaded) if loaded is not None else len(weights)


class VllmRollout(Worker):
    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "rollout", rank)
        # The engine in this process: collective_rpc then calls the worker directly.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM  # lazy: vLLM (gpu extra), after the environment is set
        self.llm = LLM(model=cfg.model_dir, tokenizer=cfg.model_dir, dtype="bfloat16",
                       seed=cfg.seed + rank, enforce_eager=True, max_model_len=128,
                       gpu_memory_utilization=float(os.environ.get("PLACER_VLLM_MEM", "0.2")),
                       worker_extension_cls="executors.vllm_rollout.WeightSync")
        self.version = 0

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> dict:
        t0 = time.time()
        self.llm.collective_rpc("update_weights", args=(list(state.items()),))
        self.version = version
        return _timing(t0, version=version)

    def current_version(self) -> int:
        return self.version

    def generate(self, ids: list[str], groups: list[str], contexts: list[list[int]],
                 seeds: list[int], limits: list[int] | None = None) -> tuple[rl.Samples, dict]:
        """As `executors.roles.Rollout.generate`: continue each context by up to `limits[i]`."""
        from vllm import SamplingParams  # lazy: vLLM (gpu extra)
        t0 = time.time()
        limits = limits or [self.cfg.max_new_tokens] * len(ids)
        sp = [SamplingParams(temperature=self.cfg.temperature, max_tokens=max(lim, 1),
                             logprobs=0, seed=int(seed), stop_token_ids=[EOS],
                             skip_special_tokens=False) for seed, lim in zip(seeds, limits)]
        outs = self.llm.generate([{"prompt_token_ids": c} for c in contexts], sp, use_tqdm=False)
        resp, lps = [], []
        for o in outs:
            c = o.outputs[0]
            toks = list(c.token_ids)
            resp.append(toks)
            lps.append([float(step[t].logprob) for step, t in zip(c.logprobs or [], toks)]
                       or [0.0] * len(toks))
        s = rl.Samples(list(ids), contexts, resp, lps, self.version, list(groups))
        return s, _timing(t0, tokens=sum(len(r) for r in resp), sample_ids=list(ids),
                          version=self.version, batch=len(ids))
