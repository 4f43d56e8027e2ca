"""The fused-MoE grid's occupancy and an eager engine's kernel launches (placer/cost/kernels.py):
each figure below is worked by hand from the module docstring's counts and the models' configs."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from placer.cost.efficiency import Efficiency
from placer.cost.generation import decode_step_time
from placer.cost.kernels import eager_overhead, expert_read_eff, layer_launches
from placer.cost.roofline import GB, decode_read_bytes
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.catalog import shipped_devices, shipped_models

DEV = shipped_devices()
M = shipped_models()
H100, B200 = DEV["H100-SXM"], DEV["B200"]
EFF = Efficiency()


def test_batch_one_on_b200_fills_under_half_the_sms() -> None:
    # Qwen3-235B-A22B at TP8: 1,536 / 8 = 192 columns of each expert a rank; one token hits its
    # 8 experts, each 2 x 192 / 32 = 12 gate-up tiles: 96 tiles on 148 SMs
    m = M["Qwen3-235B-A22B"]
    assert expert_read_eff(m, B200, Parallel(tp=8), 1, EFF) == pytest.approx(96 / (96 + 148))


def test_occupancy_rises_with_the_experts_a_batch_hits() -> None:
    m, par = M["Qwen3-235B-A22B"], Parallel(tp=16)
    # 64 sequences hit 128 x (1 - (120/128)^64) = 126.0 experts; 2 x 96 / 32 = 6 tiles each
    hits = 128 * (1 - (1 - 8 / 128) ** 64)
    assert expert_read_eff(m, H100, par, 64, EFF) == pytest.approx(6 * hits / (6 * hits + 132))
    effs = [expert_read_eff(m, H100, par, b, EFF) for b in (1, 2, 8, 32, 256)]
    assert effs == sorted(effs) and effs[0] < 0.3 < 0.8 < effs[-1] < 1


def test_expert_parallel_ranks_split_the_hits_and_keep_whole_experts() -> None:
    m = M["Qwen3-30B-A3B"]  # 768 columns an expert: 48 tiles of 32 whole
    ep = Parallel(tp=8, ep=8)
    hits = 128 * (1 - (1 - 8 / 128) ** 16) / 8
    assert expert_read_eff(m, H100, ep, 16, EFF) == pytest.approx(48 * hits / (48 * hits + 132))
    # a partial tile is a whole CTA: 768 / 32 = 24 columns a rank at TP32 are 2 x 24 / 32 -> 2
    assert expert_read_eff(m, H100, Parallel(tp=32), 1, EFF) == pytest.approx(16 / (16 + 132))


def test_no_experts_no_sm_count_or_no_tiling_read_at_the_dense_rate() -> None:
    assert expert_read_eff(M["Llama-3-8B"], H100, Parallel(tp=4), 8, EFF) == 1.0
    no_sms = H100.model_copy(update={"sm_count": None})
    assert expert_read_eff(M["Qwen3-30B-A3B"], no_sms, Parallel(tp=4), 8, EFF) == 1.0
    ideal = replace(EFF, fused_moe_block_n=0.0)
    assert expert_read_eff(M["Qwen3-30B-A3B"], H100, Parallel(tp=4), 8, ideal) == 1.0


def test_a_decode_step_reads_its_routed_experts_at_that_efficiency() -> None:
    # a hand-sized MoE at batch 1 on one H100: one expert hit per layer (E(1 - (1 - k/E)) = 1),
    # 2 layers x 3 x 64 x 32 params x 2 bytes = 24,576 bytes, in 2 x 32 / 32 = 2 tiles against
    # 132 SMs: read at 2 / 134 of the dense rate, 66 times as long as at the dense rate
    tiny = ModelArch(name="tiny-moe", layers=2, hidden=64, heads=4, kv_heads=2, mlp=128,
                     vocab=64, experts=4, experts_per_token=1, expert_mlp=32)
    routed = 2 * 3 * 64 * 32 * 2
    assert decode_read_bytes(tiny, 1) - decode_read_bytes(tiny, 0) == routed
    dense_rate = 3350 * GB * EFF.decode_bw_eff / (1 + EFF.decode_bw_half_batch)  # batch 1, TP1
    ideal = replace(EFF, fused_moe_block_n=0.0)
    extra = (decode_step_time(tiny, H100, Parallel(), 1, 0, EFF)
             - decode_step_time(tiny, H100, Parallel(), 1, 0, ideal))
    assert extra == pytest.approx(routed / dense_rate * (134 / 2 - 1))


def test_launch_counts_per_layer_kind() -> None:
    assert layer_launches(M["Qwen2.5-7B"]) == 28 * 10  # GQA 6 + dense MLP 4
    assert layer_launches(M["Qwen3-8B"]) == 36 * 12  # + q and k RMSNorm
    assert layer_launches(M["Qwen3-30B-A3B"]) == 48 * (8 + 10)  # MoE MLP 10
    # MLA 12 in all 61 layers; 3 dense MLPs; 58 MoE MLPs with a shared expert (10 + 4)
    assert layer_launches(M["DeepSeek-V3"]) == 61 * 12 + 3 * 4 + 58 * 14
    no_q_rank = M["DeepSeek-V3"].model_copy(update={"q_lora_rank": None})
    assert layer_launches(no_q_rank) == layer_launches(M["DeepSeek-V3"]) - 2 * 61


def test_eager_host_time_scales_with_the_launches() -> None:
    eager, graphs = Parallel(tp=4, cuda_graphs=False), Parallel(tp=4)
    # the dense layer the factor was measured on costs eager_layer_s a layer
    assert eager_overhead(M["Qwen2.5-7B"], eager, EFF) == pytest.approx(28 * EFF.eager_layer_s)
    ds = M["DeepSeek-V3"]
    assert eager_overhead(ds, eager, EFF) == pytest.approx(1556 / 10 * EFF.eager_layer_s)
    assert eager_overhead(ds, graphs, EFF) == 0.0
    assert math.isclose(eager_overhead(ds, eager, EFF) / 61 / EFF.eager_layer_s, 1556 / 610)
