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
its whole batch's, so FSDP2 leaves the experts alone (`ignored_params`). Under TP the expert
groups are orthogonal to TP: an ep group holds one TP index across the dp ranks (the mesh's
"dp" dim; ranks {t, tp + t} at dp 2), as Megatron-Core's default builds them (NVIDIA/Megatron-LM
megatron/core/parallel_state.py @ d98e8a6: `expert_tensor_parallel_size` defaults to the TP
size and the expert RankGenerator's order is tp-ep-dp-pp); the TP ranks of one DP group hold
the same experts whole and route the same tokens. Under PP each stage's experts split over its
own dp ranks. `executed_layout` reports the group (`expert_ranks`, `executors.layoutread`).
The gradient clip sums the experts' squared norms over the ep group like any shard
(`executors.sharding.clip_grad_norm`).
"""
from __future__ import annotations

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


class ParallelExperts(nn.Module):
    """One layer's experts, this rank's share of them held (see the module docstring)."""

    gate_up_proj: Any  # DTensor parameters, Shard(0) over the ep mesh
    down_proj: Any

    def __init__(self, experts: Any, mesh: Any) -> None:
        super().__init__()
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


def shard_experts(model: nn.Module, mesh: Any) -> list[nn.Parameter]:
    """Replace every experts module by `ParallelExperts` over the 1-D `mesh`, in place; the
    experts' parameters (for FSDP2 to leave alone)."""
    params: list[nn.Parameter] = []
    for parent, name, m in expert_modules(model):
        par = ParallelExperts(m, mesh)
        parent.register_module(name, par)
        params += [par.gate_up_proj, par.down_proj]
    return params


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
