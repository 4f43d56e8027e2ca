"""The weight-sync group: trainer senders and rollout-engine ranks in torch.distributed process
groups of their own, so that a refresh's bytes go rank to rank and Ray carries only control
messages (the manifests below, the calls' small results).

As verl, OpenRLHF and NeMo-RL do it: a group separate from the trainers' own, formed over an
explicit TCP store that trainer rank 0 hosts on its node's address (loopback when embedded; the
store's socket is bound there, never to every interface), its ranks the refresh's senders and
every TP rank of every target engine (a torch engine's process holds all its TP ranks; each of
a vLLM engine's workers holds its own, `join_engine(..., tp_ranks)`, and loads whole tensors,
`receive(..., cut=False)`; an SGLang engine's ranks join and receive in SGLang's own code, so
for it (`GroupSpec.protocol` PER_TENSOR) the senders form each group as SGLang does
(`sglang_group`) and broadcast tensor by tensor, `update_weights_from_distributed`'s
protocol). Otherwise the process groups are built directly on that store (`ProcessGroupGloo` /
`ProcessGroupNCCL`), not through `init_process_group`: a trainer already has its default group,
and a torch engine process holds all its TP ranks. The backend is NCCL
when every member sends or receives on a GPU, gloo otherwise; the code is the same.

Channels. Each sender (a pipeline stage's first rank, `executors.reshard`) streams on channels
of its own, so the stages' streams run in parallel:
  receiving-side reshard  one channel per sender, its ranks the sender and every engine TP
                          rank; the sender broadcasts its full tensors in buckets, and each TP
                          rank keeps its cut (`engine_shard`), as vLLM's loaders do
  sending-side reshard    one channel per sender and TP rank t (`GroupSpec.send_shards`): the
                          sender cuts every tensor to rank t's shard and broadcasts that stream
                          to the engines' rank t only (a destination-local slice, as the
                          paired transports' `shards` price it)
A channel's manifest (`Manifest`: each tensor's name, dtype, shape and offset, and the bucket
size) is the refresh's only control payload; the receivers rebuild the bucket ranges from it
(`StreamLayout`), post one broadcast per bucket and load each tensor as its last byte arrives.

Protocols. An engine names how it takes a refresh (`sync_member`); `PROTOCOLS` holds one class
per protocol, and nothing else compares their names: `Protocol` (byte buckets over the group),
`PerTensor` (SGLang's), and `SharedMemory`, which forms no group: an engine the plan colocates
with the trainer is handed each bucket as shared memory (`executors.ipc`); `SharedTensors`, its
variant for SGLang on a GPU, hands over the whole tensors each bucket completes, which the
engine passes unopened to SGLang's `update_weights_from_tensor`. `PyNccl`, a vLLM engine's: on
NCCL every member (the trainer's senders too) forms each channel as vLLM's RLHF example does,
a `StatelessProcessGroup` over the channel's store and a `PyNcclCommunicator` on it
(`executors.pynccl`), rather than a torch process group, so that no member's torch.distributed
state is touched (vLLM's workers hold theirs); on gloo (the CPU) a torch group as any other.
"""
from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from executors.gather import Gathered
from executors.ipc import HandOverReceiver, HandOverSender
from executors.nodeaddr import _interface_of, _node_ip
from executors.reshard import (
    Assembler,
    Channel,
    Manifest,
    Stream,
    StreamLayout,
    engine_shard,
    manifest_digest,
)

# How an engine takes a refresh (it names its own in `sync_member`; `PROTOCOLS` says what each
# does): byte buckets broadcast over the group (the torch and vLLM engines), one broadcast per
# tensor into groups formed as the engine forms them (SGLang's `update_weights_from_distributed`),
# or, when the plan colocates engine and trainer, the buckets handed over as shared memory
# (`executors.ipc`: no group at all).
BUCKETS = "buckets"
PER_TENSOR = "per-tensor"
IPC = "ipc"
IPC_TENSORS = "ipc-tensors"
PYNCCL = "pynccl"


@dataclass(frozen=True)
class GroupSpec:
    """What every member needs to join: the store's address, the senders, each engine's TP."""

    name: str
    path: int  # the refresh path (`path_key`: bucket size, colocation): a new group replaces
    addr: str  # its old one of the same path
    port: int
    senders: int
    tps: tuple[int, ...]  # each target engine's TP ranks, in engine order
    backend: str  # gloo | nccl
    send_shards: bool = False
    timeout_s: float = 300.0
    protocol: str = BUCKETS  # a name in `PROTOCOLS` that forms a group
    # whose weights the path carries: engines time-shared by several jobs (`executors.fleetrun`)
    # hold one group per (scope, path), so that a swap between jobs re-sends over a held group
    scope: str = ""

    @property
    def slot(self) -> tuple[str, int]:
        """Where a member holds its side of the group: a new group replaces the old one of
        the same scope and path."""
        return self.scope, self.path

    @property
    def mechanism(self) -> Protocol:
        return PROTOCOLS[self.protocol]

    def channels(self) -> list[Channel]:
        if not self.send_shards:
            return [(s, None) for s in range(self.senders)]
        if len(set(self.tps)) != 1:
            raise ValueError(f"weight sync: sending-side resharding needs one engine TP, got "
                             f"{sorted(set(self.tps))}")
        return [(s, t) for s in range(self.senders) for t in range(self.tps[0])]

    def world(self, ch: Channel) -> int:
        return 1 + (sum(self.tps) if ch[1] is None else len(self.tps))

    def engine_rank(self, ch: Channel, engine: int, t: int) -> int | None:
        """The group rank of engine `engine`'s TP rank `t` on channel `ch` (None: not in it);
        the sender is rank 0."""
        if ch[1] is None:
            return 1 + sum(self.tps[:engine]) + t
        return 1 + engine if t == ch[1] else None

    def key(self, ch: Channel) -> str:
        return f"{self.name}/s{ch[0]}/t{'all' if ch[1] is None else ch[1]}"


def listen() -> socket.socket:
    """A listening socket on this node's address only, for the group's store to take."""
    ip = _node_ip()
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    s.bind((ip, 0))
    s.listen(128)
    return s


def group_device(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
        else torch.device("cpu")


def _process_group(store: dist.Store, backend: str, rank: int, world: int,
                   timeout: timedelta, ip: str | None = None) -> Any:
    if backend == "nccl":
        nccl_opts = dist.ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, nccl_opts)
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._timeout = timeout
    ifname = _interface_of(ip or _node_ip())
    if ifname:  # gloo's pairs listen on the node's interface only (loopback when embedded)
        opts._devices = [dist.ProcessGroupGloo.create_device(interface=ifname)]
    return dist.ProcessGroupGloo(store, rank, world, opts)


def sglang_group(store: dist.Store, group_name: str, backend: str, rank: int, world: int,
                 timeout: timedelta) -> Any:
    """A process group formed as SGLang's engine forms its weight-update group
    (`sglang.srt.utils.common.init_custom_process_group`, SGLang 0.5.23: the store under the
    group's name, then torch's `_new_process_group_helper`, ranks as global ranks), so that the
    sender's side and the engine's meet in one group."""
    from torch.distributed.distributed_c10d import (
        Backend,
        GroupName,
        _new_process_group_helper,
        _world,
    )
    pg, _ = _new_process_group_helper(world, rank, [], Backend(backend),
                                      dist.PrefixStore(group_name, store),
                                      group_name=GroupName(group_name), backend_options=None,
                                      timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}
    return pg


class Peer:
    """One process's membership: its process groups by (channel, local TP rank)."""

    def __init__(self, spec: GroupSpec, ranks: dict[tuple[Channel, int], int],
                 host: socket.socket | None = None, ip: str | None = None) -> None:
        """Join every channel in `ranks` ((channel, local index) -> group rank) at once: each
        group forms only when all its ranks join, and this process may hold several. `ip`:
        this node's address for gloo, where the process cannot ask Ray (an engine's worker)."""
        self.spec = spec
        timeout = timedelta(seconds=spec.timeout_s)

        def store(master: bool = False) -> dist.TCPStore:
            return dist.TCPStore(spec.addr, spec.port, None, master, timeout=timeout,
                                 wait_for_workers=False,
                                 master_listen_fd=host.fileno() if master and host else None,
                                 use_libuv=True)
        # the host's server; then a client per group: a client blocks in its waits, so groups
        # forming at once in threads must not share one
        self._server = store(True) if host is not None else None
        if host is not None:
            host.detach()  # the store owns the descriptor now

        def form(item: tuple[tuple[Channel, int], int]) -> Any:
            (ch, _), rank = item
            return spec.mechanism.form(store(), spec, ch, rank, timeout, ip)
        items = sorted(ranks.items(), key=lambda kv: (kv[0][0][0], kv[0][0][1] or 0, kv[0][1]))
        with ThreadPoolExecutor(max(len(items), 1)) as pool:
            self.groups = dict(zip([k for k, _ in items], pool.map(form, items)))


def _bcast(pg: Any, buf: torch.Tensor) -> Any:
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    return pg.broadcast([buf], opts)


def join_sender(spec: GroupSpec, index: int, host: socket.socket | None) -> Peer:
    return Peer(spec, {(ch, 0): 0 for ch in spec.channels() if ch[0] == index}, host)


def join_engine(spec: GroupSpec, engine: int, tp_ranks: list[int] | None = None,
                ip: str | None = None) -> Peer:
    """Engine `engine`'s membership: its TP ranks `tp_ranks` (default every one: the torch
    engine holds them all; a vLLM worker holds its own)."""
    ranks = {}
    for ch in spec.channels():
        for t in range(spec.tps[engine]) if tp_ranks is None else tp_ranks:
            r = spec.engine_rank(ch, engine, t)
            if r is not None:
                ranks[(ch, t)] = r
    return Peer(spec, ranks, ip=ip)


class Sending:
    """A sender's refresh: its streams (one per channel) over one `Gathered` source, and their
    manifests. Each tensor is made whole once, when the first channel's bucket needs it, and
    dropped once every channel is past it; whatever way the send ends, the source is drained
    (`Gathered.drain`), so the trainer ranks' gathers stay paired."""

    def __init__(self, peer: Peer, index: int, source: Gathered, bucket_bytes: int,
                 kv_heads: int | None, dtype: torch.dtype | None = None) -> None:
        """`dtype`: what the streams carry the floating-point tensors in (the engines' BF16
        for a BF16 job, cast as each bucket is built: `executors.reshard.Stream`)."""
        self.peer, self.source = peer, source
        self.streams: dict[Channel, Stream] = {}
        for ch, _ in peer.groups:
            cut = None if ch[1] is None else functools.partial(
                _cut, tp=peer.spec.tps[0], rank=ch[1], kv_heads=kv_heads)
            self.streams[ch] = Stream(source, bucket_bytes, index, cut=cut, owner=False,
                                      dtype=dtype)

    def manifests(self) -> list[Manifest]:
        return [Manifest(ch, tuple(s.entries), s.bucket_bytes) for ch, s in self.streams.items()]

    def send(self) -> dict[str, Any]:
        try:
            return self.peer.spec.mechanism.send(self)
        finally:
            self.source.drain()

    def _build(self, k: int, dev: torch.device) -> list[tuple[Channel, torch.Tensor]]:
        """The channels' k-th buckets (a sharded trainer's gathers run here), then the source's
        tensors no later bucket needs released."""
        out = []
        for ch, s in self.streams.items():
            lo, hi = s.ranges[k] if k < s.count else (0, 0)
            if hi > lo:  # an empty bucket (an empty tensor, unbucketed) moves nothing
                out.append((ch, s.bucket(k, dev).data))
        self.source.release(min(s.first_needed(k + 1) for s in self.streams.values()))
        return out

    def send_buckets(self) -> dict[str, Any]:
        """Broadcast every channel's buckets, the channels' k-th buckets together; bucket
        k + 1 is built (its tensors gathered) while bucket k is on the wire, so the gathers
        and the broadcasts overlap, two buckets held at most."""
        t0 = time.time()
        dev = group_device(self.peer.spec.backend)
        sent = 0
        count = max(s.count for s in self.streams.values())
        ready = self._build(0, dev) if count else []
        for k in range(count):
            works = [_bcast(self.peer.groups[(ch, 0)], buf) for ch, buf in ready]
            sent += sum(buf.numel() for _, buf in ready)
            on_wire = ready  # referenced until its broadcasts are done
            ready = self._build(k + 1, dev) if k + 1 < count else []
            for w in works:
                w.wait()
            del on_wire
        return {"t0": t0, "dur": time.time() - t0, "bytes": sent}

    def send_tensors(self) -> dict[str, Any]:
        """SGLang's protocol (`update_weights_from_distributed`, default load format): one
        broadcast per tensor, of its own dtype and shape, in the manifest's order (the
        channels' i-th tensors together: each is made whole once)."""
        t0 = time.time()
        dev = group_device(self.peer.spec.backend)
        sent = 0
        chans = list(self.streams.items())
        for i, row in enumerate(zip(*(s.entries for _, s in chans))):
            for (ch, s), e in zip(chans, row):  # one tensor at a time on the device
                _bcast(self.peer.groups[(ch, 0)],
                       s.tensor(e.name).detach().to(dev).contiguous()).wait()
                sent += e.nbytes
            self.source.release(i + 1)
        return {"t0": t0, "dur": time.time() - t0, "bytes": sent}


def _cut(name: str, full: torch.Tensor, tp: int, rank: int, kv_heads: int | None
         ) -> torch.Tensor:
    return engine_shard(name, full, tp, rank, kv_heads)


def receive(peer: Peer, manifests: list[Manifest], tp: int, kv_heads: int | None,
            load: Callable[[int, str, torch.Tensor], None], cut: bool = True
            ) -> dict[str, Any]:
    """Receive a refresh on every (channel, TP rank) this process holds; `load(t, name,
    shard)` each tensor's TP-rank-t shard as it completes (`cut` False: the whole tensor, for
    an engine whose loaders cut their own shard, as vLLM's do). RuntimeError when a stream ends
    with tensors unfinished. The bytes are the most one TP rank received (what one engine rank
    of a real TP engine takes off the wire)."""
    t0 = time.time()
    dev = group_device(peer.spec.backend)
    by_ch = {m.channel: m.layout() for m in manifests}
    mine = [(ch, t, by_ch[ch]) for ch, t in peer.groups]
    asm = {t: Assembler() for _, t in peer.groups}
    got = dict.fromkeys(asm, 0)

    def post(k: int) -> list[tuple[Channel, int, StreamLayout, torch.Tensor, Any]]:
        posted = []
        for ch, t, lay in mine:
            if k < lay.count:
                lo, hi = lay.ranges[k]
                buf = torch.empty(hi - lo, dtype=torch.uint8, device=dev)
                work = _bcast(peer.groups[(ch, t)], buf) if hi > lo else None
                posted.append((ch, t, lay, buf, work))
        return posted
    count = max((lay.count for _, _, lay in mine), default=0)
    ahead = post(0) if count else []
    for k in range(count):
        # bucket k + 1's receipt posted before bucket k is loaded: loading overlaps the wire
        posted, ahead = ahead, post(k + 1) if k + 1 < count else []
        for ch, t, lay, buf, work in posted:
            if work is not None:
                work.wait()
            got[t] += buf.numel()
            for name, full in asm[t].add(lay.received(k, buf)):
                load(t, name, full if ch[1] is not None or not cut else
                     engine_shard(name, full, tp, t, kv_heads))
    senders = len({ch[0] for ch, _, _ in mine})
    if not all(a.complete(senders) for a in asm.values()):
        raise RuntimeError("weight sync: a stream of the group ended with tensors unfinished")
    return {"t0": t0, "dur": time.time() - t0, "bytes": max(got.values(), default=0)}


class Protocol:
    """How a refresh path's engines take a refresh; the base: byte buckets broadcast over the
    path's group, which every member forms. `PROTOCOLS` holds one instance of each."""

    name: ClassVar[str] = BUCKETS
    forms_group: ClassVar[bool] = True  # False: no process group (the hand-over)
    # a hand-over's: the engine's method taking one bucket, and whether the buckets go as the
    # whole tensors they complete (`ipc.HandOver`)
    receive: ClassVar[str] = "handover_receive"
    tensors: ClassVar[bool] = False

    def form(self, store: dist.Store, spec: GroupSpec, ch: Channel, rank: int,
             timeout: timedelta, ip: str | None) -> Any:
        return _process_group(dist.PrefixStore(spec.key(ch), store), spec.backend, rank,
                              spec.world(ch), timeout, ip)

    def send(self, sending: Sending) -> dict[str, Any]:
        return sending.send_buckets()

    def calls(self, m: Manifest) -> int:
        """Sequential calls of a sender's stream (what `costmodel.sync_call_cost` prices)."""
        return len(m.layout().ranges)


class PyNccl(Protocol):
    """A vLLM engine's: byte buckets as `Protocol`'s, each channel on NCCL formed on vLLM's
    stateless group and communicator (`pynccl_channel`) by every member, on gloo a torch
    group."""

    name = PYNCCL

    def form(self, store: dist.Store, spec: GroupSpec, ch: Channel, rank: int,
             timeout: timedelta, ip: str | None) -> Any:
        if spec.backend != "nccl":
            return super().form(store, spec, ch, rank, timeout, ip)
        from executors.pynccl import pynccl_channel  # its vLLM imports are lazy too
        return pynccl_channel(dist.PrefixStore(spec.key(ch), store), rank, spec.world(ch))


class PerTensor(Protocol):
    """SGLang's: the engine's TP ranks join groups formed as SGLang forms them and receive one
    broadcast per tensor (`update_weights_from_distributed`)."""

    name = PER_TENSOR

    def form(self, store: dist.Store, spec: GroupSpec, ch: Channel, rank: int,
             timeout: timedelta, ip: str | None) -> Any:
        return sglang_group(store, spec.key(ch), spec.backend, rank, spec.world(ch), timeout)

    def send(self, sending: Sending) -> dict[str, Any]:
        return sending.send_tensors()

    def calls(self, m: Manifest) -> int:
        return len(m.entries)


class SharedMemory(Protocol):
    """A colocated engine's: each bucket handed over as shared memory (`executors.ipc`); the
    driver runs it (`executors.weights.GroupRefresh.handover`), no group is formed."""

    name = IPC
    forms_group = False

    def form(self, store: dist.Store, spec: GroupSpec, ch: Channel, rank: int,
             timeout: timedelta, ip: str | None) -> Any:
        raise RuntimeError("weight sync: the shared-memory hand-over forms no process group")

    def send(self, sending: Sending) -> dict[str, Any]:
        raise RuntimeError("weight sync: the shared-memory hand-over broadcasts nothing")


class SharedTensors(SharedMemory):
    """SGLang's colocated hand-over on a GPU: each bucket as the whole tensors it completes,
    one CUDA IPC handle per tensor and TP rank, which the engine hands SGLang unopened
    (`executors.sglang_rollout.SglangRollout.handover_receive_tensors`)."""

    name = IPC_TENSORS
    receive = "handover_receive_tensors"
    tensors = True


PROTOCOLS: dict[str, Protocol] = {p.name: p() for p in (Protocol, PyNccl, PerTensor,
                                                         SharedMemory, SharedTensors)}


def find_peer(peers: Mapping[Any, Peer] | None, name: str) -> Peer:
    """This member's group `name` (a restarted process has none: the driver forms anew)."""
    found = [p for p in (peers or {}).values() if p.spec.name == name]
    if not found:
        raise RuntimeError(f"weight sync: this process is not in group {name!r}")
    return found[0]


def _device_kind() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class GroupSender(HandOverSender):
    """Mixed into the trainer: a refresh's sender on the weight-sync group. The class defines
    `_sync_state(bucket_bytes)`, the full tensors it streams, or `_sync_source` when it
    gathers them as it streams (then the trainer ranks that send nothing take part,
    `sync_gather`), and `_kv_heads()`."""

    _sync_listen: socket.socket | None = None
    _sync_peers: dict[tuple[str, int], Peer] | None = None  # by (scope, refresh path)
    _sync_sending: Sending | None = None

    def _kv_heads(self) -> int | None:
        return None

    def sync_member(self) -> tuple[str, int, int]:
        """Where this member's side of a broadcast lives (NCCL needs every member on a GPU),
        its ranks in a group (a sender: one) and its process (a restarted one is in no group)."""
        return _device_kind(), 1, os.getpid()

    def sync_host(self) -> tuple[str, int]:
        """Address and port of a new group's store, which this sender (index 0) hosts."""
        self._sync_listen = listen()
        addr, port = self._sync_listen.getsockname()[:2]
        return str(addr), int(port)

    def sync_join(self, spec: GroupSpec, index: int) -> bool:
        host = self._sync_listen if index == 0 else None
        if index == 0 and host is None:  # without it the store would bind to every interface
            raise RuntimeError("weight sync: sender 0 joins before sync_host")
        self._sync_listen = None
        self._sync_peers = {**(self._sync_peers or {}), spec.slot: join_sender(spec, index, host)}
        return True

    def sync_prepare(self, name: str, bucket_bytes: int, index: int) -> list[Manifest]:
        """Cut the current version into this sender's streams; their manifests."""
        peer = find_peer(self._sync_peers, name)
        self._sync_sending = Sending(peer, index, self._sync_source(bucket_bytes), bucket_bytes,
                                     self._kv_heads(), self._sync_dtype())
        return self._sync_sending.manifests()

    def sync_send(self, name: str, bucket_bytes: int | None = None, index: int = 0,
                  digest: str | None = None) -> dict[str, Any]:
        """Send the refresh `sync_prepare` cut, or with `digest` (the driver's
        `manifest_digest` of this sender's manifests at an earlier refresh of the group) cut
        it here and send it in the same call: the receivers were handed those manifests, so
        a stream that no longer matches them is refused (its gathers still run: `drain`)."""
        if digest is not None and bucket_bytes is not None:
            got = manifest_digest(self.sync_prepare(name, bucket_bytes, index))
            if got != digest:
                sending, self._sync_sending = self._sync_sending, None
                if sending is not None:
                    sending.source.drain()
                raise RuntimeError(f"weight sync: sender {index}'s stream on {name!r} no longer "
                                   f"matches the manifests of its last refresh")
        sending, self._sync_sending = self._sync_sending, None
        if sending is None or sending.peer.spec.name != name:
            raise RuntimeError(f"weight sync: sync_send on {name!r} before sync_prepare")
        return sending.send()


class GroupReceiver(HandOverReceiver):
    """Mixed into a rollout engine: a refresh's receiver, every TP rank of the engine in the
    group. The class defines `_engine_tp()`, `_kv_heads()`, `_load_shard(t, name, shard)`,
    `_refreshed()` (the refresh is complete) and `_expected_names()`."""

    version: int
    _sync_peers: dict[tuple[str, int], Peer] | None = None  # by (scope, refresh path)

    def _engine_tp(self) -> int:
        return 1

    def _kv_heads(self) -> int | None:
        return None

    def _load_shard(self, t: int, name: str, shard: torch.Tensor) -> None:
        raise NotImplementedError

    def _refreshed(self) -> None:
        """Called once every tensor of a refresh arrived."""

    def _expected_names(self) -> set[str] | None:
        return None

    def sync_member(self) -> tuple[str, int, int] | tuple[str, int, int, str]:
        """The engine's device for the group (the torch engine's CPU), its TP ranks in it and
        its process (an engine that joins and receives in its own code adds its protocol)."""
        return "cpu", self._engine_tp(), os.getpid()

    def sync_join(self, spec: GroupSpec, engine: int) -> bool:
        if spec.tps[engine] != self._engine_tp():
            raise RuntimeError(f"weight sync: engine {engine} runs tp {self._engine_tp()}, the "
                               f"group expects {spec.tps[engine]}")
        self._sync_peers = {**(self._sync_peers or {}), spec.slot: join_engine(spec, engine)}
        return True

    def sync_receive(self, name: str, manifests: list[Manifest], version: int
                     ) -> dict[str, Any]:
        """Receive the refresh to `version`; the call's timing and the bytes one rank took."""
        peer = find_peer(self._sync_peers, name)
        names: list[set[str]] = [set() for _ in range(self._engine_tp())]

        def load(t: int, tensor_name: str, shard: torch.Tensor) -> None:
            names[t].add(tensor_name)
            self._load_shard(t, tensor_name, shard)
        out = receive(peer, manifests, self._engine_tp(), self._kv_heads(), load)
        want = self._expected_names()
        for got in names:
            missing = sorted(want - got) if want is not None else []
            if missing:
                raise RuntimeError(f"weight sync to version {version}: {len(missing)} tensors "
                                   f"never arrived ({missing[0]}, ...)")
        self._refreshed()
        self.version = version
        return {**out, "done": True, "version": version}
