"""The trainer's parallel layout, as the plan gives it: a device mesh, FSDP2 over DP, TP via DTensor.

A trainer role with layout `dp x cp x tp x pp` runs as `dp * cp * tp * pp` processes (one per device) in
one torch.distributed group; its mesh has dims `("dp", "tp")` (`("pp", "dp", "tp")` with PP):

  tp  every decoder layer's attention projections (q, k, v column-parallel, o row-parallel;
      Qwen3's per-head q/k norms replicated with their gradients summed over the heads' ranks)
      and a dense MLP (gate, up column-parallel, down row-parallel) are split over the `tp`
      ranks with `parallelize_module` (Megatron-style: one all-reduce after o and after down;
      heads and MLP columns are divided, so `tp` must divide the query heads, the KV heads,
      the MLP width and the vocabulary). A mixture-of-experts block keeps its experts whole
      on every TP rank (replicated over `tp`, sharded over `dp` by FSDP, or split over the dp
      ranks by expert parallelism, `ep == dp`, or an ep sub-group of them, ep dividing dp,
      replicated over dp / ep groups; each TP rank then dispatching its 1/tp of the
      tokens, each CP rank its slice of the sequences; under CP also `ep == dp * cp`, the
      experts split over FSDP's flattened "dp_cp" dim; with ep above dp * cp, dividing
      dp * cp * tp, EP folded over TP with expert TP 1, each TP rank holding its own experts:
      `executors.experts`); norms are
      replicated; the embedding and
      LM head are split by vocabulary rows, and log-probs computed from the logits' shards
      (`executors.vocab`). TP ranks of one DP group see the same samples.
  dp  `fully_shard` (FSDP2) on each decoder layer and the root over the `dp` dim: parameters,
      gradients and Adam state sharded, gradients reduce-scattered. A plan's HSDP `shard`
      splits the dim into ("rep", "shard") and FSDP2 shards over "shard" and replicates over
      "rep" (its 2-D mesh; verl's `fsdp_size`).
  cp  context parallelism (`executors.cpattn`): each sequence split over the cp ranks of a DP
      group, attention all-gathering keys and values over "cp"; FSDP2 shards over the
      flattened ("dp", "cp") mesh ("dp_cp", torchtitan's `dp_shard_cp`), so gradients are
      reduced over dp x cp; with HSDP over ("rep", "shard_cp"), the shard group's ranks times
      cp (the cost model's ZeRO group of shard x cp ranks). Ranks `((p * dp + d) * cp + c) *
      tp + t` on ("dp", "cp", "tp").
  pp  pipeline stages (`executors.pipeline`): each stage a contiguous run of the decoder
      layers, TP and FSDP2 as above within it; ranks `(p * dp + d) * tp + t` on a
      ("pp", "dp", "tp") mesh. `check_layout` refuses more stages than layers and PP for a
      model whose input and output embeddings are one tied weight.

Activation recomputation (the plan's `recompute`, which the cost model prices as a second
forward pass that saves only each layer's input) wraps every decoder layer in torch's non-reentrant
checkpoint (`recompute_layers`) after TP and before FSDP2, so that `fully_shard` holds the
checkpointed layer (torchtitan's order: TP, checkpointing, FSDP); a pipeline stage's layers too.

`clip_grad_norm` clips over parameters living on different meshes (TP-sharded and replicated),
which `torch.nn.utils.clip_grad_norm_` refuses to mix; `full_state` gathers the full weights
(for weight sync and checkpoints), a collective every rank must call.
"""
from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import torch
from torch import nn

from executors.experts import shard_experts
from executors.gather import batches, nbytes, whole_tensors
from executors.precision import fsdp_policy
from executors.runplan import Layout
from executors.vocab import shard_vocab
from placer.base.errors import SpecError

# bytes made whole per all-gather when a checkpoint or `Trainer.weights` gathers the model: a
# run's tensors at a time, so a rank holds at most this much of them beyond what it keeps
GATHER_BATCH_BYTES = 256 * 2**20


def check_layout(role: str, layout: Layout, heads: int, kv_heads: int, mlp: int,
                 layers: int | None = None, tied: bool = False, experts: int = 0,
                 vocab: int = 0) -> None:
    """SpecError (exit 2) naming the role and layout when this executor cannot run it."""
    where = f"plan.roles.{role}: layout {layout}"
    # over a sub-group of the dp ranks, all of them, folded over dp x cp, or over tp too
    ranks = layout.dp * layout.cp
    eps = sorted({e for e in range(2, layout.dp + 1) if layout.dp % e == 0} | {ranks}
                 | {e for e in range(ranks + 1, ranks * layout.tp + 1)
                    if ranks * layout.tp % e == 0} - {1})
    if layout.ep > 1 and (layout.ep not in eps or layout.hsdp or experts % layout.ep):
        raise SpecError(f"{where}: expert parallelism runs over the dp ranks (ep dividing dp, "
                        f"the experts then replicated over dp / ep groups, or equal to dp x cp "
                        f"under context parallelism), or folded over TP (ep above dp x cp, "
                        f"dividing dp x cp x tp; expert TP 1), without an HSDP shard group, "
                        f"and must divide the model's {experts} experts; plan with ep 1"
                        f"{''.join(' or ep ' + str(e) for e in eps)}")
    if layout.pp > 1 and tied:
        raise SpecError(f"{where}: pipeline parallelism (pp > 1) with tied input and output "
                        f"embeddings is not run by the executor (the first and last stage would "
                        f"share one weight); plan with pp 1")
    if layers is not None and layout.pp > layers:
        raise SpecError(f"{where}: pp {layout.pp} is more pipeline stages than the model's "
                        f"{layers} decoder layers")
    bad = [f"{name} {n}" for name, n in (("query heads", heads), ("KV heads", kv_heads),
                                          ("MLP width", mlp), ("vocabulary", vocab))
           if n % layout.tp]
    if bad:
        raise SpecError(f"{where}: tp {layout.tp} does not divide the model's "
                        f"{', '.join(bad)}; tensor parallelism splits them evenly")


def build_mesh(layout: Layout) -> Any:
    """The ("dp", "tp") device mesh over the current process group; ("pp", "dp", "tp") with PP,
    ("dp", "cp", "tp") with CP (ranks `Layout.rank_of`). HSDP splits "dp" into ("rep",
    "shard"): dp / shard replicas of a shard-rank group (a rank's dp index is rep * shard + its
    index in the group, as without HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh  # lazy: distributed only
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    dims: tuple[tuple[str, int], ...] = (("dp", layout.dp),)
    if layout.hsdp:
        dims = (("rep", layout.dp // layout.shard), ("shard", layout.shard))
    if layout.pp > 1:
        dims = (("pp", layout.pp), *dims)
    if layout.cp > 1:
        dims = (*dims, ("cp", layout.cp))
    dims = (*dims, ("tp", layout.tp))
    return init_device_mesh(kind, tuple(n for _, n in dims),
                            mesh_dim_names=tuple(name for name, _ in dims))


def _backbone(model: nn.Module) -> nn.Module:
    """The module that holds the decoder layers: `model.model` in every HF causal LM, a value
    model's `backbone`, or a pipeline stage itself."""
    for name in ("model", "backbone"):
        inner = getattr(model, name, None)
        if isinstance(inner, nn.Module):
            return inner
    return model


def _layer_container(model: nn.Module) -> nn.Module:
    layers = getattr(_backbone(model), "layers", None)
    if not isinstance(layers, (nn.ModuleList, nn.ModuleDict)):
        raise ValueError(f"{type(model).__name__}: no decoder layers (model.layers) to shard")
    return layers


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a causal LM (`model.model.layers` in every HF decoder; a
    value model's `backbone.layers`; a pipeline stage's `layers`, by layer index)."""
    return list(_layer_container(model).children())


def recompute_layers(model: nn.Module) -> nn.Module:
    """Wrap every decoder layer in non-reentrant activation checkpointing, in place: the
    forward keeps only each layer's inputs, the backward runs the layer's forward again (the
    cost model's `recompute`: 8 matmul passes instead of 6). Call it after TP (whose plan
    names the layer's own submodules) and before `fully_shard`. Returns the model.

    The model's KV cache is switched off: a cache written inside a checkpointed layer would be
    written a second time by the recompute (training reads no cache)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # lazy
        CheckpointImpl,
        CheckpointWrapper,
        checkpoint_wrapper,
    )
    layers = _layer_container(model)
    for key, layer in list(layers.named_children()):
        if not isinstance(layer, CheckpointWrapper):
            layers.register_module(key, checkpoint_wrapper(
                layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    config = getattr(_backbone(model), "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = False
    return model


def recomputes(model: nn.Module) -> bool:
    """Whether every decoder layer of the model recomputes its activations (`recompute_layers`)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # lazy
        CheckpointWrapper,
    )
    layers = decoder_layers(model)
    return bool(layers) and all(isinstance(m, CheckpointWrapper) for m in layers)


def layer_tp_plan(layer: nn.Module) -> dict[str, Any]:
    """The column/row split of one decoder layer's linear projections (see the docstring)."""
    from torch.distributed.tensor import Replicate  # lazy: distributed only
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )
    modules = dict(layer.named_modules())
    names = {n for n, m in modules.items() if isinstance(m, nn.Linear)}
    plan: dict[str, Any] = {}
    # The block's input enters as one replicated DTensor that its column-parallel projections
    # share, so that their input gradients (partial sums on each TP rank) add up locally and are
    # all-reduced once at the block's entry: Megatron's one backward all-reduce per block, which
    # the cost model prices (`placer.cost.layercomm.layer_comm`). Left to each projection, q, k and v
    # (gate and up) would all-reduce their own.
    entry = {"self_attn": PrepareModuleInput(
                 input_kwarg_layouts={"hidden_states": Replicate()},
                 desired_input_kwarg_layouts={"hidden_states": Replicate()},
                 use_local_output=False),
             "mlp": PrepareModuleInput(input_layouts=(Replicate(),),
                                       desired_input_layouts=(Replicate(),),
                                       use_local_output=False)}
    # Qwen3's per-head q/k norms see only this rank's heads ([batch, seq, heads, head_dim]):
    # their weight is one replicated DTensor over the heads dim, so that its gradient, partial
    # on each TP rank, is summed (torchtitan's Qwen3 plan does the same).
    for norm in ("self_attn.q_norm", "self_attn.k_norm"):
        if norm in modules:
            plan[norm] = SequenceParallel(sequence_dim=2, use_local_output=True)
    for col, row in ((("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                      "self_attn.o_proj"),
                     (("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj")):
        if row in names and all(c in names for c in col):
            plan.update({c: ColwiseParallel() for c in col})
            plan[row] = RowwiseParallel()
            block = row.split(".")[0]
            plan[block] = entry[block]
    return plan


def _expert_meshes(mesh: Any, ep: int) -> tuple[Any, Any]:
    """ep < dp: the (ep, replica) 1-D meshes of this rank, the "dp" dim split into ("edp",
    "ep"), dp index d = r * ep + e: an ep group holds ep consecutive dp ranks of one CP, TP
    (and PP) index, and its replicas are the dp / ep groups' ranks of the same e (Megatron-Core's
    expert RankGenerator order tp-ep-dp: ep inside the expert-data-parallel dim). A collective:
    every rank builds the whole mesh (one process group per dim and group)."""
    from torch.distributed.device_mesh import DeviceMesh  # lazy: distributed only
    names = list(mesh.mesh_dim_names)
    at, dp = names.index("dp"), mesh.shape[names.index("dp")]
    shape = [*mesh.shape[:at], dp // ep, ep, *mesh.shape[at + 1:]]
    emesh = DeviceMesh(mesh.device_type, mesh.mesh.reshape(shape),
                       mesh_dim_names=(*names[:at], "edp", "ep", *names[at + 1:]))
    return emesh["ep"], emesh["edp"]


def _folded_meshes(mesh: Any, ep: int) -> tuple[Any, Any]:
    """ep > dp x cp, EP folded over TP with expert TP 1: the (ep, replica) 1-D meshes of this
    rank, the ("dp", ["cp",] "tp") dims flattened (rank (d * cp + c) * tp + t, Megatron-Core's
    tp-cp-dp order) and split into ("edp", "ep"), ep innermost: an ep group is ep consecutive
    ranks of one PP stage, as Megatron-Core's expert RankGenerator builds it with
    `expert_tensor_parallel_size` 1 (order tp-ep-dp-pp, its tp then 1: NVIDIA/Megatron-LM
    megatron/core/parallel_state.py @ d98e8a6), its replicas the (dp * cp * tp) / ep groups'
    ranks of the same ep index (Megatron-Core's expert-data-parallel group). A collective:
    every rank builds the whole mesh."""
    from torch.distributed.device_mesh import DeviceMesh  # lazy: distributed only
    names = list(mesh.mesh_dim_names)
    at = names.index("dp")
    ranks = math.prod(mesh.shape[at:])
    emesh = DeviceMesh(mesh.device_type, mesh.mesh.reshape([*mesh.shape[:at], ranks // ep, ep]),
                       mesh_dim_names=(*names[:at], "edp", "ep"))
    return emesh["ep"], emesh["edp"]


def _shard_experts(model: nn.Module, mesh: Any, dp_mesh: Any, ep: int, tp_mesh: Any
                   ) -> list[nn.Parameter]:
    """The experts split over the ep group (`executors.experts`): the "dp" dim (ep == dp; under
    CP each CP rank dispatches its slice of the sequences to the dp ranks of its CP index, and
    the experts' gradients are summed over CP as over TP), an "ep" sub-group of it replicated
    over dp / ep groups (ep < dp, `_expert_meshes`; gradients summed over the replicas too), or
    under CP with ep == dp x cp the flattened "dp_cp" dim FSDP2 shards over (EP folded over CP,
    as Megatron-Core's expert groups may span the CP ranks: each CP rank holds its own
    experts), or with ep > dp x cp over ep consecutive ranks of the flattened ("dp", "cp",
    "tp") dims (EP folded over TP, expert TP 1, `_folded_meshes`: every TP rank holds its own
    experts, their gradients summed over the replicas only, when ep < dp x cp x tp)."""
    names = mesh.mesh_dim_names or ()
    cp_mesh = mesh["cp"] if "cp" in names else None
    if ep > mesh["dp"].size() * (cp_mesh.size() if cp_mesh is not None else 1):
        ep_mesh, replicas = _folded_meshes(mesh, ep)
        return shard_experts(model, ep_mesh, tp_mesh, None, replicas, folded_tp=True)
    if "cp" in names and ep == dp_mesh.size() and ep != mesh["dp"].size():
        return shard_experts(model, dp_mesh, tp_mesh)
    if ep < mesh["dp"].size():
        ep_mesh, replicas = _expert_meshes(mesh, ep)
        return shard_experts(model, ep_mesh, tp_mesh, cp_mesh, replicas)
    return shard_experts(model, mesh["dp"], tp_mesh, cp_mesh)


def shard(model: nn.Module, mesh: Any, recompute: bool = False,
          precision: str = "fp32", ep: int = 1) -> nn.Module:
    """Apply TP over mesh["tp"], activation checkpointing of every decoder layer when
    `recompute`, then FSDP2 over mesh["dp"], in place; returns the model. With HSDP, FSDP2 over
    the 2-D mesh ("rep", "shard"): parameters sharded over "shard" and replicated over "rep",
    gradients reduce-scattered in the group, then all-reduced across. `precision` bf16:
    FSDP2 gathers BF16 parameters and reduces FP32 gradients (`executors.precision`). `ep`
    (dividing the dp size, dp x cp, or above dp x cp and dividing dp x cp x tp): the experts
    split over the dp ranks, ep-rank groups of them, or groups spanning TP, first
    (`executors.experts`)."""
    from torch.distributed.fsdp import fully_shard  # lazy: distributed only
    from torch.distributed.tensor.parallel import parallelize_module  # lazy
    names = mesh.mesh_dim_names or ()
    hsdp = "rep" in names
    tp_mesh, dp_mesh = mesh["tp"], mesh["rep", "shard"] if hsdp else mesh["dp"]
    if "cp" in names and hsdp:  # HSDP: the shard group's ranks with their CP ranks
        mesh["shard", "cp"]._flatten("shard_cp")
        with warnings.catch_warnings():  # torch 2.13 warns that slicing a flattened dim from
            warnings.simplefilter("ignore", UserWarning)  # the root will go; it still runs
            dp_mesh = mesh["rep", "shard_cp"]  # (torchtitan's ["dp_replicate", "dp_shard_cp"])
    elif "cp" in names:  # the CP ranks of a DP group hold one model: FSDP2 over dp x cp
        dp_mesh = mesh["dp", "cp"]._flatten("dp_cp")
    # DTensor warns on every 2-D norm and gather that it runs two collectives where one could
    # do; at these sizes that is noise in the run's output, once per parameter per step.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    # under TP each TP rank dispatches its slice of the tokens (`executors.experts`)
    ep_tp = tp_mesh if tp_mesh.size() > 1 else None
    experts = _shard_experts(model, mesh, dp_mesh, ep, ep_tp) if ep > 1 else []
    layers = decoder_layers(model)
    if tp_mesh.size() > 1:
        for layer in layers:
            parallelize_module(layer, tp_mesh, layer_tp_plan(layer))
        shard_vocab(model, tp_mesh)
    if recompute:  # checkpoint inside fully_shard: FSDP's hooks stay outside the recompute
        recompute_layers(model)
        layers = decoder_layers(model)
    policy = fsdp_policy(precision)
    mp: dict[str, Any] = {} if policy is None else {"mp_policy": policy}
    if experts:  # each rank holds its own experts whole (EP over the dp dim)
        mp["ignored_params"] = set(experts)
    for layer in layers:
        fully_shard(layer, mesh=dp_mesh, **mp)
    fully_shard(model, mesh=dp_mesh, **mp)
    # Each DP shard's loss already carries 1 / (the mini-batch's tokens): gradients are summed
    # over DP ranks, not averaged (FSDP2 divides by the DP size unless told otherwise), with a
    # plain SUM (gloo has no pre-multiplied sum).
    for m in [*layers, model]:
        m.set_gradient_divide_factor(1.0)  # type: ignore[operator]
        m.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    return model


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor  # lazy
    return t.full_tensor() if isinstance(t, DTensor) else t


def _sharded(placement: Any) -> bool:
    """A shard of any kind: `Shard`, or FSDP2's `_StridedShard` of a TP shard (its own class,
    whose `is_shard()` is False in torch 2.13; a private name, so matched by name)."""
    return bool(placement.is_shard()) or type(placement).__name__ == "_StridedShard"


def clip_grad_norm(params: list[nn.Parameter], max_norm: float, stages: Any = None) -> float:
    """Scale gradients so that their global L2 norm is at most `max_norm`; the norm before.

    Squared norms are summed locally per class of gradients that share a mesh and placements,
    then each class's sum is all-reduced over the mesh dims of more than one rank its gradients
    are sharded on (a replicated dim holds the same values on every rank: not summed): one
    collective per class and sharded dim, as FSDP2's and torch's `clip_grad_norm_` reduce once,
    rather than one per parameter, which over gloo costs a round trip each. A shard of any kind
    counts, FSDP2's strided shard of a TP shard too: every element lives on exactly one rank of
    the sharded dims, so the local sums of squares add up to the whole. A partial sum (a pending
    reduction) is reduced on its own (`full_tensor`); with pipeline stages, the squared norms are
    then summed over the stages' group `stages` (each holds its own layers)."""
    from torch.distributed.tensor import DTensor  # lazy
    grads = [p.grad for p in params if p.grad is not None]
    sq = 0.0
    classes: dict[tuple[Any, tuple[Any, ...]], tuple[Any, list[torch.Tensor]]] = {}
    for g in grads:
        g = g.detach()
        if not isinstance(g, DTensor):
            sq += float(g.float().norm()) ** 2
        elif not all(_sharded(pl) or pl.is_replicate() for pl in g.placements):
            sq += float(g.full_tensor().float().norm()) ** 2
        else:
            # by the mesh's value: FSDP2 and TP hand equal meshes as distinct objects
            key = (g.device_mesh, tuple(g.placements))
            classes.setdefault(key, (g, []))[1].append(g.to_local().float().norm() ** 2)
    if classes or stages is not None:
        import torch.distributed as dist  # lazy: distributed only
        for first, parts in classes.values():  # the same order on every rank (parameter order)
            t = torch.stack(parts).sum().to(torch.float64).reshape(1)
            for dim, pl in enumerate(first.placements):
                if _sharded(pl) and first.device_mesh.size(dim) > 1:
                    dist.all_reduce(t, group=first.device_mesh.get_group(dim))
            sq += float(t)
        if stages is not None:
            t = torch.tensor([sq], dtype=torch.float64,
                             device="cuda" if torch.cuda.is_available() else "cpu")
            dist.all_reduce(t, group=stages)
            sq = float(t)
    total = math.sqrt(sq)
    scale = max_norm / (total + 1e-6)
    if scale < 1.0:
        for g in grads:
            g.mul_(scale)
    return total


def whole_tensor(t: torch.Tensor) -> torch.Tensor:
    """`t` whole on its device (an all-gather of a sharded one: a collective)."""
    return _local(t.detach())


def full_state(model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict, on the CPU; a collective: every rank of the group calls
    it. The tensors are gathered in runs of `GATHER_BATCH_BYTES`, one all-gather per run
    (`executors.gather`); a rank that does not `keep` them drops each run at once and returns
    an empty dict."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return dict(gathered(state, keep))


def gathered(state: dict[Any, torch.Tensor], keep: bool = True
             ) -> list[tuple[Any, torch.Tensor]]:
    """`state`'s tensors whole, on the CPU, each a copy of its own (`full_state`); a
    collective. Not `keep`: this rank's part of the gathers only (an empty list)."""
    names = list(state)
    out: list[tuple[Any, torch.Tensor]] = []
    for lo, hi in batches([nbytes(state[n]) for n in names], GATHER_BATCH_BYTES):
        got = whole_tensors([state[n] for n in names[lo:hi]])
        if keep:
            out.extend((n, g.cpu().clone()) for n, g in zip(names[lo:hi], got))
    return out
