"""The `vllm` rollout backend: a vLLM engine inside the rollout actor (the `gpu` extra).

The engine is configured from the plan and the job (`engine_args`): the rollout role's tensor
parallel size (`tensor_parallel_size`; above 1 the engine's workers are processes on the
actor's bundle GPUs), the job's longest context (`max_model_len`: prompt, every turn's response
and tool output, with BOS), and the share of device memory the plan priced for the role
(`gpu_memory_utilization` = the plan's memory_gb / the device's memory, clamped). It loads the
same model directory the torch workers load (the run's version 0: a built model or the job's
checkpoint folder). Weight sync: under Ray the engine's workers are members of the
weight-sync group (`executors.syncgroup`), one rank per TP rank, as in vLLM's RLHF example (on
NCCL every channel a `StatelessProcessGroup` with a `PyNcclCommunicator`, the trainer's
senders' too: `syncgroup.PyNccl`; gloo torch groups on the CPU): a
worker extension (`WeightSync`, `worker_extension_cls`) joins the group
(`init_weight_update_group`) and receives each refresh's buckets straight from the trainer's
senders (`receive_weights`), loading whole tensors with `model.load_weights` (vLLM's loaders
keep each TP worker's shard). The tensors arrive in the refresh's dtype (BF16 for a BF16 job,
the engine's own `dtype=bfloat16`: `executors.precision.wire_dtype`; FP32 for an fp32 job, which
`load_weights` casts as it copies them in). `LLM.collective_rpc` carries only control messages:
the group's spec, and per refresh its manifests (names, dtypes, shapes, offsets). Then `reset_prefix_cache`
drops the KV the old weights computed. The one-process runtime has no group: there the
tensors go as `collective_rpc` arguments (`update_weights`). A colocated engine
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

from executors import ipc, rl
from executors.engine_common import (
    LOAD_BYTES,
    EngineRollout,
    checked_logprobs,
    engine_mem_fraction,
)
from executors.nodeaddr import _node_ip
from executors.reshard import Assembler, BucketHead
from executors.roles import RunConfig, _timing
from executors.syncgroup import (
    IPC,
    PYNCCL,
    GroupSpec,
    Manifest,
    Peer,
    find_peer,
    join_engine,
    receive,
)


class WeightSync:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): each engine worker (one per TP
    rank) is a member of the weight-sync group, as in vLLM's RLHF example
    (examples/offline_inference/rlhf_utils.py, `WorkerExtension.init_weight_update_group` /
    `update_weight`): the bytes come off the group into the worker, and `collective_rpc` carries
    only the group's spec and the refresh's manifests (names, dtypes, shapes, offsets)."""

    _wsync_peers: dict[int, Peer] | None = None  # by refresh path

    def _tp_rank(self) -> int:
        """This worker's rank in the engine, as the example takes it (`get_world_group().rank`:
        the engine runs TP only, so its world is its TP group)."""
        from vllm.distributed.parallel_state import get_world_group  # lazy: in vLLM's worker
        return int(get_world_group().rank)

    def init_weight_update_group(self, spec: GroupSpec, engine: int, ip: str) -> int:
        """Join group `spec` as engine `engine`'s TP rank (`ip`: the node's address for gloo,
        which a worker process cannot ask Ray); the rank joined."""
        t = self._tp_rank()
        self._wsync_peers = {**(self._wsync_peers or {}),
                             spec.path: join_engine(spec, engine, [t], ip)}
        return t

    def receive_weights(self, name: str, manifests: list[Manifest]) -> dict[str, Any]:
        """Receive a refresh on group `name` and load it with `model.load_weights` in loads of
        `LOAD_BYTES`, whole tensors (vLLM's loaders cut this rank's shard); the timing, the
        bytes taken and the tensors loaded."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        pending: list[tuple[str, torch.Tensor]] = []
        size, loaded = 0, 0

        def flush() -> None:
            nonlocal size, loaded
            if pending:
                model.load_weights(weights=list(pending))
                loaded += len(pending)
                pending.clear()
                size = 0

        def load(t: int, tensor_name: str, full: torch.Tensor) -> None:
            nonlocal size
            pending.append((tensor_name, full))
            size += full.numel() * full.element_size()
            if size >= LOAD_BYTES:
                flush()
        out = receive(find_peer(self._wsync_peers, name), manifests, 1, None, load, cut=False)
        flush()
        return {**out, "tensors": loaded}

    _wsync_handover: tuple[str, Assembler] | None = None  # the hand-over in progress

    def receive_handover(self, handles: list[bytes], head: BucketHead, senders: int,
                         refresh: str) -> dict[str, Any]:
        """Bucket `head` of a colocated refresh, handed over as CUDA IPC (`executors.ipc`, verl's
        `update_weights_from_ipc`): this worker maps its own handle (`handles[t]`, exported by
        the trainer rank on its device) on its device, copies the bucket's bytes out, drops
        the mapping and loads the tensors it completed, whole; `done` once every sender's
        stream is in."""
        if self._wsync_handover is None or self._wsync_handover[0] != refresh:
            self._wsync_handover = (refresh, Assembler())
        asm = self._wsync_handover[1]
        dev = torch.cuda.current_device() if torch.cuda.is_available() else None
        view = ipc.rebuild(handles[self._tp_rank()], dev)
        nbytes = view.numel()
        tensors = asm.add(head.with_data(view))
        del view
        if tensors:
            self.model_runner.model.load_weights(weights=tensors)  # type: ignore[attr-defined]
        done = asm.complete(senders)
        if done:
            self._wsync_handover = None
        return {"bytes": nbytes, "tensors": len(tensors), "done": done}

    def update_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """The one-process runtime's path (no group): tensors as `collective_rpc` arguments."""
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

    def sync_member(self) -> tuple[str, int, int, str]:
        """The engine's workers join the group on their GPUs, one rank per TP rank, each channel
        on vLLM's stateless group and NCCL communicator (`syncgroup.PyNccl`; gloo groups when
        a member is on the CPU); a colocated engine shares the trainer's GPUs and takes its
        refreshes as CUDA IPC handles instead (`executors.ipc`; NCCL holds no two ranks of a
        group on one device)."""
        if self.cfg.engines.colocated:
            return "cuda", self.cfg.engines.tp, os.getpid(), IPC
        return "cuda", self.cfg.engines.tp, os.getpid(), PYNCCL

    def handover_receive(self, head: BucketHead, version: int, senders: int, refresh: str,
                         picks: ipc.Picks, *exports: ipc.Export) -> dict[str, Any]:
        """A colocated refresh's bucket `head`: every worker maps its own handle, the one the
        trainer rank on its device exported (`picks[t]`; `WeightSync.receive_handover`;
        `collective_rpc` carries the handles and the bucket's head, no tensor) and loads what
        it completes; after the last, the prefix cache is dropped."""
        t0 = time.time()
        outs = self.llm.collective_rpc("receive_handover",
                                       args=(ipc.picked(picks, exports), head, senders, refresh))
        done = all(o["done"] for o in outs)
        if done:
            self._refreshed()
            self.version = version
        return {"t0": t0, "dur": time.time() - t0, "bytes": max(o["bytes"] for o in outs),
                "done": done, "version": version, "bucket": head.index,
                "receivers": ipc.taken(picks, exports)}

    def sync_join(self, spec: GroupSpec, engine: int) -> bool:
        """Every engine worker joins group `spec` (`WeightSync.init_weight_update_group`)."""
        if spec.send_shards:
            raise RuntimeError("weight sync: the vllm backend loads whole tensors (its loaders "
                               "cut each TP worker's shard); sending-side resharding is not "
                               "supported")
        if spec.tps[engine] != self.cfg.engines.tp:
            raise RuntimeError(f"weight sync: engine {engine} runs tp {self.cfg.engines.tp}, "
                               f"the group expects {spec.tps[engine]}")
        ranks = self.llm.collective_rpc("init_weight_update_group",
                                        args=(spec, engine, _node_ip()))
        if sorted(ranks) != list(range(self.cfg.engines.tp)):
            raise RuntimeError(f"weight sync: vllm workers joined as TP ranks {ranks}")
        return True

    def sync_receive(self, name: str, manifests: list[Manifest], version: int
                     ) -> dict[str, Any]:
        """Every worker receives the refresh off the group and loads it (`WeightSync.
        receive_weights`); then the prefix cache is dropped. RuntimeError when a worker loaded
        fewer tensors than the manifests name."""
        t0 = time.time()
        outs = self.llm.collective_rpc("receive_weights", args=(name, manifests))
        want = sum(len(m.entries) for m in manifests)
        short = [o["tensors"] for o in outs if o["tensors"] != want]
        if short:
            raise RuntimeError(f"weight sync to version {version}: a vllm worker loaded "
                               f"{short[0]} of {want} tensors")
        self._refreshed()
        self.version = version
        return {"t0": t0, "dur": time.time() - t0, "bytes": max(o["bytes"] for o in outs),
                "done": True, "version": version}

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
        """As `executors.modelroles.Rollout.generate`: continue each context by up to `limits[i]`."""
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
