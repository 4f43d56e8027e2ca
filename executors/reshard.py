"""Weight sync between layouts: each tensor as an engine's TP rank holds it, and the buckets it
travels in from the trainer's shards to the rollout engines.

Gather. The trainer holds its weights as FSDP2 shards over DP, DTensor shards over TP and
pipeline stages over PP, and no full copy between steps: a refresh makes each tensor whole
(an all-gather, every rank of the stage taking part) when the first bucket that needs it is
built, and drops it once every stream is past it (`Gathered`), so a sender holds the tensors
of the buckets in flight, not the model.

Senders and buckets. A sender streams its tensors as one byte stream (`Stream`) cut into buckets
of `bucket_bytes` (the cost model's `sync_bucket_gb`): ceil(bytes / bucket) sequential calls, a
tensor straddling two buckets where the cut falls (checkpoint-engine's and Megatron's flat
buckets). The stream carries the engines' dtype (BF16 for a BF16 job, `executors.precision.
wire_dtype`: each tensor cast as its bucket is built), so its bytes are the ones the plan
prices (`placer.cost.roofline.weight_bytes`, 2 B a parameter). With buckets every pipeline
stage streams its own layers in parallel; unbucketed (`bucket_bytes` 0) trainer rank 0 makes
one call per tensor (verl's NCCL path).
`placer.cost.timing.sync_senders` and `sync_calls` price exactly these calls.

Reshard. On TP rank r an engine keeps its slice of each tensor (`engine_shard`), as vLLM's
parallel layers and Megatron cut them:
  column  q, k, v (weight and bias), MLP gate and up (every expert's too): output rows in tp
          parts; KV heads fewer than tp are replicated (rank r holds KV head r // (tp /
          kv_heads), vLLM's QKVParallelLinear); a fused gate/up tensor (transformers 5's
          experts' `gate_up_proj`) cuts each half so, a rank keeping its gate rows then its up rows
  row     o projection, MLP down (the experts' `down_proj`): input columns, the last dim (a row
          layer's bias is added once, after the all-reduce: replicated)
  vocab   token embedding and LM head: vocabulary rows, padded to a multiple of 64, then cut in
          tp parts (vLLM's VocabParallelEmbedding and ParallelLMHead)
  whole   norms (Qwen3's per-head q/k norms too), the MoE router, anything one-dimensional
A tensor of more dimensions that no rule names is an error, never a silent copy. An engine that
loads full tensors and cuts them itself (vLLM's `load_weights`) gets them whole; a torch engine at
tp > 1 keeps each rank's cut and gathers them whole for its forward (`engine_unshard`). The
receiving engine loads each tensor as its last byte arrives, so it holds at most a bucket and
the tensors it straddles in flight: over the weight-sync group (`executors.syncgroup`), or
bucket by bucket as call arguments in one process (`BucketLoading`).
"""
from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from executors.gather import Gathered, Whole
from executors.precision import to_wire, wire_state

VOCAB_PAD = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE: vocabulary rows pad to a multiple of it
ALIGN = 16  # bytes: a whole-tensor hand-over places each tensor at a multiple of this

# (kind, unit names), in the order they are tried. A tensor's unit is its module's name for a
# `weight` or `bias` (`...q_proj.weight`), else its own (a fused experts' `gate_up_proj`).
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocab", ("embed_tokens", "lm_head")),
    ("column", ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3")),
    ("fused", ("gate_up_proj",)),
    ("row", ("o_proj", "down_proj", "w2")),
    ("whole", ("norm", "q_norm", "k_norm", "input_layernorm", "post_attention_layernorm",
               "gate", "shared_expert_gate")),
)


def _unit(name: str) -> str:
    parts = name.split(".")
    return parts[-2] if parts[-1] in ("weight", "bias") and len(parts) > 1 else parts[-1]


def split_of(name: str, ndim: int) -> tuple[str, int | None]:
    """(kind, dim) of the TP cut of tensor `name` (HF names) of `ndim` dimensions; dim None:
    kept whole. Weights are stored [(experts,) out, in]: column, fused and vocab cut the output
    dim (ndim - 2; a bias its only one), row the input dim (ndim - 1)."""
    unit = _unit(name)
    for kind, units in _RULES:
        if unit in units:
            if kind == "whole" or (kind == "row" and name.endswith(".bias")):
                return "whole", None
            return kind, ndim - 1 if kind == "row" else max(ndim - 2, 0)
    if ndim <= 1:
        return "whole", None
    raise ValueError(f"weight sync: no tensor-parallel rule for {name!r} ({ndim} dims)")


def shard_range(name: str, shape: tuple[int, ...], tp: int, rank: int,
                kv_heads: int | None = None) -> tuple[int | None, int, int]:
    """(dim, start, stop) of TP rank `rank`'s slice of tensor `name` of `shape` (dim None: the
    whole tensor); of a fused gate/up tensor, the slice of each half. ValueError when `tp`
    does not divide the cut dimension."""
    if not 0 <= rank < tp:
        raise ValueError(f"weight sync: TP rank {rank} outside tp {tp}")
    if tp == 1:  # one rank holds everything, whatever the tensor
        return None, 0, shape[0] if shape else 0
    kind, dim = split_of(name, len(shape))
    if dim is None:
        return None, 0, shape[0] if shape else 0
    n = shape[dim] // 2 if kind == "fused" else shape[dim]
    if kind == "vocab":  # the padded vocabulary in tp equal parts, each the real rows it holds
        padded = math.ceil(n / VOCAB_PAD) * VOCAB_PAD
        if padded % tp:
            raise ValueError(f"weight sync: tp {tp} does not divide the padded vocabulary "
                             f"({padded} rows) of {name!r}")
        size = padded // tp
        return dim, min(rank * size, n), min((rank + 1) * size, n)
    if _unit(name) in ("k_proj", "v_proj") and kv_heads and kv_heads < tp:
        if tp % kv_heads or n % kv_heads:
            raise ValueError(f"weight sync: tp {tp} is not a multiple of the {kv_heads} KV "
                             f"heads of {name!r}")
        head = n // kv_heads
        h = rank // (tp // kv_heads)  # a KV head replicated over tp / kv_heads ranks
        return dim, h * head, (h + 1) * head
    if n % tp:
        raise ValueError(f"weight sync: tp {tp} does not divide dim {dim} ({n}) of {name!r}")
    return dim, rank * n // tp, (rank + 1) * n // tp


def engine_shard(name: str, full: torch.Tensor, tp: int, rank: int,
                 kv_heads: int | None = None) -> torch.Tensor:
    """TP rank `rank`'s part of the full tensor `name` on an engine of tensor parallelism `tp`
    (a fused gate/up tensor: its slice of the gate half, then of the up half, as vLLM's
    merged column layers and fused MoE hold them)."""
    dim, lo, hi = shard_range(name, tuple(full.shape), tp, rank, kv_heads)
    if dim is None:
        return full
    if split_of(name, full.dim())[0] == "fused":
        half = full.shape[dim] // 2
        return torch.cat([full.narrow(dim, lo, hi - lo), full.narrow(dim, half + lo, hi - lo)],
                         dim)
    return full.narrow(dim, lo, hi - lo)


def engine_state(state: dict[str, torch.Tensor], tp: int, rank: int,
                 kv_heads: int | None = None) -> dict[str, torch.Tensor]:
    """`engine_shard` of every tensor of a full state dict."""
    return {k: engine_shard(k, v, tp, rank, kv_heads) for k, v in state.items()}


def engine_unshard(name: str, shards: list[torch.Tensor], kv_heads: int | None = None
                   ) -> torch.Tensor:
    """The full tensor `name` from every TP rank's `engine_shard` of it, in rank order (the
    inverse cut: a torch engine gathers its shards whole for a forward on one device)."""
    tp = len(shards)
    kind, dim = split_of(name, shards[0].dim()) if tp > 1 else ("whole", None)
    if dim is None:
        return shards[0]
    if _unit(name) in ("k_proj", "v_proj") and kv_heads and kv_heads < tp:
        shards = shards[::tp // kv_heads]  # each KV head once: replicated over tp / kv_heads
    if kind == "fused":  # each rank holds its gate rows then its up rows
        halves = [s.chunk(2, dim) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim)
    return torch.cat(shards, dim)


# ----------------------------------------------------------------------------- buckets
@dataclass(frozen=True)
class Entry:
    """One tensor in a sender's byte stream."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # first byte in the stream
    nbytes: int


@dataclass
class Bucket:
    """One call of a sender's stream: bytes [start, start + len(data)) and the tensors that
    overlap them (a tensor's bytes may span buckets)."""

    sender: int  # the stream's index among the refresh's senders
    index: int
    count: int  # buckets in this stream
    start: int
    data: torch.Tensor  # uint8
    entries: list[Entry]

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())


@dataclass(frozen=True)
class BucketHead:
    """A bucket without its bytes: what a shared-memory hand-over's control message says of
    it (`executors.ipc`); the bytes are mapped where they lie (`with_data`)."""

    sender: int
    index: int
    count: int
    start: int
    entries: tuple[Entry, ...]

    def with_data(self, data: torch.Tensor) -> Bucket:
        return Bucket(self.sender, self.index, self.count, self.start, data, list(self.entries))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def bucket_count(nbytes: int, tensors: int, bucket_bytes: int) -> int:
    """Calls of one stream: ceil(bytes / bucket), or one per tensor when unbucketed (0)."""
    if bucket_bytes <= 0:
        return tensors
    return max(math.ceil(nbytes / bucket_bytes), 1)


def manifest_digest(manifests: list[Manifest]) -> str:
    """A sender's manifests as a short digest: what the driver hands the sender to check, in
    place of the manifests themselves, when it hands the receivers the ones it kept from an
    earlier refresh (`executors.weights.GroupRefresh`)."""
    return hashlib.sha256(repr(manifests).encode()).hexdigest()


class StreamLayout:
    """A sender's byte stream as its receivers know it: the tensors (`Entry`), the buckets'
    byte ranges and the tensors overlapping each. The manifest of a refresh over the
    weight-sync group (`executors.syncgroup`) is the entries and the bucket size: a control
    message; the receivers rebuild the rest from it."""

    def __init__(self, entries: list[Entry], bucket_bytes: int, sender: int = 0) -> None:
        self.entries, self.bucket_bytes, self.sender = entries, bucket_bytes, sender
        at = sum(e.nbytes for e in entries)
        self.nbytes = at
        if bucket_bytes <= 0:  # one call per tensor
            self.ranges = [(e.offset, e.offset + e.nbytes) for e in self.entries]
        else:
            self.ranges = [(lo, min(lo + bucket_bytes, at)) for lo in range(0, max(at, 1),
                                                                            bucket_bytes)]
        assert len(self.ranges) == bucket_count(at, len(self.entries), bucket_bytes)
        self.members = self._members(bucket_bytes <= 0)

    def _members(self, per_tensor: bool) -> list[list[Entry]]:
        """The tensors overlapping each bucket (one sweep: both are in stream order); an empty
        tensor rides in its own call (unbucketed) or the first bucket."""
        out: list[list[Entry]] = [[] for _ in self.ranges]
        k = 0
        for i, e in enumerate(self.entries):
            if e.nbytes == 0:
                out[i if per_tensor else 0].append(e)
                continue
            while self.ranges[k][1] <= e.offset:
                k += 1
            j = k
            while j < len(self.ranges) and self.ranges[j][0] < e.offset + e.nbytes:
                out[j].append(e)
                j += 1
        return out

    @property
    def count(self) -> int:
        return len(self.ranges)

    def ending(self) -> list[list[Entry]]:
        """The tensors each bucket completes: those whose last byte it holds (an empty one:
        the first bucket it rides in). Every tensor ends in exactly one bucket."""
        out: list[list[Entry]] = [[] for _ in self.ranges]
        seen: set[str] = set()
        for k, members in enumerate(self.members):
            for e in members:
                if e.name not in seen and e.offset + e.nbytes <= self.ranges[k][1]:
                    seen.add(e.name)
                    out[k].append(e)
        return out

    def received(self, k: int, data: torch.Tensor) -> Bucket:
        """Bucket `k` with the bytes `data` that arrived for it."""
        return self.head(k).with_data(data)

    def head(self, k: int) -> BucketHead:
        return BucketHead(self.sender, k, self.count, self.ranges[k][0], tuple(self.members[k]))


Channel = tuple[int, int | None]  # (sender index, the TP rank it carries; None: every one)


@dataclass(frozen=True)
class Manifest:
    """A channel's stream as a control message: its tensors and its bucket size."""

    channel: Channel
    entries: tuple[Entry, ...]
    bucket_bytes: int

    def layout(self) -> StreamLayout:
        return StreamLayout(list(self.entries), self.bucket_bytes, self.channel[0])


def entries_of(state: dict[str, torch.Tensor]) -> list[Entry]:
    """The tensors of `state` laid end to end in one byte stream."""
    out, at = [], 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        out.append(Entry(name, t.dtype, tuple(t.shape), at, n))
        at += n
    return out


class Stream(StreamLayout):
    """A sender's tensors as one byte stream in buckets (`bucket(k)` builds bucket k), read
    from a `Gathered` source: given a state dict, its own (`whole`, when given, makes each
    tensor whole as the first bucket that needs it is built, and the tensors are dropped as
    the stream moves past them; a sharded trainer's all-gather, `executors.trainer`: a
    collective, so every rank of the group builds the same buckets in the same order); given a
    `Gathered`, that one, which it releases unless it shares it with other streams (`owner`
    False: a sender's channels, `executors.syncgroup`, whose `Sending` releases it).
    `cut(name, whole)`: the part of each tensor this stream carries (an engine TP rank's
    slice). `dtype`: the dtype the stream carries its floating-point tensors in (the
    engines', `executors.precision.wire_dtype`; None: their own), each cast after its cut as
    the bucket it is in is built, so the sender holds no cast copy of the model. The tensors'
    global shapes (and the carried dtype) lay out the stream."""

    def __init__(self, state: dict[str, torch.Tensor] | Gathered, bucket_bytes: int,
                 sender: int = 0, whole: Whole | None = None,
                 cut: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
                 owner: bool = True, dtype: torch.dtype | None = None) -> None:
        self.owns = owner
        self.source = Gathered(state, whole) if not isinstance(state, Gathered) else state
        metas = {n: self.source.meta(n) for n in self.source.names}
        if cut is not None:
            metas = {n: cut(n, m) for n, m in metas.items()}
        super().__init__(entries_of(wire_state(metas, dtype)), bucket_bytes, sender)
        self.cut, self.dtype = cut, dtype
        # the last tensor cast, while the buckets it straddles are built (cast once)
        self._cast: tuple[str, torch.Tensor] | None = None

    def tensor(self, name: str) -> torch.Tensor:
        """The part of tensor `name` this stream carries, in the stream's dtype."""
        if self._cast is not None and self._cast[0] == name:
            return self._cast[1]
        t = self.source.get(name)
        part = self.cut(name, t) if self.cut is not None else t
        out = to_wire(part, self.dtype)
        self._cast = (name, out) if out is not part else None
        return out

    def first_needed(self, k: int) -> int:
        """The source index of the first tensor with bytes in bucket k (past the end: none)."""
        return min((self.source.index[e.name] for e in self.members[k] if e.nbytes)
                   if k < self.count else (), default=len(self.source.names))

    def bucket(self, k: int, device: torch.device | str = "cpu", shared: bool = False
               ) -> Bucket:
        """Bucket k, its bytes on `device` (a GPU sender's for NCCL: no host copy); `shared`:
        in host memory another process can map (`executors.ipc`), filled in place."""
        lo, hi = self.ranges[k]
        data = torch.empty(hi - lo, dtype=torch.uint8, device=device)
        if shared and not data.is_cuda:
            data.share_memory_()
        for e in self.members[k]:
            a, b = max(e.offset, lo), min(e.offset + e.nbytes, hi)
            if a < b:
                data[a - lo:b - lo] = _bytes(self.tensor(e.name))[a - e.offset:b - e.offset]
        if self.owns:
            self.source.release(self.first_needed(k + 1))
        return self.received(k, data)

    def ending_tensors(self, k: int, device: torch.device | str = "cpu", shared: bool = False
                       ) -> tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]:
        """The whole tensors bucket k completes (`ending`), copied into one buffer, each at an
        offset aligned to `ALIGN` bytes (a typed view needs its element size's alignment); the
        buffer and each tensor as a typed view into it. Read from the `Gathered` source as
        `bucket` reads it (under `whole` a collective, in stream order on every rank), and what
        no later bucket needs is dropped."""
        entries = self.ending()[k]
        at, offsets = 0, []
        for e in entries:
            offsets.append(at)
            at += -(-e.nbytes // ALIGN) * ALIGN
        data = torch.empty(at, dtype=torch.uint8, device=device)
        if shared and not data.is_cuda:
            data.share_memory_()
        out = []
        for e, lo in zip(entries, offsets):
            data[lo:lo + e.nbytes] = _bytes(self.tensor(e.name))
            out.append((e.name, data[lo:lo + e.nbytes].view(e.dtype).reshape(e.shape)))
        if self.owns:
            self.source.release(self.first_needed(k + 1))
        return data, out


@dataclass
class Assembler:
    """The receiving side: each tensor rebuilt from its bytes, in any bucket order."""

    partial: dict[str, tuple[torch.Tensor, int]] = field(default_factory=dict)  # buffer, filled
    received: dict[int, int] = field(default_factory=dict)  # sender -> buckets received
    counts: dict[int, int] = field(default_factory=dict)  # sender -> its stream's buckets

    def add(self, b: Bucket) -> list[tuple[str, torch.Tensor]]:
        """The tensors bucket `b` completes."""
        self.received[b.sender] = self.received.get(b.sender, 0) + 1
        self.counts[b.sender] = b.count
        done = []
        hi = b.start + b.nbytes
        for e in b.entries:
            buf, filled = self.partial.get(e.name) or (
                torch.empty(e.nbytes, dtype=torch.uint8, device=b.data.device), 0)
            lo_, hi_ = max(e.offset, b.start), min(e.offset + e.nbytes, hi)
            if lo_ < hi_:
                buf[lo_ - e.offset:hi_ - e.offset] = b.data[lo_ - b.start:hi_ - b.start]
                filled += hi_ - lo_
            if filled >= e.nbytes:
                self.partial.pop(e.name, None)
                done.append((e.name, buf.view(e.dtype).reshape(e.shape)))
            else:
                self.partial[e.name] = (buf, filled)
        return done

    def complete(self, senders: int) -> bool:
        """Every stream of the refresh's `senders` fully received."""
        return (len(self.counts) == senders and not self.partial
                and all(self.received[s] == c for s, c in self.counts.items()))


class BucketLoading:
    """Mixed into a rollout engine: receives a refresh bucket by bucket (`receive_bucket`) and
    loads each tensor as it completes (`_load_part`); the new version once every stream ended.
    The engine class defines `_load_part(tensors)` and `version`. An engine whose refresh broke
    off holds some new tensors under its old version: the driver counts it as holding none
    (`executors.weights`) and gives it no work until a refresh completes."""

    version: int
    _sync: Assembler | None = None
    _sync_names: set[str] | None = None
    _sync_refresh: str | None = None

    def _load_part(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    def _expected_names(self) -> set[str] | None:
        """The tensors a refresh must bring (None: the engine does not say)."""
        return None

    def _refreshed(self) -> None:
        """Called once every tensor of a refresh arrived."""

    def receive_bucket(self, b: Bucket, version: int, senders: int, refresh: str
                       ) -> dict[str, Any]:
        """Load bucket `b` of refresh `refresh` (to `version`, from `senders` parallel
        streams); the call's timing, `done` when it was the refresh's last. A new refresh
        drops what an interrupted one left half-received."""
        t0 = time.time()
        if self._sync is None or self._sync_refresh != refresh:
            self._sync, self._sync_names, self._sync_refresh = Assembler(), set(), refresh
        sync = self._sync
        tensors = sync.add(b)
        assert self._sync_names is not None
        self._sync_names.update(n for n, _ in tensors)
        if tensors:
            self._load_part(tensors)
        done = sync.complete(senders)
        if done:
            want = self._expected_names()
            missing = sorted(want - self._sync_names) if want is not None else []
            self._sync = self._sync_names = None
            if missing:
                raise RuntimeError(f"weight sync to version {version}: {len(missing)} tensors "
                                   f"never arrived ({missing[0]}, ...)")
            self._refreshed()
            self.version = version
        return {"t0": t0, "dur": time.time() - t0, "bytes": b.nbytes, "sender": b.sender,
                "done": done, "version": version}

