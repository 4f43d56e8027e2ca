"""What a decode step's kernels cost beyond their bytes and FLOPs: the fused-MoE grid's occupancy
and an eager engine's kernel launches.

Fused-MoE occupancy. An engine's fused-MoE kernel (vLLM's Triton `fused_moe`; SGLang runs the
same kernel) computes, for every routed expert a step's tokens hit, that expert's slice of the
gate-up GEMM in tiles of BLOCK_N output columns, one thread block (CTA) a tile. A rank holds
w = expert_mlp / expert TP columns of each expert, so a step launches hits x ceil(2w / BLOCK_N)
gate-up tiles on it (hits: the distinct experts hit, `ModelArch.expected_experts`, over the EP
ranks). While that grid is small against the device's SMs, most SMs idle and the weight read
cannot reach the bandwidth a dense GEMV does; as it grows, every SM streams. The fraction of the
dense decode bandwidth the routed experts read at is tiles / (tiles + SMs): a wave model with no
fitted factor. BLOCK_N is the kernel's tile width, 32 in vLLM's default configuration while a
step's tokens are at most the experts (vllm-project/vllm @000d1458,
model_executor/layers/fused_moe/fused_moe.py `get_default_config`); a tuned per-device
configuration file overrides it where one exists (`Efficiency.fused_moe_block_n`).

Eager launches. Without CUDA graphs an engine's host launches every kernel of a decode step
itself, so the host time of a step grows with the kernels its layers launch. `eager_layer_s` was
measured on a dense layer (Qwen2.5-Omni-7B's thinker, a Qwen2 decoder); a layer is priced at
eager_layer_s x its launches / the dense layer's. The launches of a decode step's layer, counted
from vLLM's model code (model_executor/models/qwen2.py, qwen3_moe.py, deepseek_v2.py and
fused_moe/fused_moe.py; collectives are priced apart, `layercomm.decode_comm`):

  attention, GQA   input RMSNorm (fused with the residual add), QKV projection, rotary
                   embedding, KV-cache write, attention, O projection: 6; q and k RMSNorm
                   (Qwen3) +2; an output gate +1
  attention, MLA   input RMSNorm, q_a and kv_a projections, q_a RMSNorm, q_b projection,
                   kv_a RMSNorm, rotary embedding, the W_UK absorption, KV-cache write,
                   attention, the W_UV absorption, O projection: 12 (without a q rank one q
                   projection and no q_a RMSNorm: 10)
  MLP, dense       post-attention RMSNorm, gate-up projection, SiLU-and-mul, down projection: 4
  MLP, MoE         post-attention RMSNorm, router GEMM, top-k, the top-k weights' sum and
                   division (renormalised), block alignment, gate-up GEMM, SiLU-and-mul, down
                   GEMM, the weighted sum over the k experts: 10; shared experts +4 (gate-up,
                   SiLU-and-mul, down, add)

A Qwen2 layer is 10, a Qwen3-MoE layer 18, a DeepSeek-V3 MoE layer 26 (a hybrid's linear-attention
layers are counted as GQA layers: no eager hybrid engine is priced yet). The count treats every
launch alike; the fused-MoE path's Triton launches cost the host more than an ATen op's, so an
MoE layer's share is, if anything, low. No public eager-vs-graph decode measurement of an MoE
model checks the ratio (docs/cost-model.md, "Prefill and decode").
"""
from __future__ import annotations

import math

from placer.cost.efficiency import Efficiency
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceType

# launches of the layer `eager_layer_s` was measured on (a Qwen2 decoder layer: GQA, dense MLP)
DENSE_LAYER_LAUNCHES = 10
GQA_LAUNCHES = 6
QK_NORM_LAUNCHES = 2
OUTPUT_GATE_LAUNCHES = 1
MLA_LAUNCHES = 12
DENSE_MLP_LAUNCHES = 4
MOE_MLP_LAUNCHES = 10
SHARED_EXPERT_LAUNCHES = 4


def expert_read_eff(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                    eff: Efficiency) -> float:
    """Fraction of the dense decode bandwidth at which a step of `batch` sequences reads its
    routed experts: tiles / (tiles + SMs), tiles = hits per rank x ceil(2 w / BLOCK_N) (module
    docstring). 1 for a dense model, a device without an SM count, or BLOCK_N 0."""
    if not m.moe or not m.expert_mlp or not dev.sm_count or eff.fused_moe_block_n <= 0:
        return 1.0
    w = m.expert_mlp / max(par.expert_tp, 1)
    hits = m.expected_experts(max(batch, 1)) / max(par.ep, 1)
    tiles = hits * math.ceil(2 * w / eff.fused_moe_block_n)
    return tiles / (tiles + dev.sm_count)


def layer_launches(m: ModelArch) -> float:
    """Kernels a decode step launches over all of the model's layers (module docstring)."""
    if m.kv_lora_rank is not None:
        attention = MLA_LAUNCHES if m.q_lora_rank is not None else MLA_LAUNCHES - 2
    else:
        attention = (GQA_LAUNCHES + QK_NORM_LAUNCHES * m.qk_norm
                     + OUTPUT_GATE_LAUNCHES * m.attn_output_gate)
    moe_mlp = MOE_MLP_LAUNCHES + SHARED_EXPERT_LAUNCHES * (m.shared_experts > 0)
    moe = m.moe_layers
    return m.layers * attention + (m.layers - moe) * DENSE_MLP_LAUNCHES + moe * moe_mlp


def eager_overhead(m: ModelArch, par: Parallel, eff: Efficiency) -> float:
    """Host time an eager engine (no CUDA graphs) adds to one decode step: eager_layer_s per
    dense layer's worth of launches (`layer_launches` / DENSE_LAYER_LAUNCHES; a token passes
    every layer, whatever the TP or PP split). 0 with CUDA graphs."""
    if par.cuda_graphs:
        return 0.0
    return eff.eager_layer_s * layer_launches(m) / DENSE_LAYER_LAUNCHES
