"""The slowest pipeline stage paces a pipelined pass (`placer.cost.stages`): Megatron builds the LM
head on the last stage only and splits the layers evenly unless the recipe pins the first / last
stage's count; and a token budget sets the bubble's micro-batch count
(`model.pipeline_micro_batches`); a host-stepped optimizer steps the heaviest stage's shard
(`stages.heaviest_stage_params`, `model.offload_time`). Closed forms by hand."""
from __future__ import annotations

from dataclasses import replace

import pytest

from placer.cost.efficiency import Efficiency
from placer.cost.model import offload_time, pipeline_micro_batches, score_time, train_time
from placer.cost.roofline import device_ceiling
from placer.cost.sharding import Parallel, params_per_device
from placer.cost.stages import heaviest_stage_params, stage_excess, stage_layers
from placer.cost.vocabcomm import Head
from placer.spec.catalog import shipped_devices, shipped_models

H20 = shipped_devices()["H20"]
DSV3 = shipped_models()["DeepSeek-V3"]
QWEN7B = shipped_models()["Qwen2.5-7B"]  # 28 layers, P_mm 7,070,619,136, head 152,064 x 3,584
FLAT = replace(Efficiency(), gemm_half_ridge=0.0, prefill_half_ridge=0.0, step_overhead_s=0.0)


def test_stage_layers_follow_megatrons_split() -> None:
    assert stage_layers(8, Parallel(pp=4)) == (2.0, 2.0, 2.0)
    # verl's DeepSeek-V3 script: LAST_LAYER 6 of 61 over 12 stages, the other 11 take 5 each
    assert stage_layers(61, Parallel(pp=12, last_stage_layers=6)) == (5.0, 5.0, 6.0)
    # NeMo-RL's grpo-deepseek-v3-32n8g: first 3, last 2, the 14 others 56 / 14 = 4
    assert stage_layers(61, Parallel(pp=16, first_stage_layers=3, last_stage_layers=2)) == (
        3.0, 4.0, 2.0)
    assert stage_layers(61, Parallel()) == (61.0, 61.0, 61.0)
    with pytest.raises(ValueError, match="last_stage_layers 70"):
        stage_layers(61, Parallel(pp=12, last_stage_layers=70))


def test_stage_excess_by_hand() -> None:
    assert stage_excess(10.0, 2.0, 28, Parallel()) == 0.0
    # even split, the head on the last stage: pp x (T_L / pp + T_H) - (T_L + T_H) = (pp - 1) T_H
    assert stage_excess(28.0, 2.0, 28, Parallel(pp=4)) == pytest.approx(6.0)
    # 61 layers at 1 s, head 3 s, pp 12, last 6: slowest = 6 + 3 = 9; 12 x 9 - 64 = 44
    assert stage_excess(61.0, 3.0, 61, Parallel(pp=12, last_stage_layers=6)) == pytest.approx(44.0)
    # first 3, last 2 of 61 over 16, head 1.5: the middle stages' 4 layers are the slowest
    # (2 + 1.5 = 3.5 < 4): 16 x 4 - 62.5 = 1.5
    par = Parallel(pp=16, first_stage_layers=3, last_stage_layers=2)
    assert stage_excess(61.0, 1.5, 61, par) == pytest.approx(1.5)


def test_score_time_prices_the_slowest_stage_by_hand() -> None:
    # Qwen2.5-7B, 1e6 tokens, seq 0 (no attention term), pp 4 on 4 H20 at a flat ceiling:
    # a parameter-token costs 2 / (4 x 148e12 x c). Per layer (7,070,619,136 - 544,997,376) / 28
    # = 233,057,920; head 152,064 x 3,584 = 544,997,376.
    # even 7 a stage: the last 7 x 233,057,920 + 544,997,376 = 2,176,402,816, x 4 - P_mm
    #   = 1,634,992,128 (3 heads); last 4 (first and middle 8): the 8-layer stages pace it,
    #   4 x 1,864,463,360 - P_mm = 387,234,304. Bubble: no budget, 4 x pp = 16 micro-batches.
    c = device_ceiling(FLAT.mfu_score, H20, FLAT)
    unit = 2 * 1e6 / (4 * 148e12 * c)
    even, light = Parallel(pp=4), Parallel(pp=4, last_stage_layers=4)
    d = score_time(QWEN7B, H20, even, 1e6, 0.0, FLAT) - score_time(QWEN7B, H20, light, 1e6,
                                                                    0.0, FLAT)
    assert d == pytest.approx((1_634_992_128 - 387_234_304) * unit * (1 + 3 / 16), rel=1e-9)
    # an explicit even split is the default's
    assert score_time(QWEN7B, H20, replace(even, first_stage_layers=7, last_stage_layers=7),
                      1e6, 0.0, FLAT) == pytest.approx(score_time(QWEN7B, H20, even, 1e6, 0.0,
                                                                  FLAT), rel=1e-12)
    # a scalar head has no vocabulary GEMM on the last stage: only the split counts (even: 0)
    assert score_time(QWEN7B, H20, even, 1e6, 0.0, FLAT, Head.SCALAR) < score_time(
        QWEN7B, H20, even, 1e6, 0.0, FLAT)


def test_train_time_prices_the_slowest_stage_by_hand() -> None:
    # the update with recomputation over the same layout: the layers' 8 passes, the head's 6
    # (recomputation re-runs the layers only, `roofline.head_passes`). FLOPs a token: the even
    # split's excess is (pp - 1) heads of 6 passes, the last-4 split's its 8-layer stages'
    c = device_ceiling(FLAT.mfu_train, H20, FLAT)
    unit = 1e6 / (4 * 148e12 * c)  # seconds of a FLOP a token
    layer, head = 233_057_920, 544_997_376
    total = 8 * 28 * layer + 6 * head
    even_excess = 4 * (8 * 7 * layer + 6 * head) - total
    light_excess = 4 * (8 * 8 * layer) - total
    assert even_excess == 3 * 6 * head
    even, light = Parallel(pp=4, zero=1), Parallel(pp=4, zero=1, last_stage_layers=4)
    d = (train_time(QWEN7B, H20, even, 1e6, 0.0, 1, FLAT)
         - train_time(QWEN7B, H20, light, 1e6, 0.0, 1, FLAT))
    assert d == pytest.approx((even_excess - light_excess) * unit * (1 + 3 / 16), rel=1e-9)


def test_pipeline_micro_batches_from_the_budget() -> None:
    # verl's rearrange_micro_batches: ceil(tokens / max_token_len); r11's 768 samples of
    # ~2,210 tokens over a budget of 11,680: ceil(1,697,280 / 11,680) = 146
    assert pipeline_micro_batches(Parallel(pp=12, micro_token_budget=11680), 1_697_280,
                                  11680) == 146
    assert pipeline_micro_batches(Parallel(pp=12), 1_697_280, 16384) == 48  # 4 x pp
    assert pipeline_micro_batches(Parallel(pp=2, micro_batch=2), 40_000, 8_000) == 5.0
    assert pipeline_micro_batches(Parallel(pp=2, micro_token_budget=8192), 100, 8192) == 1


def test_heaviest_stage_holds_the_last_stages_layers_and_head() -> None:
    # verl's DeepSeek-V3 layout: TP 8, PP 12 (6 of 61 layers last), EP 8. The last stage holds 6
    # MoE layers and the LM head. Routed experts: 6 x 256 x 3 x 7,168 x 2,048 / EP 8
    # = 8,455,716,864. Dense part per MoE layer: MLA 187,107,328 (q 7,168 x 1,536 + 1,536 +
    # 1,536 x 128 x 192; kv 7,168 x 576 + 512 + 512 x 128 x 256; o 128 x 128 x 7,168), norms
    # 2 x 7,168, router 7,168 x 256, one shared expert 3 x 7,168 x 2,048: 232,996,864; x 6 +
    # head 129,280 x 7,168 + final norm 7,168 = 2,324,667,392, / TP 8 = 290,583,424.
    par = Parallel(tp=8, pp=12, ep=8, last_stage_layers=6)
    dense, experts = heaviest_stage_params(DSV3, par)
    assert experts == pytest.approx(8_455_716_864)
    assert dense == pytest.approx(290_583_424)
    # the mean stage holds 61 / 12 layers' worth: the heaviest holds ~25% more
    assert (dense + experts) / sum(params_per_device(DSV3, par)) == pytest.approx(1.25, abs=0.01)
    # no pipeline: the one stage holds everything
    assert heaviest_stage_params(DSV3, Parallel(tp=8, ep=8)) == params_per_device(
        DSV3, Parallel(tp=8, ep=8))


def test_host_step_paces_the_heaviest_stage() -> None:
    # one fp32 parameter a second x 1e9 per G: the host step of the heaviest shard, ZeRO over dp 1
    eff = replace(FLAT, host_adam_gparams_s=0.34, offload_gbs=1e6)
    par = Parallel(tp=8, pp=12, ep=8, zero=1, offload=True, last_stage_layers=6)
    assert offload_time(DSV3, H20, par, eff) == pytest.approx(
        (290_583_424 + 8_455_716_864) / 0.34e9)
