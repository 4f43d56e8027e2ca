"""Generation: the time and room of a rollout engine's steps, one replica of a layout at a time.

An inference engine (vLLM, SGLang; an LPU's chip pipeline) runs a rollout as steps: a prefill over
the new tokens of the sequences it admits (`prefill_time`, a forward pass, `forward_time`), then
decode steps that each add one token to every running sequence (`decode_step_time`). A decode step
reads the weights once for the whole batch and every sequence's KV cache: its time is the larger
of a memory line (weights + KV bytes, growing with the batch's total context) and a compute floor
(the batch's FLOPs), plus fixed terms (collectives, stage sends, host overhead). The KV cache's
room (`kv_capacity_tokens`) bounds the sequences an engine can hold (`max_concurrency`; admission
by the KV in use is `placer.cost.admission`). `placer.cost.batching` keeps the per-batch lines
(`decode_step_line`, `prefill_line`) from which the planner's replica replay and the simulator's
engine price their steps.

Formulas (decode step, its bandwidth efficiency, fused-MoE reads, hybrid state, the LPU chip
pipeline) and their sources: docs/cost-model.md, "Prefill and decode".
"""
from __future__ import annotations

import math
from dataclasses import replace

from placer.cost.efficiency import Efficiency
from placer.cost.flash import decode_blocks, kernel_floor, prefill_kernel_time
from placer.cost.kernels import eager_overhead, expert_read_eff
from placer.cost.layercomm import decode_comm, layer_comm, pp_send
from placer.cost.roofline import (
    BYTES,
    GB,
    decode_read_bytes,
    gemm_peak_tflops,
    infer_memory,
    kv_bytes_per_token,
    kv_split,
    matmul_derate,
    pass_compute,
    weight_bytes,
)
from placer.cost.sharding import Parallel, linear_state_bytes, state_split, state_tokens
from placer.cost.vocabcomm import decode_vocab_comm, prefill_vocab_comm
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceKind, DeviceType


def lpu_chips(m: ModelArch, dev: DeviceType, eff: Efficiency) -> int:
    """LPU chips one replica needs: the weights (plus a KV reserve) must sit in SRAM."""
    return math.ceil(weight_bytes(m) * (1 + eff.lpu_kv_reserve) / (dev.memory_gb * GB))


def forward_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
                 eff: Efficiency) -> float:
    """A prefill-like forward pass over `tokens` tokens, spread over dp replicas."""
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, eff)
        per_token = 2 * m.matmul_params() / (chips * dev.bf16_tflops * 1e12 * eff.mfu_prefill)
        replicas = max(par.devices // chips, 1)
        return tokens * per_token / replicas + chips * eff.lpu_hop_s
    # the GEMMs (attention's score FLOPs apart, seq = 0) and the attention kernels
    compute = pass_compute(m, dev, par, tokens, 0.0, 2, eff.mfu_prefill * matmul_derate(dev, par),
                           tokens / par.dp, eff, eff.prefill_half_ridge)
    return (compute + prefill_kernel_time(m, dev, par, tokens, seq, eff)
            + layer_comm(m, dev, par, tokens / par.dp, eff)
            + prefill_vocab_comm(m, dev, par, tokens / par.dp, eff) + eff.step_overhead_s)


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
    (infeasible). Engines admit by the KV in use instead (`placer.cost.admission`)."""
    per_seq = max(max_context, 1) + state_tokens(m, dev, par, eff)
    return int(kv_capacity_tokens(m, dev, par, eff) // per_seq)


def prefill_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, ctx: float,
                 eff: Efficiency) -> float:
    """One prefill of `tokens` new tokens on one replica (context `ctx` for attention)."""
    rep = par if par.dp == 1 else replace(par, dp=1)
    return forward_time(m, dev, rep, tokens, ctx, eff)


def prefill_line(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
                 eff: Efficiency) -> tuple[float, float]:
    """(base, per_ctx) of a prefill of `tokens` new tokens on one replica: prefill_time(tokens,
    ctx) = base + per_ctx * ctx. Only the attention kernels' score FLOPs depend on the
    context, linearly at a fixed token count (`flash.prefill_kernel_time`); an LPU's forward
    does not depend on it. `batching.StepTerms` keeps this per
    token count, so an engine replay prices each prefill size once."""
    rep = par if par.dp == 1 else replace(par, dp=1)
    base = forward_time(m, dev, rep, tokens, 0.0, eff)
    if dev.kind is DeviceKind.lpu:
        return base, 0.0
    return base, (prefill_kernel_time(m, dev, rep, tokens, 1.0, eff)
                  - prefill_kernel_time(m, dev, rep, tokens, 0.0, eff))


def kv_read_time(m: ModelArch, dev: DeviceType, par: Parallel, batch: int, kv_tokens: float,
                 eff: Efficiency) -> float:
    """Seconds a decode step of `batch` sequences reads `kv_tokens` KV tokens in (each device
    its TP share, `ModelArch.kv_tp_shards`, of its data-parallel attention group's), at the
    step's HBM bandwidth efficiency (`decode_bw_eff` of the group's batch): `_decode_terms`'
    k (at kv_tokens = 1), and the decode attention kernel of workflows/operators.py."""
    groups = par.attn_dp
    rate = dev.mem_bw_gbs * GB * decode_bw_eff(math.ceil(batch / groups), par.attn_tp, eff)
    return (kv_tokens * kv_bytes_per_token(m) * par.kv_scale / m.kv_tp_shards(par.attn_tp)
            / groups / rate)


def _decode_terms(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                  eff: Efficiency) -> tuple[float, float, float, float]:
    """A GPU/CPU decode step as max(a + k * context_tokens, c) + d: (a, k, c, d) in seconds.

    With data-parallel attention (`Parallel.attn_dp` groups of attn_tp ranks; DeepSeek-style
    wide EP) the dense weights are read by every group at attn_tp ranks each, the KV of a
    group's batch / attn_dp sequences by its own ranks, each group's scheduler steps its own
    sequences, and the routed experts stay split over all tp = ep ranks.

    a: read the weights the step uses (`decode_read_bytes`) over the tp ranks of a stage, and
    a hybrid's GDN state of each sequence read and written (`linear_state_bytes`); k:
    read one KV token (its TP share, `ModelArch.kv_tp_shards`); c: the batch's matmul FLOPs (2 *
    `matmul_params` per sequence) over tp ranks; d: the step's collectives (`decode_comm`, and
    the vocabulary split's `decode_vocab_comm`), the
    stage-to-stage sends (`pp_send`), the attention kernels' fixed time
    (`attention_floor`) and the engine's per-step overhead. Pipeline stages do not
    shorten a step: a token passes every stage in turn (or, with pp micro-batches in flight,
    every stage reads its weights once per micro-batch), so a step of the whole batch reads
    all the weights and KV at one stage's bandwidth; PP buys memory (KV room), not speed.
    """
    n, groups = par.tp, par.attn_dp
    bw = dev.mem_bw_gbs * GB
    # data-parallel attention: each of the attn_dp groups reads its own dense copy (split over
    # attn_tp ranks) and its own sequences' KV, side by side, for batch / attn_dp sequences
    rate = bw * decode_bw_eff(math.ceil(batch / groups), par.attn_tp, eff)
    # routed experts read at the efficiency of their own split: whole experts per rank under EP
    routed = (m.decode_read_params(batch) - m.decode_read_params(0)) * BYTES
    a = (weight_read_time(decode_read_bytes(m, batch) - routed, math.ceil(batch / groups),
                          par.attn_tp, dev, eff)
         + routed / n / (bw * decode_bw_eff(batch, par.expert_tp, eff)
                         * expert_read_eff(m, dev, par, batch, eff))) * par.weight_scale
    # a hybrid reads and writes every sequence's GDN state once per step (its TP share)
    a += 2 * linear_state_bytes(m, eff) * batch * par.pp / state_split(m, par) / rate
    k = kv_read_time(m, dev, par, batch, 1.0, eff)
    c = decode_flops_time((2 * m.matmul_params() + m.linear_flops_per_token()) * batch, n,
                          dev, par, eff)
    d = (decode_comm(m, dev, par, batch, eff) + decode_vocab_comm(m, dev, par, batch, eff)
         + pp_send(m, dev, par, batch, eff, par.tp)
         + step_overhead(math.ceil(batch / groups), eff) + eager_overhead(m, par, eff)
         + attention_floor(m, dev, par, batch, eff))
    return a, k, c, d


def attention_floor(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                    eff: Efficiency) -> float:
    """GPU time a decode step's attention kernels take whatever their KV (`flash.kernel_floor`
    of the step's grid: a token passes every layer; each layer's kernel runs on every rank of
    its group at once)."""
    return kernel_floor(m, decode_blocks(m, par, batch), dev, eff)


def decode_attention_time(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                          kv_tokens: float, eff: Efficiency) -> float:
    """A decode step's attention kernels alone over `kv_tokens` KV tokens: their KV read
    (`kv_read_time`) plus their fixed time (`attention_floor`), the two terms `_decode_terms`
    prices them with. workflows/operators.py prices one layer's decode attention with it."""
    return kv_read_time(m, dev, par, batch, kv_tokens, eff) + attention_floor(m, dev, par, batch,
                                                                              eff)


def weight_read_time(nbytes: float, batch: int, tp: int, dev: DeviceType,
                     eff: Efficiency) -> float:
    """Seconds a decode step of `batch` sequences reads `nbytes` of weights split over tp
    ranks in: nbytes / tp / (HBM bandwidth * `decode_bw_eff`)."""
    return nbytes / tp / (dev.mem_bw_gbs * GB * decode_bw_eff(batch, tp, eff))


def decode_flops_time(flops: float, tp: int, dev: DeviceType, par: Parallel,
                      eff: Efficiency) -> float:
    """Seconds of a decode step's `flops` matmul FLOPs over tp ranks at `decode_flops_eff`
    (lowered by `matmul_derate` where the device's matmuls reach less of their peak)."""
    return flops / tp / (gemm_peak_tflops(dev, par) * 1e12 * eff.decode_flops_eff
                         * matmul_derate(dev, par))


def decode_matmul_time(nbytes: float, flops: float, batch: int, dev: DeviceType, par: Parallel,
                       eff: Efficiency) -> float:
    """A decode step's matmuls over `nbytes` of weights doing `flops`, alone: the larger of
    their read and their FLOPs (`_decode_terms`' a and c for these weights, no KV, no fixed
    terms). workflows/operators.py prices one layer's linear layers with it."""
    return max(weight_read_time(nbytes, batch, par.tp, dev, eff),
               decode_flops_time(flops, par.tp, dev, par, eff))


def decode_bw_eff(batch: int, tp: int, eff: Efficiency) -> float:
    """Achieved fraction of HBM bandwidth of a decode step: decode_bw_eff * batch / (batch +
    decode_bw_half_batch) / (1 + decode_tp_bw_loss * log2 tp) (see the `Efficiency` fields)."""
    b = max(batch, 1)
    return (eff.decode_bw_eff * b / (b + eff.decode_bw_half_batch)
            / (1 + eff.decode_tp_bw_loss * math.log2(max(tp, 1))))


def step_overhead(batch: int, eff: Efficiency) -> float:
    """Host time of one engine step of `batch` sequences: step_overhead_s +
    step_overhead_per_seq_s * batch."""
    return eff.step_overhead_s + eff.step_overhead_per_seq_s * max(batch, 0)


def _lpu_decode_step(m: ModelArch, dev: DeviceType, batch: int, eff: Efficiency) -> float:
    """A token walks the chip pipeline; each further sequence adds one chip's stage time."""
    chips = lpu_chips(m, dev, eff)
    stage = max(decode_read_bytes(m, 1) / chips / (dev.mem_bw_gbs * GB * eff.decode_bw_eff),
                2 * m.matmul_params() / chips / (dev.bf16_tflops * 1e12 * eff.decode_flops_eff))
    return eff.lpu_step_s + chips * eff.lpu_hop_s + (batch - 1) * stage


def decode_step_line(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                     eff: Efficiency) -> tuple[float, float, float]:
    """(m0, k, floor) of a decode step of `batch` (> 0) sequences: its time at C KV tokens in
    total is max(m0 + k * C, floor) (`_decode_terms` with the fixed term d folded in; an LPU's
    step does not depend on C). `batching.Run` sums runs of steps from these three numbers."""
    if dev.kind is DeviceKind.lpu:
        t = _lpu_decode_step(m, dev, batch, eff)
        return t, 0.0, t
    a, k, c, d = _decode_terms(m, dev, par, batch, eff)
    return a + d, k, c + d


def decode_step_time(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                     context_tokens: float, eff: Efficiency) -> float:
    """One decode step of `batch` sequences holding `context_tokens` KV tokens in total."""
    if batch <= 0:
        return 0.0
    m0, k, floor = decode_step_line(m, dev, par, batch, eff)
    return max(m0 + k * context_tokens, floor)


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

