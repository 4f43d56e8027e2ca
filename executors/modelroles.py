"""Role workers that hold a model (torch): plain classes that Ray wraps as actors.

  Rollout      generation with the `torch` backend (sampling loop with a KV cache, in the actor);
               `executors.vllm_rollout.VllmRollout` (`vllm`) and `executors.sglang_rollout.
               SglangRollout` (`sglang`) have the same methods (`executors.backends`).
  Reference    frozen policy copy: log-probs for the KL term (at the rollout's temperature).
  ModelReward  a reward model (Llama backbone + scalar head, frozen).
  Critic       PPO value model (`executors.critic`, re-exported here): values for GAE,
               trained on returns; one process, or a context-parallel group.

The workers without a model (the rule reward, the environment) and what every worker shares
(`RunConfig`, `Worker`) are in `executors.roles`, which does not import torch.
"""
from __future__ import annotations

import os
import time

import torch

from executors import rl
from executors.critic import Critic  # noqa: F401 - re-exported (the role classes live here)
from executors.model import ValueModel, state_digest
from executors.precision import autocast
from executors.reshard import BucketLoading, engine_shard, engine_state, engine_unshard
from executors.roles import RunConfig, Worker, _timing
from executors.syncgroup import BUCKETS, IPC, GroupReceiver
from executors.task import Target
from executors.vlm import encoder_spans, load_model
from placer.spec.arch import ModelArch


class Rollout(Worker, BucketLoading, GroupReceiver):
    """Generation with the torch backend. At tp > 1 the engine holds each TP rank's shards
    of the weights (`executors.reshard.engine_shard`), as a refresh delivers them, and gathers
    them whole for its forward on one device (`engine_unshard`): the shards are the engine's
    weights, the model its view of them. It generates in the plan's precision (`cfg.precision`:
    BF16 autocast, as vLLM and SGLang run `dtype=bfloat16`, its sampled log-probs from FP32
    log-softmax). Its weights are FP32 tensors, into which a refresh loads what the trainer
    sent, cast to their dtype as vLLM's `load_weights` copies into its parameters: a BF16 job's
    refresh carries BF16 (`executors.precision.wire_dtype`), so the engine then holds the
    trainer's weights rounded to BF16 (exactly representable in FP32: its digest is the one of
    the weights sent, `Trainer.weights_digest`); an fp32 job's, exactly the trainer's."""

    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "rollout", rank)
        self.model = load_model(cfg.model_dir)
        self._own = self.model.state_dict()  # views of the weights, for a refresh to fill
        self.version = 0
        self.tp, self._kv = cfg.engines.tp, cfg.model_arch.kv_heads
        self._shards = [{k: v.clone() for k, v in engine_state(self._own, self.tp, t,
                                                               self._kv).items()}
                        for t in range(self.tp)] if self.tp > 1 else []
        self._touched: set[str] = set()  # tensors a refresh in progress replaced

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> dict:
        t0 = time.time()
        for name, t in state.items():
            for r in range(self.tp):
                self._load_shard(r, name, engine_shard(name, t, self.tp, r, self._kv))
        self._refreshed()
        self.version = version
        return _timing(t0, version=version)

    def _load_part(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Full tensors of a refresh bucket by bucket (`executors.reshard`): each TP rank's
        cut of each, as it arrives."""
        for name, t in tensors:
            for r in range(self.tp):
                self._load_shard(r, name, engine_shard(name, t, self.tp, r, self._kv))

    def _engine_tp(self) -> int:
        return self.tp

    def sync_member(self) -> tuple[str, int, int, str]:
        """As `GroupReceiver.sync_member`, with the protocol the plan implies: an engine
        colocated with the trainer takes its refreshes as shared memory (`executors.ipc`),
        others over the group in buckets."""
        return "cpu", self.tp, os.getpid(), IPC if self.cfg.engines.colocated else BUCKETS

    def _kv_heads(self) -> int | None:
        return self._kv

    def _load_shard(self, t: int, name: str, shard: torch.Tensor) -> None:
        """TP rank `t`'s shard of tensor `name` into its place (at tp 1 the model's own)."""
        if name not in self._own:
            raise KeyError(f"weight sync: the engine has no tensor {name!r}")
        with torch.no_grad():
            if self.tp == 1:
                self._own[name].copy_(shard)
            else:
                self._shards[t][name].copy_(shard)
                self._touched.add(name)

    def _refreshed(self) -> None:
        """The forward's weights: every replaced tensor gathered whole from its shards."""
        with torch.no_grad():
            for name in self._touched:
                self._own[name].copy_(engine_unshard(name, [s[name] for s in self._shards],
                                                     self._kv))
        self._touched.clear()

    def _expected_names(self) -> set[str]:
        return set(self._own)

    def sleep_engine(self) -> bool:
        """A colocated engine's training-phase sleep: the torch engine keeps its weights
        in host memory already (nothing to free)."""
        return False

    def wake_engine(self) -> bool:
        return False

    def weights_digest(self) -> str:
        """`executors.model.state_digest` of the weights the engine generates with."""
        return state_digest(self._own)

    def engine_shards(self) -> list[dict[str, torch.Tensor]]:
        """Each TP rank's weights, as the engine holds them."""
        return self._shards if self.tp > 1 else [self._own]

    def current_version(self) -> int:
        return self.version

    def executed_layout(self, replicas: int) -> dict[str, int]:
        """One engine per data-parallel replica, each holding the plan's TP shards."""
        return {"dp": replicas, "tp": self.tp, "pp": 1}

    def generate(self, ids: list[str], groups: list[str], contexts: list[list[int]],
                 seeds: list[int], limits: list[int] | None = None) -> tuple[rl.Samples, dict]:
        """Continue each context (a prompt, or a trajectory so far: `executors.rollouts`) by up
        to `limits[i]` tokens (default `max_new_tokens`), stopping at EOS. The samples hold the
        contexts as prompts and the new tokens as responses."""
        t0 = time.time()
        delayed = self._straggle()
        with autocast(self.cfg.precision):  # the plan's BF16, over the refreshed weights
            resp, lps = rl.generate(self.model, contexts, self.cfg.max_new_tokens, seeds,
                                    self.cfg.temperature, limits, eos=self.cfg.codec.eos)
        s = rl.Samples(list(ids), contexts, resp, lps, self.version, list(groups))
        return s, _timing(t0, tokens=sum(len(r) for r in resp), sample_ids=list(ids),
                          version=self.version, batch=len(ids), delayed_s=delayed,
                          **encoder_spans(self.model))


class Reference(Worker):
    """The frozen reference policy's log-probs, its forward in the plan's precision
    (`cfg.precision`: BF16 autocast over its FP32 weights, as the actor's old-log-prob pass;
    the log-softmax in FP32, `rl.scaled_logprobs`)."""

    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "reference", rank)
        self.model = load_model(cfg.model_dir)

    @torch.no_grad()
    def logprobs(self, s: rl.Samples) -> tuple[list[list[float]], dict]:
        t0 = time.time()
        with autocast(self.cfg.precision):
            lp = rl.response_logprobs(self.model, s, self.cfg.temperature)
        rows = [lp[i, :len(r)].tolist() for i, r in enumerate(s.responses)]
        return rows, _timing(t0, tokens=s.tokens(), sample_ids=s.ids, **encoder_spans(self.model))


class ModelReward(Worker):
    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "reward", rank)
        if cfg.reward_arch is None:  # `run_config` sets it whenever the job has a reward model
            raise ValueError("a model reward worker needs the reward model's architecture")
        self.model = ValueModel(ModelArch(**cfg.reward_arch), cfg.seed + 17)
        self.model.eval()

    @torch.no_grad()
    def score(self, s: rl.Samples, results: list[dict], targets: list[Target]) -> tuple[list[float], dict]:
        t0 = time.time()
        return rl.sequence_scores(self.model, s), _timing(t0, tokens=s.tokens(), sample_ids=s.ids)
