"""The FlashAttention kernel model (placer/cost/flash.py) against FlashAttention-2's own rules:
its grid, waves and split-KV choice, and the linearity in context the engine's prefill line
relies on. Independent of any measurement."""
from __future__ import annotations

import pytest

from placer.cost.efficiency import Efficiency
from placer.cost.flash import (
    BLOCKS_PER_SM,
    decode_blocks,
    kernel_floor,
    key_tile,
    prefill_blocks,
    prefill_kernel_time,
    splits_keys,
    wave_occupancy,
)
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.catalog import shipped_devices

EFF = Efficiency()
A100 = shipped_devices()["A100-80G"]
LAYER = ModelArch(name="layer", layers=1, hidden=8192, heads=64, kv_heads=8, mlp=8192, vocab=1)


def test_grid_of_a_prefill_and_a_decode() -> None:
    par = Parallel(tp=2)  # 32 query heads, 4 KV heads per device, head dim 128
    assert key_tile(LAYER) == 128
    assert prefill_blocks(LAYER, par, 4096, 4096) == 32 * 64  # one sequence, 64-row blocks
    assert prefill_blocks(LAYER, par, 4096, 512) == 8 * 32 * 8  # eight sequences of 512
    assert decode_blocks(LAYER, par, 16) == 16 * 4  # a block per sequence and KV head


def test_waves_and_split_kv_follow_the_heuristic() -> None:
    slots = BLOCKS_PER_SM * 108
    assert wave_occupancy(slots, A100) == 1.0
    assert wave_occupancy(slots + 1, A100) == pytest.approx((slots + 1) / (2 * slots))
    # flash_api.cpp num_splits_heuristic: one split from 0.8 x the SMs up
    assert splits_keys(86, A100) and not splits_keys(87, A100)
    assert wave_occupancy(100, shipped_devices()["emu-gpu"]) == 1.0  # SMs not known
    assert kernel_floor(LAYER, 64, A100, EFF) == EFF.attn_kernel_s + EFF.attn_split_s
    assert kernel_floor(LAYER, 512, A100, EFF) == EFF.attn_kernel_s


def test_the_sm_count_is_the_device_types_own() -> None:
    # a user's GPU with its SMs given rounds waves on them; the same part without is filled
    mine = A100.model_copy(update={"name": "my-gpu", "sm_count": 10})
    assert wave_occupancy(2 * 10 + 1, mine) == pytest.approx(21 / 40)
    assert wave_occupancy(21, mine.model_copy(update={"sm_count": None})) == 1.0
    gpus = [d for d in shipped_devices().values() if d.kind == "gpu" and not d.memory_is_host]
    assert gpus and all(d.sm_count for d in gpus)  # every shipped (real) GPU carries its count


def test_prefill_is_linear_in_context_and_appending_costs_more() -> None:
    par = Parallel(tp=2)
    t = [prefill_kernel_time(LAYER, A100, par, 1024, s, EFF) for s in (0.0, 1000.0, 2000.0)]
    assert t[2] - t[1] == pytest.approx(t[1] - t[0], rel=1e-12) and t[1] > t[0]
    plain = prefill_kernel_time(LAYER, A100, par, 1024, 1024, EFF, chunk=1024)
    appended = prefill_kernel_time(LAYER, A100, par, 1024, 1024, EFF, chunk=1024, append=True)
    assert appended > plain
    # a small chunk fills few SMs: per token it costs more than a large one
    small = prefill_kernel_time(LAYER, A100, par, 256, 256, EFF, chunk=256) / 256
    large = prefill_kernel_time(LAYER, A100, par, 2048, 256, EFF, chunk=2048) / 2048
    assert small > large
