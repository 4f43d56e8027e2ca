"""The cost model against hand-computed cases, public figures and monotonicity."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from placer.base.errors import SpecError
from placer.cost.batching import step_terms
from placer.cost.calibration import calibration_from_dict
from placer.cost.efficiency import Efficiency
from placer.cost.estimate import pass_dispatch
from placer.cost.flash import prefill_kernel_time
from placer.cost.generation import (
    attention_floor,
    decode_run_time,
    decode_step_line,
    decode_step_time,
    forward_time,
    kv_capacity_tokens,
    lpu_chips,
    max_concurrency,
    prefill_line,
    prefill_time,
)
from placer.cost.layercomm import fsdp_calls, fsdp_units, weight_gather_time
from placer.cost.model import (
    dispatch_time,
    engine_swap_time,
    offload_time,
    score_time,
    switch_time,
    tool_waves,
    train_flops,
    train_memory,
    train_time,
    weight_sync_time,
)
from placer.cost.optpark import park_time
from placer.cost.pricer import Pricer
from placer.cost.roofline import (
    GB,
    Memory,
    decode_read_bytes,
    infer_memory,
    kv_bytes_per_token,
    weight_bytes,
    weight_tensors,
)
from placer.cost.sharding import Parallel
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.load import job_from_dict

DEV = shipped_devices()
M = shipped_models()
H100, LPU, CPU = DEV["H100-SXM"], DEV["groq-lpu"], DEV["cpu-node"]
EFF = Efficiency()
# No overheads, full bandwidth and FLOP/s: the bare first-principles formulas.
IDEAL = replace(EFF, mfu_train=1.0, mfu_prefill=1.0, decode_bw_eff=1.0, decode_flops_eff=1.0,
                link_eff=1.0, tp_link_eff=1.0, tp_base_s=0.0, prefill_half_ridge=0.0,
                step_overhead_s=0.0, train_overhead_s=0.0, gemm_half_ridge=0.0,
                decode_tp_bw_loss=0.0, decode_bw_half_batch=0.0, step_overhead_per_seq_s=0.0,
                coll_base_s=0.0, nvlink_hop_s=0.0, net_hop_s=0.0, nongemm_bytes_per_flop=0.0,
                tp_hop_s=0.0, p2p_net_s=0.0,
                fused_moe_block_n=0.0, attn_kernel_s=0.0, attn_split_s=0.0)


# -------------------------------------------------------------------------------------- memory
def test_bf16_weights_are_two_bytes_per_parameter() -> None:
    for m in M.values():
        assert weight_bytes(m) == 2 * m.params()
    # "7B in bf16 is 14 GB": Llama-2-7B has 6.74B parameters -> 13.48 GB
    assert weight_bytes(M["Llama-2-7B"]) / GB == pytest.approx(13.48, abs=0.01)
    assert infer_memory(M["Llama-2-7B"], Parallel(), H100, EFF).weights == pytest.approx(13.477,
                                                                                          abs=1e-3)
    # tensor parallelism splits the weights
    assert infer_memory(M["Llama-2-7B"], Parallel(tp=4), H100, EFF).weights == pytest.approx(
        13.477 / 4, abs=1e-3)


def test_mixed_precision_adam_is_16_bytes_per_parameter() -> None:
    m = M["Llama-3-8B"]
    mem = train_memory(m, Parallel(zero=0), micro_tokens=0)
    states = mem.weights + mem.grads + mem.optimizer
    assert states * GB == pytest.approx(16 * m.params())
    assert (mem.weights, mem.grads, mem.optimizer) == pytest.approx(
        (2 * m.params() / GB, 2 * m.params() / GB, 12 * m.params() / GB))


@pytest.mark.parametrize("zero, bytes_per_param", [(0, 16), (1, 2 + 2 + 12 / 8),
                                                   (2, 2 + (2 + 12) / 8), (3, 16 / 8)])
def test_zero_stages_shard_the_states(zero: int, bytes_per_param: float) -> None:
    m = M["Llama-3-8B"]
    mem = train_memory(m, Parallel(dp=8, zero=zero), micro_tokens=0)
    assert (mem.weights + mem.grads + mem.optimizer) * GB == pytest.approx(
        bytes_per_param * m.params())


def test_optimizer_offload_leaves_weights_and_grads() -> None:
    m = M["Llama-3-8B"]
    mem = train_memory(m, Parallel(offload=True, zero=0), micro_tokens=0)
    assert mem.optimizer == 0 and (mem.weights + mem.grads) * GB == pytest.approx(4 * m.params())


def test_an_offloaded_optimizer_is_copied_or_stepped_on_the_host() -> None:
    # 8B parameters, ZeRO-1 over dp 2 with TP 4: 1/8 of them per rank
    m, par = M["Llama-3-8B"], Parallel(tp=4, dp=2, zero=1, offload=True)
    p = m.params() / 8
    # no host rate in the profile (the shared default): only the copies, 8 bytes a parameter of
    # fp32 gradient down and parameter back (the moments stay on the host)
    assert offload_time(m, H100, par, EFF) == pytest.approx(8 * p / (EFF.offload_gbs * GB))
    # stepped on the host (Megatron's HybridDeviceOptimizer): its parameters at the host's rate,
    # the 8 bytes each of gradient down and parameter back hidden under it ...
    host = replace(EFF, host_adam_gparams_s=0.13)
    assert offload_time(m, H100, par, host) == pytest.approx(p / 0.13e9)
    # ... unless the copies are the slower side
    fast = replace(EFF, host_adam_gparams_s=1e3)
    assert offload_time(m, H100, par, fast) == pytest.approx(8 * p / (EFF.offload_gbs * GB))
    # no offload, or a device whose memory is the host's: nothing
    assert offload_time(m, H100, replace(par, offload=False), host) == 0.0
    assert offload_time(m, CPU, par, host) == 0.0
    # the update carries it once per optimizer step
    kw = dict(tokens=4096.0 * 64, seq=4096.0, steps=2)
    assert (train_time(m, H100, par, eff=host, **kw) - train_time(m, H100, par, eff=EFF, **kw)
            == pytest.approx(2 * (p / 0.13e9 - 8 * p / (EFF.offload_gbs * GB))))


def test_activation_memory_per_token() -> None:
    m = M["Llama-3-8B"]
    h, L, T = m.hidden, m.layers, 4096
    full = train_memory(m, Parallel(recompute=False), micro_tokens=T).activations
    assert full * GB == pytest.approx(34 * h * L * T)  # Korthikanti et al., flash attention
    rec = train_memory(m, Parallel(recompute=True), micro_tokens=T).activations
    assert rec * GB == pytest.approx(2 * h * L * T + 34 * h * T)  # inputs + one live layer
    tp4 = train_memory(m, Parallel(tp=4, recompute=False), T).activations
    assert tp4 == pytest.approx(full / 4)


def test_kv_bytes_per_token() -> None:
    assert kv_bytes_per_token(M["Llama-3-8B"]) == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token(M["Llama-2-7B"]) == 2 * 32 * 32 * 128 * 2  # no GQA
    assert kv_bytes_per_token(M["Qwen2.5-7B"]) == 2 * 28 * 4 * 128 * 2


def test_kv_capacity_is_the_memory_left_after_weights() -> None:
    m = M["Llama-3-8B"]
    free_gb = 80 * EFF.kv_mem_fraction - weight_bytes(m) / GB - EFF.engine_mem_gb
    assert kv_capacity_tokens(m, H100, Parallel(), EFF) == pytest.approx(free_gb * GB / 131072)


def test_max_concurrency_falls_with_context() -> None:
    m = M["Llama-3-8B"]
    conc = [max_concurrency(m, H100, Parallel(), ctx, EFF) for ctx in (1024, 4096, 16384, 65536)]
    assert conc == sorted(conc, reverse=True) and conc[0] > conc[-1]
    cap = kv_capacity_tokens(m, H100, Parallel(), EFF)
    assert conc[1] == int(cap // 4096)
    # more tensor parallelism frees memory for KV
    assert max_concurrency(m, H100, Parallel(tp=2), 4096, EFF) > conc[1]
    # a model that fills the device leaves no room
    assert max_concurrency(M["Llama-3-70B"], H100, Parallel(), 1024, EFF) == 0


# ------------------------------------------------------------------------------------ training
def test_training_flops_rule_of_thumb() -> None:
    m = M["Llama-3-8B"]
    # FLOPs count the matrices a token multiplies by: all but the input embedding (a gather)
    P = m.matmul_params()
    assert P == m.params() - 128256 * 4096
    assert train_flops(m, 1000, seq=0, recompute=False) == pytest.approx(6 * P * 1000)
    # recomputation re-runs the decoder layers, not the LM head (V x h, 6 passes either way)
    head = 128256 * 4096
    assert train_flops(m, 1000, seq=0, recompute=True) == pytest.approx(
        (8 * (P - head) + 6 * head) * 1000)
    attn = train_flops(m, 1, 2048, False) - train_flops(m, 1, 0, False)
    # causal: half of PaLM's full-matrix 12*L*h*s (a token sees s/2 keys on average)
    assert attn == pytest.approx(6 * m.layers * m.hidden * 2048)


@pytest.mark.parametrize("recompute, k", [(False, 6), (True, 8)])
def test_training_time_is_flops_over_peak_times_mfu(recompute: bool, k: int) -> None:
    m, tokens = M["Llama-3-8B"], 2e6
    t = train_time(m, H100, Parallel(recompute=recompute), tokens, seq=0, steps=1, eff=EFF)
    # a 16,384-token micro-batch per device, H100 ridge 989e12 / 3.35e12 = 295 FLOP per byte;
    # the ceiling with the memory-bound kernels: 1 / (1/0.86 + 0.0045 * 295.2) = 0.4014
    mfu = 0.40140 * 16384 / (16384 + 989 / 3.35)
    head = m.vocab * m.hidden  # the LM head: 6 passes, recomputed or not
    flops = (k * (m.matmul_params() - head) + 6 * head) * tokens
    expect = flops / (989e12 * mfu) + EFF.train_overhead_s
    assert t == pytest.approx(expect, rel=2e-4)


def test_data_parallel_training_adds_a_ring_all_reduce() -> None:
    m, tokens = M["Llama-3-8B"], 2e6
    t = train_time(m, H100, Parallel(dp=8, recompute=False), tokens, seq=0, steps=2, eff=IDEAL)
    compute = 6 * m.matmul_params() * tokens / (8 * 989e12)
    allreduce = 2 * 7 / 8 * 2 * m.params() / (450 * GB)  # every gradient, over NVLink
    # ZeRO-3: each 16,384-token micro-batch (2e6 / 8 / 16,384 = 15.26 of them) gathers the
    # weights twice and reduce-scatters the grads once, one call per FSDP unit of 7/8 of its
    # 2P / units bytes over NVLink; the root's backward gather is skipped (kept gathered)
    units = fsdp_units(m)
    gathers = fsdp_calls(m, 3) * (2e6 / 8 / 16384) * 7 / 8 * 2 * m.params() / units / (450 * GB)
    assert t == pytest.approx(compute + 2 * allreduce + gathers)
    zero1 = train_time(m, H100, Parallel(dp=8, zero=1, recompute=False), tokens, 0, 2, IDEAL)
    assert zero1 == pytest.approx(compute + 2 * allreduce)


def test_pipeline_adds_a_bubble() -> None:
    m, tokens = M["Llama-3-8B"], 2e6
    t1 = train_time(m, H100, Parallel(pp=1, dp=4), tokens, 0, 1, IDEAL)
    t4 = train_time(m, H100, Parallel(pp=4, dp=1), tokens, 0, 1, IDEAL)
    head = m.vocab * m.hidden  # 6 passes: recomputation re-runs the layers, not the head
    compute = (8 * (m.matmul_params() - head) + 6 * head) * tokens / (4 * 989e12)
    # each micro-batch's hidden state crosses the 3 stage boundaries once per pass (3 passes
    # with recomputation): 2e6 tokens * h * 2 bytes over NVLink, 9 times
    sends = 9 * tokens * m.hidden * 2 / (450 * GB)
    # the LM head (vocab x hidden) runs on the last stage only, which paces the pipeline: pp - 1
    # more heads' FLOPs than the even spread (`placer.cost.stages`; moved with that change)
    stage = 3 * 6 * head * tokens / (4 * 989e12)
    assert t4 == pytest.approx((compute + stage) * (1 + 3 / 16) + sends)  # bubble (pp-1)/m, m = 4*pp
    assert t1 > compute  # dp pays its all-reduce instead


# ------------------------------------------------------------------------------------- forward
def test_forward_is_two_flops_per_parameter_per_token() -> None:
    m, tokens = M["Llama-3-8B"], 1e5
    t = forward_time(m, H100, Parallel(), tokens, seq=0, eff=IDEAL)
    # plus the attention kernel's diagonal key tiles, which seq 0 still computes
    attention = prefill_kernel_time(m, H100, Parallel(), tokens, 0.0, IDEAL)
    assert t == pytest.approx(2 * m.matmul_params() * tokens / 989e12 + attention)
    assert prefill_time(m, H100, Parallel(dp=4), tokens, 0, IDEAL) == pytest.approx(t)  # 1 replica


# ------------------------------------------------------------------------------------- decode
def test_decode_at_batch_one_reads_the_weights() -> None:
    m = M["Llama-3-8B"]
    # every matrix but the input embedding table, of which a step gathers one row
    read = weight_bytes(m) - 2 * 128256 * 4096
    assert decode_read_bytes(m, 1) == decode_read_bytes(m, 256) == read
    t = decode_step_time(m, H100, Parallel(), 1, 0, EFF)
    bw_eff = EFF.decode_bw_eff / (1 + EFF.decode_bw_half_batch)  # batch 1: GEMV, less efficient
    assert t == pytest.approx(read / (3350 * GB * bw_eff) + EFF.step_overhead_s
                              + EFF.step_overhead_per_seq_s
                              + attention_floor(m, H100, Parallel(), 1, EFF))
    assert decode_step_time(m, H100, Parallel(), 1, 0, IDEAL) == pytest.approx(
        read / (3350 * GB))  # ~4.5 ms
    # the KV cache is read as well
    with_kv = decode_step_time(m, H100, Parallel(), 1, 8192, IDEAL)
    assert with_kv == pytest.approx((read + 8192 * 131072) / (3350 * GB))


def test_eager_engines_pay_a_launch_overhead_per_layer() -> None:
    m = M["Qwen3-30B-A3B"]
    graphs, eager = Parallel(tp=4), Parallel(tp=4, cuda_graphs=False)
    # 48 layers of 18 launches at 0.34 ms per dense layer's 10 = 29.4 ms a step, whatever the
    # batch or context (placer/cost/kernels.py)
    for batch, ctx in ((1, 0), (256, 256 * 2000)):
        gap = (decode_step_time(m, H100, eager, batch, ctx, EFF)
               - decode_step_time(m, H100, graphs, batch, ctx, EFF))
        assert gap == pytest.approx(48 * 18 / 10 * 3.4e-4)
    # the rollout tail's per-replica step terms keep the whole layout (not just TP and PP)
    st = step_terms(m, H100, replace(eager, dp=8), EFF)
    assert st.par == replace(eager, dp=1)
    assert st.step(4, 0) == pytest.approx(decode_step_time(m, H100, eager, 4, 0, EFF))


def test_large_batches_become_compute_bound() -> None:
    m = M["Llama-3-8B"]
    t = decode_step_time(m, H100, Parallel(), 4096, 0, IDEAL)
    assert t == pytest.approx(2 * m.matmul_params() * 4096 / (989e12))


@pytest.mark.parametrize("batch, ctx0, steps", [(1, 100, 300), (256, 0, 500), (512, 2000, 200),
                                                (2048, 0, 50), (64, 10, 1)])
def test_decode_run_is_the_exact_sum_of_its_steps(batch: int, ctx0: float, steps: int) -> None:
    m = M["Llama-3-8B"]
    brute = sum(decode_step_time(m, H100, Parallel(), batch, batch * (ctx0 + i), EFF)
                for i in range(steps))
    assert decode_run_time(m, H100, Parallel(), batch, ctx0, steps, EFF) == pytest.approx(
        brute, rel=1e-9)


# ------------------------------------------------------------------------------------------ LPU
def test_lpu_chips_hold_the_weights_in_sram() -> None:
    for name, chips in (("Llama-2-70B", 660), ("Llama-3-8B", 77), ("Llama-2-7B", 65)):
        m = M[name]
        assert lpu_chips(m, LPU, EFF) == chips == math.ceil(
            weight_bytes(m) * (1 + EFF.lpu_kv_reserve) / 230e6)


@pytest.mark.parametrize("model, tokens_per_s", [("Llama-2-70B", 300), ("Llama-2-7B", 750)])
def test_lpu_batch_one_decode_matches_groqs_public_figures(model: str, tokens_per_s: float) -> None:
    t = decode_step_time(M[model], LPU, Parallel(), 1, 0, EFF)
    assert 1 / t == pytest.approx(tokens_per_s, rel=0.05)


# ---------------------------------------------------------------------------- environment, sync
@pytest.mark.parametrize("calls, cpu, cores, waves", [(100, 1, 64, 2), (64, 1, 64, 1),
                                                     (10, 2, 3, 10), (10, 0.5, 4, 2),
                                                     (0, 1, 4, 0), (5, 8, 4, 5)])
def test_tool_waves(calls: int, cpu: float, cores: int, waves: int) -> None:
    assert tool_waves(calls, cpu, cores) == waves


def test_weight_sync_time() -> None:
    m = M["Llama-3-8B"]
    t = weight_sync_time(m, 50.0, H100, EFF)
    assert t == pytest.approx(weight_bytes(m) / (50 * GB * EFF.link_eff) + EFF.sync_latency_s)
    assert weight_sync_time(m, 50.0, LPU, EFF) == pytest.approx(t + EFF.lpu_reload_s)
    assert weight_sync_time(m, 100.0, H100, EFF) < t


def test_switch_time_copies_weights_and_optimizer_out_and_back() -> None:
    # 10 GB weights + 30 GB optimizer, out and back: 80 GB of copies at offload_gbs; gradients,
    # activations, KV and overhead are freed or stay, never copied (written out, not re-run)
    mem = Memory(weights=10.0, grads=10.0, optimizer=30.0, activations=7.0, kv_cache=3.0,
                 overhead=2.0)
    assert switch_time(mem, EFF) == pytest.approx(80.0 / EFF.offload_gbs)
    # one price per GB for every move off a slot: the switch, the engine's sleep and wake and a
    # parked optimizer are the same round trip
    assert switch_time(mem, EFF) == pytest.approx(park_time(40.0, EFF))
    assert engine_swap_time(10.0, EFF, 1) - EFF.engine_sleep_s - EFF.engine_wake_s == \
        pytest.approx(park_time(10.0, EFF))


def test_engine_swap_moves_weights_both_ways_and_pays_fixed_calls() -> None:
    # a 7B engine at TP4 holds 3.81 GB of weights per device: sleep copies them to the host,
    # wake copies them back (2 x 3.81 / 25 = 0.305 s); the KV pool is never copied
    assert engine_swap_time(3.81, EFF, 1) == pytest.approx(2 * 3.81 / 25.0 + 11.2 + 3.7)
    bare = replace(EFF, engine_sleep_s=0.0, engine_wake_s=0.0, offload_gbs=10.0)
    assert engine_swap_time(5.0, bare, 1) == pytest.approx(1.0)
    # row 12's anchor: Qwen3-0.6B's 1.2 GB one way is 0.048 s, the rest of each call is fixed
    assert EFF.engine_sleep_s + 1.2 / EFF.offload_gbs == pytest.approx(11.23, abs=0.02)
    assert EFF.engine_wake_s + 1.2 / EFF.offload_gbs == pytest.approx(3.77, abs=0.03)


# -------------------------------------------------------------------------------- monotonicity
@pytest.mark.parametrize("model", ["Llama-3-8B", "Qwen2.5-32B", "Llama-3-70B"])
@pytest.mark.parametrize("dev", ["A100-80G", "H100-SXM", "H20", "B200"])
def test_more_devices_never_slower_when_compute_bound(model: str, dev: str) -> None:
    m, d, tokens, seq = M[model], DEV[dev], 4e6, 2048
    # ZeRO-1 (Megatron's distributed optimizer): no per-micro-batch weight gathers, which on a
    # compute-rich part cost more than they save once the group leaves NVLink
    train = [train_time(m, d, Parallel(dp=n, zero=1), tokens, seq, 4, EFF)
             for n in (1, 2, 4, 8, 16, 32, 64)]
    assert all(b <= a for a, b in zip(train, train[1:])), train
    fwd = [forward_time(m, d, Parallel(dp=n), tokens, seq, EFF) for n in (1, 2, 4, 8, 16, 64)]
    assert all(b <= a for a, b in zip(fwd, fwd[1:])), fwd
    tp = [forward_time(m, d, Parallel(tp=n), tokens, seq, EFF) for n in (1, 2, 4, 8)]
    assert all(b <= a for a, b in zip(tp, tp[1:])), tp


# --------------------------------------------------------------------------------- calibration
def test_calibration_overrides_factors_per_device() -> None:
    cal = calibration_from_dict({"default": {"decode_bw_eff": 0.5},
                                 "devices": {"H100-SXM": {"step_overhead_s": 0}}})
    assert cal.for_device(DEV["A100-80G"]).decode_bw_eff == 0.5
    h = cal.for_device(H100)
    assert h.decode_bw_eff == 0.5 and h.step_overhead_s == 0
    m = M["Llama-3-8B"]
    assert decode_step_time(m, H100, Parallel(), 1, 0, h) == pytest.approx(
        decode_read_bytes(m, 1) / (3350 * GB * 0.5 / (1 + h.decode_bw_half_batch))
        + h.step_overhead_per_seq_s + attention_floor(m, H100, Parallel(), 1, h))


@pytest.mark.parametrize("data, field", [({"default": {"mfu_trian": 0.3}}, "mfu_trian"),
                                         ({"default": {"mfu_train": -1}}, "mfu_train"),
                                         ({"default": {"mfu_train": "high"}}, "mfu_train"),
                                         ({"devices": ["H100-SXM"]}, "devices"),
                                         ({"defaults": {}}, "defaults")])
def test_bad_calibration_is_a_spec_error_naming_the_field(data: dict, field: str) -> None:
    with pytest.raises(SpecError, match=field):
        calibration_from_dict(data)


# ------------------------------------------------------------------------------ driver dispatch
def test_dispatch_is_the_padded_batch_over_the_drivers_rate() -> None:
    # verl rows 1-3: 512 x 16 samples padded to 2,048 + 28,672 tokens, 56 bytes per token:
    # 8,192 * 30,720 * 56 = 14.093 GB at 0.4 GB/s = 35.23 s (the published passes' intercept)
    assert dispatch_time(8192, 30720, EFF) == pytest.approx(35.232, abs=1e-3)
    assert dispatch_time(8192, 30720, replace(EFF, dispatch_bytes_per_token=0.0)) == 0.0
    assert dispatch_time(8192, 30720, replace(EFF, dispatch_gbs=0.8)) == pytest.approx(17.616,
                                                                                         abs=1e-3)


def _dispatch_job() -> dict:
    return {"name": "dispatch", "algorithm": "grpo",
            "models": {"policy": "Qwen2.5-7B", "reward": "rule"},
            "batch": {"prompts": 64, "samples_per_prompt": 4, "mini_batches": 2},
            "lengths": {"prompt": {"kind": "fixed", "value": 256},
                        "response": {"kind": "fixed", "value": 768}},
            "cluster": {"pools": [{"name": "g", "device": "H100-SXM", "devices_per_node": 8,
                                   "nodes": 2}]}}


@pytest.mark.parametrize("dp", [4, 16])
def test_every_trainer_and_forward_pass_pays_one_dispatch_whatever_the_devices(dp: int) -> None:
    res = resolve(job_from_dict(_dispatch_job()))
    calib = calibration_from_dict({}, "test")
    pool, m = res.cluster.pool("g"), M["Qwen2.5-7B"]
    # 256 samples padded to 1,024 tokens: 256 * 1,024 * 56 B / 0.4 GB/s = 36.70 ms
    ship = 256 * 1024 * 56 / 0.4e9
    assert pass_dispatch(res, EFF) == pytest.approx(ship, rel=1e-12)
    par = Parallel(dp=dp, zero=3, recompute=True)
    actor = Pricer(res, calib).estimate("actor", pool, par)
    tokens = 256 * 1024.0
    assert actor.stage_s["score"] == pytest.approx(
        score_time(m, H100, par, tokens, 1024, EFF) + ship, rel=1e-9)
    # once, not per step; so is the sharded trainer's weight gather for the sync
    gather = weight_gather_time(m, H100, par, weight_tensors(m), EFF)
    assert gather > 0
    # the update reduces its gradients in fp32, as placer's own FSDP2 loop does (native)
    upar = replace(par, grad_reduce_bytes=4)
    assert actor.stage_s["train"] == pytest.approx(
        train_time(m, H100, upar, tokens, 1024, 2, EFF) + ship + gather, rel=1e-9)
    ref = Pricer(res, calib).estimate("reference", pool, Parallel(dp=dp))
    assert ref.stage_s["score"] == pytest.approx(
        score_time(m, H100, Parallel(dp=dp), tokens, 1024, EFF) + ship, rel=1e-9)


@pytest.mark.parametrize("model,par", [
    (model, par) for model in ("Llama-3-8B", "Qwen3-30B-A3B", "DeepSeek-V3", "Qwen3-Next-80B-A3B")
    for par in (Parallel(tp=8), Parallel(tp=4, cp=2), Parallel(tp=8, ep=8))
    if par.ep == 1 or M[model].moe])  # expert parallelism needs experts
@pytest.mark.parametrize("dev", ["H100-SXM", "groq-lpu"])
def test_step_lines_reproduce_the_step_times_they_stand_for(model: str, dev: str,
                                                           par: Parallel) -> None:
    """The engine loop prices decode steps and prefills from these lines (`batching.StepTerms`):
    they must be the cost model's times at every context, for every architecture."""
    m, d = M[model], DEV[dev]
    eff = Efficiency()
    for batch in (1, 7, 256):
        m0, k, floor = decode_step_line(m, d, par, batch, eff)
        for ctx in (0.0, 1e3 * batch, 3e4 * batch):
            assert max(m0 + k * ctx, floor) == pytest.approx(
                decode_step_time(m, d, par, batch, ctx, eff), rel=1e-12)
    for tokens in (1.0, 900.0, 5e4):
        base, per_ctx = prefill_line(m, d, par, tokens, eff)
        for ctx in (0.0, 512.0, 32768.0):
            assert base + per_ctx * ctx == pytest.approx(
                prefill_time(m, d, par, tokens, ctx, eff), rel=1e-12)
        if dev != "groq-lpu":  # attention grows with the context on a GPU
            assert per_ctx > 0
