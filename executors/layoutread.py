"""The trainer's layout read off the model it built, not the plan's: the device mesh, the
DTensor placements of representative parameters, the experts each rank holds and the decoder
layers of its pipeline stage (`metadata.executed_layout.actor`).

  dp, shard  the FSDP2 mesh dims a decoder weight is laid out over ("dp", or HSDP's "rep" x
             "shard"); 1 for a plain module;
  cp         the size of the mesh the model's attention gathers keys and values over
             (`executors.cpattn`: the CP attention installed, and its "cp" mesh); the dp
             and shard above are then FSDP's "dp_cp" (HSDP's "shard_cp") dim over it;
  tp         the "tp" dim's size when the first attention projection is a shard over it (a
             layer TP left whole reads tp 1);
  pp         the size of the mesh's "pp" dim that the pipeline's stages were cut over, with
             `layers`, the decoder layers this rank's stage holds;
  ep         the layer's experts over the experts this rank holds (`executors.experts`), with
             `expert_ranks`, the global ranks of this rank's expert-parallel group, read off
             the experts' mesh: under TP one TP index across the dp ranks (groups orthogonal
             to TP), or ep consecutive (dp, cp, tp) ranks when EP is folded over TP (ep
             above dp x cp, expert TP 1), under PP within this rank's stage; with ep < dp
             (or, folded over TP, ep < dp x cp x tp) `expert_replicas`, the ranks holding
             this rank's expert shard (one per ep group), whose gradients are summed;
  placements per representative parameter (first attention projection, embedding, LM head,
             experts), its mesh dims and placements as DTensor prints them.

`mismatch` compares it with the plan's layout: the trainer refuses to train a model whose
build differs from what the plan priced.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from executors.cpattn import cp_mesh_of
from executors.experts import expert_modules, experts_per_rank
from executors.runplan import Layout
from executors.sharding import decoder_layers, recomputes

# representative parameters: (name in the report, what the parameter's name ends with)
REPRESENTATIVE = (("attention", "q_proj.weight"), ("embedding", "embed_tokens.weight"),
                  ("embedding", "embed.weight"), ("lm_head", "lm_head.weight"),
                  ("lm_head", "head.weight"), ("experts", "experts.gate_up_proj"))
FSDP_DIMS = ("dp", "rep", "shard", "dp_cp", "shard_cp")


def _placements(model: nn.Module) -> dict[str, tuple[Any, ...]]:
    """name -> (mesh dim names, mesh shape, placements) of each representative parameter."""
    from torch.distributed.tensor import DTensor  # lazy: distributed only
    out: dict[str, tuple[Any, ...]] = {}
    for name, p in model.named_parameters():
        for key, suffix in REPRESENTATIVE:
            if key not in out and name.endswith(suffix):
                out[key] = ((tuple(p.device_mesh.mesh_dim_names or ()), tuple(p.device_mesh.shape),
                             tuple(p.placements)) if isinstance(p, DTensor) else ((), (), ()))
    return out


def _size(dims: tuple[str, ...], shape: tuple[int, ...], name: str) -> int:
    return shape[dims.index(name)] if name in dims else 1


def read_layout(model: nn.Module, pp_mesh: Any = None) -> dict[str, Any]:
    """The layout the built `model` (a whole model, or this rank's pipeline stage) runs;
    `pp_mesh`: the mesh dim its pipeline stages were cut over (None: no pipeline)."""
    from torch.distributed.tensor import DTensor  # lazy: distributed only
    reps = _placements(model)
    dims, shape, placements = reps.get("attention", ((), (), ()))
    out: dict[str, Any] = {"dp": 1, "tp": 1, "pp": pp_mesh.size() if pp_mesh is not None else 1}
    for d, n in zip(dims, shape):
        if d in FSDP_DIMS:
            out["dp"] *= n
    cp_mesh = cp_mesh_of(model)
    cp = cp_mesh.size() if cp_mesh is not None else 1
    if cp_mesh is not None:
        out["cp"] = cp
        out["dp"] //= cp if {"dp_cp", "shard_cp"} & set(dims) else 1
    if "rep" in dims:
        out["shard"] = _size(dims, shape, "shard") if "shard" in dims else \
            _size(dims, shape, "shard_cp") // cp
    if "tp" in dims and placements[dims.index("tp")].is_shard():
        out["tp"] = _size(dims, shape, "tp")
    held = experts_per_rank(model)
    if held:
        out["ep"] = int(expert_modules(model)[0][2].num_experts) // held
        out["experts_per_rank"] = held
        w = expert_modules(model)[0][2].gate_up_proj
        if isinstance(w, DTensor):
            out["expert_ranks"] = [int(r) for r in w.device_mesh.mesh.flatten().tolist()]
        replicas = getattr(expert_modules(model)[0][2], "replica_ranks", [])
        if replicas:  # ep < dp: the ranks holding the same expert shard, one per ep group
            out["expert_replicas"] = list(replicas)
    out["recompute"] = recomputes(model)
    out["mesh"] = {"dims": list(dims), "shape": list(shape)}
    out["placements"] = {k: {"mesh": list(v[0]), "placements": [str(p) for p in v[2]]}
                         for k, v in reps.items()}
    if pp_mesh is not None:
        out["layers"] = [int(k) for k in getattr(model, "layers", {}).keys()]
    else:
        out["layers"] = list(range(len(decoder_layers(model))))
    return out


def mismatch(read: dict[str, Any], plan: Layout) -> str | None:
    """Where the read layout differs from the plan's (None: it runs the plan)."""
    want = {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp,
            "shard": plan.shard if plan.hsdp else None, "ep": plan.ep, "cp": plan.cp}
    got = {**want, **{k: read.get(k) for k in ("dp", "tp", "pp", "shard")},
           "ep": read.get("ep", 1), "cp": read.get("cp", 1)}
    bad = [f"{k} {got[k]} (plan: {want[k]})" for k in want if got[k] != want[k]]
    return ", ".join(bad) if bad else None
