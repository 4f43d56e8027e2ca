"""What the engine rollout backends (`executors.vllm_rollout`, `executors.sglang_rollout`) share.

Both run an inference library's engine inside the rollout actor and differ only in how they
configure it, hand it weights and read its outputs. Common to both:

  * the memory share the plan priced for the rollout, clamped to what the engines accept
    (`engine_mem_fraction`);
  * the sampled log-prob of every generated token, checked, never replaced by a zero
    (`checked_logprobs`): the trainer's importance weights (`executors.rl`, OFF_POLICY) divide
    by them;
  * the worker's policy version, its engine layout (one engine of the rollout's TP per data-
    parallel replica, no pipeline stages), and the samples with their timing (`EngineRollout`).

Nothing here imports vLLM or SGLang.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from executors import rl
from executors.reshard import BucketLoading
from executors.roles import RunConfig, Worker, _timing
from executors.syncgroup import GroupReceiver

# vLLM refuses 0 and SGLang needs some static memory; both need headroom below 1
MEM_FRACTION = (0.05, 0.95)
# A group refresh's tensors go to the engine's loader in loads of about this many bytes
LOAD_BYTES = 1 << 28

Step = TypeVar("Step")


def engine_mem_fraction(cfg: RunConfig) -> float:
    """The plan's memory share of the rollout (memory_gb / device memory), clamped."""
    lo, hi = MEM_FRACTION
    return min(max(cfg.engines.mem_fraction, lo), hi)


def checked_logprobs(engine: str, sample_id: str, tokens: list[int], steps: list[Step] | None,
                     how: str, logprob: Callable[[Step, int], float | None]) -> list[float]:
    """The log-prob of each of `tokens` from the engine's per-token `steps` (`logprob(step,
    token)`: the step's log-prob of that token, None when it has none); RuntimeError when the
    steps are absent or too few or many (`how`: what the request must set), or a token has none."""
    if steps is None or len(steps) != len(tokens):
        raise RuntimeError(f"{engine} returned {0 if steps is None else len(steps)} log-probs for "
                           f"{len(tokens)} tokens of sample {sample_id} ({how}); the trainer's "
                           "importance weights need every one")
    out = []
    for k, (step, t) in enumerate(zip(steps, tokens)):
        lp = logprob(step, t)
        if lp is None:
            raise RuntimeError(f"{engine} returned no log-prob for token {k} ({t}) of sample "
                               f"{sample_id}")
        out.append(lp)
    return out


class EngineRollout(Worker, BucketLoading, GroupReceiver):
    """A rollout worker whose engine is an inference library's: the subclass starts the engine
    and implements loading (`_load_part`: full tensors, the engine's loaders cut each TP
    worker's shard) and generation; this holds the version and builds the samples. On the
    weight-sync group the actor is one rank that receives full tensors and hands them to the
    loader in loads of `LOAD_BYTES` (`_load_shard`), the rest when the refresh completes."""

    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "rollout", rank)
        self.version = 0
        self._pending: list[tuple[str, torch.Tensor]] = []
        self._pending_bytes = 0

    def _engine_tp(self) -> int:
        """The engine's TP ranks: each takes its own hand-over handle (`executors.ipc`)."""
        return self.cfg.engines.tp

    def _load_shard(self, t: int, name: str, shard: torch.Tensor) -> None:
        self._pending.append((name, shard))
        self._pending_bytes += shard.numel() * shard.element_size()
        if self._pending_bytes >= LOAD_BYTES:
            self._flush()

    def _flush(self) -> None:
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if pending:
            self._load_part(pending)

    def _refreshed(self) -> None:
        self._flush()

    def sleep_engine(self) -> bool:
        """Free the engine's device memory for the trainer (a colocated slot's training
        phase); whether it slept. The subclass's `_sleep` / `_wake` call the engine."""
        if not self.cfg.engines.colocated or self._asleep:
            return False
        self._sleep()
        self._asleep = True
        return True

    def wake_engine(self) -> bool:
        """Take the memory back before a refresh or generation; whether it woke."""
        if not self._asleep:
            return False
        self._wake()
        self._asleep = False
        return True

    _asleep = False

    def _sleep(self) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        raise NotImplementedError

    def current_version(self) -> int:
        return self.version

    def executed_layout(self, replicas: int) -> dict[str, int]:
        return {"dp": replicas, "tp": self.cfg.engines.tp, "pp": 1}

    def _samples(self, t0: float, ids: list[str], groups: list[str],
                 contexts: list[list[int]], outputs: list[tuple[list[int], list[float]]]
                 ) -> tuple[rl.Samples, dict[str, Any]]:
        """The samples of one `generate` call (each output: its tokens and their log-probs) at
        this worker's version, with the call's timing since `t0`."""
        resp = [toks for toks, _ in outputs]
        lps = [lp for _, lp in outputs]
        s = rl.Samples(list(ids), contexts, resp, lps, self.version, list(groups))
        return s, _timing(t0, tokens=sum(len(r) for r in resp), sample_ids=list(ids),
                          version=self.version, batch=len(ids))
