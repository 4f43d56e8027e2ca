"""The one cost model: memory and time of every role's work on a device type and parallel config.

The ILP, the baselines and the simulator all price work here, so their numbers agree on the same
work. Formulas are first principles plus named efficiency factors (`Efficiency`), each with a
default that a calibration profile overrides per device type.

Notation: P parameters (`ModelArch.params`: embeddings, GQA attention, SwiGLU MLP, RMSNorm), L
layers, h hidden, s context, b = 2 bytes per element (BF16), T tokens, n = tp*pp devices of one
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
  KV cache         2 * L * kv_heads * head_dim * b per token (keys and values of every layer)
  engine           a fixed `engine_mem_gb` per inference GPU, `train_mem_gb` per training device
Time:
  training         (6*P + 12*L*h*s) FLOPs per token, (8*P + 16*L*h*s) with full recomputation
                   (one more forward): Narayanan et al. 2021 count 96*B*s*L*h^2*(1 + s/6h +
                   V/16Lh) per batch with recomputation, i.e. 8*(12*L*h^2) + 16*L*h*s per token;
                   PaLM's MFU accounting (Chowdhery et al. 2022, app. B) is the 6*N + 12*L*h*s
                   form. P here includes the input embedding (a lookup, no FLOPs): ~6-7% high
                   for 7-8B models with 128-152k vocabularies, 1-2% at 70B; the fitted
                   mfu_train absorbs it. / (devices * peak * mfu_train)
                   + pipeline bubble compute * (pp-1)/m with m = 4*pp micro-batches (1F1B
                   schedule, Narayanan et al. 2021)
                   + per optimizer step: ring all-reduce of bf16 grads 2(dp-1)/dp * 2P/n bytes over
                   NVLink (<= 8 devices) or the NIC (Patarasuk & Yuan 2009), optimizer offload
                   traffic 2 * 12P/(n*dp) bytes at `offload_gbs`, and `train_overhead_s`
                   + TP: 2 all-reduces of T*h*b bytes per layer per pass (Shoeybi et al. 2019),
                   3 passes with recomputation, 2 without, layers / pp
  forward          (2*P + 4*L*h*s) FLOPs per token / (devices * peak * mfu_prefill) + TP comm
                   (one pass) + `step_overhead_s`
  decode step      max((P*b + KV bytes * context) / n / (bw * decode_bw_eff),
                       2*P*batch / n / (peak * decode_flops_eff))
                   + TP comm of the batch's tokens + `step_overhead_s`; memory-bound at small
                   batch (Pope et al. 2022; the roofline view of decoding)
  continuous batch concurrency = floor(KV capacity / longest context), KV capacity = (memory *
                   kv_mem_fraction - weights - engine) * n / KV bytes per token (vLLM's
                   gpu_memory_utilization, Kwon et al. 2023)
  LPU              weights live in SRAM: chips = ceil(P*b * (1 + lpu_kv_reserve) / SRAM) (230
                   MB per GroqChip); KV room = chips * SRAM * reserve / (1 + reserve);
                   decode step = lpu_step_s + chips * lpu_hop_s + (batch-1) * one chip's stage
                   time (max of its weight reads and FLOPs); the two constants are fitted so that
                   batch-1 decoding reproduces Groq's public ~300 tokens/s per user on
                   Llama-2-70B and ~750 on Llama-2-7B; forward = 2*P per token over the chips'
                   FLOP/s * mfu_prefill, replicas = devices // chips, + chips * lpu_hop_s
  environment      waves = ceil(calls / max(floor(cores / cpu_per_call), 1)), each the call's
                   mean latency + tool_overhead_s; a rule reward is ceil(samples / cores) *
                   rule_reward_s
  weight sync      P*b / (path GB/s * link_eff) + sync_latency_s (+ lpu_reload_s onto LPUs)
  colocation       switching roles moves state host<->device at `offload_gbs`
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

    # Megatron-LM reaches 52-56% MFU on 0.5-1T GPT pre-training (Narayanan et al. 2021,
    # Korthikanti et al. 2022); RL steps on smaller models and batches run lower.
    mfu_train: float = 0.40
    mfu_prefill: float = 0.50  # prefill / forward passes: large GEMMs, a bit higher than training
    decode_bw_eff: float = 0.70  # decode achieves ~70% of HBM bandwidth (vLLM/TRT-LLM measurements)
    decode_flops_eff: float = 0.50
    link_eff: float = 0.80  # achieved fraction of NVLink / NIC bandwidth in collectives
    step_overhead_s: float = 0.002  # per engine step (scheduling, sampling, kernel launches)
    train_overhead_s: float = 0.05  # per optimizer step (optimizer, launch, sync)
    engine_mem_gb: float = 2.0  # CUDA context, activations and graphs of an inference engine
    kv_mem_fraction: float = 0.90  # share of device memory an engine may use (gpu_memory_util)
    # LPU batch-1 token time = lpu_step_s + chips * lpu_hop_s, solved from two public figures
    # with this model's chip counts: Llama-2-70B (660 chips) ~300 tok/s, Llama-2-7B (65) ~750.
    lpu_hop_s: float = 3.36e-6  # per chip a token passes through
    lpu_step_s: float = 1.11e-3  # per LPU decode step, whatever the chip count
    lpu_kv_reserve: float = 0.10  # SRAM share kept for KV beyond the weights
    lpu_reload_s: float = 5.0  # fixed cost to re-push weights onto LPU chips (assumption)
    offload_gbs: float = 25.0  # host<->device copy (PCIe Gen5 x16 ~ 50 GB/s, half achieved)
    tool_overhead_s: float = 0.0  # fixed cost per tool call on top of its drawn latency
    sync_latency_s: float = 0.01  # per weight-sync transfer (setup, NCCL/RPC)
    train_mem_gb: float = 1.0  # per training device: CUDA context, allocator fragmentation
    rule_reward_s: float = 0.005  # CPU seconds to verify one sample with a rule (assumption)

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
def train_memory(m: ModelArch, par: Parallel, micro_tokens: int,
                 eff: Efficiency | None = None) -> Memory:
    """Per-device memory of training with mixed-precision Adam (bytes -> GB).

    `micro_tokens` are the tokens of one micro-batch (its activations are live at once).
    """
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
                  activations=act / GB, overhead=(eff or Efficiency()).train_mem_gb)


def train_flops(m: ModelArch, tokens: float, seq: float, recompute: bool) -> float:
    """Forward + backward (+ recomputed forward) FLOPs: (6 or 8) * (P + 2*L*h*s) per token."""
    passes = 8 if recompute else 6  # forward 2, backward 4, recomputed forward 2
    return passes * (m.params() + 2 * m.layers * m.hidden * seq) * tokens


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
    # Megatron TP: 2 all-reduces per layer in the forward, 2 in the backward, 2 more in the
    # recomputed forward; each device runs layers / pp of them.
    passes = 3 if par.recompute else 2
    tp_comm = _tp_comm(m, dev, par.tp, tokens / par.dp, eff) * passes / par.pp
    offload = 0.0
    if par.offload:
        offload = 2 * 12 * m.params() / par.replica / par.dp / (eff.offload_gbs * GB)
    return compute + bubble + steps * (allreduce + offload + eff.train_overhead_s) + tp_comm


def _tp_comm(m: ModelArch, dev: DeviceType, tp: int, tokens: float, eff: Efficiency) -> float:
    """One pass's TP traffic: 2 ring all-reduces of tokens*h bf16 activations per layer."""
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


def _decode_terms(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                  eff: Efficiency) -> tuple[float, float, float, float]:
    """A GPU/CPU decode step as max(a + k * context_tokens, c) + d: (a, k, c, d) in seconds.

    a: read the replica's weights; k: read one KV token; c: the batch's matmul FLOPs;
    d: TP all-reduces of the batch's tokens and the engine's per-step overhead.
    """
    n = par.replica
    rate = dev.mem_bw_gbs * GB * eff.decode_bw_eff
    a = weight_bytes(m) / n / rate
    k = kv_bytes_per_token(m) / n / rate
    c = 2 * m.params() * batch / n / (dev.bf16_tflops * 1e12 * eff.decode_flops_eff)
    d = _tp_comm(m, dev, par.tp, batch, eff) + eff.step_overhead_s
    return a, k, c, d


def _lpu_decode_step(m: ModelArch, dev: DeviceType, batch: int, eff: Efficiency) -> float:
    """A token walks the chip pipeline; each further sequence adds one chip's stage time."""
    chips = lpu_chips(m, dev, eff)
    stage = max(weight_bytes(m) / chips / (dev.mem_bw_gbs * GB * eff.decode_bw_eff),
                2 * m.params() / chips / (dev.bf16_tflops * 1e12 * eff.decode_flops_eff))
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


def weight_sync_time(m: ModelArch, path_gbs: float, dst: DeviceType, eff: Efficiency) -> float:
    """Push BF16 weights over a path of `path_gbs` GB/s; LPUs also pay a reload."""
    t = weight_bytes(m) / (path_gbs * GB * eff.link_eff) + eff.sync_latency_s
    if dst.kind is DeviceKind.lpu:
        t += eff.lpu_reload_s
    return t


def switch_time(mem_gb: float, eff: Efficiency) -> float:
    """Offload one role's state to the host and onload the next (colocated roles)."""
    return mem_gb * GB / (eff.offload_gbs * GB)
