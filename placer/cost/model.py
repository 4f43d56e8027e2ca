"""The one cost model: memory and time of every role's work on a device type and parallel config.

The ILP, the baselines and the simulator all price work here, so their numbers agree on the same
work. Formulas are first principles (bytes, FLOPs, messages) times named efficiency factors
(`Efficiency`), each with a default that a calibration profile overrides per device type.

This module prices training (`train_memory`, `train_time`: 6 or 8 matmul passes per token at the
device's GEMM ceiling, pipeline bubble, gradient sync, a host-stepped optimizer's copies
(`placer.cost.offload.host_step_gb`), layer collectives,
ZeRO-3 gathers), a training framework's forward-only passes (`score_time`), the single
controller's dispatch of each pass (`dispatch_time`), tool-call waves, weight pushes
(`transfer_time`), and colocated roles' switches (`switch_time`, `engine_swap_time`, both
`host_round_trip_time`). It
re-exports the engine steps (`placer.cost.generation`), the sizes and GEMM rates
(`placer.cost.roofline`), the layouts (`placer.cost.sharding`) and their collectives
(`placer.cost.layercomm`), so callers import one module.

Notation, every formula and its source: docs/cost-model.md.
"""
from __future__ import annotations

import math

from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.generation import (
    decode_bw_eff,
    decode_run_time,
    decode_step_line,
    decode_step_time,
    forward_time,
    kv_capacity_tokens,
    lpu_chips,
    max_concurrency,
    prefill_line,
    prefill_time,
    step_overhead,
)
from placer.cost.kernels import eager_overhead, expert_read_eff, layer_launches
from placer.cost.layercomm import (
    MICRO_TOKENS,
    NODE_DEVICES,
    decode_comm,
    decode_tp_comm,
    grad_sync_time,
    layer_comm,
    micro_tokens,
    oversubscription,
    pp_send,
    span_link,
    tp_link,
    weight_gather_time,
    zero3_gathers,
)
from placer.cost.offload import MODEL_BYTES, SLEEP_COPIES, host_step_gb
from placer.cost.roofline import (
    BYTES,
    GB,
    Memory,
    attention_flops_per_token,
    decode_read_bytes,
    device_ceiling,
    engine_load_entries,
    gemm_eff,
    gemm_peak_tflops,
    head_passes,
    infer_memory,
    kv_bytes_per_token,
    kv_split,
    matmul_time,
    pass_compute,
    weight_bytes,
)
from placer.cost.sharding import (
    OPTIMIZER_BYTES,
    Parallel,
    linear_state_bytes,
    state_split,
    state_tokens,
    train_state_bytes,
)
from placer.cost.stages import heaviest_stage_params, stage_excess
from placer.cost.vocabcomm import Head, score_vocab_comm, train_vocab_comm
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceKind, DeviceType

# re-exported: the layout type lives in placer.cost.sharding, the layers' collectives in
# placer.cost.layercomm, the efficiency factors in placer.cost.efficiency, the sizes and GEMM rates in
# placer.cost.roofline, the engine steps (prefill, decode, KV capacity) in placer.cost.generation
__all__ = ["Calibration", "Efficiency", "MICRO_TOKENS", "NODE_DEVICES", "Parallel", "decode_comm",
           "decode_tp_comm", "grad_sync_time", "layer_comm", "micro_tokens", "linear_state_bytes", "pp_send",
           "span_link", "state_split", "state_tokens", "tp_link", "zero3_gathers", "oversubscription",
           "weight_gather_time", "offload_time",
           "BYTES", "GB", "Memory", "attention_flops_per_token", "decode_bw_eff", "decode_read_bytes",
           "decode_run_time", "decode_step_line", "decode_step_time", "device_ceiling", "eager_overhead",
           "expert_read_eff", "forward_time", "gemm_eff", "gemm_peak_tflops", "infer_memory",
           "layer_launches",
           "kv_bytes_per_token", "kv_capacity_tokens", "kv_split", "lpu_chips", "max_concurrency",
           "pass_compute", "prefill_line", "prefill_time", "step_overhead", "weight_bytes"]


# ------------------------------------------------------------------------------------ training
def train_memory(m: ModelArch, par: Parallel, micro_tokens: int,
                 eff: Efficiency | None = None, optimizer_bytes: float | None = None) -> Memory:
    """Per-device memory of training with mixed-precision Adam (bytes -> GB).

    `micro_tokens` are the tokens of one micro-batch (its activations are live at once);
    `optimizer_bytes` a parameter of the optimizer state (None: `sharding.OPTIMIZER_BYTES`; a
    framework's own, `FrameworkProfile.optimizer_bytes`). Every move of the state (a parked
    optimizer's copies, a switch) is of `Memory.optimizer`, so it follows.
    """
    wts, grads, opt = train_state_bytes(  # dense and expert parts, each ZeRO-sharded
        m, par, OPTIMIZER_BYTES if optimizer_bytes is None else optimizer_bytes)
    tokens = micro_tokens / par.cp  # context parallelism splits every sequence
    per_tok_layer = (2 if par.recompute else 34) * m.hidden / par.tp
    act = tokens * per_tok_layer * m.layers / par.pp
    if par.recompute:  # one layer's full activations are live while it is recomputed
        act += tokens * 34 * m.hidden / par.tp
    return Memory(weights=wts / GB, grads=grads / GB, optimizer=0.0 if par.offload else opt / GB,
                  activations=act / GB, overhead=(eff or Efficiency()).train_mem_gb)


def train_flops(m: ModelArch, tokens: float, seq: float, recompute: bool) -> float:
    """Forward + backward (+ recomputed forward) FLOPs: (6 or 8) * (P_mm - V*h + L*w*s)
    + 6 * V*h per token (causal attention, `attention_flops_per_token`; the LM head's V*h is
    not recomputed, `head_passes`), P_mm = `ModelArch.matmul_params` (the experts a token
    runs, no input-embedding gather), w = `ModelArch.attention_width`."""
    passes = 8 if recompute else 6  # forward 2, backward 4, recomputed forward 2
    head = m.vocab * m.hidden
    return (passes * (m.matmul_params() - head + attention_flops_per_token(m, seq) / 2)
            + head_passes(passes) * head) * tokens


def train_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
               steps: int, eff: Efficiency, head: Head = Head.LOGPROB,
               attn_seq: float | None = None) -> float:
    """Seconds for `steps` optimizer steps over `tokens` tokens in total of sequences of `seq`
    tokens on average; `head` what the pass computes at the top (`vocabcomm.head_of` the role);
    `attn_seq` the length whose causal attention prices the batch's (`attnspan`: E[s^2] / E[s]
    of sequences of unequal lengths; default `seq`). ZeRO-3's weight
    gathers (`zero3_gathers`) are added without overlap, like every collective of the model:
    FSDP prefetches them under the compute (Zhao et al. 2023), but an affine price keeps the
    cost calibratable (`placer.calibrate.fit` probes each factor's term; a max() would hide one side)."""
    passes = 8 if par.recompute else 6
    per_step = tokens / max(steps, 1) / par.dp
    mt = micro_tokens(par, seq)
    ceiling = device_ceiling(eff.mfu_train, dev, eff, par)
    group = _micro_group(par, per_step, mt)
    span = seq if attn_seq is None else attn_seq
    compute = pass_compute(m, dev, par, tokens, span, passes, ceiling, group, eff)
    # the slowest pipeline stage paces every micro-batch (`placer.cost.stages`)
    compute += pipeline_stage_excess(m, dev, par, tokens, compute, passes, ceiling, group, eff,
                                     head)
    # micro-batches are cut per optimizer step: a step's tokens / the micro-batch's, at least one
    gathers = zero3_gathers(m, dev, par, per_step, 3, eff, mt) * max(steps, 1)
    compute += gathers
    # 1F1B's bubble: (pp - 1) stage times over the step's micro-batches (`pipeline_micro_batches`)
    micro = pipeline_micro_batches(par, per_step, mt)
    bubble = compute * (par.pp - 1) / micro
    # Megatron TP: 2 all-reduces per layer in the forward, 2 in the backward, 2 more in the
    # recomputed forward (likewise the EP all-to-alls and CP exchanges); layers / pp per device.
    comm = layer_comm(m, dev, par, tokens / par.dp, eff, mt) * (passes // 2 - 1) / par.pp
    # the embedding's and LM head's vocabulary split: on the first and last stage, which every
    # micro-batch passes, so not shared out over the stages; recomputation does not repeat them
    comm += train_vocab_comm(m, dev, par, tokens / par.dp, eff, mt, head)
    # 1F1B: each micro-batch crosses every stage boundary forward and back once per pass
    chunk = min(tokens / par.dp, mt)
    comm += pp_send(m, dev, par, chunk / par.cp, eff) * (passes // 2 - 1) * tokens / par.dp / chunk
    return oversubscription(dev, par.devices, eff) * (
        compute + bubble + steps * (grad_sync_time(m, dev, par, eff) + offload_time(m, dev, par, eff)
                                    + eff.train_overhead_s) + comm)


def offload_time(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> float:
    """Seconds per optimizer step that a host-stepped optimizer (`par.offload`, Megatron-Core's
    HybridDeviceOptimizer: megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py,
    radixark/Megatron-LM @235952df607b3820716e5e67728a5ab470ca33ae) adds. Its state stays on the
    host; each step moves the fp32 gradients down and the fp32 parameters back
    (`offload.host_step_gb`), one tensor at a time on their own streams under the host's AdamW
    (`--overlap-cpu-optimizer-d2h-h2d`), so the slower of the copies and, where the framework's
    profile gives a host rate (`host_adam_gparams_s` > 0), the host step: the rank's
    parameters / that rate. Every rank steps its own shard and the step ends with the last, so
    the rank is the heaviest pipeline stage's (`stages.heaviest_stage_params`: an uneven split,
    the LM head's stage). A host-backed device moves nothing."""
    if not par.offload or dev.host_backed:
        return 0.0
    dense, experts = heaviest_stage_params(m, par)
    groups = (par.zero_group, par.expert_zero_group) if par.zero >= 1 else (1, 1)
    params = dense / groups[0] + experts / groups[1]  # the rank's optimizer shard
    copies = host_step_gb(params * MODEL_BYTES["optimizer"] / GB) / eff.offload_gbs
    if eff.host_adam_gparams_s <= 0:
        return copies
    return max(params / (eff.host_adam_gparams_s * 1e9), copies)


def pipeline_micro_batches(par: Parallel, rank_tokens: float, micro: float) -> float:
    """Micro-batches one pipelined pass (or optimizer step) runs over a dp rank's `rank_tokens`,
    which its bubble's (pp - 1) stage times are shared over: a fixed `micro_batch` count's
    tokens / `micro` (the micro-batch's tokens); a token budget the layout or the job sets
    (`micro_token_budget`, verl's use_dynamic_bsz max_token_len: verl/utils/seqlen_balancing.py
    `rearrange_micro_batches` cuts ceil(the batch's tokens / max_token_len) micro-batches,
    volcengine/verl @31771cfad, verl/workers/actor/megatron_actor.py `forward_backward_batch`
    hands Megatron's schedule that many) ceil(tokens / budget); neither set, 4 x pp."""
    if par.micro_batch > 0:
        return max(rank_tokens / micro, 1.0)
    if par.micro_token_budget > 0:
        return float(max(math.ceil(rank_tokens / par.micro_token_budget), 1))
    return float(max(4 * par.pp, 1))


def pipeline_stage_excess(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
                          compute: float, passes: int, ceiling: float, group_tokens: float,
                          eff: Efficiency, head: Head) -> float:
    """Seconds the slowest pipeline stage adds to a pass whose FLOPs `pass_compute` spread over
    every device (`compute`, s): its LM-head part (a `Head.LOGPROB` head: `passes` x vocab x
    hidden FLOPs a token, at the dense GEMMs' rate, as `pass_compute` priced it) runs on the last
    stage only, its layers as the layout splits them (`placer.cost.stages.stage_excess`). A
    scalar head's output layer is one column: only the layer split counts. 0 for pp = 1."""
    if par.pp <= 1:
        return 0.0
    head_s = 0.0
    if head is Head.LOGPROB:
        per_device = group_tokens / (par.cp * par.attn_dp)
        head_s = matmul_time(head_passes(passes) * m.vocab * m.hidden * tokens, per_device,
                             dev, par, ceiling, eff)
    return stage_excess(compute - head_s, head_s, m.layers, par)


# ----------------------------------------------------------------------------- frozen forward
def score_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
               eff: Efficiency, head: Head = Head.LOGPROB, attn_seq: float | None = None) -> float:
    """A training framework's forward-only pass over `tokens` tokens (old log-probs, reference,
    reward model, critic values) on a GPU: 2 passes of FLOPs at `device_ceiling(mfu_score)` (the
    training module's kernels and roofline, not an engine's prefill) + the layers' collectives
    + a measured MoE routing cost where the framework has one (`moe_route_time`). Elsewhere
    (an LPU or CPU serving a frozen model) the engine's `forward_time`. `head`: what the pass
    computes at the top (`vocabcomm.head_of` the role); `attn_seq`: as `train_time`'s."""
    span = seq if attn_seq is None else attn_seq
    if dev.kind is not DeviceKind.gpu:
        return forward_time(m, dev, par, tokens, span, eff)
    ceiling = device_ceiling(eff.mfu_score, dev, eff, par)
    mt = micro_tokens(par, seq)  # a trained role's forward runs its training micro-batches
    rank_tokens = tokens / par.dp
    group = _micro_group(par, rank_tokens, mt)
    compute = pass_compute(m, dev, par, tokens, span, 2, ceiling, group, eff)
    compute += pipeline_stage_excess(m, dev, par, tokens, compute, 2, ceiling, group, eff, head)
    # as `train_time` prices a pipeline's forward: each device runs its layers / pp of the
    # collectives, the stages' fill and drain idle (pp - 1) stage times over the micro-batches,
    # and each micro-batch crosses every stage boundary once
    micro = pipeline_micro_batches(par, rank_tokens, mt)
    bubble = compute * (par.pp - 1) / micro
    compute += moe_route_time(m, par, rank_tokens, eff)
    chunk = min(rank_tokens, mt)
    comm = (layer_comm(m, dev, par, rank_tokens, eff, mt) / par.pp
            + pp_send(m, dev, par, chunk / par.cp, eff) * rank_tokens / chunk
            + score_vocab_comm(m, dev, par, rank_tokens, eff, mt, head))
    return oversubscription(dev, par.devices, eff) * (compute + bubble + comm)


def moe_route_time(m: ModelArch, par: Parallel, rank_tokens: float, eff: Efficiency) -> float:
    """Seconds a forward-only pass of an MoE model spends per GPU beyond its FLOPs and
    collectives, where the framework's profile measured it (`moe_route_token_layer_s`, 0
    elsewhere): that rate x the tokens one GPU routes (the dp rank's, split by context and
    tensor parallelism: Megatron's dispatcher routes each TP rank's sequence-parallel share)
    x the MoE layers of its pipeline stage. A per-token cost that does not shrink with the
    device's FLOPs or bandwidth (NeMo-RL's measured log-prob passes, `placer.spec.framework.
    NEMO_MOE_ROUTE_S`); 0 for a dense model."""
    if eff.moe_route_token_layer_s <= 0 or not m.moe:
        return 0.0
    tokens = rank_tokens / (par.cp * par.tp)
    return eff.moe_route_token_layer_s * tokens * m.moe_layers / par.pp


def _micro_group(par: Parallel, rank_tokens: float, micro: float) -> float:
    """Tokens a dp rank's GEMMs see at once: its tokens, cut to a micro-batch of a fixed
    `micro_batch` count (a token budget, unset, is `gemm_eff`'s own `MICRO_TOKENS` cap)."""
    return min(rank_tokens, micro) if par.micro_batch > 0 else rank_tokens


def dispatch_time(samples: float, padded_tokens: float, eff: Efficiency) -> float:
    """Seconds a single controller spends shipping a pass's batch to its workers and back:
    `samples` sequences padded to `padded_tokens` each, `dispatch_bytes_per_token` bytes per
    padded token at `dispatch_gbs` (the driver's rate). Independent of the devices: the driver
    serializes every DP rank's chunk (see `Efficiency.dispatch_gbs`)."""
    return samples * padded_tokens * eff.dispatch_bytes_per_token / (eff.dispatch_gbs * GB)


# ------------------------------------------------------------------------- environment, sync
def call_slots(cores: int, cpu_per_call: float) -> int:
    """Tool calls `cores` cores run at once, each taking `cpu_per_call` of them (at least one)."""
    return max(int(cores // cpu_per_call), 1)


def tool_waves(calls: int, cpu_per_call: float, cores: int) -> int:
    """Rounds of tool calls when `calls` wait at once on `cores` cores."""
    return math.ceil(calls / call_slots(cores, cpu_per_call))


def sync_call_cost(m: ModelArch, eff: Efficiency) -> float:
    """Seconds of each call of a refresh after the first: a bucket's call (`sync_call_s`), or,
    unbucketed, one tensor's: the engine's `load_weights` walk over its parameters and expert
    mapping for every tensor it is handed (`engine_load_entries` x `sync_load_entry_s`; verl's
    `_sync_vllm_weights` broadcasts one tensor and calls `load_weights([(key, tensor)])` per
    tensor, so a bucket pays the walk once and an unbucketed sync once per tensor)."""
    if eff.sync_bucket_gb > 0:
        return eff.sync_call_s
    return engine_load_entries(m) * eff.sync_load_entry_s


def weight_sync_time(m: ModelArch, path_gbs: float, dst: DeviceType, eff: Efficiency,
                     calls: int = 1, call_s: float | None = None) -> float:
    """Push BF16 weights over a path of `path_gbs` GB/s in `calls` sequential calls per sender
    (`placer.cost.timing.sync_calls`; the first is in `sync_latency_s`) of `call_s` each
    (`placer.cost.timing.sync_call_cost`); LPUs also pay a reload."""
    return transfer_time(weight_bytes(m), path_gbs, dst, eff, calls, call_s)


def transfer_time(nbytes: float, path_gbs: float, dst: DeviceType, eff: Efficiency,
                  calls: int = 1, call_s: float | None = None) -> float:
    """One weight push of `nbytes` to a `dst` device: the wire at `path_gbs` x `link_eff`, the
    first call's `sync_latency_s`, `call_s` (default `sync_call_s`, a bucket's call) for each
    later call, an LPU's reload. The one formula the planner, the calibration fit and the
    synthetic traces price transfers with."""
    per_call = eff.sync_call_s if call_s is None else call_s
    t = (nbytes / (path_gbs * GB * eff.link_eff) + eff.sync_latency_s
         + max(calls - 1, 0) * per_call)
    if dst.kind is DeviceKind.lpu:
        t += eff.lpu_reload_s
    return t


def host_round_trip_time(gb: float, eff: Efficiency) -> float:
    """Seconds to copy `gb` GB per device to the host and back (every device at once): one copy
    each way over the host link at `offload_gbs`, one after the other. Every move of state off a
    colocated slot's devices is priced by it: a role's switch (`switch_time`), an engine's sleep
    and wake (`engine_swap_time`) and a parked optimizer (`optpark.park_time`). The copies are
    synchronous and the two directions run at different times (verl offloads after a phase and
    loads before the next: volcengine/verl verl/workers/fsdp_workers.py `update_actor`, ~894-935
    at b178a3c, v0.8.0.dev), so a full-duplex link's other direction does not shorten them."""
    return 2.0 * gb / eff.offload_gbs


def switched_gb(mem: Memory) -> float:
    """GB per device a role copies to the host when it gives its colocated slot up: its weights
    and its on-device optimizer state. Gradients are freed, not copied (verl's Megatron offload
    resizes `grad_data` to 0 and re-allocates it zeroed on load, verl/utils/megatron_utils.py
    `offload_megatron_model_to_cpu` / `load_megatron_model_to_gpu` at b178a3c; its FSDP actor
    ends `update_policy` with `zero_grad()`); activations and KV caches are discarded."""
    return mem.weights + mem.optimizer


def switch_time(mem: Memory, eff: Efficiency) -> float:
    """A colocated role's state (`switched_gb`) to the host after its phase and back before its
    next (`host_round_trip_time`)."""
    return host_round_trip_time(switched_gb(mem), eff)


def engine_swap_time(weights_gb: float, eff: Efficiency, sleep_level: int) -> float:
    """A colocated GPU rollout engine's sleep after a generation plus its wake before the next,
    at vLLM's `sleep_level` (`placer.spec.framework.SLEEP_LEVELS`; a job's `Job.sleep_level`).
    Level 1 (verl 0.5 and before, EasyR1, `placer execute`) copies the engine's weights
    (`weights_gb` per device, every device at once) to the host and back over the host link at
    `offload_gbs`; level 2 (verl's hybrid engine with vLLM >= 0.8.5) discards them, and the
    refit that follows every wake writes them again (priced as the sync, `timing.sync_time`),
    so nothing crosses the host link (`SLEEP_COPIES`). Either pays the fixed costs
    (`engine_sleep_s`, `engine_wake_s`: unmapping / re-mapping every allocation, the caches'
    release), measured on a level-1 swap and kept for level 2, which unmaps and maps the same
    allocations; the KV pool is discarded and re-allocated, never copied."""
    copied = SLEEP_COPIES[sleep_level] * weights_gb
    return host_round_trip_time(copied, eff) + eff.engine_sleep_s + eff.engine_wake_s
