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
  generation       engine steps (`placer.cost.generation`): prefill, decode step = max(memory line,
                   compute floor) + fixed terms, KV capacity and continuous batch admission,
                   the LPU chip pipeline
  parallelism      `placer.cost.sharding`: TP, CP, PP, DP and expert parallelism (EP, ETP) split
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
  environment      waves = ceil(calls / max(floor(cores / cpu_per_call), 1)), each the call's
                   mean latency + tool_overhead_s; a rule reward is ceil(samples / cores) *
                   rule_reward_s for an in-process check, plus sandbox_batch_s + ceil(samples
                   / sandboxes) * sandbox_sample_s where answers run as code
                   (`placer.cost.rulecheck`, by the job's kind of check)
  weight sync      P*b / (path GB/s * link_eff) + sync_latency_s + (calls - 1) * sync_call_s
                   (+ lpu_reload_s onto LPUs); the path is one broadcast every replica joins
                   (`placer.cost.timing.sync_links`): pp senders at sync_sender_gbs each (1 when
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

from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.generation import (
    decode_bw_eff,
    decode_run_time,
    decode_step_line,
    decode_step_time,
    eager_overhead,
    expert_read_eff,
    forward_time,
    kv_capacity_tokens,
    lpu_chips,
    max_concurrency,
    prefill_line,
    prefill_time,
    step_overhead,
)
from placer.cost.layercomm import (
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
from placer.cost.roofline import (
    BYTES,
    GB,
    Memory,
    attention_flops_per_token,
    decode_read_bytes,
    device_ceiling,
    gemm_eff,
    gemm_peak_tflops,
    infer_memory,
    kv_bytes_per_token,
    kv_split,
    pass_compute,
    weight_bytes,
)
from placer.cost.sharding import (
    Parallel,
    linear_state_bytes,
    state_split,
    state_tokens,
    train_state_bytes,
)
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceKind, DeviceType

# re-exported: the layout type lives in placer.cost.sharding, the layers' collectives in
# placer.cost.layercomm, the efficiency factors in placer.cost.efficiency, the sizes and GEMM rates in
# placer.cost.roofline, the engine steps (prefill, decode, KV capacity) in placer.cost.generation
__all__ = ["Calibration", "Efficiency", "MICRO_TOKENS", "NODE_DEVICES", "Parallel", "decode_comm",
           "decode_tp_comm", "grad_sync_time", "layer_comm", "linear_state_bytes", "pp_send",
           "span_link", "state_split", "state_tokens", "tp_link", "zero3_gathers", "oversubscription",
           "weight_gather_time",
           "BYTES", "GB", "Memory", "attention_flops_per_token", "decode_bw_eff", "decode_read_bytes",
           "decode_run_time", "decode_step_line", "decode_step_time", "device_ceiling", "eager_overhead",
           "expert_read_eff", "forward_time", "gemm_eff", "gemm_peak_tflops", "infer_memory",
           "kv_bytes_per_token", "kv_capacity_tokens", "kv_split", "lpu_chips", "max_concurrency",
           "pass_compute", "prefill_line", "prefill_time", "step_overhead", "weight_bytes"]


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


def train_flops(m: ModelArch, tokens: float, seq: float, recompute: bool) -> float:
    """Forward + backward (+ recomputed forward) FLOPs: (6 or 8) * (P_mm + L*w*s) per token
    (causal attention, `attention_flops_per_token`), P_mm = `ModelArch.matmul_params` (the
    experts a token runs, no input-embedding gather), w = `ModelArch.attention_width`."""
    passes = 8 if recompute else 6  # forward 2, backward 4, recomputed forward 2
    return passes * (m.matmul_params() + attention_flops_per_token(m, seq) / 2) * tokens


def train_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
               steps: int, eff: Efficiency) -> float:
    """Seconds for `steps` optimizer steps over `tokens` tokens in total. ZeRO-3's weight
    gathers (`zero3_gathers`) are added without overlap, like every collective of the model:
    FSDP prefetches them under the compute (Zhao et al. 2023), but an affine price keeps the
    cost calibratable (`placer.calibrate.fit` probes each factor's term; a max() would hide one side)."""
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


# ------------------------------------------------------------------------- environment, sync
def tool_waves(calls: int, cpu_per_call: float, cores: int) -> int:
    """Rounds of tool calls when `calls` wait at once on `cores` cores."""
    per_wave = max(int(cores // cpu_per_call), 1)
    return math.ceil(calls / per_wave)


def weight_sync_time(m: ModelArch, path_gbs: float, dst: DeviceType, eff: Efficiency,
                     calls: int = 1) -> float:
    """Push BF16 weights over a path of `path_gbs` GB/s in `calls` sequential calls per sender
    (`placer.cost.timing.sync_calls`; the first is in `sync_latency_s`); LPUs also pay a reload."""
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
