"""The attention span of a trained batch: the sequence length whose causal attention prices the
attention of a batch of sequences of unequal lengths.

A causal sequence of s tokens costs 2 * L * w * s^2 attention-score FLOPs (s / 2 keys a query,
`roofline.attention_flops_per_token`), so sequences of lengths s_i cost 2 * L * w * sum s_i^2:
per token, those of one sequence of sum s_i^2 / sum s_i = E[s^2] / E[s] = E[s] + Var(s) / E[s]
tokens, not of the mean E[s]. That holds where each sequence attends only to itself, with no
padding: verl's FSDP workers unpad the batch and run FlashAttention's varlen kernel over the
packed sequences (`use_remove_padding`: verl/workers/actor/dp_actor.py:109-161, Ulysses SP
splitting the heads, not the sequences' keys; volcengine/verl @503ea75f5), and its Megatron
workers pack them into THD batches with per-sequence cu_seqlens (verl/models/mcore/
model_forward.py `gptmodel_forward`, `pack_seqs=True`, same commit). The dense layers' FLOPs are
linear in the tokens and keep the mean.

The trained samples are those `estimate.trained_context` averages: all of them, or the shortest
kept fraction of an over-provisioned step; their spread is taken on the same quantile grid (one
turn) or the same seeded draws (several turns) as that mean's cut.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from placer.cost.tail_samples import sample_totals, shortest
from placer.spec.distributions import Distribution


def attention_span(mean: float, prompt: Distribution, response: Distribution, turns: int,
                   keep: float, seed: int) -> float:
    """E[s^2] / E[s] of the trained samples' contexts: `mean` (their mean context, prompt, every
    turn's response and tool outputs) + Var / `mean`, the variance that of the prompt plus that
    of the kept samples' total responses (prompt and responses drawn independently; tool
    outputs a fixed count). `keep`: the fraction of generated samples trained (the shortest
    ones, 1 where all are)."""
    if mean <= 0:
        return mean
    var = _variance(prompt, 1, 1.0, seed) + _variance(response, turns, keep, seed)
    return mean + var / mean


@lru_cache(maxsize=64)
def _variance(dist: Distribution, turns: int, keep: float, seed: int) -> float:
    """Variance of the total of `turns` draws of `dist`, over the `keep` fraction of samples with
    the shortest totals (a pure function of its arguments, so cached across a plan's
    candidates)."""
    return float(np.var(shortest(sample_totals(dist, turns, seed), keep)))
