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
from torch.multiprocessing.reductions import rebuild_cuda_tensor

from executors.reshard import Bucket, BucketHead, Gathered, Manifest, Stream

SHARING = "file_system"  # CPU segments by name: opened by any process of the node


def export(t: torch.Tensor) -> bytes:
    """A handle to `t`'s memory for one receiving process (each rebuild consumes one)."""
    if not t.is_cuda:
        use_file_system()
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(t)  # torch's `reduce_tensor`
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


@dataclass
class Exported:
    """A sender's bucket while receivers hold handles to it."""

    data: torch.Tensor
    handles: dict[int, bytes] = field(default_factory=dict)  # receiver -> handle, until acked


class HandOver:
    """A sender's side of one refresh's hand-over: its stream and the buckets exported and not
    yet acknowledged by every receiver."""

    def __init__(self, refresh: str, stream: Stream, device: torch.device) -> None:
        self.refresh, self.stream, self.device = refresh, stream, device
        self.live: dict[int, Exported] = {}
        if device.type == "cpu":
            use_file_system()

    def export(self, k: int, receivers: int) -> list[bytes]:
        """One handle to bucket k for each of `receivers` processes (an engine TP rank each).
        With none (a rank that only takes part in a gathering stream's collectives) the bucket
        is built and dropped."""
        if receivers == 0:
            self.stream.bucket(k, self.device)
            return []
        data = self.stream.bucket(k, self.device, shared=True).data
        ex = Exported(data, {r: export(data) for r in range(receivers)})
        self.live[k] = ex
        return list(ex.handles.values())

    def acked(self, k: int, receivers: list[int]) -> None:
        """`receivers` rebuilt bucket k and copied it out: free it once every one has."""
        ex = self.live.get(k)
        if ex is None:
            return
        for r in receivers:
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
                    rebuild(h)
        self.live.clear()
        if n and torch.cuda.is_available():
            torch.cuda.ipc_collect()
        return n


def handover_senders(beside: list[int], streaming: list[int], whole_everywhere: bool
                     ) -> list[int]:
    """The trainer ranks that hand a colocated engine its refresh: the one on its own
    device (the first rank sharing its bundle, `beside`), when every rank can build the whole
    model's buckets (a CUDA IPC handle opens on the device it was made on); else the ranks that stream
    the refresh (each pipeline stage's first rank, or rank 0)."""
    return [min(beside)] if beside and whole_everywhere else list(streaming)


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

    def _handover_stream(self, bucket_bytes: int, index: int) -> Stream:
        """The stream a hand-over exports (`_sync_source`)."""
        return Stream(self._sync_source(bucket_bytes), bucket_bytes, index)

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

    def handover_senders(self, bucketed: bool, beside: list[list[int]]) -> list[list[int]]:
        """Per colocated engine, the ranks that hand it a refresh (`beside`: the trainer ranks
        sharing its bundle; `ipc.handover_senders`)."""
        return [handover_senders(b, self.sync_senders(bucketed), self._whole_everywhere())
                for b in beside]

    def handover_prepare(self, refresh: str, bucket_bytes: int, index: int, device: str
                         ) -> Manifest:
        """Start refresh `refresh` as stream `index` in buckets of `bucket_bytes`, exported
        from `device` (cuda: CUDA IPC; cpu: shared memory); what a previous refresh left
        exported is released first. Its manifest."""
        self.handover_release("")
        dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" \
            else torch.device("cpu")
        stream = self._handover_stream(bucket_bytes, index)
        self._handover = HandOver(refresh, stream, dev)
        return Manifest((index, None), tuple(stream.entries), bucket_bytes)

    def handover_export(self, refresh: str, k: int, receivers: int, *acks: dict[str, Any]
                        ) -> list[bytes]:
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

    def handover_receive(self, handles: list[bytes], first: int, head: BucketHead,
                         version: int, senders: int, refresh: str) -> dict[str, Any]:
        """Bucket `head` of a refresh handed over as shared memory: each TP rank maps its own
        handle (`handles[first + t]`), the bucket is loaded as one that arrived
        (`receive_bucket`: its bytes copied into the weights), the mappings are dropped, and
        the acknowledgement names the bucket and the handles consumed."""
        mine = handles[first:first + self._engine_tp()]
        views = [rebuild(h) for h in mine]
        try:
            out = self.receive_bucket(head.with_data(views[0]), version, senders, refresh)
        finally:
            del views
        return {**out, "bucket": head.index, "receivers": list(range(first, first + len(mine)))}
