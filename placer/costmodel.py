"""The one cost model: memory and time of every role's work on a device type and parallel config.

The ILP, the baselines and the simulator all price work here, so their numbers agree on the same
work. Formulas are first principles plus named efficiency factors (`Efficiency`), each with a
default that a calibration profile overrides per device type.

Notation: P parameters, L layers, h hidden, b bytes per element (2 for BF16), T tokens.

Memory (per device, GB = 1e9 bytes):
  weights          P*b / (tp*pp)                                    (frozen / inference roles)
  training states  16 bytes/param for mixed-precision Adam (bf16 weights 2 + bf16 grads 2 + fp32
                   master 4 + Adam m 4 + v 4; ZeRO paper, Rajbhandari et al. 2020), divided by
                   tp*pp and, for the sharded part (ZeRO stage), by dp
  activations      per token per layer: 34*h bytes without recomputation (Korthikanti et al. 2022,
                   flash attention so no s^2 term), 2*h with full recomputation; divided by tp
  KV cache         2 * L * kv_heads * head_dim * b per token (keys and values of every layer)
Time:
  training         (6*P + 12*L*h*s) FLOPs per token (Kaplan et al. 2020; 8*P with recomputation)
                   / (devices * peak * mfu_train) + DP gradient all-reduce 2(dp-1)/dp * grad bytes
                   / link + pipeline bubble (pp-1)/microbatches
  forward          (2*P + 4*L*h*s) FLOPs per token / (devices * peak * mfu_prefill)
  decode step      max(weight bytes + KV bytes read, 2*P*batch FLOPs) / achieved rate
                   + 2 all-reduces per layer for tp > 1 + a fixed per-step engine overhead
  LPU              weights live in SRAM: chips = ceil(weight bytes * (1 + kv reserve) / SRAM);
                   a token walks the chip pipeline (per-chip hop latency, fitted to Groq's
                   ~300 tokens/s per user on Llama-2-70B over 576 chips)
  environment      waves of ceil(calls * cpu_per_call / cores) tool calls, each its latency
  weight sync      P*b / path bandwidth + latency (+ a fixed reload cost on LPUs)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from placer.spec import DeviceKind, DeviceType, ModelArch

GB = 1e9
BYTES = 2  # BF16


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak and fixed overheads. Defaults are public rules of thumb."""

    mfu_train: float = 0.40  # Megatron-LM reports 40-55% MFU for GPT training at scale
    mfu_prefill: float = 0.50  # prefill / forward passes: large GEMMs, a bit higher than training
    decode_bw_eff: float = 0.70  # decode achieves ~70% of HBM bandwidth (vLLM/TRT-LLM measurements)
    decode_flops_eff: float = 0.50
    link_eff: float = 0.80  # achieved fraction of NVLink / NIC bandwidth in collectives
    step_overhead_s: float = 0.002  # per engine step (scheduling, sampling, kernel launches)
    train_overhead_s: float = 0.05  # per optimizer step (optimizer, launch, sync)
    engine_mem_gb: float = 2.0  # CUDA context, activations and graphs of an inference engine
    kv_mem_fraction: float = 0.90  # share of device memory an engine may use (gpu_memory_util)
    lpu_hop_s: float = 5.8e-6  # per chip in the pipeline: 1/300 s per token / 576 chips (Groq 70B)
    lpu_kv_reserve: float = 0.10  # SRAM share kept for KV beyond the weights
    lpu_reload_s: float = 5.0  # fixed cost to re-push weights onto LPU chips (assumption)
    offload_gbs: float = 25.0  # host<->device copy (PCIe Gen5 x16 ~ 50 GB/s, half achieved)
    tool_overhead_s: float = 0.0  # fixed cost per tool call on top of its drawn latency
    sync_latency_s: float = 0.01  # per weight-sync transfer (setup, NCCL/RPC)

    def override(self, values: dict[str, float]) -> "Efficiency":
        known = {f.name for f in fields(self)}
        bad = sorted(set(values) - known)
        if bad:
            raise KeyError(f"unknown efficiency factor(s) {bad}; known: {sorted(known)}")
        return replace(self, **values)


@dataclass(frozen=True)
class Calibration:
    """Per-device-type efficiency overrides (fitted from traces by `placer calibrate`)."""

    default: Efficiency = field(default_factory=Efficiency)
    per_device: dict[str, Efficiency] = field(default_factory=dict)

    def for_device(self, dev: DeviceType) -> Efficiency:
        return self.per_device.get(dev.name, self.default)


@dataclass(frozen=True)
class Parallel:
    """A parallel configuration of one role. `zero` is the ZeRO/FSDP stage (0: none, 3: full)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 3
    recompute: bool = True
    offload: bool = False  # optimizer state (training) kept on the host

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def replica(self) -> int:
        return self.tp * self.pp


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
    return m.params() * BYTES


def kv_bytes_per_token(m: ModelArch) -> float:
    return 2 * m.layers * m.kv_heads * m.head_dim * BYTES


# ------------------------------------------------------------------------------------ training
def train_memory(m: ModelArch, par: Parallel, micro_tokens: int) -> Memory:
    """Per-device memory of training with mixed-precision Adam (bytes -> GB)."""
    P = m.params() / par.replica
    shard = par.dp if par.zero >= 1 else 1
    opt = 12 * P / shard
    grads = 2 * P / (par.dp if par.zero >= 2 else 1)
    wts = 2 * P / (par.dp if par.zero >= 3 else 1)
    per_tok_layer = (2 if par.recompute else 34) * m.hidden / par.tp
    act = micro_tokens * per_tok_layer * m.layers / par.pp
    if par.recompute:  # one layer's full activations are live while it is recomputed
        act += micro_tokens * 34 * m.hidden / par.tp
    return Memory(weights=wts / GB, grads=grads / GB, optimizer=0.0 if par.offload else opt / GB,
                  activations=act / GB, overhead=1.0)


def train_flops(m: ModelArch, tokens: float, seq: float, recompute: bool) -> float:
    per_tok = (8 if recompute else 6) * m.params() + 12 * m.layers * m.hidden * seq
    return per_tok * tokens


def train_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
               steps: int, eff: Efficiency) -> float:
    """Seconds for `steps` optimizer steps over `tokens` tokens in total."""
    compute = train_flops(m, tokens, seq, par.recompute) / (par.devices * dev.bf16_tflops * 1e12
                                                              * eff.mfu_train)
    micro = max(4 * par.pp, 1)
    bubble = compute * (par.pp - 1) / micro
    grad = 2 * m.params() / par.replica
    link = dev.intra_link_gbs if par.dp * par.replica <= 8 else dev.nic_gbs
    allreduce = 2 * (par.dp - 1) / par.dp * grad / (link * GB * eff.link_eff) if par.dp > 1 else 0.0
    tp_comm = _tp_comm(m, dev, par.tp, tokens / par.dp, eff) * 3  # fwd + bwd (x2)
    offload = 0.0
    if par.offload:
        offload = 2 * 12 * m.params() / par.replica / par.dp / (eff.offload_gbs * GB)
    return compute + bubble + steps * (allreduce + offload + eff.train_overhead_s) + tp_comm


def _tp_comm(m: ModelArch, dev: DeviceType, tp: int, tokens: float, eff: Efficiency) -> float:
    """Two all-reduces of the activations per layer (Megatron tensor parallelism)."""
    if tp == 1:
        return 0.0
    vol = 2 * m.layers * tokens * m.hidden * BYTES * 2 * (tp - 1) / tp
    return vol / (dev.intra_link_gbs * GB * eff.link_eff)


# ----------------------------------------------------------------------------- frozen forward
def infer_memory(m: ModelArch, par: Parallel, dev: DeviceType, eff: Efficiency) -> Memory:
    """Weights of a frozen model (reference, reward, critic forward, rollout engine)."""
    over = eff.engine_mem_gb if dev.kind is DeviceKind.gpu else 0.0
    return Memory(weights=weight_bytes(m) / par.replica / GB, overhead=over)


def forward_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, seq: float,
                 eff: Efficiency) -> float:
    """A prefill-like forward pass over `tokens` tokens, spread over dp replicas."""
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, eff)
        per_token = 2 * m.params() / (chips * dev.bf16_tflops * 1e12 * eff.mfu_prefill)
        replicas = max(par.devices // chips, 1)
        return tokens * per_token / replicas + chips * eff.lpu_hop_s
    flops = (2 * m.params() + 4 * m.layers * m.hidden * seq) * tokens
    compute = flops / (par.devices * dev.bf16_tflops * 1e12 * eff.mfu_prefill)
    return compute + _tp_comm(m, dev, par.tp, tokens / par.dp, eff) + eff.step_overhead_s


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
    return max(free, 0.0) * GB * par.replica / kv_bytes_per_token(m)


def max_concurrency(m: ModelArch, dev: DeviceType, par: Parallel, max_context: int,
                    eff: Efficiency) -> int:
    """Sequences one engine replica runs at once: each reserves KV for its longest context."""
    return int(kv_capacity_tokens(m, dev, par, eff) // max(max_context, 1))


def prefill_time(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, ctx: float,
                 eff: Efficiency) -> float:
    """One prefill of `tokens` new tokens on one replica (context `ctx` for attention)."""
    rep = Parallel(tp=par.tp, pp=par.pp, dp=1)
    return forward_time(m, dev, rep, tokens, ctx, eff)


def decode_step_time(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                     context_tokens: float, eff: Efficiency) -> float:
    """One decode step of `batch` sequences holding `context_tokens` KV tokens in total."""
    if batch <= 0:
        return 0.0
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, eff)
        stage = max(weight_bytes(m) / chips / (dev.mem_bw_gbs * GB * eff.decode_bw_eff),
                    2 * m.params() / chips / (dev.bf16_tflops * 1e12 * eff.decode_flops_eff))
        return chips * eff.lpu_hop_s + (batch - 1) * stage + eff.step_overhead_s
    n = par.replica
    read = (weight_bytes(m) + kv_bytes_per_token(m) * context_tokens) / n
    mem = read / (dev.mem_bw_gbs * GB * eff.decode_bw_eff)
    comp = 2 * m.params() * batch / n / (dev.bf16_tflops * 1e12 * eff.decode_flops_eff)
    return max(mem, comp) + _tp_comm(m, dev, par.tp, batch, eff) + eff.step_overhead_s


def decode_run_time(m: ModelArch, dev: DeviceType, par: Parallel, batch: int, ctx0: float,
                    steps: int, eff: Efficiency) -> float:
    """`steps` decode steps of a lockstep batch whose per-sequence context starts at `ctx0`.

    Exact sum of `decode_step_time` over the steps: the memory term is linear in the context,
    so the sum is closed-form when memory-bound; mixed regimes fall back to summing.
    """
    if steps <= 0 or batch <= 0:
        return 0.0
    first = decode_step_time(m, dev, par, batch, batch * ctx0, eff)
    last = decode_step_time(m, dev, par, batch, batch * (ctx0 + steps - 1), eff)
    mid = decode_step_time(m, dev, par, batch, batch * (ctx0 + (steps - 1) / 2), eff)
    if abs((first + last) / 2 - mid) <= 1e-12 * max(mid, 1e-30):
        return steps * (first + last) / 2  # linear in the step index: arithmetic series
    return sum(decode_step_time(m, dev, par, batch, batch * (ctx0 + i), eff) for i in range(steps))


# ------------------------------------------------------------------------- environment, sync
def tool_waves(calls: int, cpu_per_call: float, cores: int) -> int:
    """Rounds of tool calls when `calls` wait at once on `cores` cores."""
    per_wave = max(int(cores // cpu_per_call), 1)
    return math.ceil(calls / per_wave)


def weight_sync_time(m: ModelArch, path_gbs: float, dst: DeviceType, eff: Efficiency) -> float:
    """Push BF16 weights over a path of `path_gbs` GB/s; LPUs also pay a reload."""
    t = weight_bytes(m) / (path_gbs * GB * eff.link_eff) + eff.sync_latency_s
    if dst.kind is DeviceKind.lpu:
        t += eff.lpu_reload_s
    return t


def switch_time(mem_gb: float, eff: Efficiency) -> float:
    """Offload one role's state to the host and onload the next (colocated roles)."""
    return mem_gb * GB / (eff.offload_gbs * GB)
