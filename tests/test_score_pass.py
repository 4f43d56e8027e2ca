"""A training framework's forward-only passes (old log-probs, reference, reward, critic values):
`costmodel.score_time` prices them on the training module's roofline, `device_ceiling(mfu_score)`,
not at the inference engine's `mfu_prefill` (verl runs them through the actor's FSDP / Megatron
module, verl/workers/actor/dp_actor.py `compute_log_prob`)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from placer.cost.efficiency import Efficiency
from placer.cost.flash import prefill_kernel_time
from placer.cost.generation import forward_time
from placer.cost.model import score_time
from placer.cost.roofline import device_ceiling, matmul_time
from placer.cost.sharding import Parallel
from placer.spec.catalog import shipped_devices, shipped_models

DEV = shipped_devices()
M = shipped_models()
H20, H100, CPU, LPU = DEV["H20"], DEV["H100-SXM"], DEV["cpu-node"], DEV["groq-lpu"]
QWEN7B = M["Qwen2.5-7B"]  # P_mm = 7,070,619,136 (no input embedding)
# No half-ridge ramp, no engine step overhead: the pass's FLOPs over its ceiling alone.
FLAT = replace(Efficiency(), gemm_half_ridge=0.0, prefill_half_ridge=0.0, step_overhead_s=0.0)


def test_default_ceiling_on_an_h20_and_an_h100_by_hand() -> None:
    # H20: 148 TFLOP/s over 4.0 TB/s = 37 FLOP/byte; 1 / (1/0.86 + 0.0045 * 37) = 0.75228
    # (mfu_score's default is mfu_train's: a forward-only pass at the training ceiling)
    assert FLAT.mfu_score == 0.86 == FLAT.mfu_train
    assert device_ceiling(FLAT.mfu_score, H20, FLAT) == pytest.approx(0.752281, rel=1e-5)
    # H100: 989 / 3.35 = 295.22 FLOP/byte; 1 / (1/0.86 + 0.0045 * 295.22) = 0.40140
    assert device_ceiling(FLAT.mfu_score, H100, FLAT) == pytest.approx(0.401397, rel=1e-5)


def test_one_h20_prices_two_flops_per_matmul_parameter_at_the_score_ceiling() -> None:
    # seq 0 (no attention term): 2 * 7,070,619,136 * 1e6 / (148e12 * 0.752281) = 127.012 s
    t = score_time(QWEN7B, H20, Parallel(), 1e6, 0.0, FLAT)
    assert t == pytest.approx(127.012, rel=1e-5)
    # dp replicas split the tokens: 16 H20 take 1/16 of it (no TP, no collectives in a forward)
    assert score_time(QWEN7B, H20, Parallel(dp=16), 1e6, 0.0, FLAT) == pytest.approx(
        127.012 / 16, rel=1e-5)


def test_score_pass_against_the_engine_prefill_by_hand() -> None:
    # Same FLOPs, ceiling 0.75228 against mfu_prefill 0.68 (fitted on measured layer kernels):
    # an H20's engine prefill takes 1.10630x its trainer forward's time; an H100's (trainer
    # ceiling 0.40140) 0.59029x (its non-GEMM kernels cost more of its peak).
    # The engine's attention kernel is priced apart (`flash.prefill_kernel_time`).
    for dev, ratio in ((H20, 1.106295), (H100, 0.590290)):
        fwd = (forward_time(QWEN7B, dev, Parallel(), 1e6, 0.0, FLAT)
               - prefill_kernel_time(QWEN7B, dev, Parallel(), 1e6, 0.0, FLAT))
        assert fwd / score_time(QWEN7B, dev, Parallel(), 1e6, 0.0, FLAT) == pytest.approx(
            ratio, rel=1e-5)


def test_score_pass_scales_with_its_own_factor_only() -> None:
    base = score_time(QWEN7B, H20, Parallel(), 1e6, 2048.0, FLAT)
    assert score_time(QWEN7B, H20, Parallel(), 1e6, 2048.0,
                      replace(FLAT, mfu_prefill=0.9)) == base  # the engine's factor is not used
    # 1 / ceiling is affine in 1 / mfu_score (what `placer.calibrate.fit` relies on): mfu_score 0.30
    # takes 1 / ceiling from 1/0.86 + 0.1665 = 1.32929 to 1/0.30 + 0.1665 = 3.49983, x2.63285
    slower = score_time(QWEN7B, H20, Parallel(), 1e6, 2048.0, replace(FLAT, mfu_score=0.30))
    assert slower / base == pytest.approx(3.499833 / 1.329291, rel=1e-5)


@pytest.mark.parametrize("dev", [CPU, LPU])
def test_a_frozen_model_off_the_gpus_keeps_the_engine_forward(dev) -> None:
    m = M["Llama-2-7B"]
    par = Parallel(dp=70) if dev is LPU else Parallel()
    assert score_time(m, dev, par, 1e5, 512.0, Efficiency()) == forward_time(
        m, dev, par, 1e5, 512.0, Efficiency())


def test_a_pipelined_forward_prices_each_stage_its_own_layers_collectives() -> None:
    # TP2 over PP4: each device runs 28 / 4 layers, so a quarter of the pass's layer collectives;
    # the fill and drain idle 3 stage times over 16 micro-batches (a token budget: 4 x pp), and
    # every micro-batch crosses each stage boundary once (as `train_time` prices a pipeline)
    from placer.cost.layercomm import layer_comm, micro_tokens, pp_send
    from placer.cost.vocabcomm import Head, score_vocab_comm
    eff, tokens, seq = Efficiency(), 4e5, 2048.0
    flat, piped = Parallel(tp=2), Parallel(tp=2, pp=4)
    mt = micro_tokens(piped, seq)
    comm = layer_comm(QWEN7B, H100, piped, tokens, eff, mt)
    sends = pp_send(QWEN7B, H100, piped, min(tokens, mt), eff) * tokens / min(tokens, mt)
    vocab = score_vocab_comm(QWEN7B, H100, piped, tokens, eff, mt, Head.LOGPROB)
    base = score_time(QWEN7B, H100, flat, tokens, seq, eff) - layer_comm(
        QWEN7B, H100, flat, tokens, eff, micro_tokens(flat, seq)) - score_vocab_comm(
        QWEN7B, H100, flat, tokens, eff, micro_tokens(flat, seq), Head.LOGPROB)
    compute = base / 4  # the same FLOPs over four stages' devices
    # the LM head on the last stage only paces the pipeline: 3 more heads' time than the even
    # spread (`placer.cost.stages`; moved with that change)
    head = matmul_time(2 * QWEN7B.vocab * QWEN7B.hidden * tokens, tokens, H100, piped,
                       device_ceiling(eff.mfu_score, H100, eff), eff)
    assert score_time(QWEN7B, H100, piped, tokens, seq, eff) == pytest.approx(
        (compute + 3 * head) * (1 + 3 / 16) + comm / 4 + sends + vocab, rel=1e-9)
