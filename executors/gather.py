"""Sharded tensors made whole in batches: one all-gather for many tensors, not one each.

A trainer's FSDP2 shards are DTensors. `DTensor.full_tensor()` gathers one tensor per call, a
collective each: over gloo a round trip per tensor (about a millisecond on the CPU, measured:
tiny-llama's 21 tensors took 17-20 ms per refresh and its 42 Adam moments 60 ms per checkpoint
on a dp 2 trainer), over NCCL a kernel launch and a sync each. FSDP2 gathers a whole layer's
parameters in one call for the same reason (`foreach_all_gather`). `whole_tensors` does the
same for a weight refresh and a checkpoint: the local shards of many tensors are packed as
bytes into one buffer per process group and gathered in one all-gather; each rank's share of
each tensor is then cut out at its offset and the shares concatenated along the cut dim. A
shard's extent on rank r is `Shard.local_shard_size_and_offset` (torch.chunk's cut, DTensor's
and FSDP2's), so every rank knows every other rank's offsets without asking.

A tensor cut on several mesh dims (TP's `Shard` and FSDP2's shard of the TP part, dp x tp) is
made whole one mesh dim at a time, its cuts undone in the reverse of the order they were made
(`cuts`: FSDP2 over TP cuts TP first, which DTensor writes `_StridedShard` on the dp dim): a
round of gathers per mesh dim, every tensor of the batch taking its next step in the same
round, one all-gather per group and round (tiny-llama's weights and Adam moments after a step
at dp 2 x tp 2, every one but the norms' cut on both dims: at most four all-gathers in all,
tests/test_exec_keptcopy.py, where each was a `full_tensor` of its own before). A tensor of
any other placement (a `Partial`) is gathered by itself (`full_tensor`), in list order, before
the batch: every rank of the group must pass the same tensors in the same order, as for any
collective.

`batches` cuts a list of tensors into consecutive runs of at most `limit` bytes (a tensor
larger alone), from their global sizes only: every rank cuts the same runs, whatever it does
with them, so the gathers pair up (`Gathered`, below).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def nbytes(t: torch.Tensor) -> int:
    """Bytes of `t` whole (a DTensor's global shape)."""
    return t.numel() * t.element_size()


def batches(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """[start, stop) index runs over `sizes` (bytes), in order, each at most `limit` bytes or a
    single item; `limit` <= 0: one item each."""
    out: list[tuple[int, int]] = []
    lo, acc = 0, 0
    for i, n in enumerate(sizes):
        if i > lo and (limit <= 0 or acc + n > limit):
            out.append((lo, i))
            lo, acc = i, 0
        acc += n
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    return out


def cuts(t: Any) -> list[tuple[int, int]] | None:
    """(mesh dim, tensor dim) of each cut that made a DTensor's local shard from the whole, in
    the order the cuts were made, each `torch.chunk`'s cut of what the earlier ones left (mesh
    dims of one rank and replicated ones make none); None for a placement that is no cut (a
    `Partial`) or a strided shard this order cannot express.

    A plain `Shard(d)` cuts in mesh-dim order (DTensor's left-to-right rule). FSDP2 over TP
    cuts the other way: TP's `Shard(d)` first, then FSDP2's shard of the TP rank's part,
    written `_StridedShard(d, split_factor=tp)` on the earlier (dp) mesh dim; such a cut is made
    once the later cuts of dim `d`, `split_factor` shards between them, are made."""
    out: list[tuple[int, int]] = []
    waiting: list[list[int]] = []  # [mesh dim, tensor dim, shards still to come]
    for md, p in enumerate(t.placements):
        kind = type(p).__name__  # (a `_StridedShard` is no `is_shard()` in torch 2.13)
        if p.is_replicate():
            continue
        if kind not in ("Shard", "_StridedShard"):
            return None
        n = t.device_mesh.size(md)
        if n == 1:
            continue
        if kind == "_StridedShard" and p.split_factor > 1:
            waiting.append([md, p.dim, p.split_factor])
            continue
        out.append((md, p.dim))
        for w in waiting:
            if w[1] == p.dim:
                if w[2] % n:
                    return None
                w[2] //= n
        out += [(w[0], w[1]) for w in waiting if w[2] == 1]
        waiting = [w for w in waiting if w[2] > 1]
    return None if waiting else out


Step = tuple[int, int, tuple[int, ...]]  # (mesh dim, tensor dim, the shape that cut was made on)


def steps(t: Any) -> list[Step] | None:
    """The gathers that make DTensor `t` whole from this rank's shard, in the order to make
    them: its `cuts` undone last first, each with the shape its cut was made on (the same on
    every rank of that mesh dim's group: the earlier cuts are theirs too). None: see `cuts`."""
    from torch.distributed.tensor import Shard  # lazy: distributed only
    order = cuts(t)
    if order is None:
        return None
    coord = list(t.device_mesh.get_coordinate() or [])
    shape, out = list(t.shape), []
    for md, d in order:
        out.append((md, d, tuple(shape)))
        size, _ = Shard.local_shard_size_and_offset(shape[d], t.device_mesh.size(md), coord[md])
        shape[d] = int(size)
    return out[::-1]


def _shares(shape: tuple[int, ...], dim: int, ranks: int) -> list[tuple[int, ...]]:
    """Each rank's local shape of a tensor of `shape` cut in `ranks` along `dim`."""
    from torch.distributed.tensor import Shard  # lazy: distributed only
    out = []
    for r in range(ranks):
        size, _ = Shard.local_shard_size_and_offset(shape[dim], ranks, r)
        out.append((*shape[:dim], int(size), *shape[dim + 1:]))
    return out


ALIGN = 16  # bytes: each share starts at a multiple (a typed view needs its element size's)


def _slot(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


Item = tuple[int, torch.Tensor, int, tuple[int, ...]]  # (index, local part, tensor dim, shape)


def whole_tensors(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every tensor of `ts` whole, on its device: a plain tensor as it is, a DTensor gathered
    (module docstring). A collective: every rank of the tensors' groups calls it with the same
    tensors (its own shards of them) in the same order."""
    from torch.distributed.tensor import DTensor  # lazy: distributed only
    out: list[torch.Tensor | None] = [None] * len(ts)
    pending: dict[int, tuple[torch.Tensor, list[Step], Any]] = {}
    for i, t in enumerate(ts):
        t = t.detach()
        if not isinstance(t, DTensor):
            out[i] = t
            continue
        todo = steps(t)
        if todo is None:
            out[i] = t.full_tensor()  # another placement: by itself, in list order
        elif not todo:
            out[i] = t.to_local()  # replicated
        else:
            pending[i] = (t.to_local(), todo, t.device_mesh)
    while pending:  # one round per mesh dim a tensor is cut on: each tensor's next gather
        groups: dict[tuple[int, str], tuple[Any, list[Item]]] = {}
        for i, (local, todo, mesh) in pending.items():  # in list order: the same on every rank
            md, d, shape = todo[0]
            pg = mesh.get_group(md)
            groups.setdefault((md, str(pg.group_name)), (pg, []))[1].append((i, local, d, shape))
        for pg, items in groups.values():  # in order of first use: the same on every rank
            for i, whole in _gather_group(pg, items):
                local, todo, mesh = pending[i]
                if len(todo) == 1:
                    out[i] = whole
                    del pending[i]
                else:
                    pending[i] = (whole, todo[1:], mesh)
    assert all(o is not None for o in out)
    return [o for o in out if o is not None]


def _gather_group(pg: Any, items: list[Item]) -> list[tuple[int, torch.Tensor]]:
    """One all-gather over `pg` of the local parts of `items` ((index, part, tensor dim, the
    shape the cut was made on)); (index, the part of that shape) each."""
    ranks, me = dist.get_world_size(pg), dist.get_rank(pg)
    shares = [_shares(shape, d, ranks) for _, _, d, shape in items]
    sizes = [[int(torch.Size(s[r]).numel()) * t.element_size() for s, (_, t, _, _) in
              zip(shares, items)] for r in range(ranks)]
    width = max(sum(_slot(n) for n in s) for s in sizes)
    dev = items[0][1].device
    mine = torch.zeros(width, dtype=torch.uint8, device=dev)
    at = 0
    for (_, local, _, _), s, n in zip(items, shares, sizes[me]):
        if tuple(local.shape) != s[me]:
            raise RuntimeError(f"gather: a shard of shape {tuple(local.shape)} where the cut "
                               f"gives {s[me]}")
        mine[at:at + n] = _as_bytes(local)
        at += _slot(n)
    got = [torch.empty(width, dtype=torch.uint8, device=dev) for _ in range(ranks)]
    dist.all_gather(got, mine, group=pg)
    offsets = [0] * ranks
    out = []
    for k, (i, t, d, _) in enumerate(items):
        parts = []
        for r in range(ranks):
            n = sizes[r][k]
            parts.append(got[r][offsets[r]:offsets[r] + n].view(t.dtype).reshape(shares[k][r]))
            offsets[r] += _slot(n)
        out.append((i, torch.cat(parts, d)))
    return out


Whole = Callable[[str, torch.Tensor], torch.Tensor]  # (name, held tensor) -> the whole tensor
Wholes = Callable[[list[torch.Tensor]], list[torch.Tensor]]  # held tensors -> each whole


class Gathered:
    """A sender's tensors, each made whole (`whole`) once, in stream order, when a bucket first
    needs it, and dropped once every stream that reads it has moved past it (`release`): a
    sharded trainer holds no full copy of its weights, only the tensors of the buckets being
    built (verl @ b178a3cd, verl/workers/fsdp_workers.py `rollout_mode`: each parameter's
    `full_tensor()` in the generator the rollout's `update_weights` consumes). `whole` is a
    collective: every rank of the trainer's group makes the same tensors whole in the same
    order, a rank that sends nothing by `drain`. Without `whole` the tensors are held already
    (a plain state dict): nothing is gathered or dropped. An empty tensor is never gathered
    (it carries no bytes; its shape is its global one)."""

    def __init__(self, state: dict[str, torch.Tensor], whole: Whole | None = None,
                 wholes: Wholes | None = None, batch_bytes: int = 0) -> None:
        """`wholes`: makes many tensors whole in one collective (`executors.gather`), taking
        the tensors in runs of at most `batch_bytes` (`gather.batches`: cut from the global
        sizes alone, so every rank gathers the same runs); it replaces `whole`."""
        self.state, self.whole, self.wholes = state, whole, wholes
        self.names = list(state)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.done = 0  # tensors made whole so far (the first `done` names)
        self.held: dict[str, torch.Tensor] = {}
        self.peak = 0  # the most bytes held at once
        self.runs = batches([nbytes(state[n]) for n in self.names], batch_bytes) \
            if wholes is not None else []
        self.gathers = 0  # collectives made so far

    @property
    def gathering(self) -> bool:
        return self.whole is not None or self.wholes is not None

    def _next(self) -> list[tuple[str, torch.Tensor]]:
        """Make the next tensor (or, batched, the next run) whole; (name, tensor) each."""
        if self.wholes is None:
            assert self.whole is not None
            n, t = self.names[self.done], self.state[self.names[self.done]]
            self.done += 1
            if not t.numel():
                return [(n, torch.empty(tuple(t.shape), dtype=t.dtype))]
            self.gathers += 1
            return [(n, self.whole(n, t))]
        lo, hi = next(r for r in self.runs if r[0] == self.done)
        self.done = hi
        names = self.names[lo:hi]
        full = [n for n in names if self.state[n].numel()]
        got = dict(zip(full, self.wholes([self.state[n] for n in full]))) if full else {}
        self.gathers += 1 if full else 0
        return [(n, got[n] if n in got else torch.empty(tuple(self.state[n].shape),
                                                        dtype=self.state[n].dtype))
                for n in names]

    def meta(self, name: str) -> torch.Tensor:
        """Tensor `name`'s global shape and dtype, no data (a DTensor's shape is the global one)."""
        t = self.state[name]
        return torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")

    def get(self, name: str) -> torch.Tensor:
        """Tensor `name` whole, gathering it (and every earlier one not yet gathered) now."""
        if not self.gathering:
            return self.state[name]
        i = self.index[name]
        if name not in self.held and i < self.done:
            raise RuntimeError(f"weight sync: {name!r} was needed again after it was released")
        while self.done <= i:
            self.held.update(self._next())
            self.peak = max(self.peak, self.nbytes)
        return self.held[name]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.held.values())

    def release(self, before: int) -> None:
        """Drop the whole tensors before index `before`: no stream needs them again."""
        if not self.gathering:
            return
        for n in [n for n in self.held if self.index[n] < before]:
            del self.held[n]

    def drain(self) -> None:
        """Take part in the gathers not made yet, dropping each at once, and drop what is held:
        a rank that streams nothing (or a stream that broke off) keeps the group's collectives
        paired."""
        if self.gathering:
            while self.done < len(self.names):
                self._next()
        self.held.clear()
