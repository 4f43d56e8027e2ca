"""The trainer's weights made whole: what a weight refresh's senders stream, `weights()` and
its digest (`TrainerSender`, mixed into `executors.trainer.Trainer`).

A refresh carries the engines' dtype, BF16 in a BF16 job: each sender casts every tensor as it
builds the bucket it is in (`executors.reshard.Stream`), whether the tensors come from a kept
copy or a gather.

Where the plan's host memory holds it (`RunConfig.keep_sync_copy`, priced by
`placer.solve.hostmem.sync_copy_gb`), the ranks that send a refresh keep the step's weights
whole on the host from the step's end (`_keep`: every rank joins one all-gather per run of
tensors, `executors.gather`), so a refresh reads that copy and no rank gathers then; the trace's
sync events say which source ran (`sync_source`). Otherwise every rank holds its shards only
between steps, and a weight refresh gathers the tensors from the shards, a bucket's worth per
all-gather, as the bucket they are in is built and drops them once the stream is past them
(`_sync_source`, `executors.gather.Gathered`; verl's `rollout_mode` gathers likewise), every
rank of the sender's group taking part: the senders (each pipeline
stage's first rank when bucketed, rank 0 otherwise, `executors.reshard`) as they stream, over
the weight-sync group (`executors.syncgroup.GroupSender`) under Ray or bucket by bucket as call
results in one process, the other ranks by `sync_gather`; a colocated engine's hand-over runs
the same gathers on every rank as it exports. Unbucketed with stages, rank 0 sends the whole
model: each later stage's first rank passes it its stage's tensors one at a time, as they are
gathered.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from executors.gather import Gathered, whole_tensors
from executors.model import state_digest
from executors.pipeline import Pipeline
from executors.precision import wire_dtype, wire_state
from executors.reshard import Bucket, Stream
from executors.roles import RunConfig
from executors.runplan import Layout
from executors.sharding import full_state, gathered, whole_tensor
from executors.syncgroup import GroupSender


class TrainerSender(GroupSender):
    """Mixed into the trainer: its weights whole, for a refresh's senders (from the kept copy
    or gathered from the shards as the buckets need them), `weights()` and its digest. The
    trainer sets the attributes declared here (`_owner` and `_whole_meta` with pipeline
    stages only: `Trainer._stage_of`)."""

    cfg: RunConfig
    rank: int
    world: int
    layout: Layout
    model: torch.nn.Module
    pipe: Pipeline | None  # this rank's pipeline stage (pp > 1, once sharded)
    version: int
    _nbytes: int  # the bytes a refresh carries (in `_sync_dtype`)
    _stream: Stream | None  # the weight refresh this rank streams
    # (version, full weights) a refresh's sender keeps between steps (`_keep`)
    _kept: tuple[int, dict[str, torch.Tensor]] | None
    # with stages: the stage that holds each of the whole model's tensors (the first, for a
    # buffer every stage holds) and their shapes, stage after stage: what rank 0 streams
    # unbucketed
    _owner: dict[str, int]
    _whole_meta: dict[str, torch.Tensor]

    def weights(self) -> dict[str, torch.Tensor]:
        """The full weights, on the CPU. Sharded, a collective (every rank calls it; with
        stages the first DP/TP coordinate's stages send theirs to rank 0): rank 0 gets them,
        the others an empty dict; only rank 0 holds them whole, even while gathering."""
        if self.world == 1:
            return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        kept = self._kept_now()
        if kept is not None:  # every rank knows it: none gathers
            return dict(kept) if self.rank == 0 else {}
        first = self.pipe is not None and self.layout.heads_stage(self.rank)
        full = full_state(self.model, keep=self.rank == 0 or first)
        if self.pipe is not None:
            stage = self.pipe.stage
            parts = self._from_stages({stage.full_name(k): v for k, v in full.items()})
            full = {k: v for part in parts or [] for k, v in part.items()}
        return full if self.rank == 0 else {}

    def _from_stages(self, obj: Any) -> list[Any] | None:
        """Every stage's `obj`, on rank 0 (None elsewhere): the first DP and TP coordinate's
        pipeline gathers; the other ranks' copies are the same weights."""
        assert self.pipe is not None
        if not self.layout.heads_stage(self.rank):
            return None
        out: list[Any] | None = [None] * self.layout.pp if self.rank == 0 else None
        dist.gather_object(obj, out, group=self.pipe.group, group_dst=0)
        return out

    def _keeps(self) -> bool:
        """Whether this sharded trainer keeps the refresh's full weights between steps: the
        plan's host-memory decision (`RunConfig.keep_sync_copy`), without pipeline stages."""
        return self.cfg.keep_sync_copy and self.world > 1 and self.pipe is None

    def _keep(self) -> None:
        """At a step's end, where the plan keeps a copy: every rank joins one all-gather per
        `GATHER_BATCH_BYTES` (`sharding.gathered`), the ranks that send a refresh (each beside
        a colocated engine, else rank 0) keep the whole weights on the host until the next
        step; the others hold none."""
        self._kept = None
        if not self._keeps():
            return
        mine = self._whole_everywhere() or self.rank == 0
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        self._kept = (self.version, dict(gathered(state, keep=mine)))

    def _kept_now(self) -> dict[str, torch.Tensor] | None:
        """The kept copy of the current version (empty on a rank that sends nothing), or None:
        the refresh gathers from the shards."""
        return self._kept[1] if self._kept is not None and self._kept[0] == self.version \
            else None

    def sync_senders(self, bucketed: bool) -> list[int]:
        """The ranks that stream a weight refresh (`executors.reshard`): each pipeline stage's
        first rank, its own layers, when bucketed; rank 0, the whole model, otherwise."""
        if not bucketed or self.pipe is None:
            return [0]
        return [self.layout.rank_of(p, 0, 0, 0) for p in range(self.layout.pp)]

    def _whole_everywhere(self) -> bool:
        """Whether every rank can build any bucket of the whole model (without stages each
        holds a shard of every tensor), so the rank beside each colocated engine hands it over
        (`executors.ipc`)."""
        return self.cfg.engines.colocated and self.pipe is None

    def handover_gathers(self) -> bool:
        """Sharded, every rank takes part in each hand-over bucket's gathers (none with a kept
        copy: the senders build every bucket from it)."""
        return self.world > 1 and self._kept_now() is None

    def sync_open(self, bucket_bytes: int, sender: int) -> tuple[int, int, int]:
        """Start streaming this rank's share of the current version as stream `sender` in
        buckets of `bucket_bytes` (0: a call per tensor); (version, bytes, buckets)."""
        self._stream = Stream(self._sync_source(bucket_bytes), bucket_bytes, sender,
                              dtype=self._sync_dtype())
        return self.version, self._stream.nbytes, self._stream.count

    def _sync_dtype(self) -> torch.dtype | None:
        """What a refresh carries the weights in: the engines' BF16 when the job trains in
        BF16 (`executors.precision.wire_dtype`), the FP32 masters' own in fp32."""
        return wire_dtype(self.cfg.precision)

    def _sync_source(self, bucket_bytes: int) -> Gathered:
        """What this rank streams in buckets of `bucket_bytes`, or takes part in gathering
        (`sync_gather`): one process, its model's tensors as they are (no copy: its calls run
        in order, so no step runs mid-refresh); sharded, its shards made whole as the buckets
        need them, with stages its stage's layers, except unbucketed, where rank 0 streams
        the whole model and each later stage's first rank passes it its stage's tensors."""
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        if self.world == 1:
            return Gathered(state)
        kept = self._kept_now()
        if kept is not None:  # the step's end gathered it: nothing to gather, on any rank
            return Gathered(kept)
        if self.pipe is None:  # a bucket's worth per all-gather (`executors.gather`)
            return Gathered(state, wholes=whole_tensors, batch_bytes=bucket_bytes)
        stage = self.pipe.stage
        mine = {stage.full_name(k): v for k, v in state.items()}
        if bucket_bytes > 0 or not self.layout.heads_stage(self.rank):
            return Gathered(mine, wholes=whole_tensors, batch_bytes=bucket_bytes)
        if self.rank == 0:
            return Gathered({n: mine.get(n, m) for n, m in self._whole_meta.items()},
                            self._gather_or_receive)
        return Gathered(mine, self._gather_and_send)

    def _gather_or_receive(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's tensor `name` whole: gathered with its stage, or received from the first
        rank of the stage that holds it."""
        assert self.pipe is not None
        owner = self._owner[name]
        if owner == 0:
            return whole_tensor(t)
        buf = torch.empty(tuple(t.shape), dtype=t.dtype, device=self.pipe.device)
        dist.recv(buf, src=self.layout.rank_of(owner, 0, 0, 0), group=self.pipe.group)
        return buf

    def _gather_and_send(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A later stage's first rank: tensor `name` whole, passed on to rank 0 when its
        stage holds it first."""
        assert self.pipe is not None
        w = whole_tensor(t)
        if self._owner[name] == self.layout.stage(self.rank):
            dist.send(w.contiguous(), dst=0, group=self.pipe.group)
        return w

    def _kv_heads(self) -> int | None:
        return self.cfg.model_arch.kv_heads

    def sync_bucket(self, k: int) -> Bucket:
        """Bucket `k` of the stream `sync_open` started."""
        if self._stream is None:
            raise RuntimeError(f"trainer rank {self.rank}: sync_bucket before sync_open")
        return self._stream.bucket(k)

    def weights_digest(self) -> str:
        """`executors.model.state_digest` of the weights a refresh sends: `weights()` (the kept
        copy or a gather, whichever serves the refresh) cast as the refresh casts them (BF16
        for a BF16 job, `wire_state`), so an engine refreshed from them has the same digest.
        Sharded, a collective (as `weights()`): rank 0's digest is of the whole model."""
        return state_digest(wire_state(self.weights(), self._sync_dtype()))

    def weights_info(self) -> tuple[int, int, bool]:
        """(version, bytes) of the whole model's weights as a refresh carries them (in the
        refresh's dtype, `_sync_dtype`), and whether the senders stream them from a kept copy
        (no rank gathers) rather than gathering as they stream."""
        return self.version, self._nbytes, self._kept_now() is not None
