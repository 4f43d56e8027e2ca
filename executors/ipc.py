"""The colocated hand-over: a refresh's buckets as shared memory, not a copy over a group.

An engine that shares its devices with the trainer (`EngineGroup.colocated`: the plan put
rollout and actor in one slot, and prices the refresh at `sync_local_gbs`, "CUDA IPC + the
engine's weight loading", `placer.cost.timing.sync_links`) takes each bucket by a handle to the
sender's memory, as verl and NeMo-RL refresh a colocated vLLM or SGLang engine:

  export   the sender cuts its stream into buckets (`executors.reshard.Stream`; a sharded
           trainer gathers each bucket's tensors from its group's shards as it builds the
           bucket, every rank taking part, `handover_gathers`) and exports each, once per
           receiving process, with torch's `reduce_tensor` (pickled by
           `ForkingPickler`, the format of SGLang's `MultiprocessingSerializer`): on a GPU a
           CUDA IPC handle to the bucket's device memory; on the CPU the name of a shared-memory
           segment (sharing strategy `file_system`: a name any process of the node opens; the
           default `file_descriptor` strategy passes descriptors over a socket authenticated
           with the parent's key, which unrelated Ray workers do not share)
  receive  the engine rebuilds the bucket from the handle (`rebuild`; on a GPU on its own
           device index, as verl's `rebuild_ipc` does for vLLM), copies the bytes it needs into
           its weights (`executors.reshard.Assembler`), drops the view and acknowledges
  release  the sender frees a bucket once every receiver acknowledged it; a handle nobody
           rebuilt (its receiver died) is reclaimed by the sender (`reclaim`), so no segment
           outlives the refresh

Who hands over: the trainer rank beside each of the engine's TP ranks, when every rank can
build every bucket (`handover_senders`): each engine worker maps a handle to memory on its own
device, from the trainer rank on that device, as vLLM's colocated RLHF example does (vLLM @
081b8e32, examples/offline_inference/rlhf_utils.py `ColocateWorkerExtension.
update_weights_from_ipc`: each worker connects to the stream keyed by its own device's UUID,
`report_device_id`, rebuilds the sender's buffer on its device index and loads whole tensors,
the worker's loader cutting its shard). Each sender answers an export
with its handles and its process (`Export`); an engine names, per TP rank, which export and
which handle is its (`picks`) and acknowledges per sender (`taken`).

Whole tensors (`HandOver(tensors=True)`, SGLang's protocol on a GPU): each bucket is handed
over as the tensors it completes, each a typed view into one aligned buffer and exported by
itself, its CUDA device named by UUID as SGLang's `monkey_patch_torch_reductions` names it
(`export(uuid=True)`): the engine passes them on, unopened, as SGLang's per-TP-rank payloads
(`LocalSerializedTensor`), and SGLang's TP ranks open them on their own devices.

Only the handles (a few hundred bytes each), each bucket's head (`reshard.BucketHead`) and the
acknowledgements travel as control messages; the bytes never leave the node's memory. The
trainer's side is `HandOverSender`, the engine's `HandOverReceiver` (mixed into the weight-sync
group's `GroupSender` / `GroupReceiver`); the driver is
`executors.weights.GroupRefresh.handover`. Sources: verl @ b178a3cd
(verl/workers/rollout/vllm_rollout/vllm_rollout.py `update_weights`: one bucket buffer,
`reduce_tensor`, a handshake per bucket; utils.py `rebuild_ipc`, `update_weights_from_ipc`: copy
out, then acknowledge), NeMo-RL @ 7ea279ab (nemo_rl/models/policy/utils.py
`stream_weights_via_ipc_zmq_impl`: two buffers in ping-pong, a buffer reused only after the
receiver's reply; vllm_backend.py `update_weights_via_ipc_zmq`), SGLang 0.5.23
(srt/entrypoints/engine.py `update_weights_from_tensor`: one `MultiprocessingSerializer` payload
per TP rank, "so producer-side CUDA-IPC refcounts drop cleanly").
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as tmp
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from executors.gather import Gathered
from executors.reshard import Bucket, BucketHead, Manifest, Stream, manifest_digest

# the device argument of torch's `rebuild_cuda_tensor` (SGLang 0.5.23, srt/utils/patch_torch.py
# `_REDUCE_TENSOR_ARG_DEVICE_INDEX`)
DEVICE_ARG = 6

SHARING = "file_system"  # CPU segments by name: opened by any process of the node


class _ByUuid(ForkingPickler):
    """Pickles a CUDA tensor with its device named by UUID instead of this process's index, as
    SGLang's patched `reduce_tensor` does (`_device_to_uuid`): SGLang's TP ranks map it back to
    their own index (`_device_from_maybe_uuid`), each process seeing its own visible devices."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.is_cuda:
            fn, args = reduce_tensor(obj)
            uuid = str(torch.cuda.get_device_properties(args[DEVICE_ARG]).uuid)
            return fn, (*args[:DEVICE_ARG], uuid, *args[DEVICE_ARG + 1:])
        return NotImplemented


def export(t: torch.Tensor, uuid: bool = False) -> bytes:
    """A handle to `t`'s memory for one receiving process (each rebuild consumes one); `uuid`:
    a CUDA device named by UUID (`_ByUuid`, for SGLang's receivers)."""
    if not t.is_cuda:
        use_file_system()
    buf = io.BytesIO()
    (_ByUuid if uuid else ForkingPickler)(buf, pickle.HIGHEST_PROTOCOL).dump(t)  # `reduce_tensor`
    return buf.getvalue()


class _OnDevice(pickle.Unpickler):
    """Rebuilds a CUDA tensor on `device` (this process's index of the sender's GPU: Ray gives
    each actor its own visible devices, so the sender's index may not be ours)."""

    def __init__(self, data: bytes, device: int | None) -> None:
        super().__init__(io.BytesIO(data))
        self.device = device

    def find_class(self, module: str, name: str) -> Any:
        found: Any = super().find_class(module, name)
        if found is rebuild_cuda_tensor and self.device is not None:
            dev = self.device

            def on_device(*args: Any) -> Any:
                given = list(args)
                given[6] = dev  # rebuild_cuda_tensor's device index
                return found(*given)
            return on_device
        return found


def rebuild(handle: bytes, device: int | None = None) -> torch.Tensor:
    """The tensor `export` handed over (shared, not copied; `device`: see `_OnDevice`)."""
    out = _OnDevice(handle, device).load()
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"weight sync: a hand-over handle held {type(out).__name__}")
    return out


Handle = Any  # bytes (a bucket), or [(name, bytes)] (the tensors a bucket completes)


@dataclass
class Exported:
    """A sender's bucket while receivers hold handles to it."""

    data: torch.Tensor
    handles: dict[int, Handle] = field(default_factory=dict)  # receiver -> handle, until acked


@dataclass(frozen=True)
class Export:
    """A sender's answer to an export: its handles to one bucket, one per receiving engine TP
    rank, and the sender (its trainer rank), which the acknowledgements name (`taken`)."""

    sender: int
    handles: tuple[Handle, ...]


Picks = list[tuple[int, int]]  # per engine TP rank: (which export, which of its handles)


def picked(picks: Picks, exports: tuple[Export, ...]) -> list[Handle]:
    """Each TP rank's handle: `picks[t]` names its export and its index there."""
    return [exports[a].handles[b] for a, b in picks]


def taken(picks: Picks, exports: tuple[Export, ...]) -> dict[int, list[int]]:
    """The acknowledgement's receivers: per sender, the handles its TP ranks consumed."""
    out: dict[int, list[int]] = {}
    for a, b in picks:
        out.setdefault(exports[a].sender, []).append(b)
    return out


class HandOver:
    """A sender's side of one refresh's hand-over: its stream and the buckets exported and not
    yet acknowledged by every receiver. `tensors`: each bucket handed over as the whole tensors
    it completes (`Stream.ending`), one handle per tensor, devices named by UUID (SGLang's)."""

    def __init__(self, refresh: str, stream: Stream, device: torch.device,
                 tensors: bool = False, ident: int = 0) -> None:
        self.refresh, self.stream, self.device, self.tensors = refresh, stream, device, tensors
        self.ident = ident  # the sender, as the acknowledgements name it (`taken`)
        self.live: dict[int, Exported] = {}
        if device.type == "cpu":
            use_file_system()

    def export(self, k: int, receivers: int) -> Export:
        """One handle to bucket k for each of `receivers` processes (an engine TP rank each).
        With none (a rank that only takes part in a gathering stream's collectives) the bucket
        is built and dropped."""
        if receivers == 0:
            if self.tensors:
                self.stream.ending_tensors(k, self.device)
            else:
                self.stream.bucket(k, self.device)
            return Export(self.ident, ())
        if self.tensors:
            data, named = self.stream.ending_tensors(k, self.device, shared=True)
            ex = Exported(data, {r: [(n, export(t, uuid=True)) for n, t in named]
                                 for r in range(receivers)})
        else:
            data = self.stream.bucket(k, self.device, shared=True).data
            ex = Exported(data, {r: export(data) for r in range(receivers)})
        self.live[k] = ex
        return Export(self.ident, tuple(ex.handles.values()))

    def acked(self, k: int, receivers: dict[int, list[int]]) -> None:
        """Bucket k's handles that `receivers` (per sender, `taken`) rebuilt and copied out:
        free the bucket once every one of this sender's is."""
        ex = self.live.get(k)
        if ex is None:
            return
        for r in receivers.get(self.ident, []):
            ex.handles.pop(r, None)
        if not ex.handles:
            del self.live[k]
            if ex.data.is_cuda:  # blocks the consumers released go back to the allocator
                torch.cuda.ipc_collect()

    def reclaim(self) -> int:
        """Release every bucket still exported (a receiver failed, or its acknowledgement was
        lost): each unconsumed CPU handle is rebuilt here and dropped, which returns the
        reference its export took, so the segment goes with the sender's; CUDA blocks return
        with `ipc_collect`. The buckets reclaimed."""
        n = len(self.live)
        for ex in self.live.values():
            if not ex.data.is_cuda:
                for h in ex.handles.values():
                    for one in ([x for _, x in h] if self.tensors else [h]):
                        rebuild(one)
        self.live.clear()
        if n and torch.cuda.is_available():
            torch.cuda.ipc_collect()
        return n


def handover_senders(beside: list[list[int]], streaming: list[int], whole_everywhere: bool
                     ) -> list[list[int]]:
    """The trainer ranks that hand a colocated engine its refresh, per stream and per engine TP
    rank (`beside[t]`: the trainer ranks on TP rank t's device). When every rank can build the
    whole model's buckets: one stream, each TP rank's from the first rank on its own device (a
    TP rank with none beside it: the first beside any); else the ranks that stream the refresh
    (each pipeline stage's first rank, or rank 0), one stream each to every TP rank."""
    anyone = sorted(r for b in beside for r in b)
    if anyone and whole_everywhere:
        return [[min(b) if b else anyone[0] for b in beside]]
    return [[s] * len(beside) for s in streaming]


def use_file_system() -> None:
    """This process shares CPU tensors by segment name (see the module docstring)."""
    if tmp.get_sharing_strategy() != SHARING:
        tmp.set_sharing_strategy(SHARING)


def segments(pid: int) -> list[str]:
    """The shared-memory segments process `pid` created under `file_system` sharing (torch
    names them torch_<pid>_...): what a refresh must leave none of."""
    shm = Path("/dev/shm")
    return sorted(p.name for p in shm.glob(f"torch_{pid}_*")) if shm.is_dir() else []


class HandOverSender:
    """Mixed into the trainer (`executors.syncgroup.GroupSender`): a hand-over's sender. The
    class defines `_sync_state(bucket_bytes)`, the full tensors it hands over, or
    `_sync_source` when it builds each bucket from its shards at export (a sharded trainer's
    all-gather: then every rank of its group takes part in every export, `handover_gathers`)."""

    _handover: HandOver | None = None

    def _sync_state(self, bucket_bytes: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _sync_source(self, bucket_bytes: int) -> Gathered:
        """What this rank streams in buckets of `bucket_bytes` (0: a call per tensor): the
        full tensors held (`_sync_state`), or (a sharded trainer) its shards, made whole as
        the buckets need them, every rank of its group taking part."""
        return Gathered(self._sync_state(bucket_bytes))

    def sync_gather(self, bucket_bytes: int) -> bool:
        """A rank that streams nothing in a refresh of buckets of `bucket_bytes`: take part in
        its group's gathers for the ranks that do (`Gathered.drain`)."""
        self._sync_source(bucket_bytes).drain()
        return True

    def _sync_dtype(self) -> torch.dtype | None:
        """The dtype a refresh carries the floating-point tensors in (the trainer's: the
        engines' BF16 for a BF16 job, `executors.precision.wire_dtype`); None: their own."""
        return None

    def _handover_stream(self, bucket_bytes: int, index: int) -> Stream:
        """The stream a hand-over exports (`_sync_source`), in the refresh's dtype."""
        return Stream(self._sync_source(bucket_bytes), bucket_bytes, index,
                      dtype=self._sync_dtype())

    def handover_gathers(self) -> bool:
        """Whether each bucket is gathered from the ranks' shards as it is exported (every rank
        then prepares, exports and releases every bucket; only the senders' have receivers)."""
        return False

    def sync_senders(self, bucketed: bool) -> list[int]:
        """The ranks that stream a refresh (the trainer's: each pipeline stage's first)."""
        return [0]

    def _whole_everywhere(self) -> bool:
        """Whether every rank can build any bucket of the whole model (it holds the model, or
        gathers each bucket at export), so the rank beside an engine can hand it over."""
        return False

    def handover_senders(self, bucketed: bool, beside: list[list[list[int]]]
                         ) -> list[list[list[int]]]:
        """Per colocated engine, per stream and TP rank, the ranks that hand it a refresh
        (`beside[j][t]`: the trainer ranks on engine j's TP rank t's device;
        `ipc.handover_senders`)."""
        return [handover_senders(b, self.sync_senders(bucketed), self._whole_everywhere())
                for b in beside]

    def handover_prepare(self, refresh: str, bucket_bytes: int, index: int, device: str,
                         tensors: bool = False, ident: int = 0, digest: str | None = None
                         ) -> Manifest:
        """Start refresh `refresh` as stream `index` in buckets of `bucket_bytes`, exported
        from `device` (cuda: CUDA IPC; cpu: shared memory), as whole tensors when `tensors`,
        by sender `ident` (the trainer rank; `HandOver`); what a previous refresh left
        exported is released first. Its manifest. `digest`: the `manifest_digest` of the
        manifest the driver kept from an earlier refresh and issued this one's bucket calls
        by, without waiting for this answer: a stream that differs is refused (its gathers
        still run), and so is then every export of the refresh."""
        self.handover_release("")
        dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" \
            else torch.device("cpu")
        stream = self._handover_stream(bucket_bytes, index)
        manifest = Manifest((index, None), tuple(stream.entries), bucket_bytes)
        if digest is not None and manifest_digest([manifest]) != digest:
            stream.source.drain()
            raise RuntimeError(f"weight sync: hand-over stream {index} of {refresh!r} no longer "
                               f"matches the manifest of its last refresh")
        self._handover = HandOver(refresh, stream, dev, tensors, ident)
        return manifest

    def handover_export(self, refresh: str, k: int, receivers: int, *acks: dict[str, Any]
                        ) -> Export:
        """Bucket k's handles, one per receiving engine TP rank; `acks`: earlier buckets'
        acknowledgements, whose buckets are freed first."""
        ho = self._handover
        if ho is None or ho.refresh != refresh:
            raise RuntimeError(f"weight sync: handover_export of {refresh!r} before its prepare")
        for a in acks:
            ho.acked(a["bucket"], a["receivers"])
        return ho.export(k, receivers)

    def handover_release(self, refresh: str, *acks: dict[str, Any]) -> int:
        """End the hand-over: free the acknowledged buckets and reclaim the rest; the buckets
        that were never acknowledged (0 when every receiver took every bucket)."""
        ho, self._handover = self._handover, None
        if ho is None:
            return 0
        ho.stream.source.drain()  # a hand-over that broke off: the gathers stay paired
        for a in acks if ho.refresh == refresh else ():
            ho.acked(a["bucket"], a["receivers"])
        return ho.reclaim()


class HandOverReceiver:
    """Mixed into a rollout engine (`executors.syncgroup.GroupReceiver`): a hand-over's
    receiver. The class defines `_engine_tp()` and `receive_bucket` (`executors.reshard.
    BucketLoading`)."""

    def _engine_tp(self) -> int:
        return 1

    def receive_bucket(self, b: Bucket, version: int, senders: int, refresh: str
                       ) -> dict[str, Any]:
        raise NotImplementedError  # `executors.reshard.BucketLoading`'s, in the engine class

    def handover_receive(self, head: BucketHead, version: int, senders: int, refresh: str,
                         picks: Picks, *exports: Export) -> dict[str, Any]:
        """Bucket `head` of a refresh handed over as shared memory: each TP rank maps its own
        handle (`picks[t]`: which of `exports` and which handle there), the bucket is loaded as
        one that arrived (`receive_bucket`: its bytes copied into the weights), the mappings
        are dropped, and the acknowledgement names the bucket and the handles consumed."""
        views = [rebuild(h) for h in picked(picks, exports)]
        try:
            out = self.receive_bucket(head.with_data(views[0]), version, senders, refresh)
        finally:
            del views
        return {**out, "bucket": head.index, "receivers": taken(picks, exports)}
