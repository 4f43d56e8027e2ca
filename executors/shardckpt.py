"""A sharded trainer's checkpoint written rank by rank: each rank its own shards, none gathered.

As torch's distributed checkpoint (DCP) writes one file per rank, so that no host holds the
whole model and optimizer while a checkpoint is written, a sharded trainer (no pipeline stages)
writes a folder at the checkpoint's path: `rank-NNNNN.pt` per rank, each holding that rank's
pieces of the weights and Adam moments. A piece is a DTensor's local shard when one mesh dim
cuts it with a plain `Shard(d)` and the others replicate it (FSDP2's placement without TP,
`executors.gather`), written by the replica whose other coordinates are all 0 (each element once),
with its index along the cut and the cut's dim (the replica on the mesh through rank 0: a
DTensor's mesh may not span the trainer's group). A tensor of another placement (TP's, or
FSDP2's strided shard of a TP shard) is made whole by every rank of its group and written by
rank 0: those alone are still gathered onto one host; a plain tensor (a buffer, Adam's step
count) by rank 0 too, which also writes the version, the step, the optimizer's parameter
groups and the world size.

Atomic: the ranks write into `.NAME.tmp` beside the final path (rank 0 empties it first; a
barrier on the trainers' group before and after the writes), and rank 0 renames it to the
final path; the driver records it in `latest.json` only after every rank's call returned, so a
checkpoint interrupted half-way is never the one a run resumes from. `read` rebuilds the
one-process format (full weights, full Adam state by parameter index) from the files, so any
layout restores it, as one process, another dp or a pipeline (`executors.trainer.Trainer.load`:
`load_full` and `load_sharded_optim` cut a layout's shards from it). A pipelined trainer's
checkpoint is still gathered onto rank 0 (`full_optim`) and written as one file.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executors.gather import one_shard
from executors.roles import save_checkpoint
from executors.sharding import gathered

Key = tuple[Any, ...]  # ("model", name) | ("optim", parameter index, state name)


def _pieces(state: dict[Key, Any], rank: int) -> dict[str, dict[Any, Any]]:
    """This rank's part of `state`: its pieces and the whole tensors it writes (a collective:
    the tensors no plain `Shard` cuts are gathered by their group)."""
    from torch.distributed.tensor import DTensor  # lazy: distributed only
    pieces: dict[Key, Any] = {}
    whole: dict[Key, Any] = {}
    for key, t in state.items():
        t = t.detach() if torch.is_tensor(t) else t
        if not isinstance(t, DTensor):
            if rank == 0:
                whole[key] = t.cpu() if torch.is_tensor(t) else t
            continue
        coord: list[int] = list(t.device_mesh.get_coordinate() or [])
        # one replica writes: the mesh through rank 0 (a DTensor's mesh may not span the
        # group: FSDP2's dp mesh of one TP rank), at coordinate 0 on every dim but the cut
        first = 0 in t.device_mesh.mesh.flatten().tolist()
        cut = one_shard(t)
        if cut is None:
            full = t.full_tensor()  # every rank of its group, in key order
            if rank == 0:
                whole[key] = full.cpu()
            continue
        md, dim = cut
        if not first or any(c for i, c in enumerate(coord) if i != md):
            continue  # a replica of a piece another rank writes
        pieces[key] = {"local": t.to_local().cpu(), "dim": dim, "at": coord[md],
                       "of": t.device_mesh.size(md)}
    return {"pieces": pieces, "whole": whole}


def save(path: str, rank: int, world: int, state: dict[Key, Any],
         meta: dict[str, Any]) -> str:
    """Write this rank's part of the checkpoint folder `path` (module docstring); every rank
    of the trainer's group calls it; `meta` (rank 0's) goes into rank 0's file."""
    final = Path(path)
    tmp = final.with_name(f".{final.name}.tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    mine = _pieces(state, rank)
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


def read(path: str) -> dict[str, Any]:
    """The checkpoint folder `path` in the one-process format: {"model", "optim", "version",
    "step", "optimizer_steps"}."""
    d = Path(path)
    meta = torch.load(d / "rank-00000.pt", weights_only=False)["meta"]
    parts = [torch.load(d / f"rank-{r:05d}.pt", weights_only=False)
             for r in range(meta["world"])]
    flat: dict[Key, Any] = {}
    cuts: dict[Key, list[dict[str, Any]]] = {}
    for p in parts:
        flat.update(p["whole"])
        for k, piece in p["pieces"].items():
            cuts.setdefault(k, []).append(piece)
    for k, ps in cuts.items():
        ps.sort(key=lambda x: x["at"])
        if [x["at"] for x in ps] != list(range(ps[0]["of"])):
            raise RuntimeError(f"checkpoint {path}: {k} has pieces {[x['at'] for x in ps]} of "
                               f"{ps[0]['of']}")
        flat[k] = torch.cat([x["local"] for x in ps], ps[0]["dim"])
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
