"""Sizes and rates the cost model prices work with: the bytes a device holds or reads (weights, KV
cache, the `Memory` record of one device), the FLOPs of a token's attention, and the fraction of
peak a pass's GEMMs reach on a device (a roofline: small passes are bound by reading their
weights, `gemm_eff`; memory-bound kernels cap a pass below its GEMMs, `device_ceiling`).

The layer under `placer.cost.generation` (engine steps) and `placer.cost.model` (training, frozen
passes, environment and sync), which re-exports every name here; the formulas, notation and
sources are in docs/cost-model.md ("Memory per device", "Training").
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import MICRO_TOKENS
from placer.cost.sharding import Parallel, active_expert_params, expert_tokens, params_per_device
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceKind, DeviceType

GB = 1e9
BYTES = 2  # BF16


@dataclass(frozen=True)
class Memory:
    weights: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    kv_cache: float = 0.0
    overhead: float = 0.0

    @property
    def total(self) -> float:
        return (self.weights + self.grads + self.optimizer + self.activations + self.kv_cache
                + self.overhead)


def weight_bytes(m: ModelArch) -> float:
    """BF16 bytes of every parameter (all experts, both embedding tables unless tied): what a
    device holds and a weight sync moves."""
    return m.params() * BYTES


def decode_read_bytes(m: ModelArch, batch: float) -> float:
    """BF16 bytes one decode step of `batch` sequences reads: `ModelArch.decode_read_params`
    (the matmul weights, with the MoE experts the batch is expected to hit, not all of them;
    not the input embedding table, of which a step gathers one row per sequence)."""
    return m.decode_read_params(batch) * BYTES


def kv_bytes_per_token(m: ModelArch) -> float:
    """KV-cache bytes per token of one replica: `ModelArch.kv_elements_per_token` * b."""
    return m.kv_elements_per_token() * BYTES


def kv_split(m: ModelArch, par: Parallel) -> int:
    """Devices of a replica that each hold a distinct part of the KV cache: pp stages times
    the ways TP splits it (`ModelArch.kv_tp_shards`: KV heads, or 1 for a latent cache), times
    the data-parallel attention groups (`Parallel.attn_dp`), each holding its own sequences'."""
    return par.attn_dp * par.pp * m.kv_tp_shards(par.attn_tp)

def attention_flops_per_token(m: ModelArch, seq: float) -> float:
    """Forward attention-score FLOPs per token of a causal sequence of `seq` tokens: QK^T and
    AV over the keys before it, 2 * 2 * L * w per key, and a causal token sees seq / 2 keys on
    average, so 2 * L * w * seq (half of the full-matrix 4 * L * w * s of Narayanan et al.),
    L the full-attention layers; a hybrid's GDN layers add their state update and readout
    (`ModelArch.linear_flops_per_token`), the same for every token whatever `seq`."""
    return (2 * m.full_attention_layers * m.attention_width() * seq
            + m.linear_flops_per_token())


def chunk_seq(span: float, new: float) -> float:
    """The causal sequence length whose `attention_flops_per_token` prices a prefill chunk of
    `new` tokens whose attention span after the prefill is `span` (span - new cached tokens):
    each new token sees the cache and on average half the chunk, span - new / 2 keys, where a
    causal sequence of `seq` tokens sees seq / 2; so seq = 2 * span - new (pricing it at `span`
    would count the cache at half its keys). Linear, so it holds for means over sequences."""
    return 2.0 * span - new


# The share of its datasheet BF16 peak a device's matmuls can reach at best (MAMF / peak) on the
# devices the GEMM ceilings (`mfu_*`, `decode_flops_eff`) were measured on: the H100-SXM's, 794.5 of
# 989 TFLOP/s (stas00/ml-engineering @744d01e18b79512572f64a6bbd8b5f4a725203a7,
# compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", BF16), the
# lower of the two devices of the operator fits (A100 SXM: 271.2 of 312, 0.869). H20 rows fix
# some factors too; the table has no H20, so its ratio is not known and it is not derated.
REFERENCE_MATMUL_FRACTION = 794.5 / 989.0


def runs_fp8(dev: DeviceType, par: Parallel) -> bool:
    """Whether the layout's GEMMs run in FP8: FP8 weights (inference) or FP8 training GEMMs on
    a device with FP8 tensor cores."""
    return (par.fp8_weights or par.fp8_train) and dev.fp8_tflops is not None


def matmul_derate(dev: DeviceType, par: Parallel | None = None) -> float:
    """How much lower a device's BF16 GEMM ceiling is than the fitted factors say: its measured
    best matmul share of peak (`DeviceType.matmul_tflops` / `bf16_tflops`) over the share of the
    devices the factors were measured on (`REFERENCE_MATMUL_FRACTION`), at most 1. The factors
    were measured on devices spanning 0.80 (H100) to 0.87 (A100) of peak without telling them
    apart, so a device within or above that span is priced as they are; only one below it
    (B200 0.776, GB200 0.729 in the same table) runs its GEMMs proportionally slower. 1 for a
    device without a measured figure, and for FP8 GEMMs (`runs_fp8`): the same table's FP8
    shares put B200 and GB200 (0.763, 0.723) above the H100's (0.709)."""
    if dev.matmul_tflops is None or (par is not None and runs_fp8(dev, par)):
        return 1.0
    return min(1.0, dev.matmul_tflops / dev.bf16_tflops / REFERENCE_MATMUL_FRACTION)


def device_ceiling(ceiling: float, dev: DeviceType, eff: Efficiency,
                   par: Parallel | None = None) -> float:
    """A pass's achievable fraction of peak on `dev`: its GEMMs at `ceiling` (lowered by
    `matmul_derate` on a device whose matmuls reach less of their peak than the devices it was
    measured on) plus the memory-bound kernels' `nongemm_bytes_per_flop` bytes per FLOP at HBM
    bandwidth, 1 / (1/ceiling + nongemm * peak / bandwidth). A compute-poor, bandwidth-rich
    part (H20) keeps more of its peak than a compute-rich one (H100, B200). `par`: the layout,
    whose FP8 GEMMs are not derated (none: BF16)."""
    ridge = dev.bf16_tflops * 1e12 / (dev.mem_bw_gbs * GB)
    gemm = ceiling * matmul_derate(dev, par)
    return 1.0 / (1.0 / gemm + eff.nongemm_bytes_per_flop * ridge)


def gemm_eff(ceiling: float, tokens_per_device: float, dev: DeviceType, eff: Efficiency,
             half_ridge: float | None = None) -> float:
    """Achieved fraction of peak of a pass over `tokens_per_device` tokens per device (one
    micro-batch at most, `MICRO_TOKENS`): ceiling * t / (t + t_half), t_half =
    half_ridge * peak / bandwidth (the ridge point in FLOP per byte, which is where a GEMM
    over t tokens stops being bound by reading its weights); `half_ridge` is
    `gemm_half_ridge` unless the pass has its own (an engine's forward: `prefill_half_ridge`)."""
    t = min(max(tokens_per_device, 0.0), MICRO_TOKENS)
    ridges = eff.gemm_half_ridge if half_ridge is None else half_ridge
    half = ridges * dev.bf16_tflops * 1e12 / (dev.mem_bw_gbs * GB)
    return ceiling * t / (t + half) if t > 0 else ceiling


def matmul_time(flops: float, tokens_per_device: float, dev: DeviceType, par: Parallel,
                ceiling: float, eff: Efficiency, half_ridge: float | None = None) -> float:
    """Seconds of `flops` GEMM FLOPs spread over the layout's devices, at `gemm_eff` of the
    tokens one device's GEMMs see: the piece `pass_compute` prices a pass with, and
    workflows/operators.py one layer's linear layers."""
    peak = par.devices * gemm_peak_tflops(dev, par) * 1e12
    return flops / (peak * gemm_eff(ceiling, tokens_per_device, dev, eff, half_ridge))


def gemm_peak_tflops(dev: DeviceType, par: Parallel) -> float:
    """Peak TFLOP/s the layout's GEMMs run at: FP8 when its weights (inference) or its
    training GEMMs are FP8 and the device has FP8 tensor cores, else BF16."""
    if runs_fp8(dev, par) and dev.fp8_tflops is not None:
        return dev.fp8_tflops
    return dev.bf16_tflops


def head_passes(passes: int) -> int:
    """Matmul passes of the LM head in a pass of `passes` over the layers: activation
    recomputation re-runs the decoder layers only, never the output layer (HF
    `gradient_checkpointing_enable` wraps each decoder layer, e.g. transformers' Qwen2Model;
    Megatron's `recompute_granularity` full checkpoints transformer layers, the output layer
    outside them), so a recomputed forward (8 passes) runs the head 6 times, as any training
    pass without recomputation; forward-only passes (2) and 6 are unchanged."""
    return min(passes, 6)


def pass_compute(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
                 passes: int, ceiling: float, group_tokens: float, eff: Efficiency,
                 half_ridge: float | None = None) -> float:
    """Seconds of `passes` matmul passes (2 a forward, 6 forward + backward, 8 with a recomputed
    forward) over `tokens` tokens on the layout's devices: the dense, attention and LM-head
    FLOPs at `gemm_eff` of the tokens a device's GEMMs see (`group_tokens` per dp rank / cp),
    the LM head's `head_passes` of them (a recomputed forward does not repeat it),
    the routed experts' at `gemm_eff` of the tokens one expert sees (`sharding.expert_tokens`):
    small for a mixture of many experts, which expert parallelism raises by gathering an EP
    group's tokens. `half_ridge`: as `gemm_eff`'s. An engine's forward prices its attention
    scores apart (`flash.prefill_kernel_time`) and passes seq = 0."""
    routed = active_expert_params(m)
    # data-parallel attention: a device's dense GEMMs see its own group's share of the tokens
    per_device = group_tokens / (par.cp * par.attn_dp)
    head = m.vocab * m.hidden
    dense = (passes * (m.matmul_params() - routed - head + attention_flops_per_token(m, seq) / 2)
             + head_passes(passes) * head) * tokens
    out = matmul_time(dense, per_device, dev, par, ceiling, eff, half_ridge)
    # a micro-batch per data-parallel attention group, its groups' tokens meeting at the experts
    t = min(group_tokens / par.attn_dp, MICRO_TOKENS) * par.attn_dp
    if routed:
        t_exp = expert_tokens(m, par, t)
        out += matmul_time(passes * routed * tokens, t_exp, dev, par, ceiling, eff, half_ridge)
    return out


def infer_memory(m: ModelArch, par: Parallel, dev: DeviceType, eff: Efficiency) -> Memory:
    """Weights of a frozen model (reference, reward, critic forward, rollout engine)."""
    over = eff.engine_mem_gb if dev.kind is DeviceKind.gpu else 0.0
    return Memory(weights=sum(params_per_device(m, par)) * BYTES * par.weight_scale / GB,
                  overhead=over)


def weight_tensors(m: ModelArch) -> int:
    """Tensors in a checkpoint of `m` (HF layout): what an unbucketed sync sends one call each.

    Per layer: 2 RMSNorms; GQA attention q, k, v, o (+ 3 biases with `qkv_bias`, + q/k norms
    with `qk_norm`) or MLA (q_a, q_a_norm, q_b -- or one q without a q rank -- kv_a, kv_a_norm,
    kv_b, o); a dense SwiGLU MLP (gate, up, down) or an MoE block (router + 3 per routed and
    per shared expert). Plus the embedding, the final norm and the LM head unless tied. A
    hybrid's GDN layers hold 7 mixer tensors in place of attention's (in_proj_qkvz, in_proj_ba,
    conv1d, dt_bias, A_log, norm, out_proj: transformers' Qwen3NextGatedDeltaNet).
    Qwen2.5-7B: 28 x 12 + 3 = 339; Qwen3-30B-A3B: 48 x (8 + 1 + 384) + 3 = 18,867."""
    if m.mla:
        attn = (3 if m.q_lora_rank else 1) + 4
    else:
        attn = 4 + (3 if m.qkv_bias else 0) + (2 if m.qk_norm else 0)
    moe = m.moe_layers
    per_moe = 1 + 3 * (m.experts + m.shared_experts)
    mixers = m.full_attention_layers * attn + m.linear_layers * 7
    return mixers + 2 * m.layers + (m.layers - moe) * 3 + moe * per_moe + (
        2 if m.tie_embeddings else 3)


def engine_load_entries(m: ModelArch) -> int:
    """Entries an engine's `load_weights` walks on every call, whatever it is handed: its
    parameter dict (`dict(self.named_parameters())`: the engine's fused parameters) and, for an
    MoE model, the expert mapping it rebuilds (`get_expert_mapping()`: 3 per routed expert) and
    scans for an expert tensor (vLLM model_executor/models/qwen3_moe.py `load_weights`). An
    unbucketed refresh pays this walk once per tensor (`timing.sync_call_cost`).

    Engine parameters per layer: 2 RMSNorms; GQA attention fused into qkv (+ its bias with
    `qkv_bias`) and o (+ q/k norms with `qk_norm`), MLA as in `weight_tensors`; a dense MLP as
    gate_up and down; an MoE block as router, w13 and w2 (+ gate_up and down per shared expert).
    Plus embedding, final norm and LM head unless tied. Qwen2.5-7B: 28 x 7 + 3 = 199;
    Qwen3-30B-A3B: 48 x 9 + 3 + 384 = 819; Qwen3-235B-A22B: 94 x 9 + 3 + 384 = 1,233."""
    if m.mla:
        attn = (3 if m.q_lora_rank else 1) + 4
    else:
        attn = 2 + (1 if m.qkv_bias else 0) + (2 if m.qk_norm else 0)
    moe = m.moe_layers
    mixers = m.full_attention_layers * attn + m.linear_layers * 7
    params = (mixers + 2 * m.layers + (m.layers - moe) * 2 + moe * (3 + 2 * m.shared_experts)
              + (2 if m.tie_embeddings else 3))
    return params + 3 * m.experts
