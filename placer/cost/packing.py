"""Sequence-packed micro-batches under pipeline parallelism: the tokens a pass really computes.

NeMo-RL's Megatron trainer packs a pass's sequences into bins of `micro_token_budget` tokens
(sequence_packing: train_mb_tokens / logprob_mb_tokens) and, where the trainer is pipelined,
pads every bin to one length. At NVIDIA-NeMo/RL v0.6.0 @5fb588932bf835506a8a5bac01de4f8c7ab0a065
(the NeMo-RL rows' recipes; unchanged at @7ea279ab, the nemo-rl profile's version):

  pack     each chunk of the batch (a training step's global batch; the whole batch for the
           log-prob passes) is packed by Modified First-Fit Decreasing (Johnson & Garey:
           nemo_rl/data/packing/algorithms.py 476-652, `ModifiedFirstFitDecreasingPacker`,
           the recipes' `sequence_packing.algorithm`, examples/configs/grpo_math_1B.yaml:243),
           with at least one bin per data-parallel rank and a multiple of their count
           (nemo_rl/distributed/batched_data_dict.py 430-436 `min_bin_count` /
           `bin_count_multiple`, algorithms.py 107-158 `_adjust_bin_count`)
  deal     bin i goes to rank i mod dp (batched_data_dict.py 484-486)
  pad      with pp > 1 "all sequences must have the same length": every micro-batch of a
           rank is padded to the rank's longest bin (nemo_rl/models/megatron/data.py 585-589
           `pad_packed_seq_to = max_seq_len_in_batch`, the max over the rank's bins,
           batched_data_dict.py 802-804), in the train pass and the log-prob passes alike
           (megatron_policy_worker.py 305, 481: both through `get_microbatch_iterator`)

So a pipelined rank computes (its bins) x (its longest bin) tokens, not its sequences' tokens:
where most sequences are over half a bin, each takes a bin of its own and is padded to the
longest (a truncated sequence fills one). The step waits for the slowest rank. `pad_factor`
is that rank's padded tokens over its even share of the batch's tokens: x1 without pipeline
parallelism (only the bins' own tail pads, `sequence_length_round`, a few tokens a sequence).

The batch's lengths are the job's distributions at evenly spaced quantiles (no draw: the same
lengths every call), each sequence its prompt's mean plus a response, capped at the budget
(NeMo-RL's max_total_sequence_length caps prompt and response together).
"""
from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import numpy as np

from placer.cost.sharding import Parallel
from placer.cost.tail_samples import tokens as quantile_tokens
from placer.spec.catalog import Resolved
from placer.spec.distributions import Distribution


def mffd_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of sequence lengths as Modified First-Fit Decreasing packs them (module
    docstring): one bin per large item (over half), a medium one (over a third) added to each,
    pairs of small ones (over a sixth) into bins without a medium one, a greedy fill, and
    first-fit decreasing over the smallest open bin for what is left."""
    large = sorted((s for s in lengths if s > capacity / 2), reverse=True)
    medium = sorted((s for s in lengths if capacity / 3 < s <= capacity / 2), reverse=True)
    small = sorted(s for s in lengths if capacity / 6 < s <= capacity / 3)
    tiny = sorted(s for s in lengths if s <= capacity / 6)
    bins = [[s] for s in large]
    for b in bins:  # one medium item each, largest that fits first
        fit = next((i for i, s in enumerate(medium) if s <= capacity - sum(b)), None)
        if fit is not None:
            b.append(medium.pop(fit))
    for b in reversed(bins):  # two small items into a bin holding no medium one
        if any(capacity / 3 < s <= capacity / 2 for s in b) or len(small) < 2:
            continue
        room = capacity - sum(b)
        if small[0] + small[1] > room:
            continue
        first = small.pop(0)
        second = next(j for j in range(len(small) - 1, -1, -1) if small[j] <= room - first)
        b += [first, small.pop(second)]
    rest = sorted(medium + small + tiny, reverse=True)
    for b in bins:  # greedy: the largest remaining item that fits, while one does
        while rest and capacity - sum(b) >= rest[-1]:
            b.append(rest.pop(next(i for i, s in enumerate(rest) if s <= capacity - sum(b))))
    return bins + _ffd_smallest_first(rest, capacity)


def _ffd_smallest_first(items: list[int], capacity: int) -> list[list[int]]:
    """MFFD's last phase on the leftovers (descending): into the least-filled bin if it fits,
    else a new one (the packer keeps its bins sorted by fill and checks only the first)."""
    fills: list[tuple[int, int]] = []  # (fill, bin index), sorted
    out: list[list[int]] = []
    for s in items:
        if fills and s <= capacity - fills[0][0]:
            fill, i = fills.pop(0)
        else:
            fill, i = 0, len(out)
            out.append([])
        out[i].append(s)
        insort(fills, (fill + s, i))
    return out


def dealt_bins(bins: list[list[int]], ranks: int) -> list[list[int]]:
    """Each rank's bin lengths: the bins raised to at least `ranks` and a multiple of it (one
    sequence moved into each new bin from the bins holding the most), then bin i to rank
    i mod `ranks` (module docstring)."""
    bins = [list(b) for b in bins]
    want = max(len(bins), ranks)
    want += -want % ranks
    donors = sorted(range(len(bins)), key=lambda i: len(bins[i]), reverse=True)
    for _ in range(want - len(bins)):
        src = next((i for i in donors if len(bins[i]) > 1), None)
        if src is None:  # fewer sequences than ranks: a rank without a bin
            bins.append([])
            continue
        bins.append([bins[src].pop()])
    return [[sum(b) for b in bins[r::ranks] if b] for r in range(ranks)]


def batch_lengths(prompt: float, response: Distribution, turns: int, count: int,
                  capacity: int) -> list[int]:
    """`count` sequence lengths at evenly spaced quantiles of the `response` length (each
    `turns` responses plus the `prompt` mean), capped at `capacity` (module docstring)."""
    u = (np.arange(count) + 0.5) / count
    resp = quantile_tokens(response, u) * turns
    return [int(min(round(prompt) + r, capacity)) for r in resp]


@lru_cache(maxsize=256)
def pad_factor(prompt: float, response: Distribution, turns: int, samples: int, dp: int,
               pp: int, capacity: int, chunks: int = 1) -> float:
    """Tokens the slowest of `dp` pipelined ranks computes over its even share of `samples`
    sequences' tokens (>= 1; 1 where pp is 1 or no budget is set): each of `chunks` chunks of
    the batch (its optimizer steps) packed into bins of `capacity` and dealt on its own, every
    micro-batch of a rank padded to its longest bin. Cached: a pure function of its arguments."""
    if pp <= 1 or capacity <= 0 or dp < 1:
        return 1.0
    lengths = batch_lengths(prompt, response, turns, max(samples // max(chunks, 1), 1), capacity)
    return lengths_pad(lengths, dp, capacity)


def lengths_pad(lengths: Sequence[int], dp: int, capacity: int) -> float:
    """`pad_factor` of one chunk of given sequence lengths (each capped at `capacity`): the
    slowest of `dp` ranks' (bins x longest bin) over its even share of their tokens."""
    lengths = [min(max(int(s), 1), capacity) for s in lengths]
    if not lengths or capacity <= 0 or dp < 1:
        return 1.0
    ranks = dealt_bins(mffd_bins(lengths, capacity), dp)
    slowest = max(len(r) * max(r, default=0) for r in ranks)
    return max(slowest * dp / sum(lengths), 1.0)


def pass_pad(res: Resolved, par: Parallel, kind: Literal["forward", "update"]) -> float:
    """`pad_factor` of a trainer's `kind` pass on `par` (its micro-batch budget set,
    `estimate.budgeted`) where the job's framework pads packed bins (`FrameworkProfile.
    pads_packed_bins`); the update packs each optimizer step's samples apart. 1 elsewhere."""
    job = res.job
    if not job.profile.pads_packed_bins or par.pp <= 1 or par.micro_token_budget <= 0:
        return 1.0
    return pad_factor(job.lengths.prompt.mean_value(), job.lengths.response,
                      job.environment.turns, job.batch.samples, par.dp, par.pp,
                      par.micro_token_budget, job.batch.mini_batches if kind == "update" else 1)


def samples_pad(res: Resolved, par: Parallel, lengths: Sequence[int],
                kind: Literal["forward", "update"]) -> float:
    """`pass_pad` on the samples a step really trains (`lengths`, in order: the simulator's),
    each optimizer step's share packed apart for the update; the slowest chunk's."""
    job = res.job
    if not job.profile.pads_packed_bins or par.pp <= 1 or par.micro_token_budget <= 0:
        return 1.0
    chunks = max(job.batch.mini_batches, 1) if kind == "update" else 1
    size = max(len(lengths) // chunks, 1)
    return max(lengths_pad(lengths[i:i + size], par.dp, par.micro_token_budget)
               for i in range(0, len(lengths), size))
