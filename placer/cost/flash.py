"""The FlashAttention kernel of an engine step, from its tiling: how long one device takes for
the attention of a prefill (its score FLOPs on the streaming multiprocessors the kernel's thread
blocks fill) and what a decode step's attention kernels add to their KV read (a fixed time).

FlashAttention-2's split-KV kernel, the one paged-KV prefill and decode run
(github.com/Dao-AILab/flash-attention, csrc/flash_attn/src/flash_fwd_launch_template.h
`run_mha_fwd_splitkv_dispatch`, flash_api.cpp `num_splits_heuristic`, flash_fwd_kernel.h
`compute_attn_1rowblock_splitkv`; tag v2.5.6, commit 6c9e60de566800538fedad2ad5e6b7b55ca7f0c5,
the version of the measured kernels, whose heuristic counts SMs; from v2.5.7 it counts
2 x SMs, which splits grids up to twice as large):

- a thread block computes `TILE_M` query rows of one head against key tiles of `key_tile`
  keys (128 at head dim <= 128), `BLOCKS_PER_SM` blocks resident per multiprocessor;
- a causal query block computes its last key tile in full: key_tile / 2 keys per query more
  than its causal span, on average;
- a grid of B blocks runs in ceil(B / slots) waves of slots = `BLOCKS_PER_SM` x SMs, so its
  work takes B / (ceil(B / slots) slots) of the device (`wave_occupancy`);
- a grid of fewer than `SPLIT_BELOW` x SMs blocks splits its keys over more blocks (split-KV):
  the keys before the chunk then fill the device, and a combine kernel adds `attn_split_s`;
- handed the chunk's own keys and values (`flash_attn_with_kvcache(k=..., v=...)`), every query
  block also writes the key tiles it reads of them into the paged cache (`Append_KV`), which
  costs `attn_append_factor` times a cached tile. Engines write their cache in a kernel of its
  own (vLLM's `reshape_and_cache_flash`, SGLang's `set_kv_buffer`), so engine steps do not append.

The score FLOPs run at `mfu_attention` of peak, the kernel adds `attn_kernel_s` whatever its
work; a decode step's KV read is `generation.kv_read_time`. The factors are fitted on Vidur's
A100 kernels (workflows/operators.py); formulas and sources: docs/cost-model.md, "Prefill and
decode" and "Operator-level fidelity".
"""
from __future__ import annotations

import math

from placer.cost.efficiency import Efficiency
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceKind, DeviceType

TILE_M = 64  # query rows per thread block of the split-KV kernel (`kBlockM`)
BLOCKS_PER_SM = 2  # 128-thread blocks resident per SM (flash_api.cpp from v2.5.7: "num_sm * 2")
SPLIT_BELOW = 0.8  # a grid below this share of the SMs splits its keys (`num_splits_heuristic`)


def sm_count(dev: DeviceType) -> int | None:
    """The GPU's streaming multiprocessors (`DeviceType.sm_count`, set per shipped GPU in the
    catalog with its source), or None: not a GPU, or its SMs are not given (any grid fills it)."""
    return dev.sm_count if dev.kind is DeviceKind.gpu else None


def head_dim(m: ModelArch) -> float:
    """Query-key width of one head: head_size, or an MLA head's nope + rope dims."""
    if m.kv_lora_rank is not None:
        return (m.qk_nope_head_dim or 0) + (m.qk_rope_head_dim or 0)
    return m.head_size


def key_tile(m: ModelArch) -> int:
    """Keys per tile of the split-KV kernel (`kBlockN`): 256 to head dim 64, 128 to 128, else 64."""
    d = head_dim(m)
    return 256 if d <= 64 else 128 if d <= 128 else 64


def wave_occupancy(blocks: float, dev: DeviceType) -> float:
    """Share of the device a grid of `blocks` thread blocks keeps busy: blocks / (waves x
    slots); 1 where the device's SMs are not known."""
    sms = sm_count(dev)
    if sms is None or blocks <= 0:
        return 1.0
    slots = BLOCKS_PER_SM * sms
    return blocks / (math.ceil(blocks / slots) * slots)


def splits_keys(blocks: float, dev: DeviceType) -> bool:
    """Whether a grid this small splits its keys over more blocks (split-KV)."""
    sms = sm_count(dev)
    return sms is not None and blocks < SPLIT_BELOW * sms


def prefill_blocks(m: ModelArch, par: Parallel, tokens: float, chunk: float) -> float:
    """Thread blocks of one layer's prefill kernel on one device: the sequences it holds (its
    share of `tokens` over dp replicas, data-parallel attention groups and cp ranks, in
    sequences of `chunk` new tokens, each split over the cp ranks) x its query heads x
    ceil(a sequence's tokens / TILE_M)."""
    heads = math.ceil(m.heads / par.attn_tp)
    per_device = max(tokens / (par.dp * par.attn_dp * par.cp), 1.0)
    seq_tokens = min(max(chunk / par.cp, 1.0), per_device)
    return per_device / seq_tokens * heads * math.ceil(seq_tokens / TILE_M)


def decode_blocks(m: ModelArch, par: Parallel, batch: float) -> float:
    """Thread blocks of one layer's decode kernel on one device: a block per sequence and KV
    head, its query heads packed into the block's rows (FlashAttention's seqlen_q <-> groups
    swap; an MLA latent is one KV head shared by every query head)."""
    heads = math.ceil(m.heads / par.attn_tp)
    kv = 1 if m.kv_lora_rank is not None else math.ceil(m.kv_heads / m.kv_tp_shards(par.attn_tp))
    per_kv = math.ceil(heads / kv / TILE_M) if heads > kv else 1
    return math.ceil(batch / par.attn_dp) * kv * per_kv


def kernel_floor(m: ModelArch, blocks: float, dev: DeviceType, eff: Efficiency,
                 split: bool | None = None) -> float:
    """Fixed GPU time of the attention kernels of one step: `attn_kernel_s` per full-attention
    layer, plus `attn_split_s` where the grid splits its keys (its combine kernel); `split`
    forces the choice (a sequence whose keys fit one tile has nothing to split). None off a
    GPU (a CPU's or an LPU's attention is no FlashAttention kernel)."""
    if dev.kind is not DeviceKind.gpu:
        return 0.0
    split = splits_keys(blocks, dev) if split is None else split
    return (eff.attn_kernel_s + (eff.attn_split_s if split else 0.0)) * m.full_attention_layers


def prefill_kernel_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
                        eff: Efficiency, chunk: float | None = None,
                        append: bool = False) -> float:
    """Seconds of the attention kernels of a prefill of `tokens` new tokens, as causal
    sequences of `seq` tokens in `attention_flops_per_token`'s terms (seq / 2 keys per query),
    on one device of the layout: the score FLOPs of seq / 2 + key_tile / 2 keys per query at
    `mfu_attention` of BF16 peak over the share of the device the grid fills, plus the kernels'
    fixed time (`kernel_floor`).

    `chunk`: new tokens per sequence (None: one sequence of all `tokens`, what an engine's
    prefill line prices), which sets the grid; `append`: the kernel writes the chunk's own keys
    into the cache (the module docstring), its chunk / 2 + key_tile / 2 keys per query at
    `attn_append_factor`. Linear in `seq` at a fixed token count (`generation.prefill_line`)."""
    per_key = 4 * m.full_attention_layers * m.attention_width() * tokens  # FLOPs per key
    tile = key_tile(m)
    chunk_tokens = tokens if chunk is None else chunk
    blocks = prefill_blocks(m, par, tokens, chunk_tokens)
    occ = wave_occupancy(blocks, dev)
    split = splits_keys(blocks, dev)
    own = (chunk_tokens / 2 + tile / 2) if append else 0.0
    cached = seq / 2 + tile / 2 - own
    work = per_key * (cached / (1.0 if split else occ) + eff.attn_append_factor * own / occ)
    peak = dev.bf16_tflops * 1e12
    # a sequence whose keys fit one tile has none to split (known only for a given chunk)
    keys = math.inf if chunk is None else (seq + chunk) / 2
    return (work / (par.devices * peak * eff.mfu_attention)
            + kernel_floor(m, blocks, dev, eff, split and keys > tile))
