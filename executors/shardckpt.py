"""A sharded trainer's checkpoint written rank by rank: each rank its own shards, none gathered.

As torch's distributed checkpoint (DCP) writes one file per rank, so that no host holds the
whole model and optimizer while a checkpoint is written, a sharded trainer writes a folder at
the checkpoint's path: `rank-NNNNN.pt` per rank, each holding that rank's pieces of the weights
and Adam moments. A piece is a DTensor's local shard with the cuts that made it from the whole
(`executors.gather.cuts`: FSDP2's one `Shard(d)`; under TP, TP's cut and FSDP2's cut of the TP
part, in the order they were made), each as (tensor dim, index, of), written by the replica
whose coordinates on every uncut mesh dim are 0 (each element once), on the mesh through the
stage's head (rank 0, or a pipeline stage's first rank: a DTensor's mesh may not span the
trainer's group, as FSDP2's dp mesh of one TP rank). A pipeline stage writes its own tensors,
by the whole model's names and parameter indices. A tensor no cut makes (a `Partial`) is made
whole by every rank of its group and written by the head; a plain tensor (a buffer, Adam's step
count) by the head too. Rank 0 also writes the version, the step, the optimizer's parameter
groups and the world size.

Atomic: the ranks write into `.NAME.tmp` beside the final path (rank 0 empties it first; a
barrier on the trainers' group before and after the writes), and rank 0 renames it to the
final path; the driver records it in `latest.json` only after every rank's call returned, so a
checkpoint interrupted half-way is never the one a run resumes from. `read` rebuilds the
one-process format (full weights, full Adam state by parameter index) from the files, so any
layout restores it, as one process, another dp or a pipeline (`executors.trainer.Trainer.load`:
`load_full` and `load_sharded_optim` cut a layout's shards from it).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executors.gather import cuts
from executors.roles import save_checkpoint
from executors.sharding import gathered

Key = tuple[Any, ...]  # ("model", name) | ("optim", parameter index, state name)


def _pieces(state: dict[Key, Any], rank: int, head: int) -> dict[str, dict[Any, Any]]:
    """This rank's part of `state`: its pieces and the whole tensors it writes (a collective
    only for a tensor no cut makes, `gather.cuts`: gathered by its group). `head`: the rank
    that writes this rank's plain tensors (rank 0; a pipeline stage's first rank)."""
    from torch.distributed.tensor import DTensor  # lazy: distributed only
    pieces: dict[Key, Any] = {}
    whole: dict[Key, Any] = {}
    for key, t in state.items():
        t = t.detach() if torch.is_tensor(t) else t
        if not isinstance(t, DTensor):
            if rank == head:
                whole[key] = t.cpu() if torch.is_tensor(t) else t
            continue
        order = cuts(t)
        if order is None:
            full = t.full_tensor()  # every rank of its group, in key order
            if rank == head:
                whole[key] = full.cpu()
            continue
        mesh = t.device_mesh
        coord: list[int] = list(mesh.get_coordinate() or [])
        # one replica writes: the mesh through `head` (a DTensor's mesh may not span the
        # stage: FSDP2's dp mesh of one TP rank), at coordinate 0 on every dim but the cuts'
        cut_dims = {md for md, _ in order}
        if head not in mesh.mesh.flatten().tolist() or any(
                c for i, c in enumerate(coord) if i not in cut_dims):
            continue  # a replica of a piece another rank writes
        if not order:
            whole[key] = t.to_local().cpu()
            continue
        pieces[key] = {"local": t.to_local().cpu(),
                       "cuts": [(d, coord[md], mesh.size(md)) for md, d in order]}
    return {"pieces": pieces, "whole": whole}


def save(path: str, rank: int, world: int, state: dict[Key, Any],
         meta: dict[str, Any], head: int = 0) -> str:
    """Write this rank's part of the checkpoint folder `path` (module docstring); every rank
    of the trainer's group calls it; `meta` (rank 0's) goes into rank 0's file. `head`: the
    rank that writes this rank's plain tensors (`_pieces`)."""
    final = Path(path)
    tmp = final.with_name(f".{final.name}.tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    mine = _pieces(state, rank, head)
    if rank == 0:
        mine["meta"] = {**meta, "world": world}
    save_checkpoint(str(tmp / f"rank-{rank:05d}.pt"), mine)
    dist.barrier()
    if rank == 0:
        old = final.with_name(f".{final.name}.old")
        if final.exists():  # the same step saved again (after a rollback)
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    return str(final)


def _cuts_of(piece: dict[str, Any]) -> list[tuple[int, int, int]]:
    """A piece's cuts, (tensor dim, index, of) in the order made (a file written before
    pieces had several: one cut, as `dim`, `at`, `of`)."""
    if "cuts" in piece:
        return [(int(c[0]), int(c[1]), int(c[2])) for c in piece["cuts"]]
    return [(piece["dim"], piece["at"], piece["of"])]


def _joined(key: Key, ps: list[dict[str, Any]], depth: int, path: str) -> torch.Tensor:
    """The tensor that the pieces `ps` (sharing their first `depth` cuts) were cut from."""
    if depth == len(_cuts_of(ps[0])):
        if len(ps) != 1:
            raise RuntimeError(f"checkpoint {path}: {key} has {len(ps)} copies of one piece")
        local: torch.Tensor = ps[0]["local"]
        return local
    dim, _, of = _cuts_of(ps[0])[depth]
    by: dict[int, list[dict[str, Any]]] = {}
    for p in ps:
        by.setdefault(_cuts_of(p)[depth][1], []).append(p)
    if sorted(by) != list(range(of)):
        raise RuntimeError(f"checkpoint {path}: {key} has pieces {sorted(by)} of {of}")
    return torch.cat([_joined(key, by[a], depth + 1, path) for a in range(of)], dim)


def read(path: str) -> dict[str, Any]:
    """The checkpoint folder `path` in the one-process format: {"model", "optim", "version",
    "step", "optimizer_steps"}."""
    d = Path(path)
    meta = torch.load(d / "rank-00000.pt", weights_only=False)["meta"]
    parts = [torch.load(d / f"rank-{r:05d}.pt", weights_only=False)
             for r in range(meta["world"])]
    flat: dict[Key, Any] = {}
    cut: dict[Key, list[dict[str, Any]]] = {}
    for p in parts:
        flat.update(p["whole"])
        for k, piece in p["pieces"].items():
            cut.setdefault(k, []).append(piece)
    for k, ps in cut.items():
        flat[k] = _joined(k, ps, 0, path)
    model = {k[1]: v for k, v in flat.items() if k[0] == "model"}
    state: dict[int, dict[str, Any]] = {}
    for k, v in flat.items():
        if k[0] == "optim":
            state.setdefault(k[1], {})[k[2]] = v
    return {"model": model,
            "optim": {"state": {i: dict(sorted(state[i].items())) for i in sorted(state)},
                      "param_groups": meta["param_groups"]},
            "version": meta["version"], "step": meta["step"],
            "optimizer_steps": meta["optimizer_steps"]}


def load(path: str) -> dict[str, Any]:
    """A trainer checkpoint in the one-process format: a folder of rank files (`read`) or one
    file (`torch.save`'d by a one-process or pipelined trainer)."""
    if Path(path).is_dir():
        return read(path)
    ck: dict[str, Any] = torch.load(path, weights_only=False)
    return ck


def load_full(model: torch.nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Copy full weights into a sharded model's local shards."""
    from torch.distributed.tensor import DTensor, distribute_tensor  # lazy: distributed only
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if isinstance(v, DTensor):
                v.to_local().copy_(distribute_tensor(full[k].to(v.device), v.device_mesh,
                                                     v.placements).to_local())
            else:
                v.copy_(full[k].to(v.device))


def full_optim(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state with every DTensor gathered whole, on the CPU (a collective: the
    moments in runs of `GATHER_BATCH_BYTES`, one all-gather per run, `sharding.gathered`)."""
    from torch.distributed.tensor import DTensor  # lazy: distributed only
    sd = opt.state_dict()
    state = sd["state"]
    sharded: dict[Any, torch.Tensor] = {(i, k): v for i in sorted(state)
                                        for k, v in sorted(state[i].items())
                                        if isinstance(v, DTensor)}
    whole = dict(gathered(sharded))
    return {"state": {i: {k: whole.get((i, k), v) for k, v in sorted(state[i].items())}
                      for i in sorted(state)},
            "param_groups": sd["param_groups"]}


def load_sharded_optim(opt: torch.optim.Optimizer, full: dict[str, Any]) -> None:
    """Restore `full_optim` (or a one-process optimizer's) state into this rank's shards."""
    from torch.distributed.tensor import DTensor, distribute_tensor  # lazy: distributed only
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, st in sorted(full["state"].items()):
        p = params[int(i)]
        opt.state[p] = {k: (distribute_tensor(v.to(p.device), p.device_mesh, p.placements)
                            if isinstance(p, DTensor) and torch.is_tensor(v) and v.dim() > 0
                            else v) for k, v in sorted(st.items())}
    for g, sg in zip(opt.param_groups, full["param_groups"]):
        g.update({k: v for k, v in sg.items() if k != "params"})
