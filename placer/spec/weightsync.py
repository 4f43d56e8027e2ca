"""Weight-sync transports: the job's `weight_sync` section and what each transport does, in one
place.

A refit moves the trainer's weights into the rollout engines after each update. Frameworks do it
in two shapes, and the cost model, the simulator and the planner ask a transport the same few
questions through its mechanism (`WeightSync.mechanism`), never by its name:

  paired            one stream per engine rank from its own trainer rank, all in parallel
                    (NeMo-RL's and verl's checkpoint engines); otherwise one broadcast of the
                    full weights that every engine rank joins (NCCL broadcast, CUDA IPC)
  shards(sharded)   an engine rank receives only its destination-local slice (its pipeline
                    stage, its experts or its TP slice of every expert), not the full weights
  stream_gbs(...)   raw GB/s of one paired stream over the network: RDMA reads run at the NIC;
                    an NCCL stream at most a sender's rate (`Efficiency.sync_sender_gbs`)
  reshards          an engine rank receives its slice of the FFN weights shard to shard and the
                    rest by a packed broadcast (NeMo-RL's nccl_reshard refit)

Adding a transport is one class here with its `kind` in `TransportKind` and `TRANSPORTS`; nothing
else in the project compares a transport's name. docs/cost-model.md (Weight sync) prices each.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, StrictBool, model_validator

from placer.spec.base import Strict

TransportKind = Literal["broadcast", "nixl", "nccl-p2p", "nccl-reshard"]


class WeightSync(Strict):
    """How the trainer's weights reach the rollout engines after each update.

    broadcast  one NCCL broadcast (CUDA IPC when colocated) of the full weights that every
               engine rank joins; each rank loads its own slice (verl, Miles, NeMo-RL's
               collective path, `placer execute`)
    nixl       checkpoint-engine point-to-point: each engine rank reads its share from its own
               trainer rank by GPU RDMA (NeMo-RL's NIXL checkpoint engine, UCX rails)
    nccl-p2p   the same pairs over NCCL send / receive
    nccl-reshard  NeMo-RL's nccl_reshard refit (not colocated): the FFN weights shard to shard,
               each engine rank receiving its own slice, then the rest by packed broadcast
    """

    transport: TransportKind = "broadcast"
    shard_experts: StrictBool = Field(True, description="paired transports: each engine rank "
                                "receives only its own slice (NeMo-RL's shard_expert_weights)")

    @model_validator(mode="after")
    def _shards_need_pairs(self) -> WeightSync:
        if not self.shard_experts and not self.mechanism.paired:
            raise ValueError("shard_experts applies to the paired transports (nixl, nccl-p2p, "
                             "nccl-reshard); "
                             "a broadcast always sends the full weights")
        return self

    @property
    def mechanism(self) -> SyncTransport:
        """What this transport does (`TRANSPORTS`)."""
        return TRANSPORTS[self.transport]()


class SyncTransport:
    """A transport's behaviour; the base is `broadcast`: the full weights, one broadcast."""

    kind: ClassVar[str] = "broadcast"
    paired: ClassVar[bool] = False
    reshards: ClassVar[bool] = False

    def shards(self, sharded: bool) -> bool:
        """Whether an engine rank receives only its own slice of the weights."""
        return False

    def stream_gbs(self, nic_gbs: float, sender_gbs: float) -> float:
        """Raw GB/s of one stream over the network (a broadcast sender: at most `sender_gbs`)."""
        return min(nic_gbs, sender_gbs)


class Nixl(SyncTransport):
    """Point-to-point GPU RDMA reads, one trainer rank per engine rank: the NIC's rate."""

    kind = "nixl"
    paired = True

    def shards(self, sharded: bool) -> bool:
        return sharded

    def stream_gbs(self, nic_gbs: float, sender_gbs: float) -> float:
        return nic_gbs


class NcclP2p(Nixl):
    """The same pairs over NCCL: a stream at most a sender's rate (NCCL's proxy path)."""

    kind = "nccl-p2p"

    def stream_gbs(self, nic_gbs: float, sender_gbs: float) -> float:
        return min(nic_gbs, sender_gbs)


class NcclReshard(Nixl):
    """NeMo-RL's nccl_reshard refit (NVIDIA-NeMo/RL docs/design-docs/nccl-reshard-refit.md
    @7ea279ab): the FFN projection weights (dense MLP and routed experts; not shared experts)
    go shard to shard, every engine rank receiving exactly its own slice, over per-stage NCCL
    communicators (`nccl.m2n.reshard` or batched point-to-point from GPU memory: the NIC's
    rate, no host staging); after them the rest ("misc": embeddings, attention, norms,
    routers) rides the packed broadcast of GPU buffers every engine rank joins. The doc
    requires it non-colocated ("the colocated path uses IPC and is unaffected")."""

    kind = "nccl-reshard"
    reshards = True

    def shards(self, sharded: bool) -> bool:
        return True


TRANSPORTS: dict[str, type[SyncTransport]] = {
    t.kind: t for t in (SyncTransport, Nixl, NcclP2p, NcclReshard)}
