"""Hybrid linear-attention models (Gated DeltaNet + full attention): the shape, its parameters,
FLOPs, KV and recurrent state, and the engine's concurrency and decode step, against hand counts."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from specdata import base

from placer.base.errors import SpecError
from placer.cost.batching import Run, StepTerms
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.generation import (
    decode_bw_eff,
    decode_run_time,
    decode_step_time,
    kv_capacity_tokens,
    max_concurrency,
)
from placer.cost.model import train_flops
from placer.cost.pricer import Pricer
from placer.cost.roofline import (
    GB,
    attention_flops_per_token,
    infer_memory,
    kv_bytes_per_token,
    weight_tensors,
)
from placer.cost.sharding import Parallel, linear_state_bytes, state_split, state_tokens
from placer.spec.arch import ModelArch
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.load import job_from_dict

M = shipped_models()
H200 = shipped_devices()["H200"]
EFF = Efficiency()
NEXT, Q35 = M["Qwen3-Next-80B-A3B"], M["Qwen3.5-27B"]


def test_layer_plan_puts_full_attention_last_in_each_group() -> None:
    # transformers' Qwen3NextConfig: layer i is full attention iff (i + 1) % interval == 0
    assert (NEXT.full_attention_layers, NEXT.linear_layers) == (12, 36)
    assert (Q35.full_attention_layers, Q35.linear_layers) == (16, 48)
    odd = Q35.model_copy(update={"layers": 6})  # layers 3 full; 0-2, 4-5 linear
    assert (odd.full_attention_layers, odd.linear_layers) == (1, 5)


def test_gdn_parameters_of_one_qwen3_next_layer_by_hand() -> None:
    la = NEXT.linear_attention
    assert la is not None
    h, kd, vd = 2048, 16 * 128, 32 * 128
    qkvz, ba = h * (2 * kd + 2 * vd), h * 2 * 32  # in_proj_qkvz 12288 x 2048, in_proj_ba 64 x 2048
    conv = (2 * kd + vd) * 4  # depthwise conv1d over q, k, v: 8192 channels x kernel 4
    rest = 2 * 32 + 128 + vd * h  # dt_bias, A_log; gated RMSNorm; out_proj 2048 x 4096
    assert la.params(h) == qkvz + ba + conv + rest == 33_718_464
    # gated full attention: q_proj emits query and gate (2 x 16 x 256), k/v 2 x 256, o, q/k norms
    assert NEXT.attention_params() == h * 8192 + 2 * h * 512 + 4096 * h + 2 * 256 == 27_263_488


def test_parameter_counts_match_transformers_modules() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3NextConfig(
        vocab_size=64, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_num_key_heads=2, linear_num_value_heads=4,
        moe_intermediate_size=24, shared_expert_intermediate_size=24, num_experts=8,
        num_experts_per_tok=2, intermediate_size=96)
    with torch.device("meta"):
        hf = transformers.Qwen3NextForCausalLM(cfg)
    ours = ModelArch(name="tiny-next", layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16,
                     mlp=96, vocab=64, qk_norm=True, attn_output_gate=True, experts=8,
                     experts_per_token=2, shared_experts=1, expert_mlp=24,
                     linear_attention={"every": 4, "key_heads": 2, "value_heads": 4,
                                       "key_head_dim": 8, "value_head_dim": 12})
    # the one tensor not modelled: each MoE layer's shared_expert_gate, hidden x 1
    assert sum(p.numel() for p in hf.parameters()) == ours.params() + 4 * 64
    # checkpoint tensors (experts one by one, as the safetensors hold them): 3 GDN layers of 7
    # mixer tensors, 1 gated attention of 6, 2 norms and 1 + 3 x 9 MoE tensors each; + 3
    assert weight_tensors(ours) == 3 * 7 + 6 + 4 * (2 + 1 + 27) + 3


def test_qwen3_next_counts_exactly_and_near_the_published_80b_a3b() -> None:
    assert NEXT.params() == 79_674_292_992  # model card: 80B (the MTP layer excluded)
    assert NEXT.active_params() == 3_874_831_104  # 10 routed + 1 shared expert, embeddings
    # the card's "3B activated" is the name's round figure: 3.25B without the embeddings
    assert round((NEXT.active_params() - 2 * NEXT.vocab * NEXT.hidden) / 1e9) == 3


def test_kv_counts_only_the_full_attention_layers() -> None:
    # Qwen3.5-27B: 16 full-attention layers x (K + V) x 4 KV heads x 256 x 2 bytes
    assert kv_bytes_per_token(Q35) == 16 * 2 * 4 * 256 * 2 == 65_536
    dense = Q35.model_copy(update={"linear_attention": None})
    assert kv_bytes_per_token(dense) == 4 * kv_bytes_per_token(Q35)


def test_recurrent_state_bytes_per_sequence_by_hand() -> None:
    la = Q35.linear_attention
    assert la is not None
    assert la.state_elements() == 48 * 128 * 128
    assert la.conv_state_elements() == (2 * 16 * 128 + 48 * 128) * 3
    # Miles' 151 MB: 48 v-heads x 128 x 128 x fp32 x 48 layers; + the bf16 conv window
    per_layer = 48 * 128 * 128 * 4 + 10240 * 3 * 2
    assert linear_state_bytes(Q35, EFF) == 48 * per_layer == 153_944_064
    assert linear_state_bytes(Q35, replace(EFF, linear_state_bytes=2)) == 48 * (
        48 * 128 * 128 * 2 + 10240 * 3 * 2)
    assert linear_state_bytes(M["Qwen3-8B"], EFF) == 0
    # TP shards it by head (up to key_heads), PP by layer
    assert state_split(Q35, Parallel(tp=4, pp=2)) == 8
    assert state_split(Q35, Parallel(tp=32)) == 16


def test_gdn_flops_per_token_are_linear_in_the_context() -> None:
    w = Q35.attention_width()  # 24 heads x 256
    gdn = 48 * 6 * 48 * 128 * 128  # 48 layers x 3 state products x 2 FLOPs x state elements
    assert Q35.linear_flops_per_token() == gdn
    for s in (1000.0, 8000.0):
        assert attention_flops_per_token(Q35, s) == 2 * 16 * w * s + gdn
    # only the 16 full-attention layers grow with the context
    assert attention_flops_per_token(Q35, 2000) - attention_flops_per_token(Q35, 1000) == (
        2 * 16 * w * 1000)
    p = Q35.matmul_params()
    head = Q35.vocab * Q35.hidden  # not recomputed: 6 passes
    assert train_flops(Q35, 10, 4096, True) == pytest.approx(
        (8 * (p - head + (2 * 16 * w * 4096 + gdn) / 2) + 6 * head) * 10)


def test_concurrency_counts_the_state_of_each_sequence() -> None:
    par, ctx = Parallel(), 10_240
    free = (H200.memory_gb * EFF.kv_mem_fraction - infer_memory(Q35, par, H200, EFF).total) * GB
    per_seq = ctx * 65_536 + 153_944_064
    conc = max_concurrency(Q35, H200, par, ctx, EFF)
    assert conc == int(free // per_seq)  # 86 with the default factors
    assert state_tokens(Q35, H200, par, EFF) == pytest.approx(153_944_064 / 65_536)
    # without the state the same memory would hold a fifth more (105)
    assert int(free // (ctx * 65_536)) > 1.2 * conc
    # TP 4 splits the state over 4 ranks and the KV over its 4 KV heads alike
    assert state_tokens(Q35, H200, Parallel(tp=4), EFF) == pytest.approx(153_944_064 / 65_536)


def test_decode_step_reads_and_writes_the_state_once_per_sequence() -> None:
    par, batch, ctx = Parallel(), 32, 32 * 3000
    lean = replace(EFF, linear_state_bytes=2.0)
    extra = 2 * batch * 48 * 48 * 128 * 128 * (4 - 2)  # read + write, fp32 vs bf16 state
    rate = H200.mem_bw_gbs * GB * decode_bw_eff(batch, 1, EFF)
    gap = decode_step_time(Q35, H200, par, batch, ctx, EFF) - decode_step_time(
        Q35, H200, par, batch, ctx, lean)
    assert gap == pytest.approx(extra / rate, rel=1e-9)
    # the state is a per-batch constant: the step keeps its shape max(m0 + k C, floor) and the
    # closed forms (StepTerms, Run, decode_run_time) still sum the steps exactly
    st = StepTerms(Q35, H200, par, EFF)
    assert st.of(batch) is not None
    run = Run(st, batch, ctx, 500)
    steps = sum(decode_step_time(Q35, H200, par, batch, ctx + batch * i, EFF) for i in range(500))
    assert run.time(500) == pytest.approx(steps, rel=1e-9)
    assert decode_run_time(Q35, H200, par, batch, ctx / batch, 500, EFF) == pytest.approx(
        steps, rel=1e-9)


def _job(linear: dict) -> dict:
    arch = {"name": "hyb", "layers": 8, "hidden": 256, "heads": 4, "kv_heads": 2, "mlp": 512,
            "vocab": 1000, "linear_attention": linear}
    return {"name": "h", "algorithm": "grpo", "models": {"policy": "hyb"},
            "batch": {"prompts": 4, "samples_per_prompt": 2},
            "lengths": {"prompt": {"kind": "fixed", "value": 64},
                        "response": {"kind": "fixed", "value": 64}},
            "cluster": {"pools": [{"name": "g", "device": "H100-SXM", "devices_per_node": 8,
                                   "nodes": 1}]},
            "catalog": {"models": [arch]}}


@pytest.mark.parametrize(("linear", "words"), [
    ({"every": 1, "key_heads": 2, "value_heads": 4, "key_head_dim": 8, "value_head_dim": 8},
     ("linear_attention", "every", "1")),
    ({"every": 4, "key_heads": 3, "value_heads": 4, "key_head_dim": 8, "value_head_dim": 8},
     ("linear_attention", "value_heads 4", "key_heads 3")),
    ({"every": 16, "key_heads": 2, "value_heads": 4, "key_head_dim": 8, "value_head_dim": 8},
     ("linear_attention.every 16", "layers 8")),
    ({"every": 4, "key_heads": 2, "value_heads": 4, "key_head_dim": 8, "value_head_dim": 8,
      "state_dtype": "fp32"}, ("linear_attention", "state_dtype")),
])
def test_bad_linear_attention_is_one_spec_error_naming_field_and_value(linear, words) -> None:
    with pytest.raises(SpecError) as err:
        job_from_dict(_job(linear))
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_hybrid_job_validates_and_keeps_its_shape() -> None:
    job = job_from_dict(_job({"every": 4, "key_heads": 2, "value_heads": 4, "key_head_dim": 8,
                              "value_head_dim": 8}))
    arch = job.catalog.models[0]
    assert arch.linear_attention is not None and arch.full_attention_layers == 2
    assert math.isclose(kv_bytes_per_token(arch), 2 * 2 * 2 * 64 * 2)


def test_a_context_that_fits_the_kv_but_not_kv_and_state_is_infeasible() -> None:
    room = int(kv_capacity_tokens(Q35, H200, Parallel(), EFF))  # KV tokens of one H200 engine
    prompt = 1000
    for response, feasible in ((room - prompt - 3000, True), (room - prompt - 1000, False)):
        lengths = {"prompt": {"kind": "fixed", "value": prompt},
                   "response": {"kind": "fixed", "value": response}}
        res = resolve(job_from_dict(base(models={"policy": "Qwen3.5-27B"}, lengths=lengths,
                                         cluster={"pools": [{"name": "gen", "device": "H200",
                                                             "devices_per_node": 8,
                                                             "nodes": 1}]})))
        est = Pricer(res, Calibration()).estimate("rollout", res.cluster.pool("gen"), Parallel(dp=1))
        # the state is worth 2,349 KV tokens: 3,000 spare tokens hold it, 1,000 do not
        assert est.feasible is feasible, est.reason
    assert "+ 0.15 GB of linear-attention state per replica" in est.reason
