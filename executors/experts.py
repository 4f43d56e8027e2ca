"""Expert parallelism: a mixture-of-experts layer's experts split over the `ep` ranks, tokens
sent to the rank holding their expert and back with all-to-all (the plan's `ep`).

Hugging Face keeps a layer's experts as one module with 3-D weights (`gate_up_proj` [experts,
2 * width, hidden], `down_proj` [experts, hidden, width]) called with each token's top-k
experts and routing weights (Qwen3-MoE, Qwen2-MoE, Mixtral, ... in transformers 5).
`shard_experts` swaps every such module for `ParallelExperts`, whose weights are DTensors
sharded on dim 0 over the ep mesh (rank r holds experts [r * E / ep, (r + 1) * E / ep)), under
the same names, so checkpoints, weight sync and the optimizer see the same state dict. Its
forward is the dispatch and combine of Megatron's and torchtitan's token dispatcher:

  dispatch  each (token, expert) pair of this rank's tokens, ordered by expert, goes to the
            expert's rank: one all-to-all of the pair counts, one of the tokens' hidden
            states (`all_to_all_single_autograd`: differentiable, its backward the reverse
            all-to-all), one of the local expert indices;
  compute   the rank's experts on what it received, expert by expert;
  combine   the outputs back by the reverse all-to-all, weighted by the routing weights and
            summed per token (index_add), as the one-process layer sums them.

EP runs over the trainer's data-parallel ranks (`ep == dp`, as torchtitan borrows the expert
dims from data parallelism): each rank routes its own samples, and each expert's gradient is
its whole batch's, so FSDP2 leaves the experts alone (`ignored_params`). With ep dividing dp
(ep < dp) the "dp" dim splits into ("edp", "ep"), dp index d = r * ep + e
(`executors.sharding._expert_meshes`): an ep group of ep consecutive dp ranks holds every
expert, sharded over it, and dispatches only its own ranks' tokens; each shard is replicated
in the dp / ep groups (a rank's expert-data-parallel group, `expert_replicas`), as
Megatron-Core's and torchtitan's EP groups subdivide the data-parallel ranks. A shard's
gradient then covers its group's tokens only: `sync_expert_grads` sums it over the replicas
(FSDP2 still ignores the experts, so this is their one reduction, a sum as FSDP2's are). Under TP the expert
groups are orthogonal to TP: an ep group holds one TP index across the dp ranks (the mesh's
"dp" dim; ranks {t, tp + t} at dp 2), as Megatron-Core's default builds them (NVIDIA/Megatron-LM
megatron/core/parallel_state.py @ d98e8a6: `expert_tensor_parallel_size` defaults to the TP
size and the expert RankGenerator's order is tp-ep-dp-pp); the TP ranks of one DP group hold
the same experts whole and compute the same routing. Each TP rank dispatches only its slice of
the tokens (rows [t * c, (t + 1) * c), c = ceil(tokens / tp): `_TPSlice`), and the combined
outputs are all-gathered back over TP (`_TPGather`), so a rank's all-to-all carries tokens / tp,
as the cost model prices it (`placer.cost.layercomm`'s tokens / (tp x cp) per rank) and as
Megatron-Core runs it: EP with TP requires sequence parallelism there (`TransformerConfig`,
megatron/core/transformer/transformer_config.py: "When using expert parallelism and tensor
parallelism, sequence parallelism must be used"), so each TP rank's token dispatcher permutes
and all-to-alls its own sequence shard (megatron/core/transformer/moe/token_dispatcher.py,
`MoEAlltoAllTokenDispatcher`). The slice's backward all-gathers the slices' input gradients (the
layer's input is replicated over TP, its gradient must be whole on every TP rank), the
gather's backward keeps the rank's own rows (the output's gradient is the same on every TP
rank), and `sync_expert_grads` sums the experts' gradients over TP before the optimizer step
(each TP rank's copy of an expert saw its slice of the tokens). Under PP each stage's experts
split over its own dp ranks.

Under context parallelism (`executors.cpattn`) every CP rank holds a slice of each sequence and
routes its own slice's tokens: with `ep == dp` its ep group is the dp ranks of its CP (and TP)
index, so the all-to-all carries the tokens of one CP shard, and the CP ranks of a DP group hold
the same experts, whose gradients `sync_expert_grads` sums over CP as over TP (the CP ranks are
in Megatron-Core's expert-data-parallel group when EP does not span them); with `ep == dp * cp`
EP is folded over CP (Megatron-Core's expert groups may span the CP ranks: its expert
RankGenerator has no cp dim, megatron/core/parallel_state.py @ d98e8a6), the experts split over
the flattened ("dp", "cp") dim FSDP2 shards over, every rank its own, nothing summed over CP.
With ep above dp x cp (dividing dp x cp x tp) EP is folded over TP with expert TP 1, as the
planner plans it (`placer.solve.layouts`: ep up to tp x cp x dp, ETP 1): the ep group is ep
consecutive ranks of the flattened ("dp", "cp", "tp") dims, rank (d * cp + c) * tp + t
(`executors.sharding._folded_meshes`; Megatron-Core's expert RankGenerator with
`expert_tensor_parallel_size` 1, order tp-ep-dp-pp, megatron/core/parallel_state.py @ d98e8a6),
so the TP ranks of one DP group hold different experts, whole. Each TP rank still routes its
own slice of its DP group's tokens (`_TPSlice`) over that group and gathers the combined rows
back over TP (`_TPGather`), as Megatron-Core's `MoEAlltoAllTokenDispatcher` does with expert TP
1: each rank all-to-alls its sequence-parallel shard over the ep group, and its
`dispatch_postprocess` all-gathers over the expert-TP group only when that is above 1
(megatron/core/transformer/moe/token_dispatcher.py @ d98e8a6, `self.tp_group =
pg_collection.expt_tp`). Every expert then sees all its tokens on its own rank of the group,
so its gradient is summed over TP or CP never; with ep < dp x cp x tp each shard is replicated
in the other groups (ranks of the same ep index, Megatron-Core's expert-data-parallel group)
and summed over those only (`ParallelExperts.grad_groups`).
The cost model prices these (`placer.cost.sharding.expert_tokens`: each rank routes
tokens / (tp x cp); `expert_dp`: the ranks holding one expert shard, tp * cp * dp / ep).
`executed_layout` reports the group (`expert_ranks`,
`executors.layoutread`). The gradient clip sums the experts' squared norms over the ep group
like any shard (`executors.sharding.clip_grad_norm`).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def expert_modules(model: nn.Module) -> list[tuple[nn.Module, str, Any]]:
    """(parent, attribute, module) of every experts module: 3-D `gate_up_proj` and
    `down_proj` weights and a `num_experts`."""
    out = []
    for parent in model.modules():
        for name, m in parent.named_children():
            w = getattr(m, "gate_up_proj", None)
            if (isinstance(w, nn.Parameter) and w.dim() == 3 and hasattr(m, "num_experts")
                    and isinstance(getattr(m, "down_proj", None), nn.Parameter)):
                out.append((parent, name, m))
    return out


def experts_of(model: nn.Module) -> int:
    """The experts of a layer of the model (0: not a mixture of experts)."""
    found = expert_modules(model)
    return int(found[0][2].num_experts) if found else 0


def _gather_rows(x: torch.Tensor, rows: int, total: int, group: Any) -> torch.Tensor:
    """Every TP rank's `x` (at most `rows` rows each, rank order) stacked, trimmed to `total`
    rows: each padded to `rows` for the equal-sized all-gather."""
    import torch.distributed as dist  # lazy: distributed only
    pad = x.new_zeros((rows - x.shape[0], *x.shape[1:]))
    parts = [x.new_empty((rows, *x.shape[1:])) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, torch.cat([x, pad]).contiguous(), group=group)
    return torch.cat(parts)[:total]


class _TPSlice(torch.autograd.Function):
    """Forward: this TP rank's rows [lo, hi) of a tensor replicated over TP. Backward: the
    slices' gradients all-gathered, so the input's gradient is whole on every TP rank."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, lo: int, hi: int, rows: int,
                group: Any) -> torch.Tensor:
        ctx.shape, ctx.rows, ctx.group = x.shape[0], rows, group
        return x[lo:hi]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (_gather_rows(grad.contiguous(), ctx.rows, ctx.shape, ctx.group),
                None, None, None, None)


class _TPGather(torch.autograd.Function):
    """Forward: every TP rank's rows all-gathered into the whole tensor. Backward: this rank's
    rows [lo, hi) of the gradient (the same on every TP rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, lo: int, hi: int, rows: int, total: int,
                group: Any) -> torch.Tensor:
        ctx.lo, ctx.hi = lo, hi
        return _gather_rows(x.contiguous(), rows, total, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad[ctx.lo:ctx.hi], None, None, None, None, None


class ParallelExperts(nn.Module):
    """One layer's experts, this rank's share of them held (see the module docstring)."""

    gate_up_proj: Any  # DTensor parameters, Shard(0) over the ep mesh
    down_proj: Any

    def __init__(self, experts: Any, mesh: Any, tp_mesh: Any = None, cp_mesh: Any = None,
                 replica_mesh: Any = None, folded_tp: bool = False) -> None:
        super().__init__()
        # ep < dp: the ep groups' replicas of this rank's shard (its expert-data-parallel group)
        self.replica_group = (None if replica_mesh is None or replica_mesh.size() == 1
                              else replica_mesh.get_group())
        self.replica_ranks: list[int] = ([] if self.replica_group is None
                                         else [int(r) for r in replica_mesh.mesh.flatten()])
        self.tp = 1 if tp_mesh is None else tp_mesh.size()
        self.tp_group = None if self.tp == 1 else tp_mesh.get_group()
        self.tp_rank = 0 if self.tp == 1 else tp_mesh.get_local_rank()
        # the CP ranks of a DP group hold the same experts, each computing its slice's tokens
        self.cp_group = None if cp_mesh is None or cp_mesh.size() == 1 else cp_mesh.get_group()
        # the groups a shard's gradient is summed over (`sync_expert_grads`), each covering
        # ranks that hold the same shard and computed it on other tokens: TP when EP is not
        # folded over it (folded, the TP ranks hold different experts), CP likewise, replicas
        self.grad_groups: list[Any] = [g for g in (None if folded_tp else self.tp_group,
                                                   self.cp_group, self.replica_group)
                                       if g is not None]
        from torch.distributed.tensor import Shard, distribute_tensor  # lazy: distributed only
        self.num_experts = int(experts.num_experts)
        self.ep = mesh.size()
        if self.num_experts % self.ep:
            raise ValueError(f"ep {self.ep} does not divide the layer's {self.num_experts} experts")
        self.local = self.num_experts // self.ep
        self.group = mesh.get_group()
        self.act_fn: Any = experts.act_fn
        for name in ("gate_up_proj", "down_proj"):
            w = getattr(experts, name).detach()
            self.register_parameter(name, nn.Parameter(distribute_tensor(w, mesh, [Shard(0)])))

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return self._dispatch_combine(hidden, top_k_index, top_k_weights)
        total = hidden.shape[0]
        rows = math.ceil(total / self.tp)
        lo = min(self.tp_rank * rows, total)
        hi = min(lo + rows, total)
        out = self._dispatch_combine(
            _TPSlice.apply(hidden, lo, hi, rows, self.tp_group), top_k_index[lo:hi],
            _TPSlice.apply(top_k_weights, lo, hi, rows, self.tp_group))
        return _TPGather.apply(out, lo, hi, rows, total, self.tp_group)

    def _dispatch_combine(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                          top_k_weights: torch.Tensor) -> torch.Tensor:
        """Dispatch `hidden`'s rows to their experts' ranks, compute, combine back."""
        import torch.distributed as dist  # lazy: distributed only
        from torch.distributed._functional_collectives import (  # lazy: differentiable a2a
            all_to_all_single_autograd,
        )
        k = top_k_index.shape[1]
        expert = top_k_index.reshape(-1)
        order = torch.argsort(expert, stable=True)  # pairs by expert, so by destination rank
        token = order // k
        dest = expert[order] // self.local
        send = torch.bincount(dest, minlength=self.ep)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_n, recv_n = send.tolist(), recv.tolist()
        local_ids = torch.empty(sum(recv_n), dtype=expert.dtype, device=expert.device)
        dist.all_to_all_single(local_ids, expert[order] % self.local, recv_n, send_n,
                               group=self.group)
        x = hidden[token]
        got = all_to_all_single_autograd(x, recv_n, send_n, self.group)
        y = self._compute(got, local_ids)
        back = all_to_all_single_autograd(y, send_n, recv_n, self.group)
        w = top_k_weights.reshape(-1)[order, None]
        out = torch.zeros_like(hidden)
        return out.index_add_(0, token, (back * w).to(out.dtype))

    def _compute(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """This rank's experts on the rows sent to them (row i to local expert ids[i])."""
        gate_up, down = self.gate_up_proj.to_local(), self.down_proj.to_local()
        parts, rows = [], []
        for j in range(self.local):
            idx = torch.nonzero(ids == j).squeeze(1)
            gate, up = F.linear(x[idx], gate_up[j]).chunk(2, dim=-1)
            parts.append(F.linear(self.act_fn(gate) * up, down[j]))
            rows.append(idx)
        y = torch.cat(parts)
        out = torch.empty_like(y)
        out[torch.cat(rows)] = y  # back to arrival order
        return out


def shard_experts(model: nn.Module, mesh: Any, tp_mesh: Any = None,
                  cp_mesh: Any = None, replica_mesh: Any = None,
                  folded_tp: bool = False) -> list[nn.Parameter]:
    """Replace every experts module by `ParallelExperts` over the 1-D `mesh`, in place, each TP
    rank of `tp_mesh` (None: TP 1) dispatching its slice of the tokens, each CP rank of
    `cp_mesh` (None: CP 1, or CP folded into `mesh`) its slice of the sequences, the shards
    replicated over `replica_mesh` (None: ep covers the dp ranks); `folded_tp`: `mesh` spans
    the TP ranks (expert TP 1), so the experts' gradients are not summed over TP. The
    experts' parameters (for FSDP2 to leave alone)."""
    params: list[nn.Parameter] = []
    for parent, name, m in expert_modules(model):
        par = ParallelExperts(m, mesh, tp_mesh, cp_mesh, replica_mesh, folded_tp)
        parent.register_module(name, par)
        params += [par.gate_up_proj, par.down_proj]
    return params


def sync_expert_grads(model: nn.Module) -> None:
    """Sum the experts' gradients over TP, CP and the ep groups' replicas, in place, before the
    optimizer step: the TP and CP ranks of a DP group hold the same experts and each computed
    them on its own slice of the tokens, and with ep < dp each of the dp / ep ep groups computed
    its shard on its own dp ranks' tokens (as Megatron-Core's `finalize_model_grads` reduces
    expert gradients over their expert-data-parallel group, which holds the TP ranks when the
    experts are not TP-split, the CP ranks when EP is not folded over CP, and the dp / ep
    replicas). A sum, not a mean: every rank's loss already carries 1 / (the mini-batch's
    tokens), as FSDP2's reductions sum (`executors.sharding.shard`). FSDP2 ignores the experts,
    so this is their only reduction. With EP folded over TP (expert TP 1) the TP and CP ranks
    hold different experts: only the replicas are summed over. No-op at TP 1, CP 1 and
    ep == dp (x cp), and at ep == dp x cp x tp."""
    import torch.distributed as dist  # lazy: distributed only
    for m in model.modules():
        if not isinstance(m, ParallelExperts):
            continue
        for group in m.grad_groups:
            for w in (m.gate_up_proj, m.down_proj):
                if w.grad is not None:
                    dist.all_reduce(w.grad.to_local(), group=group)


def experts_per_rank(model: nn.Module) -> int | None:
    """The experts each rank computes with, read off the model's first experts module: its
    share of the ep shards (`ParallelExperts`), else every expert (FSDP2 may store a slice,
    but gathers them all for the forward). None: no mixture of experts."""
    found = expert_modules(model)
    if not found:
        return None
    m = found[0][2]
    if isinstance(m, ParallelExperts):
        return int(m.gate_up_proj.to_local().shape[0])
    return int(m.num_experts)
