"""Model architectures by hand: head_dim, tied embeddings, mixtures of experts, latent attention.

Each figure below is worked out from the model's config.json, not from the code under test.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from specdata import base

from placer.base.errors import EXIT_INFEASIBLE, SpecError
from placer.cli import main
from placer.cost.efficiency import Efficiency
from placer.cost.flash import prefill_kernel_time
from placer.cost.generation import decode_step_time, forward_time, kv_capacity_tokens
from placer.cost.model import train_flops, train_memory
from placer.cost.roofline import GB, decode_read_bytes, kv_bytes_per_token, kv_split, weight_bytes
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.catalog import shipped_devices, shipped_models
from placer.spec.load import job_from_dict

M = shipped_models()
H100 = shipped_devices()["H100-SXM"]
EFF = Efficiency()
IDEAL = replace(EFF, mfu_train=1.0, mfu_prefill=1.0, decode_bw_eff=1.0, decode_flops_eff=1.0,
                link_eff=1.0, tp_link_eff=1.0, tp_base_s=0.0, prefill_half_ridge=0.0,
                step_overhead_s=0.0, train_overhead_s=0.0, gemm_half_ridge=0.0,
                decode_tp_bw_loss=0.0, decode_bw_half_batch=0.0, step_overhead_per_seq_s=0.0,
                coll_base_s=0.0, nvlink_hop_s=0.0, net_hop_s=0.0, nongemm_bytes_per_flop=0.0,
                tp_hop_s=0.0, p2p_net_s=0.0,
                fused_moe_block_n=0.0, attn_kernel_s=0.0, attn_split_s=0.0)


def arch(**kw) -> ModelArch:
    shape = {"name": "x", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": 128,
             "vocab": 100}
    return ModelArch.model_validate({**shape, **kw})


# ------------------------------------------------------------------------------------ head_dim
def test_head_dim_override_changes_attention_params_and_kv_bytes() -> None:
    q32 = M["Qwen3-32B"]  # hidden 5120, 64 heads of 128 (not 5120 / 64 = 80), 8 KV heads
    h, a, kv, d = 5120, 64, 8, 128
    assert q32.head_size == d
    assert q32.attention_params() == h * a * d + 2 * h * kv * d + a * d * h + 2 * d  # + q/k norm
    assert kv_bytes_per_token(q32) == 2 * 64 * kv * d * 2 == 262_144
    narrow = q32.model_copy(update={"head_dim": None})  # what hidden / heads would give
    assert narrow.head_size == 80
    assert q32.attention_params() - narrow.attention_params() == (
        (2 * a + 2 * kv) * h * (d - 80) + 2 * (d - 80))
    assert kv_bytes_per_token(narrow) == 2 * 64 * kv * 80 * 2
    # attention FLOPs per context token follow the heads' width, not hidden
    assert q32.attention_width() == a * d == 8192
    assert narrow.attention_width() == h


def test_default_head_dim_prices_dense_models_as_before() -> None:
    m = M["Llama-3-8B"]
    assert m.head_dim is None and m.head_size == 128 and m.attention_width() == m.hidden


def test_a_job_catalog_model_may_give_head_dim() -> None:
    model = {"name": "my-q3", "layers": 4, "hidden": 160, "heads": 2, "kv_heads": 1,
             "head_dim": 128, "mlp": 256, "vocab": 1000}
    job = job_from_dict(base(catalog={"models": [model]}, models={"policy": "my-q3"}))
    assert job.catalog.models[0].head_size == 128


# ---------------------------------------------------------------------------- tied embeddings
def test_tied_embeddings_are_counted_once() -> None:
    q4 = M["Qwen3-4B"]
    untied = q4.model_copy(update={"tie_embeddings": False})
    table = 151936 * 2560
    assert untied.params() - q4.params() == table
    assert q4.embedding_params() == table
    # the one table is the LM head's matrix: a token multiplies by it once either way
    assert q4.matmul_params() == untied.matmul_params() == q4.params()


# ------------------------------------------------------------------------ mixture of experts
def test_qwen3_30b_a3b_by_hand() -> None:
    m = M["Qwen3-30B-A3B"]
    h, L, V, E, k, f = 2048, 48, 151936, 128, 8, 768
    attn = h * 32 * 128 + 2 * h * 4 * 128 + 32 * 128 * h + 2 * 128
    expert = 3 * h * f
    per_layer = attn + 2 * h + h * E + E * expert
    assert m.params() == L * per_layer + 2 * V * h + h == 30_532_122_624
    assert m.active_params() == m.params() - L * (E - k) * expert
    assert m.matmul_params() == L * (attn + 2 * h + h * E + k * expert) + V * h + h


def test_moe_training_flops_use_experts_per_token() -> None:
    m = M["Qwen3-30B-A3B"]
    h, f, k, L = 2048, 768, 8, 48
    more = m.model_copy(update={"experts": 256})  # twice the experts, the same 8 per token
    assert more.params() - m.params() == L * (128 * 3 * h * f + h * 128)  # experts + router
    # FLOPs see only the router's extra logits, not the idle experts
    assert train_flops(more, 1000, 0, False) - train_flops(m, 1000, 0, False) == pytest.approx(
        6 * 1000 * L * h * 128)
    # one more expert per token adds one expert's 3*h*f per MoE layer, 6 FLOPs each
    wider = m.model_copy(update={"experts_per_token": k + 1})
    assert train_flops(wider, 1, 0, False) - train_flops(m, 1, 0, False) == pytest.approx(
        6 * L * 3 * h * f)
    assert train_flops(m, 1, 0, False) == pytest.approx(6 * m.matmul_params())
    assert m.matmul_params() < m.params() / 9  # ~3.0B of 30.5B
    # memory still holds every expert: 16 bytes per parameter unsharded
    mem = train_memory(m, Parallel(zero=0), micro_tokens=0)
    assert (mem.weights + mem.grads + mem.optimizer) * GB == pytest.approx(16 * m.params())
    assert weight_bytes(m) == 2 * m.params()


def test_deepseek_v3_dense_layers_and_shared_expert_by_hand() -> None:
    m = M["DeepSeek-V3"]
    h, L, V, a = 7168, 61, 129280, 128
    rq, rkv, rope, nope, dv = 1536, 512, 64, 128, 128
    attn = (h * rq + rq + rq * a * (nope + rope)                 # q down, norm, up
            + h * (rkv + rope) + rkv + rkv * a * (nope + dv)    # kv down (+ shared rope key)
            + a * dv * h)                                       # o
    assert m.attention_params() == attn == 187_107_328
    expert = 3 * h * 2048
    dense, moe = 3, 58
    total = (L * (attn + 2 * h) + dense * 3 * h * 18432 + moe * (h * 256 + 257 * expert)
             + 2 * V * h + h)
    assert m.moe_layers == moe and m.params() == total
    assert m.active_params() == total - moe * (256 - 8) * expert  # 8 routed + 1 shared run
    assert m.params() / 1e9 == pytest.approx(671, rel=0.002)


def test_expected_experts_per_decode_batch() -> None:
    m = M["Qwen3-30B-A3B"]  # 128 experts, 8 per token
    assert m.expected_experts(1) == pytest.approx(8)
    assert m.expected_experts(2) == pytest.approx(128 * (1 - (120 / 128) ** 2))  # 15.5
    for b in (1, 2, 4, 16, 64, 256, 4096):
        assert m.expected_experts(b) <= min(128, 8 * b) + 1e-9
    assert m.expected_experts(4096) == pytest.approx(128)
    assert M["Llama-3-8B"].expected_experts(64) == 0.0


def test_moe_decode_reads_the_experts_the_batch_hits() -> None:
    m = M["Qwen3-30B-A3B"]
    expert_bytes = 2 * 3 * 2048 * 768
    one = decode_read_bytes(m, 1)
    assert one == 2 * m.matmul_params()  # batch 1 reads its 8 experts per layer
    assert decode_read_bytes(m, 4) - one == pytest.approx(
        48 * (m.expected_experts(4) - 8) * expert_bytes)
    # a large batch touches every expert: all weights but the input embedding table
    assert decode_read_bytes(m, 10_000) == pytest.approx(
        weight_bytes(m) - 2 * 151936 * 2048, rel=1e-9)
    # batch 1 on one H100 is bound by those reads, a tenth of what the dense bytes would cost
    t = decode_step_time(m, H100, Parallel(), 1, 0, IDEAL)
    assert t == pytest.approx(one / (3350 * GB))
    assert t < 0.12 * weight_bytes(m) / (3350 * GB)


def test_moe_prefill_flops_use_active_parameters() -> None:
    m = M["Qwen3-30B-A3B"]
    t = forward_time(m, H100, Parallel(), 1e5, seq=0, eff=IDEAL)
    # plus the attention kernel's diagonal key tiles, which seq 0 still computes
    attention = prefill_kernel_time(m, H100, Parallel(), 1e5, 0.0, IDEAL)
    assert t == pytest.approx(2 * m.matmul_params() * 1e5 / 989e12 + attention)


@pytest.mark.parametrize("kw, match", [
    ({"experts_per_token": 2}, "experts_per_token need experts > 0"),
    ({"experts": 8, "experts_per_token": 9, "expert_mlp": 32}, "between 1 and experts"),
    ({"experts": 8, "experts_per_token": 2}, "needs expert_mlp"),
    ({"experts": 8, "experts_per_token": 2, "expert_mlp": 32, "dense_layers": 2},
     "leaves no MoE layer"),
])
def test_inconsistent_moe_fields_are_refused(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        arch(**kw)


# ---------------------------------------------------------------------- latent attention
def test_mla_kv_cache_holds_the_latent() -> None:
    m = M["DeepSeek-V3"]
    assert kv_bytes_per_token(m) == 61 * (512 + 64) * 2 == 70_272
    # GQA with its 128 KV heads of 128 would need 2 * 61 * 128 * 128 * 2 bytes: 57x more
    assert 2 * 61 * 128 * 128 * 2 / kv_bytes_per_token(m) == pytest.approx(56.9, abs=0.1)


def test_tensor_parallel_splits_kv_heads_but_not_a_latent() -> None:
    ds, q3 = M["DeepSeek-V3"], M["Qwen3-30B-A3B"]  # q3: 4 KV heads
    assert kv_split(ds, Parallel(tp=8)) == 1 and kv_split(ds, Parallel(tp=8, pp=2)) == 2
    assert kv_split(q3, Parallel(tp=2)) == 2 and kv_split(q3, Parallel(tp=8)) == 4
    assert kv_split(M["Llama-3-8B"], Parallel(tp=8)) == 8
    # capacity: the free memory of kv_split devices, each keeping its part
    m = q3
    free = 80 * EFF.kv_mem_fraction - weight_bytes(m) / 8 / GB - EFF.engine_mem_gb
    assert kv_capacity_tokens(m, H100, Parallel(tp=8), EFF) == pytest.approx(
        free * GB * 4 / kv_bytes_per_token(m))


@pytest.mark.parametrize("kw, match", [
    ({"q_lora_rank": 16}, "need kv_lora_rank"),
    ({"kv_lora_rank": 16, "qk_rope_head_dim": 8}, "needs qk_nope_head_dim, v_head_dim"),
    ({"kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
      "head_dim": 16}, "apply to GQA attention"),
])
def test_inconsistent_mla_fields_are_refused(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        arch(**kw)


def test_a_bad_catalog_model_is_a_spec_error_naming_the_entry() -> None:
    bad = {"name": "bad-moe", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": 128,
           "vocab": 100, "experts": 4, "experts_per_token": 8, "expert_mlp": 32}
    with pytest.raises(SpecError, match=r"catalog\.models\.0: experts_per_token must be between"):
        job_from_dict(base(catalog={"models": [bad]}))


# ------------------------------------------------------------------ every model plans (CLI)
def _job_on_h100(model: str, nodes: int) -> dict:
    return {"name": f"on-{model}", "algorithm": "grpo",
            "models": {"policy": model, "reward": "rule"},
            "batch": {"prompts": 16, "samples_per_prompt": 4},
            "lengths": {"prompt": {"kind": "fixed", "value": 256},
                        "response": {"kind": "lognormal", "median": 512, "sigma": 0.5,
                                     "cap": 4096}},
            "cluster": {"pools": [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8,
                                   "nodes": nodes},
                                  {"name": "cpu", "device": "cpu-node", "devices_per_node": 1,
                                   "nodes": 1}]}}


@pytest.mark.parametrize("model, nodes", [
    ("Llama-3.1-8B", 2), ("Qwen3-4B", 2), ("Qwen3-8B", 2), ("Qwen3-14B", 2), ("Qwen3-32B", 4),
    ("Qwen3-30B-A3B", 4), ("Qwen3-235B-A22B", 16)])
def test_validate_and_plan_accept_every_new_catalog_model(model: str, nodes: int, tmp_path,
                                                          capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job_on_h100(model, nodes)))
    assert main(["validate", str(path)]) == 0
    assert main(["plan", str(path), "-o", str(tmp_path / "plan.json")]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_model_that_fits_nowhere_is_infeasible_with_a_diagnosis(tmp_path, capsys) -> None:
    # DeepSeek-V3 in BF16 holds 1.34 TB of weights: no single-node engine (TP <= 8, no PP or EP
    # for inference) of H100s holds it, and 16 devices cannot train it.
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job_on_h100("DeepSeek-V3", 2)))
    assert main(["validate", str(path)]) == 0
    capsys.readouterr()
    assert main(["plan", str(path)]) == EXIT_INFEASIBLE
    err = capsys.readouterr().err
    assert err.startswith("placer: infeasible:") and "DeepSeek-V3" in err
    assert "Traceback" not in err


def test_execute_refuses_a_model_it_cannot_build_before_any_actor_starts(tmp_path,
                                                                          capsys) -> None:
    # The executor's workers build Llama-shaped models; a mixture of experts would silently
    # become a dense model of another size, so `execute` stops at validation (exit 2). One node:
    # on more the planner may give the engines data-parallel attention, which execute refuses
    # first (tests/test_exec_runplan.py).
    job = _job_on_h100("Qwen3-30B-A3B", 1)
    plan_path = tmp_path / "plan.json"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["plan", str(tmp_path / "job.yaml"), "-o", str(plan_path)]) == 0
    capsys.readouterr()
    assert main(["execute", str(plan_path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("placer: error: plan.job.models.policy: Qwen3-30B-A3B uses a mixture of "
                          "experts, q/k norm"), err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "run" / "model-v0").exists()  # stopped before building any model
