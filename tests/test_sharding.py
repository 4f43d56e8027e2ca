"""Parallel layouts (placer.cost.sharding): expert, context and pipeline parallelism in memory, time and
candidates, checked against hand-computed values; multi-node engines and EP chosen by the ILP."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from placer.base.errors import SpecError
from placer.cost.collectives import Link
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.estimate import trained_context
from placer.cost.generation import decode_step_time, kv_capacity_tokens
from placer.cost.layercomm import decode_comm, zero3_gathers
from placer.cost.model import train_flops, train_memory
from placer.cost.pricer import Pricer
from placer.cost.roofline import GB, infer_memory, pass_compute
from placer.cost.sharding import (
    Parallel,
    active_expert_params,
    ep_all_to_all,
    expert_tokens,
    params_per_device,
    routed_expert_params,
    train_state_bytes,
)
from placer.solve.candidates import role_candidates
from placer.solve.layouts import device_counts, layouts
from placer.solve.planfile import RolePlacement
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.load import job_from_dict, load_job

ROOT = Path(__file__).resolve().parent.parent
M, D = shipped_models(), shipped_devices()
MOE = M["Qwen3-30B-A3B"]  # 48 layers, h 2048, 128 experts of 3 * 2048 * 768, 8 per token
H100 = D["H100-SXM"]
EFF = Efficiency()
EXPERT = 3 * 2048 * 768  # 4,718,592 parameters per expert


def test_routed_and_active_expert_parameters_by_hand() -> None:
    assert routed_expert_params(MOE) == 48 * 128 * EXPERT  # 28.99B of the 30.5B
    assert active_expert_params(MOE) == 48 * 8 * EXPERT  # 1.81B: experts-per-token, not all
    assert routed_expert_params(M["Qwen2.5-7B"]) == 0


def test_expert_parallelism_splits_the_experts_not_the_dense_part() -> None:
    dense, experts = params_per_device(MOE, Parallel(tp=2, dp=8, ep=8))
    assert dense == pytest.approx((MOE.params() - 48 * 128 * EXPERT) / 2)  # TP 2
    assert experts == pytest.approx(48 * 128 * EXPERT / 8)  # EP 8 x ETP 1
    # without EP the experts split like the dense MLP, over TP
    assert params_per_device(MOE, Parallel(tp=2, dp=8))[1] == pytest.approx(48 * 128 * EXPERT / 2)


def test_zero_shards_dense_state_over_dp_cp_and_experts_over_expert_dp() -> None:
    par = Parallel(tp=2, cp=2, dp=4, ep=8)  # 16 non-pipeline ranks: expert DP = 16 / 8 = 2
    assert par.expert_dp == 2 and par.devices == 16
    dense, experts = params_per_device(MOE, par)
    w, g, o = train_state_bytes(MOE, par)
    assert w == pytest.approx(2 * (dense / 8 + experts / 2))  # dense over dp * cp = 8
    assert o == pytest.approx(12 * (dense / 8 + experts / 2))
    w1, g1, o1 = train_state_bytes(MOE, replace(par, zero=1))
    assert w1 == pytest.approx(2 * (dense + experts)) and o1 == pytest.approx(o)


def test_context_parallelism_divides_activations() -> None:
    m = M["Llama-3-8B"]
    one = train_memory(m, Parallel(), 32768).activations
    assert train_memory(m, Parallel(cp=4), 32768).activations == pytest.approx(one / 4)


def test_expert_tokens_grow_with_the_ep_group() -> None:
    # a rank's 16,384 tokens, TP 2 x CP 2 split them: an EP-8 group holds 8 ranks' shares,
    # 16,384 * 8 / 4 tokens, of which an expert gets k / E = 8 / 128
    assert expert_tokens(MOE, Parallel(tp=2, cp=2, dp=32, ep=8), 16384) == pytest.approx(2048)
    assert expert_tokens(MOE, Parallel(tp=2, cp=2, dp=32), 16384) == pytest.approx(512)


def test_all_to_all_moves_each_ranks_routed_copies() -> None:
    link = Link(alpha_s=1e-6, gbs=100.0, base_s=5e-6)
    # 1,000 tokens x 8 copies x 2,048 x 2 bytes = 32.768 MB; pairwise over 8 ranks sends 7/8
    one = 5e-6 + 7 * 1e-6 + 7 / 8 * 32.768e6 / 100e9
    assert ep_all_to_all(MOE, Parallel(dp=8, ep=8), 1000, link) == pytest.approx(2 * one)
    assert ep_all_to_all(MOE, Parallel(dp=8), 1000, link) == 0.0  # no EP: no all-to-all


def test_decode_with_ep_pays_every_calls_latency_at_batch_one() -> None:
    par = Parallel(tp=8, ep=8)
    calls = (2 * 48 - 48) + 2 * 48  # attention all-reduces + dispatch and combine per MoE layer
    assert decode_comm(MOE, H100, par, 1, EFF) >= calls * EFF.coll_base_s
    assert decode_comm(MOE, H100, Parallel(tp=8), 1, EFF) >= 2 * 48 * EFF.coll_base_s


def test_moe_compute_uses_experts_per_token() -> None:
    ideal = replace(EFF, gemm_half_ridge=0.0)
    t = pass_compute(MOE, H100, Parallel(), 1e6, 0, 6, 1.0, 1e6, ideal)
    assert t == pytest.approx(train_flops(MOE, 1e6, 0, False) / 989e12)
    assert train_flops(MOE, 1, 0, False) == pytest.approx(6 * MOE.matmul_params())


def test_zero3_gathers_by_hand_and_ep_shrinks_them() -> None:
    par = Parallel(dp=16)  # 16 ranks: the NIC, 50 GB/s x 0.8, 2.7 us a hop, 6.6 us a call
    P = MOE.params()
    # one FSDP unit per decoder layer plus the root, experts gathered with their layer: per
    # micro-batch gather, gather again, reduce-scatter for each unit, less the root's second gather
    units = MOE.layers + 1
    calls = 3 * units - 1
    per_call = 6.6e-6 + 15 * 2.7e-6 + 15 / 16 * 2 * P / units / (40 * GB)
    assert zero3_gathers(MOE, H100, par, 16384, 3, EFF) == pytest.approx(calls * per_call)
    assert zero3_gathers(MOE, H100, replace(par, ep=8), 16384, 3, EFF) < 0.2 * calls * per_call
    assert zero3_gathers(MOE, H100, replace(par, zero=1), 16384, 3, EFF) == 0.0


def test_pipeline_stages_make_kv_room_but_do_not_shorten_a_decode_step() -> None:
    m, dev = M["Llama-3-70B"], D["H200"]
    tp4, pp2 = Parallel(tp=4), Parallel(tp=4, pp=2)
    assert kv_capacity_tokens(m, dev, pp2, EFF) > 2 * kv_capacity_tokens(m, dev, tp4, EFF)
    assert decode_step_time(m, dev, pp2, 8, 800, EFF) > decode_step_time(m, dev, tp4, 8, 800, EFF)


def test_device_counts_are_not_only_powers_of_two() -> None:
    assert device_counts(16, 8) == [1, 2, 3, 4, 5, 6, 7, 8, 16]
    assert {3, 6, 24} <= set(device_counts(24, 8))


def _job(model: str, pools: list[dict], cap: int = 4096) -> dict:
    return {"name": "t", "algorithm": "grpo",
            "models": {"policy": model, "reward": "rule", "use_reference": False},
            "batch": {"prompts": 32, "samples_per_prompt": 4, "mini_batches": 2},
            "lengths": {"prompt": {"kind": "fixed", "value": 256},
                        "response": {"kind": "lognormal", "median": 512, "sigma": 0.5,
                                     "cap": cap}},
            "cluster": {"pools": pools + [{"name": "cpu", "device": "cpu-node",
                                           "devices_per_node": 1, "nodes": 1}]}}


def test_llama2_70b_engines_span_l4_nodes_of_four() -> None:
    res = resolve(job_from_dict(_job("Llama-2-70B", [
        {"name": "l4", "device": "L4", "devices_per_node": 4, "nodes": 8}]), "t"))
    cands = role_candidates(Pricer(res, Calibration()), "rollout", res.cluster.pool("l4"))
    assert cands, "138 GB of weights fit two or more L4 nodes"
    assert all(c.est.par.pp >= 2 and c.est.par.tp == 4 for c in cands)


def test_long_sequences_and_moe_get_cp_and_ep_candidates() -> None:
    res = resolve(job_from_dict(_job("Qwen3-30B-A3B", [
        {"name": "h100", "device": "H100-SXM", "devices_per_node": 8, "nodes": 2}],
        cap=32768), "t"))
    pars = layouts(Pricer(res, Calibration()), "actor", res.cluster.pool("h100"))
    assert any(p.cp > 1 for p in pars) and any(p.ep > 1 for p in pars)
    assert all((p.tp * p.cp * p.dp) % (p.ep * p.etp) == 0 for p in pars)


def test_deepseek_v3_plans_on_h100_nodes() -> None:
    res = resolve(job_from_dict(_job("DeepSeek-V3", [
        {"name": "h100", "device": "H100-SXM", "devices_per_node": 8, "nodes": 48}]), "t"))
    plan = plan_job(Pricer(res, Calibration()), time_limit_s=5)
    r, a = plan.roles["rollout"], plan.roles["actor"]
    assert r.tp * r.pp > 8  # 1.34 TB of BF16 weights: an engine spans nodes
    # the 671B state is split over a model-parallel group of 64+ devices. Whether that group
    # uses EP is a near tie at this 128-sample batch: with the LM head pacing the last pipeline
    # stage (`placer.cost.stages`) TP8 PP16 EP1 and EP8 price 10.93 and 10.95 s (score + train)
    # against TP4 PP16 DP2 EP8's 11.07 s, so the planner's EP pick is not asserted (moved with
    # that change; EP8 won by 0.1 s before it)
    assert a.tp * a.pp >= 64


def test_moe_example_chooses_expert_parallelism() -> None:
    res = resolve(load_job(ROOT / "examples" / "grpo-qwen3-30b-a3b.yaml"))
    plan = plan_job(Pricer(res, Calibration()), time_limit_s=5)
    assert plan.roles["actor"].ep > 1
    assert plan.roles["actor"].par.ep == plan.roles["actor"].ep


def test_plans_without_the_new_keys_still_read() -> None:
    old = RolePlacement(pool="g", devices=8, tp=2, pp=1, dp=4, slot="a")
    assert (old.cp, old.ep, old.etp) == (1, 1, 1) and old.par == Parallel(tp=2, dp=4)
    new = RolePlacement(pool="g", devices=16, tp=2, dp=8, ep=8, slot="a")
    assert new.par.ep == 8 and new.model_dump()["ep"] == 8


@pytest.mark.parametrize("name", sorted(n for n, m in M.items() if m.params_b is not None))
def test_every_catalog_model_plans(name: str) -> None:
    # H200 nodes enough to train it at ~60% of their memory (16 bytes a parameter)
    nodes = max(2, -(-int(M[name].params() * 16) // int(141e9 * 0.6 * 8)))
    res = resolve(job_from_dict(_job(name, [
        {"name": "h200", "device": "H200", "devices_per_node": 8, "nodes": nodes}]), "t"))
    plan = plan_job(Pricer(res, Calibration()), time_limit_s=5)
    assert plan.predicted_iteration_s > 0 and {"actor", "rollout"} <= set(plan.roles)
    # a sync plan's iteration is its stages in sequence
    assert plan.mode == "sync"
    assert plan.predicted_iteration_s == pytest.approx(sum(plan.breakdown.stage_s.values()),
                                                       rel=1e-9)
    # closed-form floor of the actor's update: 6 * P_mm FLOPs per trained token (attention's
    # FLOPs left out) at the GEMM ceiling mfu_train of the BF16 peak, which no pass exceeds
    actor, h200 = plan.roles["actor"], D["H200"]
    tokens = res.job.batch.samples * trained_context(res)
    floor = 6 * M[name].matmul_params() * tokens / (
        actor.devices * h200.bf16_tflops * 1e12 * EFF.mfu_train)
    assert actor.stage_s["train"] >= floor, (actor.stage_s, floor)
    assert plan.breakdown.stage_s["train"] >= actor.stage_s["train"]
    # every role fits its devices' memory
    assert all(r.memory_gb <= h200.memory_gb for r in plan.roles.values() if r.pool == "h200")


def test_fp8_rollout_halves_weight_and_kv_bytes() -> None:
    m, dev = M["Llama-3-70B"], D["H200"]
    bf16, fp8 = Parallel(tp=4), Parallel(tp=4, fp8_weights=True, fp8_kv=True)
    assert infer_weights(m, fp8, dev) == pytest.approx(infer_weights(m, bf16, dev) / 2)
    # KV room: (141 * 0.9 - w/2 - 2) vs (141 * 0.9 - w - 2) GB, each at half the bytes a token
    w = infer_weights(m, bf16, dev)
    ratio = 2 * (141 * 0.9 - w / 2 - 2) / (141 * 0.9 - w - 2)
    assert kv_capacity_tokens(m, dev, fp8, EFF) == pytest.approx(
        ratio * kv_capacity_tokens(m, dev, bf16, EFF))
    # a memory-bound decode step reads half the bytes (its fixed overheads stay)
    assert decode_step_time(m, dev, fp8, 8, 800, EFF) < 0.7 * decode_step_time(
        m, dev, bf16, 8, 800, EFF)


def test_fp8_training_runs_gemms_at_the_fp8_peak() -> None:
    ideal = replace(EFF, gemm_half_ridge=0.0)
    m = M["Llama-3-8B"]
    bf16 = pass_compute(m, H100, Parallel(), 1e6, 0, 6, 1.0, 1e6, ideal)
    fp8 = pass_compute(m, H100, Parallel(fp8_train=True), 1e6, 0, 6, 1.0, 1e6, ideal)
    assert fp8 == pytest.approx(bf16 * 989 / 1979)
    a100 = D["A100-80G"]  # no FP8 tensor cores: the option does not apply
    assert pass_compute(m, a100, Parallel(fp8_train=True), 1e6, 0, 6, 1.0, 1e6, ideal) == \
        pass_compute(m, a100, Parallel(), 1e6, 0, 6, 1.0, 1e6, ideal)


def test_job_precision_reaches_the_plan() -> None:
    job = _job("Qwen3-8B", [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8,
                             "nodes": 1},
                            {"name": "a100", "device": "A100-80G", "devices_per_node": 8,
                             "nodes": 1}])
    job["precision"] = {"rollout_weights": "fp8", "kv_cache": "fp8", "training": "fp8"}
    res = resolve(job_from_dict(job, "t"))
    plan = plan_job(Pricer(res, Calibration()), time_limit_s=5)
    for name, r in plan.roles.items():
        fp8 = D["H100-SXM" if r.pool == "h100" else "A100-80G"].fp8_tflops is not None
        if name == "rollout":
            assert r.fp8_weights == r.fp8_kv == fp8 and r.par.fp8_weights == fp8
        if name == "actor":
            assert r.fp8_train == fp8
    with pytest.raises(SpecError, match="precision"):
        job_from_dict({**job, "precision": {"training": "fp4"}}, "t")


def infer_weights(m, par: Parallel, dev) -> float:
    return infer_memory(m, par, dev, EFF).weights
