"""Context parallelism for the trainer: every sequence split over the `cp` ranks of a CP
group, attention gathering the keys and values of the whole sequence over the group.

  slices     the packed batch ([batch, width], `rl.pack`) is right-padded to a multiple of
             2 * cp columns and cut into 2 * cp chunks; CP rank r holds chunks r and
             2 * cp - 1 - r (Megatron-Core's load balancing for causal attention,
             megatron/core/utils.py `get_batch_on_this_cp_rank`): under a causal mask the late
             chunks attend to more keys, so pairing an early with a late chunk gives every
             rank the same attention work, where contiguous slices would leave the last rank
             with most of it. The split costs nothing here: the gather below sends every
             key whatever the order.
  attention  each layer's keys and values (after RoPE, this rank's heads under TP) are
             all-gathered over the CP group along the sequence (`GatherSeq`), and this rank's
             queries attend to the whole sequence with the causal and padding mask of their
             own columns: the all-gather CP of Llama 3 (Grattafiori et al. 2024, sec. 3.3.2)
             and Transformer Engine's `cp_comm_type="all_gather"`. The backward
             reduce-scatters the keys' and values' gradients (every rank's queries used every
             key), so each pass moves, per layer, the K and V of the group's tokens: what
             `placer.cost.sharding.cp_kv_exchange` prices (`cp_kv_bytes`), once in the
             forward, once in the backward and again in a recomputed forward.
  positions  RoPE reads each column's position in the whole packed sequence (left padding
             counted out, as `rl._positions`), so a slice rotates its keys as one process does.
  log-probs  each rank scores the response tokens its columns predict (`cp_logprobs`): zeros
             elsewhere and a mask of its own positions, so the per-token loss is computed on
             the slice and the CP group's losses, statistics and log-probs add up to the whole
             (`cp_sum`). Gradients are then summed over dp x cp by FSDP2 over the flattened
             ("dp", "cp") mesh (`executors.sharding.shard`), as `placer.cost.layercomm`
             prices the dense gradients' reduction over the dp * cp ranks.

The attention is registered with transformers' `AttentionInterface` and chosen by the model's
`set_attn_implementation`; it takes its slice (`CPSlice`) as a keyword argument of the model's
forward, which transformers hands to every attention call. Without one (a whole-sequence
forward), it is plain SDPA. With pipeline stages (`executors.pipeline`) every stage runs the
same columns: stage s's CP rank c sends its slice's hidden states to stage s + 1's CP rank c
(the pipeline of one (dp, cp, tp) coordinate), and the last stage scores the response tokens
its columns predict as above. With expert parallelism each CP rank routes its own slice's
tokens: over the dp ranks of its CP index (ep == dp, or an ep sub-group of them when ep divides
dp; the experts' gradients then summed over CP), over the dp x cp ranks (ep == dp * cp, EP
folded over CP) or over groups of the dp x cp x tp ranks (ep above dp * cp, EP folded over TP
too; `executors.experts`). An
attention with a sliding window or a soft-cap is refused: this gather does not build its masks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from executors.model import PAD
from executors.samples import Samples

ATTENTION = "placer_cp_all_gather"  # the name registered with transformers
CP_MESH_ATTR = "_placer_cp_mesh"  # the CP mesh a model's attention gathers over


@dataclass(frozen=True)
class CPSlice:
    """This rank's columns of a packed batch: `queries` (its columns, in its order), `keys`
    (every rank's columns in the order the gather concatenates them) and `valid` ([batch,
    padded width]: the attention mask of the whole batch)."""

    group: Any
    queries: torch.Tensor
    keys: torch.Tensor
    valid: torch.Tensor


def columns(width: int, cp: int, rank: int) -> tuple[int, torch.Tensor]:
    """(padded width, the columns of CP rank `rank`): chunks r and 2 * cp - 1 - r of 2 * cp."""
    chunk = -(-width // (2 * cp))
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    last = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)
    return 2 * cp * chunk, torch.cat([first, last])


class GatherSeq(torch.autograd.Function):
    """All-gather along dim 2 ([batch, heads, seq, head_dim]) over a group; the backward
    reduce-scatters the gradient (each rank keeps the sum over ranks of its own columns')."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        n = dist.get_world_size(ctx.group)
        parts = [p.contiguous() for p in grad.chunk(n, dim=2)]
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts, group=ctx.group)
        return out, None


def gather_kv(k: torch.Tensor, v: torch.Tensor, group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole sequence's keys and values, in the CP group's column order."""
    return GatherSeq.apply(k, group), GatherSeq.apply(v, group)


def cp_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0,
                 scaling: float | None = None, cp_slice: CPSlice | None = None,
                 **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [batch, heads, q, d], key and value [batch,
    kv heads, q, d] of this rank's columns; the output [batch, q, heads, d]."""
    if cp_slice is None:  # a whole-sequence forward (no slice handed to the model)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward  # lazy
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    for kw in ("sliding_window", "softcap"):  # masks this gather does not build
        if kwargs.get(kw) is not None:
            raise ValueError(f"context parallelism: attention with {kw} "
                             f"{kwargs[kw]} is not run (full causal attention only)")
    k, v = gather_kv(key, value, cp_slice.group)
    groups = query.shape[1] // k.shape[1]  # grouped-query attention: repeat each KV head
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    q_pos, k_pos = cp_slice.queries.to(query.device), cp_slice.keys.to(query.device)
    allowed = (k_pos[None, :] <= q_pos[:, None])[None] & cp_slice.valid.to(query.device)[:, None, k_pos]
    # a large negative, not -inf: a padding query with no key left gets a uniform row, as the
    # eager attention gives it, not NaN (its output is never read)
    bias = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
    bias.masked_fill_(~allowed, torch.finfo(query.dtype).min)
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=bias[:, None],
                                         dropout_p=dropout if module.training else 0.0,
                                         scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def enable_cp(model: nn.Module, cp_mesh: Any) -> None:
    """Make the model's attention gather over `cp_mesh` (a 1-D mesh) when handed a slice."""
    from transformers import AttentionInterface  # lazy: transformers only where used
    AttentionInterface.register(ATTENTION, cp_attention)
    model.set_attn_implementation(ATTENTION)  # type: ignore[operator]
    setattr(model, CP_MESH_ATTR, cp_mesh)


def cp_mesh_of(model: nn.Module) -> Any:
    """The CP mesh the model's attention gathers over (None: no context parallelism)."""
    # a causal LM's or a stage's config; a value model's backbone's (`executors.critic`)
    config = getattr(model, "config", None) or getattr(getattr(model, "backbone", None), "config", None)
    if getattr(config, "_attn_implementation", None) != ATTENTION:
        return None
    return getattr(model, CP_MESH_ATTR, None)


@dataclass(frozen=True)
class CPRank:
    """A rank's place in its CP group: the group's size, the rank's index in it, the group."""

    size: int
    index: int
    group: Any


def cp_rank_of(model: nn.Module) -> CPRank | None:
    """The rank's place in the CP group the model's attention gathers over (None: no CP)."""
    mesh = cp_mesh_of(model)
    return None if mesh is None else CPRank(mesh.size(), mesh.get_local_rank(), mesh.get_group())


def cp_piece(cp: CPRank, valid: torch.Tensor) -> CPSlice:
    """This rank's slice of a batch whose attention mask `valid` is padded to 2 * cp chunks."""
    width = valid.shape[1]
    keys = torch.cat([columns(width, cp.size, r)[1] for r in range(cp.size)])
    return CPSlice(cp.group, columns(width, cp.size, cp.index)[1], keys, valid.bool())


def cp_inputs(ids: torch.Tensor, mask: torch.Tensor, cp: CPRank
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(this rank's columns of the token ids, the attention mask of the whole batch, both
    padded to 2 * cp chunks; the columns)."""
    padded, cols = columns(ids.shape[1], cp.size, cp.index)
    extra = padded - ids.shape[1]
    return F.pad(ids, (0, extra), value=PAD)[:, cols], F.pad(mask, (0, extra), value=0), cols


def response_columns(cols: torch.Tensor, rw: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the response column each of `cols` predicts, clamped; whether it predicts one) of a
    packed batch `width` columns wide whose last `rw` are the response."""
    resp = cols + 1 - (width - rw)
    return resp.clamp(0, max(rw - 1, 0)), (resp >= 0) & (resp < rw)


def spread(lp: torch.Tensor, ent: torch.Tensor | None, resp: torch.Tensor, mine: torch.Tensor,
           rmask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """This rank's per-column log-probs (and entropy) placed at their response positions
    ([batch, response width], zeros elsewhere) and the mask of those positions."""
    rw, idx = rmask.shape[1], resp[mine]
    out = torch.zeros(lp.shape[0], rw, dtype=lp.dtype).index_copy(1, idx, lp[:, mine])
    ent_out = None if ent is None else torch.zeros_like(out).index_copy(1, idx, ent[:, mine])
    own = torch.zeros(rw, dtype=torch.bool)
    own[idx] = True
    return out, ent_out, own[None].float().expand_as(rmask) * rmask


def cp_logprobs(model: nn.Module, s: Samples, temperature: float, cp: int, rank: int,
                group: Any, entropy: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """This CP rank's share of `rl.response_logprobs_entropy`: ([batch, response width]
    log-probs of the response tokens its columns predict, zeros elsewhere; their entropy or
    None; the mask of those positions). The CP group's shares add up to the whole."""
    from executors.rl import _positions, pack, scaled_logprobs  # lazy: rl imports this module
    ids, mask, rmask = pack(s)
    rw, width = rmask.shape[1], ids.shape[1]
    nxt = torch.cat([ids, torch.full_like(ids[:, :1], PAD)], 1)
    cp_rank = CPRank(cp, rank, group)
    ids, mask, cols = cp_inputs(ids, mask, cp_rank)
    nxt = F.pad(nxt, (0, mask.shape[1] + 1 - nxt.shape[1]), value=PAD)[:, cols + 1]
    dev = next(model.parameters()).device
    logits = model(input_ids=ids.to(dev), position_ids=_positions(mask)[:, cols].to(dev),
                   cp_slice=cp_piece(cp_rank, mask)).logits
    resp, mine = response_columns(cols, rw, width)
    lp, ent = scaled_logprobs(logits, nxt, rmask[:, resp] * mine[None].float(), temperature,
                              entropy)
    return spread(lp, ent, resp, mine, rmask)


def own_only(x: torch.Tensor, own: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """`x` (old, reference or behaviour log-probs) on this rank's positions (`own` > 0), the
    rank's own zeros (`logp`) elsewhere, so that no ratio there overflows before the mask."""
    return torch.where(own > 0, x, logp.detach())


def cp_sum(t: torch.Tensor, group: Any) -> torch.Tensor:
    """`t` summed over the CP group (log-probs, losses, statistics: each rank holds its own
    positions' and zeros elsewhere)."""
    t = t.detach().clone()
    dist.all_reduce(t, group=group)
    return t


def cp_sum_info(info: dict[str, float], group: Any) -> dict[str, float]:
    """A loss's statistics (and value) summed over the CP group: the group's sums."""
    keys = sorted(info)
    total = cp_sum(torch.tensor([info[k] for k in keys], dtype=torch.float64), group)
    return dict(zip(keys, total.tolist()))
