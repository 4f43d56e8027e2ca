"""The `sglang` rollout backend: an SGLang engine inside the rollout actor (the `sglang` extra).

The engine (`sglang.srt.entrypoints.engine.Engine`, SGLang's offline engine: a tokenizer manager
in the actor's process, the scheduler and its TP workers as subprocesses on the actor's GPUs) is
configured from the plan and the job (`engine_kwargs`, every key a `ServerArgs` field): the
rollout's `tp_size`, the job's longest context (`context_length`, with BOS), the share of device
memory the plan priced (`mem_fraction_static` = the plan's memory_gb / the device's, clamped)
and the run's seed per replica (`random_seed`). It loads the run's version-0 model directory.
Token ids go in and come out (`skip_tokenizer_init`): the executor's codec owns the text. CUDA
graphs are off, as the vLLM engine runs eager: the engines here are small and short-lived.

Weight sync: each refresh is one weight-update session (`begin_weight_update` ...
`end_weight_update`, which SGLang 0.5.23 requires around every `update_weights_from_tensor`),
and the refresh's tensors go to `update_weights_from_tensor` as their buckets complete
(`executors.reshard`). They travel whole (each TP rank's `model.load_weights` cuts its own shard)
and stay on the CPU: a CUDA tensor here would open a CUDA context in the actor's process, on the
GPU the engine shares. After the session the prefix (radix) cache is flushed: its KV entries
were computed with the old weights. Under Ray the engine's TP ranks are members of the weight-sync group
(`executors.syncgroup`, SGLang's protocol): they join each sender's group
(`init_weights_update_group`) and receive the refresh themselves, one broadcast per tensor
(`update_weights_from_distributed` with the names, dtypes and shapes: the control message;
the dtypes the refresh's, BF16 for a BF16 job as the engine's `dtype=bfloat16`,
`executors.precision.wire_dtype`), the whole refresh in one session; when the driver re-forms
a path's group, the engine first destroys the old one (`destroy_weights_update_group`). A
colocated engine on a GPU is handed each bucket as the whole tensors it completes, one CUDA
IPC handle per tensor and TP rank, exported by the trainer rank on that rank's device with
the device named by UUID (`executors.ipc`, protocol `IPC_TENSORS`): this process never opens
them (no CUDA context here) but passes them to `update_weights_from_tensor` as SGLang's per-TP-rank payloads
(`LocalSerializedTensor(values=[one per TP rank])`, which each TP rank deserializes for itself,
`_unwrap_tensor`; as verl's SGLang rollout hands over its tensors), in one weight-update
session. Without a GPU (tests) the buckets come as host shared memory, mapped here and loaded
as they complete (protocol `IPC`). A colocated engine
(`EngineGroup.colocated`) starts with `enable_memory_saver` and releases its memory
(`release_memory_occupation`) while the trainer trains, resuming it
(`resume_memory_occupation`) before the refresh. Bytes and times reach the trace as every
engine's do.

Log-probs: every generated token's sampled log-prob comes back from the engine
(`meta_info["output_token_logprobs"]`, of the temperature-scaled distribution, as the torch
backend's `rl.generate`); a missing one, or one for another token, is an error
(`sample_logprobs`), never a zero, since the trainer's importance weights divide by them. Each
sample's seed goes in `sampling_seed`; SGLang applies it only under
`enable_deterministic_inference` (not set here: it restricts the attention kernels), so a
re-generated sample may differ. SGLang is imported only when this backend is chosen.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch

from executors import rl
from executors.engine_common import EngineRollout, checked_logprobs, engine_mem_fraction
from executors.ipc import Export, Picks, picked, taken
from executors.reshard import Bucket, BucketHead
from executors.roles import RunConfig, _timing
from executors.syncgroup import IPC, IPC_TENSORS, PER_TENSOR, GroupSpec, Manifest

# FlashInfer's and FA3's prebuilt attention kernels start at head dim 64 (FA3: 64, 96, 128,
# 192, 256); SGLang's Triton kernels pad any head dim to a power of two.
TRITON_BELOW_HEAD_DIM = 64


def engine_kwargs(cfg: RunConfig, rank: int) -> dict[str, Any]:
    """The `Engine` keyword arguments (`ServerArgs` fields) of rollout replica `rank`."""
    arch = cfg.model_arch
    kw: dict[str, Any] = dict(
        model_path=cfg.model_dir, skip_tokenizer_init=True, dtype="bfloat16",
        random_seed=cfg.seed + rank, tp_size=cfg.engines.tp, context_length=cfg.max_model_len,
        mem_fraction_static=engine_mem_fraction(cfg),
        disable_cuda_graph=True, base_gpu_id=0,  # the actor's bundle GPUs (Ray's visible set)
        log_level="error")
    if cfg.engines.colocated:  # releases its memory while the trainer on its devices trains
        kw["enable_memory_saver"] = True
    if (arch.head_dim or arch.hidden // arch.heads) < TRITON_BELOW_HEAD_DIM:
        kw["attention_backend"] = "triton"
    return kw


def sampling_params(cfg: RunConfig, seeds: list[int], limits: list[int]) -> list[dict[str, Any]]:
    """One SGLang `SamplingParams` dict per sample: up to `limits[i]` new tokens, stop at EOS."""
    return [{"max_new_tokens": max(int(lim), 1), "temperature": cfg.temperature,
             "stop_token_ids": [cfg.codec.eos], "sampling_seed": int(seed)}
            for seed, lim in zip(seeds, limits)]


def sample_logprobs(sample_id: str, out: dict[str, Any]) -> tuple[list[int], list[float]]:
    """(tokens, their log-probs) of one `Engine.generate` output; RuntimeError when the engine
    aborted the request or a token's log-prob is absent or belongs to another token."""
    meta = out.get("meta_info") or {}
    finish = meta.get("finish_reason") or {}
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise RuntimeError(f"sglang aborted sample {sample_id}: {finish.get('message', '')}")
    tokens = [int(t) for t in out.get("output_ids") or []]

    def logprob(step: Any, t: int) -> float | None:  # (logprob, token id, text)
        return None if step is None or step[0] is None or int(step[1]) != t else float(step[0])
    return tokens, checked_logprobs("sglang", sample_id, tokens,
                                    meta.get("output_token_logprobs"),
                                    "generate needs return_logprob=True", logprob)


def start_engine(kwargs: dict[str, Any]) -> Any:
    """An SGLang offline engine (lazy import: the `sglang` extra, CUDA)."""
    from sglang.srt.entrypoints.engine import Engine  # lazy: SGLang loads CUDA libraries
    return Engine(**kwargs)


def local_serialized(values: list[bytes]) -> Any:
    """SGLang's per-TP-rank tensor payload (`LocalSerializedTensor`: rank t deserializes
    `values[t]` only; lazy import: the engine's process has SGLang)."""
    from sglang.srt.model_executor.model_runner_components.weight_updater import (
        LocalSerializedTensor,
    )
    return LocalSerializedTensor(values=values)


def on_gpu() -> bool:
    """Whether the engine's TP ranks run on GPUs (CUDA IPC hand-over) or the test's CPU."""
    return torch.cuda.is_available()


def _ok(what: str, result: Any) -> None:
    """SGLang's control calls answer (success, message) or an object with `success`."""
    ok, msg = (result[0], result[1]) if isinstance(result, tuple) else (
        getattr(result, "success", True), getattr(result, "message", ""))
    if not ok:
        raise RuntimeError(f"sglang {what} failed: {msg}")


class SglangRollout(EngineRollout):
    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, rank)
        self.engine = start_engine(engine_kwargs(cfg, rank))
        self._session: str | None = None  # the refresh whose weight-update session is open
        self._groups: dict[str, GroupSpec] = {}  # the weight-sync groups it joined, by name
        self._handed: dict[int, tuple[int, int]] = {}  # a tensor hand-over: sender -> (got, of)

    def _open(self, refresh: str) -> None:
        """Open refresh `refresh`'s weight-update session (closing one a broken refresh left)."""
        if self._session is not None:
            _ok("end_weight_update", self.engine.end_weight_update())
        _ok("begin_weight_update", self.engine.begin_weight_update())
        self._session = refresh

    def _close(self) -> None:
        """End the session; drop the KV prefixes the old weights computed."""
        _ok("end_weight_update", self.engine.end_weight_update())
        self._session = None
        _ok("flush_cache", self.engine.flush_cache())

    def _load_part(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """A refresh's tensors as they complete, whole (each TP rank's loader cuts its shard);
        the cache is flushed once, when the session ends."""
        _ok("update_weights_from_tensor", self.engine.update_weights_from_tensor(
            named_tensors=tensors, load_format=None, flush_cache=False))

    def receive_bucket(self, b: Bucket, version: int, senders: int, refresh: str
                       ) -> dict[str, Any]:
        """`BucketLoading.receive_bucket` inside the refresh's session: the first bucket of a
        refresh opens it, the last closes it; the call's time includes both."""
        t0 = time.time()
        if self._session != refresh:
            self._open(refresh)
        out = super().receive_bucket(b, version, senders, refresh)
        if out["done"]:
            self._close()
        return {**out, "t0": t0, "dur": time.time() - t0}

    def sync_member(self) -> tuple[str, int, int, str]:
        """The engine's TP ranks join the group themselves, on their GPUs, with SGLang's
        protocol; a colocated engine on GPUs takes each bucket's whole tensors as CUDA IPC
        handles (`handover_receive_tensors`), on the CPU (tests) as host shared memory: this
        process maps each bucket (one handle per TP rank) and passes the tensors it completes
        to `update_weights_from_tensor` in the refresh's session."""
        if self.cfg.engines.colocated:
            return ("cuda", self.cfg.engines.tp, os.getpid(), IPC_TENSORS) if on_gpu() else (
                "cpu", self.cfg.engines.tp, os.getpid(), IPC)
        return "cuda", self.cfg.engines.tp, os.getpid(), PER_TENSOR

    def handover_receive_tensors(self, head: BucketHead, version: int, senders: int,
                                 refresh: str, picks: Picks, *exports: Export
                                 ) -> dict[str, Any]:
        """Bucket `head` of a colocated refresh as the whole tensors it completes: per tensor
        one handle per TP rank (`picks[t]`: the export of the trainer rank on rank t's device),
        passed unopened as SGLang's per-rank payload (`local_serialized`) to
        `update_weights_from_tensor` inside the refresh's session; the last bucket of every
        sender's stream closes it. The acknowledgement names the handles consumed."""
        t0 = time.time()
        if self._session != refresh:
            self._open(refresh)
            self._handed = {}
        mine = picked(picks, exports)  # per TP rank: [(name, handle)] in one order
        names = [n for n, _ in mine[0]]
        if any([n for n, _ in m] != names for m in mine):
            raise RuntimeError(f"weight sync: the TP ranks' handles of bucket {head.index} "
                               "name different tensors")
        if names:
            _ok("update_weights_from_tensor", self.engine.update_weights_from_tensor(
                named_tensors=[(n, local_serialized([m[i][1] for m in mine]))
                               for i, n in enumerate(names)],
                load_format=None, flush_cache=False))
        got, _ = self._handed.get(head.sender, (0, head.count))
        self._handed[head.sender] = (got + 1, head.count)
        done = len(self._handed) == senders and all(g == c for g, c in self._handed.values())
        if done:
            self._close()
            self.version = version
        sizes = {e.name: e.nbytes for e in head.entries}
        return {"t0": t0, "dur": time.time() - t0, "bytes": sum(sizes[n] for n in names),
                "done": done, "version": version, "bucket": head.index,
                "receivers": taken(picks, exports)}

    def sync_join(self, spec: GroupSpec, engine: int) -> bool:
        """Every TP rank joins each channel's group (`init_weights_update_group`: rank
        `rank_offset` + its TP rank; the sender is rank 0)."""
        if spec.send_shards:
            raise RuntimeError("weight sync: the sglang backend loads whole tensors (its "
                               "loaders cut each TP rank's shard); sending-side resharding is "
                               "not supported")
        if spec.tps[engine] != self.cfg.engines.tp:
            raise RuntimeError(f"weight sync: engine {engine} runs tp {self.cfg.engines.tp}, "
                               f"the group expects {spec.tps[engine]}")
        self._destroy_path(spec.path)
        for ch in spec.channels():
            _ok("init_weights_update_group", self.engine.init_weights_update_group(
                master_address=spec.addr, master_port=spec.port,
                rank_offset=spec.engine_rank(ch, engine, 0), world_size=spec.world(ch),
                group_name=spec.key(ch), backend=spec.backend))
        self._groups = {**self._groups, spec.name: spec}
        return True

    def _destroy_path(self, path: int) -> list[str]:
        """Destroy the groups an earlier spec of refresh path `path` formed (the driver
        re-forms a path's group when its members change, or after a failure): SGLang keeps
        every group it joined until `destroy_weights_update_group`. A group SGLang no longer
        holds (its scheduler restarted) is not an error; the groups destroyed."""
        gone = []
        for old in [sp for sp in self._groups.values() if sp.path == path]:
            del self._groups[old.name]
            for ch in old.channels():
                out = self.engine.destroy_weights_update_group(group_name=old.key(ch))
                ok = out[0] if isinstance(out, tuple) else getattr(out, "success", True)
                if ok:
                    gone.append(old.key(ch))
        return gone

    def sync_receive(self, name: str, manifests: list[Manifest], version: int
                     ) -> dict[str, Any]:
        """The refresh off the group in one weight-update session: per channel (sender)
        `update_weights_from_distributed` with its tensors' names, dtypes and shapes (the
        engine's TP ranks receive and load them); then the prefix cache is flushed."""
        spec = self._groups.get(name)
        if spec is None:
            raise RuntimeError(f"weight sync: this engine is not in group {name!r}")
        t0 = time.time()
        self._open(f"{name}-v{version}")
        got = 0
        for m in sorted(manifests, key=lambda m: m.channel[0]):
            _ok("update_weights_from_distributed", self.engine.update_weights_from_distributed(
                names=[e.name for e in m.entries],
                dtypes=[str(e.dtype).removeprefix("torch.") for e in m.entries],
                shapes=[list(e.shape) for e in m.entries], group_name=spec.key(m.channel),
                flush_cache=False))
            got += sum(e.nbytes for e in m.entries)
        self._close()
        self.version = version
        return {"t0": t0, "dur": time.time() - t0, "bytes": got, "done": True,
                "version": version}

    def _sleep(self) -> None:
        self.engine.release_memory_occupation()

    def _wake(self) -> None:
        self.engine.resume_memory_occupation()

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> dict:
        """A whole state in one session (the unbucketed path)."""
        t0 = time.time()
        self._open(f"state-v{version}")
        self._load_part(list(state.items()))
        self._close()
        self.version = version
        return _timing(t0, version=version)

    def generate(self, ids: list[str], groups: list[str], contexts: list[list[int]],
                 seeds: list[int], limits: list[int] | None = None) -> tuple[rl.Samples, dict]:
        """As `executors.modelroles.Rollout.generate`: continue each context by up to `limits[i]`."""
        t0 = time.time()
        limits = limits or [self.cfg.max_new_tokens] * len(ids)
        outs = self.engine.generate(input_ids=[list(c) for c in contexts],
                                    sampling_params=sampling_params(self.cfg, seeds, limits),
                                    return_logprob=True)
        if isinstance(outs, dict):  # one request answers a dict, a batch a list
            outs = [outs]
        if len(outs) != len(ids):
            raise RuntimeError(f"sglang answered {len(outs)} outputs for {len(ids)} samples")
        return self._samples(t0, ids, groups, contexts,
                             [sample_logprobs(sid, o) for sid, o in zip(ids, outs)])
