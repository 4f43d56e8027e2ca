"""The one cost model: memory and time of every role's work on a device type and parallel config.

The ILP, the baselines and the simulator all price work here, so their numbers agree on the same
work. Formulas are first principles plus named efficiency factors (`Efficiency`), each with a
default that a calibration profile overrides per device type.

Notation: P total parameters (`ModelArch.params`: embeddings, GQA or latent attention, SwiGLU
MLP or every expert of a mixture, RMSNorm), the sizes memory, gradients, optimizer state and weight
sync scale with; P_mm the parameters one token multiplies by (`ModelArch.matmul_params`: only the
experts it is routed to plus the shared ones, and no input embedding, which is a gather of one row
per token; = P - V*h for a dense model with untied embeddings), the size FLOPs scale with; L
layers, h hidden, w attention width (`ModelArch.attention_width`, heads * (d_qk + d_v) / 2: h for
standard heads), s context, b = 2 bytes per element (BF16), T tokens, n = tp*pp devices of one
replica. GB = 1e9 bytes, TFLOP/s = 1e12 FLOP/s.

Memory (per device):
  weights          P*b / n                                              (frozen / inference roles)
  training states  16 bytes/param for mixed-precision Adam: bf16 weights 2 + bf16 grads 2 + fp32
                   master 4 + Adam m 4 + v 4 (ZeRO, Rajbhandari et al. 2020, sec. 3.1); each /n,
                   then /dp for the parts ZeRO shards (stage 1: optimizer 12; 2: + grads; 3: +
                   weights); offload moves the 12 optimizer bytes to the host
  activations      per token per layer 34*h bytes without recomputation (Korthikanti et al. 2022:
                   s*b*h*(34 + 5*a*s/h) per layer; flash attention drops the 5*a*s/h term;
                   tensor + sequence parallel divides it by tp), 2*h (the layer input) with full
                   recomputation plus one layer's 34*h while it is recomputed; layers / pp
  KV cache         2 * L * kv_heads * head_dim * b per token (keys and values of every layer);
                   latent attention (MLA) L * (kv_lora_rank + qk_rope_head_dim) * b. A replica
                   spreads it over pp * min(tp, kv_heads) devices: TP splits KV heads and
                   replicates each beyond kv_heads ranks (vLLM, SGLang); an MLA latent is not
                   split by TP at all (`kv_split`). A hybrid model's KV is its full-attention
                   layers' only; each sequence also holds its Gated DeltaNet layers' fixed state
                   (`linear_state_bytes`: recurrent state at `linear_state_bytes` per element +
                   BF16 convolution window), split over pp * min(tp, key_heads) (`state_split`)
  engine           a fixed `engine_mem_gb` per inference GPU, `train_mem_gb` per training device
Time:
  training         (6*P_mm + 6*L*w*s) FLOPs per token, (8*P_mm + 8*L*w*s) with full
                   recomputation (one more forward): Narayanan et al. 2021 count
                   96*B*s*L*h^2*(1 + s/6h + V/16Lh) per batch with recomputation, i.e.
                   8*(12*L*h^2 + V*h) + 16*L*h*s per token (the V*h is the LM head, in P_mm; the
                   input embedding is not); PaLM's MFU accounting (Chowdhery et al. 2022, app. B)
                   is the 6*N + 12*L*h*s form; for a mixture of experts N is the activated
                   parameters (DeepSeek-V3 report, Liu et al. 2024). Their attention term is the
                   full s x s score matrix; a causal mask computes half of it (a token attends
                   s/2 keys on average; FlashAttention skips the masked blocks), hence 6*L*w*s
                   (`attention_flops_per_token`; a hybrid's L counts its full-attention layers,
                   and its GDN layers add 6 * value_heads * d_k * d_v per layer and token, linear
                   in s). / (devices * peak * mfu), mfu = `gemm_eff`:
                   mfu_train * t / (t + t_half), t = tokens per device per optimizer step (at
                   most one micro-batch, `MICRO_TOKENS`), t_half = gemm_half_ridge * peak / HBM
                   bandwidth (the roofline ridge: a GEMM over t tokens does ~t FLOP per weight
                   byte, Williams et al. 2009)
                   + pipeline bubble compute * (pp-1)/m with m = 4*pp micro-batches (1F1B
                   schedule, Narayanan et al. 2021)
                   + per optimizer step: all-reduce of bf16 grads 2P/n bytes over dp ranks
                   (`collectives.all_reduce`: min(ring, tree), latency + bytes / bandwidth) on
                   NVLink (<= 8 devices) or the NIC, optimizer offload traffic 2 * 12P/(n*dp)
                   bytes at `offload_gbs`, and `train_overhead_s`
                   + TP: 2 all-reduces of the activations per layer per pass (Shoeybi et al.
                   2019), one call per `MICRO_TOKENS` micro-batch, 3 passes with recomputation,
                   2 without, layers / pp; ZeRO-3: per micro-batch one gather / reduce-scatter
                   call per FSDP unit (`layercomm.fsdp_calls`); on an emulated (host-backed)
                   device, all of it x `oversubscription` (ranks / host cores, when above 1)
  forward          (2*P_mm + 2*L*w*s) FLOPs per token (causal) / (devices * peak * mfu), mfu =
                   `gemm_eff` of mfu_prefill at the tokens per replica, + TP comm (one pass) +
                   `step_overhead_s` (an engine's prefill, `forward_time`); a training
                   framework's forward-only pass on a GPU (old log-probs, reference, reward,
                   critic values, `score_time`): mfu = `gemm_eff` of `device_ceiling(mfu_score)`,
                   + TP comm, no engine step
  decode step      max(R(batch)*b / tp / (bw * e) + KV bytes * context / (TP KV split) /
                       (bw * e), 2*P_mm*batch / tp / (peak * decode_flops_eff))
                   + TP comm + stage sends + step overhead (PP stages run in turn: /tp, not
                   /n); memory-bound at small batch (Pope et al. 2022; the roofline view of
                   decoding). e = `decode_bw_eff`(batch, tp) = decode_bw_eff *
                   batch / (batch + decode_bw_half_batch) / (1 + decode_tp_bw_loss * log2 tp);
                   TP comm = 2 * L all-reduce calls of batch*h*b bytes, each at least its
                   latency (`decode_tp_comm`); step overhead = step_overhead_s +
                   step_overhead_per_seq_s * batch (`step_overhead`), + eager_layer_s * L
                   for an engine without CUDA graphs (`eager_overhead`). R(batch) =
                   `ModelArch.decode_read_params`: P_mm with the k routed experts of each MoE
                   layer replaced by the E * (1 - (1 - k/E)^batch) distinct experts a batch is
                   expected to hit under balanced routing (<= min(E, batch*k)); = P_mm dense.
                   A hybrid reads and writes each sequence's GDN state once per step: + 2 *
                   state bytes * batch / min(tp, key_heads) in the memory term (a per-batch
                   constant, so the step keeps its shape max(m0 + k C, floor)), and its state
                   FLOPs join the FLOP term. The routed experts' bytes stream at e *
                   `expert_read_eff` = e * w / (w +
                   expert_read_half_width), w = expert_mlp / expert TP columns per rank
                   (fused-MoE kernels run one small GEMM per expert hit)
  continuous batch admission by the KV in use (`placer.admission`, vLLM v1's scheduler): a
                   waiting sequence enters while free KV covers its new tokens (+ a hybrid's
                   GDN state in KV tokens, `state_tokens`) and fewer than `max_num_seqs` run;
                   when the batch's KV outgrows the capacity the newest are preempted and
                   recomputed. KV capacity = (memory * kv_mem_fraction - weights - engine) *
                   pp * KV split / KV bytes per token (vLLM's gpu_memory_utilization, Kwon et
                   al. 2023), in whole `kv_block_tokens` pages. An engine must hold one longest
                   context (+ state): floor(capacity / that) >= 1 (`max_concurrency`)
  parallelism      `placer.sharding`: TP, CP, PP, DP and expert parallelism (EP, ETP) split
                   weights, state and tokens; memory scales with P (every expert), FLOPs with
                   P_mm; the routed experts' GEMMs run at `gemm_eff` of the tokens one expert
                   sees (`sharding.expert_tokens`), EP adds two all-to-alls per MoE layer and
                   pass (`layer_comm`), CP a ring exchange of K and V, PP a send per stage
                   boundary (`pp_send`), ZeRO-3 the per-micro-batch weight gathers
                   (`zero3_gathers`; with HSDP, `Parallel.shard`, inside a shard group, plus
                   the shards' all-reduce across the groups, `hsdp_all_reduce`); training
                   runs at `device_ceiling` (GEMMs plus memory-
                   bound kernels at HBM bandwidth). An engine's PP stages add KV room but do not
                   shorten a decode step (a token passes every stage)
  FP8              the job's `precision` (on devices with `fp8_tflops`): FP8 rollout weights
                   halve their memory and the weights a decode step reads, FP8 KV halves the KV
                   bytes per token, and FP8 weights or FP8 training run the GEMMs at the FP8 peak
                   (`gemm_peak_tflops`); optimizer state, gradients and the sync stay as they are
  LPU              weights live in SRAM: chips = ceil(P*b * (1 + lpu_kv_reserve) / SRAM) (230
                   MB per GroqChip); KV room = chips * SRAM * reserve / (1 + reserve);
                   decode step = lpu_step_s + chips * lpu_hop_s + (batch-1) * one chip's stage
                   time (max of its weight reads and FLOPs); the two constants are fitted so that
                   batch-1 decoding reproduces Groq's public ~300 tokens/s per user on
                   Llama-2-70B and ~750 on Llama-2-7B (a stage reads R(1)*b / chips and
                   computes 2*P_mm / chips); forward = 2*P_mm per token over the chips'
                   FLOP/s * mfu_prefill, replicas = devices // chips, + chips * lpu_hop_s
  environment      waves = ceil(calls / max(floor(cores / cpu_per_call), 1)), each the call's
                   mean latency + tool_overhead_s; a rule reward is ceil(samples / cores) *
                   rule_reward_s for an in-process check, plus sandbox_batch_s + ceil(samples
                   / sandboxes) * sandbox_sample_s where answers run as code
                   (`placer.rulecheck`, by the job's kind of check)
  weight sync      P*b / (path GB/s * link_eff) + sync_latency_s + (calls - 1) * sync_call_s
                   (+ lpu_reload_s onto LPUs); the path is one broadcast every replica joins
                   (`placer.timing.sync_links`): pp senders at sync_sender_gbs each (1 when
                   unbucketed), received whole by every rollout rank (one rank's link), or
                   sync_local_gbs into each replica at once when colocated, so t = c + bytes /
                   (BW_eff x parallel senders); calls per sender: its share in sync_bucket_gb
                   buckets, or every tensor when sync_bucket_gb = 0
  colocation       switching roles moves state host<->device at `offload_gbs`; nothing on a
                   device whose memory is host RAM (`DeviceType.host_backed`: a CPU, an
                   emulated device), which neither switches nor offloads; a GPU rollout engine
                   sleeps and wakes instead (`engine_swap_time`): 2 * weights / offload_gbs +
                   engine_sleep_s + engine_wake_s, its KV pool discarded, not moved
  dispatch         every trainer or frozen forward pass (old log-probs, reference, reward model,
                   critic values, each update) first ships the batch through a single
                   controller: samples * padded context * dispatch_bytes_per_token /
                   dispatch_gbs (`dispatch_time`), padded to the job's longest context, whatever
                   the devices (verl's DataProto dispatch; `Efficiency.dispatch_gbs`)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from placer.efficiency import Calibration, Efficiency
from placer.layercomm import (
    MICRO_TOKENS,
    NODE_DEVICES,
    decode_comm,
    decode_tp_comm,
    grad_sync_time,
    layer_comm,
    oversubscription,
    pp_send,
    span_link,
    tp_link,
    weight_gather_time,
    zero3_gathers,
)
from placer.sharding import (
    Parallel,
    active_expert_params,
    expert_tokens,
    linear_state_bytes,
    params_per_device,
    state_split,
    state_tokens,
    train_state_bytes,
)
from placer.spec import DeviceKind, DeviceType, ModelArch

# re-exported: the layout type lives in placer.sharding, the layers' collectives in
# placer.layercomm, the efficiency factors in placer.efficiency
__all__ = ["Calibration", "Efficiency", "MICRO_TOKENS", "NODE_DEVICES", "Parallel", "decode_comm",
           "decode_tp_comm", "grad_sync_time", "layer_comm", "linear_state_bytes", "pp_send",
           "span_link", "state_split", "state_tokens", "tp_link", "zero3_gathers", "oversubscription",
           "weight_gather_time"]

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
    the ways TP splits it (`ModelArch.kv_tp_shards`: KV heads, or 1 for a latent cache)."""
    return par.pp * m.kv_tp_shards(par.tp)


# ------------------------------------------------------------------------------------ training
def train_memory(m: ModelArch, par: Parallel, micro_tokens: int,
                 eff: Efficiency | None = None) -> Memory:
    """Per-device memory of training with mixed-precision Adam (bytes -> GB).

    `micro_tokens` are the tokens of one micro-batch (its activations are live at once).
    """
    wts, grads, opt = train_state_bytes(m, par)  # dense and expert parts, each ZeRO-sharded
    tokens = micro_tokens / par.cp  # context parallelism splits every sequence
    per_tok_layer = (2 if par.recompute else 34) * m.hidden / par.tp
    act = tokens * per_tok_layer * m.layers / par.pp
    if par.recompute:  # one layer's full activations are live while it is recomputed
        act += tokens * 34 * m.hidden / par.tp
    return Memory(weights=wts / GB, grads=grads / GB, optimizer=0.0 if par.offload else opt / GB,
                  activations=act / GB, overhead=(eff or Efficiency()).train_mem_gb)


def attention_flops_per_token(m: ModelArch, seq: float) -> float:
    """Forward attention-score FLOPs per token of a causal sequence of `seq` tokens: QK^T and
    AV over the keys before it, 2 * 2 * L * w per key, and a causal token sees seq / 2 keys on
    average, so 2 * L * w * seq (half of the full-matrix 4 * L * w * s of Narayanan et al.),
    L the full-attention layers; a hybrid's GDN layers add their state update and readout
    (`ModelArch.linear_flops_per_token`), the same for every token whatever `seq`."""
    return (2 * m.full_attention_layers * m.attention_width() * seq
            + m.linear_flops_per_token())


def train_flops(m: ModelArch, tokens: float, seq: float, recompute: bool) -> float:
    """Forward + backward (+ recomputed forward) FLOPs: (6 or 8) * (P_mm + L*w*s) per token
    (causal attention, `attention_flops_per_token`), P_mm = `ModelArch.matmul_params` (the
    experts a token runs, no input-embedding gather), w = `ModelArch.attention_width`."""
    passes = 8 if recompute else 6  # forward 2, backward 4, recomputed forward 2
    return passes * (m.matmul_params() + attention_flops_per_token(m, seq) / 2) * tokens


def device_ceiling(ceiling: float, dev: DeviceType, eff: Efficiency) -> float:
    """A pass's achievable fraction of peak on `dev`: its GEMMs at `ceiling` plus the memory-
    bound kernels' `nongemm_bytes_per_flop` bytes per FLOP at HBM bandwidth, 1 / (1/ceiling +
    nongemm * peak / bandwidth). A compute-poor, bandwidth-rich part (H20) keeps more of its
    peak than a compute-rich one (H100, B200)."""
    ridge = dev.bf16_tflops * 1e12 / (dev.mem_bw_gbs * GB)
    return 1.0 / (1.0 / ceiling + eff.nongemm_bytes_per_flop * ridge)


def gemm_eff(ceiling: float, tokens_per_device: float, dev: DeviceType, eff: Efficiency) -> float:
    """Achieved fraction of peak of a pass over `tokens_per_device` tokens per device (one
    micro-batch at most, `MICRO_TOKENS`): ceiling * t / (t + t_half), t_half =
    gemm_half_ridge * peak / bandwidth (the ridge point in FLOP per byte, which is where a GEMM
    over t tokens stops being bound by reading its weights)."""
    t = min(max(tokens_per_device, 0.0), MICRO_TOKENS)
    half = eff.gemm_half_ridge * dev.bf16_tflops * 1e12 / (dev.mem_bw_gbs * GB)
    return ceiling * t / (t + half) if t > 0 else ceiling


def gemm_peak_tflops(dev: DeviceType, par: Parallel) -> float:
    """Peak TFLOP/s the layout's GEMMs run at: FP8 when its weights (inference) or its
    training GEMMs are FP8 and the device has FP8 tensor cores, else BF16."""
    if (par.fp8_weights or par.fp8_train) and dev.fp8_tflops is not None:
        return dev.fp8_tflops
    return dev.bf16_tflops


def pass_compute(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
                 passes: int, ceiling: float, group_tokens: float, eff: Efficiency) -> float:
    """Seconds of `passes` matmul passes (2 a forward, 6 forward + backward, 8 with a recomputed
    forward) over `tokens` tokens on the layout's devices: the dense, attention and LM-head
    FLOPs at `gemm_eff` of the tokens a device's GEMMs see (`group_tokens` per dp rank / cp),
    the routed experts' at `gemm_eff` of the tokens one expert sees (`sharding.expert_tokens`):
    small for a mixture of many experts, which expert parallelism raises by gathering an EP
    group's tokens."""
    peak = par.devices * gemm_peak_tflops(dev, par) * 1e12
    routed = active_expert_params(m)
    dense = passes * (m.matmul_params() - routed + attention_flops_per_token(m, seq) / 2) * tokens
    t = min(group_tokens, MICRO_TOKENS)
    out = dense / (peak * gemm_eff(ceiling, group_tokens / par.cp, dev, eff))
    if routed:
        t_exp = expert_tokens(m, par, t)
        out += passes * routed * tokens / (peak * gemm_eff(ceiling, t_exp, dev, eff))
    return out


def train_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
               steps: int, eff: Efficiency) -> float:
    """Seconds for `steps` optimizer steps over `tokens` tokens in total. ZeRO-3's weight
    gathers (`zero3_gathers`) are added without overlap, like every collective of the model:
    FSDP prefetches them under the compute (Zhao et al. 2023), but an affine price keeps the
    cost calibratable (`placer.fit` probes each factor's term; a max() would hide one side)."""
    passes = 8 if par.recompute else 6
    per_step = tokens / max(steps, 1) / par.dp
    ceiling = device_ceiling(eff.mfu_train, dev, eff)
    compute = pass_compute(m, dev, par, tokens, seq, passes, ceiling, per_step, eff)
    # micro-batches are cut per optimizer step: a step's tokens / MICRO_TOKENS, at least one
    gathers = zero3_gathers(m, dev, par, per_step, 3, eff) * max(steps, 1)
    compute += gathers
    micro = max(4 * par.pp, 1)
    bubble = compute * (par.pp - 1) / micro
    # Megatron TP: 2 all-reduces per layer in the forward, 2 in the backward, 2 more in the
    # recomputed forward (likewise the EP all-to-alls and CP exchanges); layers / pp per device.
    comm = layer_comm(m, dev, par, tokens / par.dp, eff) * (passes // 2 - 1) / par.pp
    # 1F1B: each micro-batch crosses every stage boundary forward and back once per pass
    chunk = min(tokens / par.dp, MICRO_TOKENS)
    comm += pp_send(m, dev, par, chunk / par.cp, eff) * (passes // 2 - 1) * tokens / par.dp / chunk
    offload = 0.0
    if par.offload and not dev.host_backed:  # on host RAM already: the offload moves nothing
        offload = 2 * train_state_bytes(m, par)[2] / (eff.offload_gbs * GB)
    return oversubscription(dev, par.devices, eff) * (
        compute + bubble + steps * (grad_sync_time(m, dev, par, eff) + offload
                                    + eff.train_overhead_s) + comm)



# ----------------------------------------------------------------------------- frozen forward
def infer_memory(m: ModelArch, par: Parallel, dev: DeviceType, eff: Efficiency) -> Memory:
    """Weights of a frozen model (reference, reward, critic forward, rollout engine)."""
    over = eff.engine_mem_gb if dev.kind is DeviceKind.gpu else 0.0
    return Memory(weights=sum(params_per_device(m, par)) * BYTES * par.weight_scale / GB,
                  overhead=over)


def forward_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
                 eff: Efficiency) -> float:
    """A prefill-like forward pass over `tokens` tokens, spread over dp replicas."""
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, eff)
        per_token = 2 * m.matmul_params() / (chips * dev.bf16_tflops * 1e12 * eff.mfu_prefill)
        replicas = max(par.devices // chips, 1)
        return tokens * per_token / replicas + chips * eff.lpu_hop_s
    compute = pass_compute(m, dev, par, tokens, seq, 2, eff.mfu_prefill, tokens / par.dp, eff)
    return compute + layer_comm(m, dev, par, tokens / par.dp, eff) + eff.step_overhead_s


def score_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
               eff: Efficiency) -> float:
    """A training framework's forward-only pass over `tokens` tokens (old log-probs, reference,
    reward model, critic values) on a GPU: 2 passes of FLOPs at `device_ceiling(mfu_score)` (the
    training module's kernels and roofline, not an engine's prefill) + the layers' collectives.
    Elsewhere (an LPU or CPU serving a frozen model) the engine's `forward_time`."""
    if dev.kind is not DeviceKind.gpu:
        return forward_time(m, dev, par, tokens, seq, eff)
    ceiling = device_ceiling(eff.mfu_score, dev, eff)
    compute = pass_compute(m, dev, par, tokens, seq, 2, ceiling, tokens / par.dp, eff)
    return oversubscription(dev, par.devices, eff) * (
        compute + layer_comm(m, dev, par, tokens / par.dp, eff))


def dispatch_time(samples: float, padded_tokens: float, eff: Efficiency) -> float:
    """Seconds a single controller spends shipping a pass's batch to its workers and back:
    `samples` sequences padded to `padded_tokens` each, `dispatch_bytes_per_token` bytes per
    padded token at `dispatch_gbs` (the driver's rate). Independent of the devices: the driver
    serializes every DP rank's chunk (see `Efficiency.dispatch_gbs`)."""
    return samples * padded_tokens * eff.dispatch_bytes_per_token / (eff.dispatch_gbs * GB)


# --------------------------------------------------------------------------------- generation
def lpu_chips(m: ModelArch, dev: DeviceType, eff: Efficiency) -> int:
    """LPU chips one replica needs: the weights (plus a KV reserve) must sit in SRAM."""
    return math.ceil(weight_bytes(m) * (1 + eff.lpu_kv_reserve) / (dev.memory_gb * GB))


def kv_capacity_tokens(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> float:
    """KV-cache tokens one replica can hold."""
    if dev.kind is DeviceKind.lpu:
        return lpu_chips(m, dev, eff) * dev.memory_gb * GB * eff.lpu_kv_reserve / (
            1 + eff.lpu_kv_reserve) / kv_bytes_per_token(m)
    free = (dev.memory_gb * eff.kv_mem_fraction - infer_memory(m, par, dev, eff).total)
    return max(free, 0.0) * GB * kv_split(m, par) / (kv_bytes_per_token(m) * par.kv_scale)


def max_concurrency(m: ModelArch, dev: DeviceType, par: Parallel, max_context: int,
                    eff: Efficiency) -> int:
    """Sequences one engine replica could hold if each reserved KV for its longest context,
    plus a hybrid model's GDN state (`state_tokens`): < 1, the engine cannot run the job
    (infeasible). Engines admit by the KV in use instead (`placer.admission`)."""
    per_seq = max(max_context, 1) + state_tokens(m, dev, par, eff)
    return int(kv_capacity_tokens(m, dev, par, eff) // per_seq)


def prefill_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, ctx: float,
                 eff: Efficiency) -> float:
    """One prefill of `tokens` new tokens on one replica (context `ctx` for attention)."""
    rep = par if par.dp == 1 else replace(par, dp=1)
    return forward_time(m, dev, rep, tokens, ctx, eff)


def _decode_terms(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                  eff: Efficiency) -> tuple[float, float, float, float]:
    """A GPU/CPU decode step as max(a + k * context_tokens, c) + d: (a, k, c, d) in seconds.

    a: read the weights the step uses (`decode_read_bytes`) over the tp ranks of a stage, and
    a hybrid's GDN state of each sequence read and written (`linear_state_bytes`); k:
    read one KV token (its TP share, `ModelArch.kv_tp_shards`); c: the batch's matmul FLOPs (2 *
    `matmul_params` per sequence) over tp ranks; d: the step's collectives (`decode_comm`), the
    stage-to-stage sends (`pp_send`) and the engine's per-step overhead. Pipeline stages do not
    shorten a step: a token passes every stage in turn (or, with pp micro-batches in flight,
    every stage reads its weights once per micro-batch), so a step of the whole batch reads
    all the weights and KV at one stage's bandwidth; PP buys memory (KV room), not speed.
    """
    n = par.tp
    bw = dev.mem_bw_gbs * GB
    rate = bw * decode_bw_eff(batch, par.tp, eff)
    # routed experts read at the efficiency of their own split: whole experts per rank under EP
    routed = (m.decode_read_params(batch) - m.decode_read_params(0)) * BYTES
    a = ((decode_read_bytes(m, batch) - routed) / n / rate
         + routed / n / (bw * decode_bw_eff(batch, par.expert_tp, eff)
                         * expert_read_eff(m, par.expert_tp, eff))) * par.weight_scale
    # a hybrid reads and writes every sequence's GDN state once per step (its TP share)
    a += 2 * linear_state_bytes(m, eff) * batch * par.pp / state_split(m, par) / rate
    k = kv_bytes_per_token(m) * par.kv_scale / m.kv_tp_shards(par.tp) / rate
    c = ((2 * m.matmul_params() + m.linear_flops_per_token()) * batch / n
         / (gemm_peak_tflops(dev, par) * 1e12 * eff.decode_flops_eff))
    d = (decode_comm(m, dev, par, batch, eff) + pp_send(m, dev, par, batch, eff)
         + step_overhead(batch, eff) + eager_overhead(m, par, eff))
    return a, k, c, d


def decode_bw_eff(batch: int, tp: int, eff: Efficiency) -> float:
    """Achieved fraction of HBM bandwidth of a decode step: decode_bw_eff * batch / (batch +
    decode_bw_half_batch) / (1 + decode_tp_bw_loss * log2 tp) (see the `Efficiency` fields)."""
    b = max(batch, 1)
    return (eff.decode_bw_eff * b / (b + eff.decode_bw_half_batch)
            / (1 + eff.decode_tp_bw_loss * math.log2(max(tp, 1))))


def expert_read_eff(m: ModelArch, expert_tp: int, eff: Efficiency) -> float:
    """Fraction of the dense decode bandwidth at which a step reads its routed experts: w / (w +
    expert_read_half_width), w = expert_mlp / expert_tp (the columns of one expert's slice on a
    rank; fused-MoE kernels run one small GEMM per expert hit). 1 for a dense model."""
    if not m.moe or not m.expert_mlp:
        return 1.0
    w = m.expert_mlp / max(expert_tp, 1)
    return w / (w + eff.expert_read_half_width)


def step_overhead(batch: int, eff: Efficiency) -> float:
    """Host time of one engine step of `batch` sequences: step_overhead_s +
    step_overhead_per_seq_s * batch."""
    return eff.step_overhead_s + eff.step_overhead_per_seq_s * max(batch, 0)


def eager_overhead(m: ModelArch, par: Parallel, eff: Efficiency) -> float:
    """Host time an eager engine (no CUDA graphs) adds to one decode step: eager_layer_s per
    layer (a token passes every layer, whatever the TP or PP split). 0 with CUDA graphs."""
    return 0.0 if par.cuda_graphs else eff.eager_layer_s * m.layers


def _lpu_decode_step(m: ModelArch, dev: DeviceType, batch: int, eff: Efficiency) -> float:
    """A token walks the chip pipeline; each further sequence adds one chip's stage time."""
    chips = lpu_chips(m, dev, eff)
    stage = max(decode_read_bytes(m, 1) / chips / (dev.mem_bw_gbs * GB * eff.decode_bw_eff),
                2 * m.matmul_params() / chips / (dev.bf16_tflops * 1e12 * eff.decode_flops_eff))
    return eff.lpu_step_s + chips * eff.lpu_hop_s + (batch - 1) * stage


def decode_step_time(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                     context_tokens: float, eff: Efficiency) -> float:
    """One decode step of `batch` sequences holding `context_tokens` KV tokens in total."""
    if batch <= 0:
        return 0.0
    if dev.kind is DeviceKind.lpu:
        return _lpu_decode_step(m, dev, batch, eff)
    a, k, c, d = _decode_terms(m, dev, par, batch, eff)
    return max(a + k * context_tokens, c) + d


def decode_run_time(m: ModelArch, dev: DeviceType, par: Parallel, batch: int, ctx0: float,
                    steps: int, eff: Efficiency) -> float:
    """`steps` decode steps of a lockstep batch whose per-sequence context starts at `ctx0`.

    Exactly the sum of `decode_step_time` over steps i = 0..steps-1 (context batch*(ctx0+i)),
    in closed form: compute-bound steps while the memory term is below the FLOP term, then an
    arithmetic series of memory-bound steps.
    """
    if steps <= 0 or batch <= 0:
        return 0.0
    if dev.kind is DeviceKind.lpu:
        return steps * _lpu_decode_step(m, dev, batch, eff)
    a, k, c, d = _decode_terms(m, dev, par, batch, eff)
    u0, du = a + k * batch * ctx0, k * batch  # memory term of step 0 and its growth per step
    # steps 0..j-1 are compute-bound (u0 + du*i < c), steps j..steps-1 memory-bound
    if u0 >= c:
        j = 0
    elif du * steps <= c - u0:  # (also du == 0) still compute-bound at the last step
        j = steps
    else:
        j = math.ceil((c - u0) / du)
    mem_steps = steps - j
    mem = mem_steps * u0 + du * (j + steps - 1) * mem_steps / 2
    return j * c + mem + steps * d


# ------------------------------------------------------------------------- environment, sync
def tool_waves(calls: int, cpu_per_call: float, cores: int) -> int:
    """Rounds of tool calls when `calls` wait at once on `cores` cores."""
    per_wave = max(int(cores // cpu_per_call), 1)
    return math.ceil(calls / per_wave)


def weight_sync_time(m: ModelArch, path_gbs: float, dst: DeviceType, eff: Efficiency,
                     calls: int = 1) -> float:
    """Push BF16 weights over a path of `path_gbs` GB/s in `calls` sequential calls per sender
    (`placer.timing.sync_calls`; the first is in `sync_latency_s`); LPUs also pay a reload."""
    return transfer_time(weight_bytes(m), path_gbs, dst, eff, calls)


def transfer_time(nbytes: float, path_gbs: float, dst: DeviceType, eff: Efficiency,
                  calls: int = 1) -> float:
    """One weight push of `nbytes` to a `dst` device: the wire at `path_gbs` x `link_eff`, the
    first call's `sync_latency_s`, `sync_call_s` for each later call, an LPU's reload. The one
    formula the planner, the calibration fit and the synthetic traces price transfers with."""
    t = (nbytes / (path_gbs * GB * eff.link_eff) + eff.sync_latency_s
         + max(calls - 1, 0) * eff.sync_call_s)
    if dst.kind is DeviceKind.lpu:
        t += eff.lpu_reload_s
    return t


def switch_time(mem_gb: float, eff: Efficiency) -> float:
    """Offload one role's state to the host and onload the next (colocated roles)."""
    return mem_gb * GB / (eff.offload_gbs * GB)


def engine_swap_time(weights_gb: float, eff: Efficiency) -> float:
    """A colocated GPU rollout engine's sleep after a generation plus its wake before the next
    (vLLM sleep mode level 1, as verl's sharding managers call it every step): each copies the
    engine's weights (`weights_gb` per device, every device at once) over the host link at
    `offload_gbs` and pays its fixed cost (`engine_sleep_s`, `engine_wake_s`: pinned-buffer
    allocation, unmapping / re-mapping every allocation); the KV pool is discarded and
    re-allocated, never copied."""
    return 2 * weights_gb / eff.offload_gbs + eff.engine_sleep_s + eff.engine_wake_s
