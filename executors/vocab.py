"""Vocabulary parallelism under TP: the token embedding and the LM head split by vocabulary
rows over the `tp` ranks, and each token's log-prob computed from the vocabulary shards
without gathering the logits.

  embedding  `RowwiseParallel` on the embedding (its weight `Shard(0)`: rows [r * V / tp,
             (r + 1) * V / tp) on TP rank r); a rank looks up the ids in its rows, zeros the
             others, and one all-reduce sums the partial embeddings (Megatron's
             `VocabParallelEmbedding`);
  LM head    `ColwiseParallel` with the logits left sharded on the vocabulary dim (a DTensor
             `Shard(-1)`), so no rank holds [batch, seq, V] (Megatron's
             `ColumnParallelLinear` with `gather_output=False`);
  log-prob   `VocabLogprob`: the max and the sum of exponentials all-reduced over the tp
             group, the target's logit from the rank that holds it, and in the backward
             softmax minus one-hot on each rank's shard, as Megatron's
             `vocab_parallel_cross_entropy` (NVIDIA/Megatron-LM,
             megatron/core/tensor_parallel/cross_entropy.py) computes the loss; the entropy of
             each position likewise (a statistic: no gradient).

A tied embedding and head are one `Shard(0)` weight in both roles (`shard_vocab` re-ties them).
`tp` must divide the vocabulary (`executors.sharding.check_layout`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def vocab_modules(model: nn.Module) -> tuple[list[tuple[nn.Module, str]], nn.Embedding | None]:
    """(parent, attribute) of each token embedding and LM head (an `nn.Linear` whose outputs
    are the embedding's rows) of a causal LM or a pipeline stage; and the embedding."""
    embeds: list[tuple[nn.Module, str, nn.Embedding]] = [
        (p, n, m) for p in model.modules() for n, m in p.named_children()
        if isinstance(m, nn.Embedding)]
    vocab = embeds[0][2].num_embeddings if embeds else getattr(
        getattr(model, "config", None), "vocab_size", 0)
    heads = [(p, n, m) for p in model.modules() for n, m in p.named_children()
             if isinstance(m, nn.Linear) and n in ("lm_head", "head") and m.out_features == vocab]
    return [(p, n) for p, n, _ in embeds + heads], embeds[0][2] if embeds else None


def shard_vocab(model: nn.Module, tp_mesh: Any) -> int:
    """Split the embedding and LM head by vocabulary over `tp_mesh`, in place; how many
    modules were split."""
    from torch.distributed.tensor import Replicate, Shard  # lazy: distributed only
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    found, embed = vocab_modules(model)
    tied = embed is not None and any(
        isinstance(m, nn.Linear) and m.weight is embed.weight
        for p, n in found for m in [getattr(p, n)])
    for parent, name in found:
        m = getattr(parent, name)
        style = (RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
                 if isinstance(m, nn.Embedding)
                 else ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))
        parallelize_module(m, tp_mesh, style)
    if tied and embed is not None:  # one weight: the embedding's shards serve the head too
        for parent, name in found:
            m = getattr(parent, name)
            if isinstance(m, nn.Linear):
                m.weight = embed.weight
    return len(found)


class VocabLogprob(torch.autograd.Function):
    """log softmax(z)[target] from vocabulary shards of z (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, target: torch.Tensor, start: int,
                group: Any) -> torch.Tensor:
        local = z.shape[-1]
        m = z.detach().amax(-1)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        e = torch.exp(z.detach() - m[..., None])
        s = e.sum(-1)
        dist.all_reduce(s, group=group)
        mine = (target >= start) & (target < start + local)
        idx = (target - start).clamp(0, local - 1)[..., None]
        zt = z.detach().gather(-1, idx).squeeze(-1) * mine
        dist.all_reduce(zt, group=group)
        ctx.save_for_backward(e / s[..., None], idx, mine)
        return zt - m - torch.log(s)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        p, idx, mine = ctx.saved_tensors
        gz = -p * grad[..., None]
        gz.scatter_add_(-1, idx, (grad * mine)[..., None].to(gz.dtype))
        return gz, None, None, None


def _shard_of(logits: Any) -> tuple[torch.Tensor, int, Any]:
    """(local shard, its first vocabulary row, the tp group) of DTensor logits `Shard(-1)`."""
    mesh = logits.device_mesh
    z = logits.to_local()
    return z, mesh.get_local_rank() * z.shape[-1], mesh.get_group()


def is_vocab_sharded(logits: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor  # lazy: distributed only
    return isinstance(logits, DTensor) and any(
        pl.is_shard(logits.dim() - 1) or pl.is_shard(-1) for pl in logits.placements)


def parallel_logprobs(logits: Any, tgt: torch.Tensor, temperature: float, entropy: bool,
                      shard: tuple[torch.Tensor, int, Any] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-prob of each target, entropy of each position or None) of softmax(logits / T)
    from vocabulary-sharded logits (a DTensor, or `shard`: local shard, first row, group)."""
    z, start, group = shard if shard is not None else _shard_of(logits)
    z = z.float() / temperature
    tgt = tgt.to(z.device)
    lp = VocabLogprob.apply(z, tgt, start, group)
    if not entropy:
        return lp, None
    with torch.no_grad():  # H = logsumexp(z) - E_p[z]
        m = z.amax(-1)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        e = torch.exp(z - m[..., None])
        sums = torch.stack([e.sum(-1), (e * z).sum(-1)])
        dist.all_reduce(sums, group=group)
        ent = m + torch.log(sums[0]) - sums[1] / sums[0]
    return lp, ent
