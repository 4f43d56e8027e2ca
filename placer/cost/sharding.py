"""How a parallel layout splits one model over devices: its weights, training state, tokens, and
the collectives that join the pieces (Megatron-Core's five dimensions; vLLM / SGLang engines).

A layout (`Parallel`) has tp, cp, pp, dp (with ZeRO stage, offload and an HSDP `shard` group), ep
and etp, plus its precision and engine settings. This module says what each device holds
(`params_per_device`, `train_state_bytes`, `grad_bytes`), the tokens a routed expert's GEMMs see
(`expert_tokens`), a hybrid model's per-sequence state (`linear_state_bytes`, `state_split`), and
the messages of expert and context parallelism (`ep_all_to_all`, `cp_kv_exchange`); the layer
collectives are priced in `placer.cost.layercomm`.

The rules (Megatron-Core's expert grid, ZeRO groups, engine replicas) and their sources:
docs/cost-model.md, "Parallel layouts".
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.cost.collectives import Link, all_gather, all_to_all
from placer.cost.efficiency import Efficiency
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceKind, DeviceType

BYTES = 2  # BF16
# bytes a parameter of mixed-precision Adam's optimizer state: the fp32 master weight and the two
# fp32 moments (a framework that keeps less says so: `FrameworkProfile.optimizer_bytes`)
OPTIMIZER_BYTES = 12.0


@dataclass(frozen=True)
class Parallel:
    """A parallel configuration of one role. `zero` is the ZeRO/FSDP stage (0: none, 3: full).

    New fields come after the first six so that positional construction stays valid."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 3
    recompute: bool = True
    offload: bool = False  # optimizer state (training) kept on the host
    cp: int = 1  # context parallelism (training)
    ep: int = 1  # expert parallelism (MoE)
    etp: int = 1  # expert tensor parallelism, with ep > 1
    # FP8 (the job's `precision`, set only on devices with FP8 tensor cores)
    fp8_weights: bool = False  # inference weights: half the bytes, GEMMs at the FP8 peak
    fp8_kv: bool = False  # KV cache: half the bytes per token
    fp8_train: bool = False  # training GEMMs at the FP8 peak
    # Inference engine: decode steps replayed as CUDA graphs (vLLM's and SGLang's default);
    # False is eager mode (vLLM `enforce_eager`), which launches every kernel from Python each
    # step (`costmodel.eager_overhead`)
    cuda_graphs: bool = True
    # Hybrid sharded data parallelism (HSDP: FSDP2's 2-D (replicate, shard) mesh, verl's
    # `fsdp_size`, DeepSpeed's MiCS; not ZeRO++ hpZ, whose state stays sharded over all of dp):
    # dp ranks of one ZeRO shard group; the dp / shard groups replicate each other. 0 (or dp):
    # ZeRO over all of dp.
    shard: int = 0
    # Inference engine: data-parallel attention inside one replica (SGLang --enable-dp-attention
    # --dp N, vLLM --data-parallel-size N with --enable-expert-parallel): the replica's tp ranks
    # form attn_dp groups of tp / attn_dp ranks, each group running attention (and the dense
    # layers) on its own sequences with its own KV cache, while the routed experts are split
    # over all tp ranks by EP (ep = tp). 1: attention is tensor-parallel over all of tp.
    attn_dp: int = 1
    # A frozen model's forward (reference, reward model) on GPUs: weights FSDP-sharded over the
    # dp ranks, as verl's and NeMo-RL's reference workers hold them (the actor's wrapping applied
    # to the reference), rather than a whole copy on every tp x pp group
    # (`placer.cost.estimate.frozen_sharded`)
    sharded_weights: bool = False
    # Training: sequences per micro-batch on one device (verl's ppo_micro_batch_size_per_gpu),
    # chosen by the planner (`placer.solve.candidates.micro_batches`); 0: micro-batches of a
    # token budget of `layercomm.MICRO_TOKENS` (verl's use_dynamic_bsz), activations priced for
    # one longest sequence
    micro_batch: int = 0
    # Training on GPUs: the optimizer state parked in host memory between phases and brought
    # back for the step, which runs on the GPU (verl's `optimizer_offload`, NeMo-RL's colocated
    # default; `placer.cost.optpark`), unlike `offload`, whose step runs on the host
    park_optimizer: bool = False
    # The role's parameters parked in host memory between phases and loaded for each phase that
    # runs the module (verl's `param_offload`; `placer.cost.offload`, which prices each
    # framework's copies): a published run's setting, not a planner candidate
    park_params: bool = False
    # Forward micro-batches cut by a token budget (tokens per device) the framework sets: EasyR1's
    # `dynamic_batching` cuts `micro_batch_size_per_device_for_experience` x the padded sequence
    # length. 0: the job's `micro_token_budget` (`estimate.budgeted`), else
    # `layercomm.MICRO_TOKENS` (verl's log_prob_max_token_len_per_gpu default)
    micro_token_budget: int = 0
    # A frozen model's weights held in host memory and copied to the GPU, unit by FSDP unit, on
    # every forward micro-batch (FSDP's CPU parameter offload, which verl and EasyR1 set on the
    # reference): bytes per parameter of the host copy (`placer.cost.offload.stream_time`);
    # 0: the weights stay on the GPU. A planner candidate where the job's framework streams
    # that role (`FrameworkProfile.stream_frozen`, `placer.solve.layouts.streamed_frozen`)
    stream_params_bytes: float = 0.0
    # Megatron's uneven pipeline split (`num_layers_in_first_pipeline_stage`,
    # `num_layers_in_last_pipeline_stage`): transformer layers on the first / last stage, the
    # rest split evenly over the others; 0: num_layers / pp (`placer.cost.stages`). A published
    # recipe's setting, not a planner candidate
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    # Training: bytes a gradient element moves in the trainer's gradient reduction (the
    # reduce-scatter or all-reduce; the weights' gathers stay BF16): 4 where the framework
    # reduces in fp32 (FSDP's `reduce_dtype`, Megatron's `grad_reduce_in_fp32`), 2 in BF16
    # (`FrameworkProfile.grad_reduce_bytes`, which `estimate` sets on the update's layout)
    grad_reduce_bytes: int = BYTES

    @property
    def attn_tp(self) -> int:
        """Ranks one attention group's weights and heads are split over: tp / attn_dp."""
        return max(self.tp // max(self.attn_dp, 1), 1)

    @property
    def shard_dp(self) -> int:
        """dp ranks of one ZeRO shard group: `shard` when it splits dp, else all of dp."""
        return self.shard if 0 < self.shard < self.dp else self.dp

    @property
    def shard_replicas(self) -> int:
        """Shard groups that replicate each other (1 without HSDP)."""
        return max(self.dp // self.shard_dp, 1)

    @property
    def hsdp(self) -> bool:
        """Whether the training state is sharded inside groups smaller than dp."""
        return self.shard_replicas > 1

    @property
    def zero_group(self) -> int:
        """Ranks the dense training state is ZeRO-sharded over: the shard group's dp x cp."""
        return self.shard_dp * self.cp

    @property
    def expert_zero_group(self) -> int:
        """Ranks one expert shard's training state is ZeRO-sharded over: `expert_dp`, split
        into the shard groups' replicas."""
        return max(self.expert_dp // self.shard_replicas, 1)

    @property
    def weight_scale(self) -> float:
        """Bytes of an inference weight relative to BF16."""
        return 0.5 if self.fp8_weights else 1.0

    @property
    def kv_scale(self) -> float:
        """Bytes of a KV element relative to BF16."""
        return 0.5 if self.fp8_kv else 1.0

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def replica(self) -> int:
        """Devices of one model copy's compute group (tp x cp x pp)."""
        return self.tp * self.cp * self.pp

    @property
    def weight_shards(self) -> int:
        """Ways the dense weights are split (CP replicates them; so do data-parallel attention
        groups, each holding its own copy split over attn_tp ranks)."""
        return self.attn_tp * self.pp

    @property
    def expert_shards(self) -> int:
        """Ways the routed experts are split: pp stages x (ep x etp, or tp without EP)."""
        return self.pp * (self.ep * self.etp if self.ep > 1 else self.tp)

    @property
    def expert_tp(self) -> int:
        """Ranks each expert's matrices are split over: etp with EP, else tp."""
        return self.etp if self.ep > 1 else self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks that hold the same expert shard in training (its ZeRO group)."""
        if self.ep == 1:
            return self.dp * self.cp
        return max(self.tp * self.cp * self.dp // (self.ep * self.etp), 1)


def routed_expert_params(m: ModelArch) -> int:
    """Parameters of every routed expert of every MoE layer (0 for a dense model)."""
    return m.moe_layers * m.experts * m.expert_params()


def active_expert_params(m: ModelArch) -> int:
    """Routed-expert parameters one token multiplies by: k experts per MoE layer."""
    return m.moe_layers * m.experts_per_token * m.expert_params()


def params_per_device(m: ModelArch, par: Parallel) -> tuple[float, float]:
    """(dense, routed-expert) parameters one device holds before any ZeRO sharding."""
    experts = routed_expert_params(m)
    return (m.params() - experts) / par.weight_shards, experts / par.expert_shards


def train_state_bytes(m: ModelArch, par: Parallel,
                      optimizer_bytes: float = OPTIMIZER_BYTES) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per device of mixed-precision Adam (2 + 2 +
    `optimizer_bytes` a parameter, `OPTIMIZER_BYTES` unless a framework's optimizer keeps less:
    `FrameworkProfile.optimizer_bytes`), ZeRO stage `zero` sharding optimizer (>= 1), grads
    (>= 2) and weights (3) over each part's ZeRO group: dp * cp for the dense part, `expert_dp`
    for the experts (with HSDP the shard group's: `zero_group`, `expert_zero_group`)."""
    parts = zip(params_per_device(m, par), (par.zero_group, par.expert_zero_group))
    shares = list(parts)

    def sharded(stage: int) -> float:
        return sum(p / (g if par.zero >= stage else 1) for p, g in shares)

    return 2 * sharded(3), 2 * sharded(2), optimizer_bytes * sharded(1)


def grad_bytes(m: ModelArch, par: Parallel) -> tuple[float, float]:
    """(dense, expert) BF16 bytes of the device's weights (and of its gradients in BF16), which
    ZeRO gathers and the optimizer step reduces over dp * cp and `expert_dp` ranks
    respectively."""
    dense, experts = params_per_device(m, par)
    return BYTES * dense, BYTES * experts


def reduce_ratio(par: Parallel) -> float:
    """How many times the BF16 bytes the layout's gradient reduction moves:
    `Parallel.grad_reduce_bytes` / 2 (2 where the trainer reduces in fp32)."""
    return par.grad_reduce_bytes / BYTES


def expert_tokens(m: ModelArch, par: Parallel, group_tokens: float) -> float:
    """Tokens one routed expert's GEMM sees when every TP x CP group holds `group_tokens`: each
    rank routes its share, group_tokens / (tp * cp), an expert's ep * etp ranks gather those of
    the whole expert group, and k / E of them choose it (balanced routing): group_tokens * ep *
    etp / (tp * cp) * k / E. Without EP (the experts split over TP) that is the group's own
    tokens / cp * k / E."""
    if not m.moe:
        return group_tokens
    share = par.ep * par.expert_tp / (par.tp * par.cp)
    return group_tokens * share * m.experts_per_token / m.experts


def ep_all_to_all(m: ModelArch, par: Parallel, tokens_per_rank: float, link: Link) -> float:
    """One MoE layer's dispatch + combine of `tokens_per_rank` tokens (a call each): every
    rank sends its k routed copies of each token, tokens * k * h * b bytes, over ep ranks."""
    if par.ep <= 1 or not m.moe or tokens_per_rank <= 0:
        return 0.0
    nbytes = tokens_per_rank * m.experts_per_token * m.hidden * BYTES
    return 2 * all_to_all(nbytes, par.ep, link)


def cp_kv_bytes(m: ModelArch, tokens_per_group: float, tp: int = 1) -> float:
    """Bytes of one layer's K and V over the `tokens_per_group` tokens of a cp group, as one
    TP rank holds them (its KV heads: `kv_tp_shards`): the buffer each rank of the trainer's
    context parallelism all-gathers in a forward and reduce-scatters in a backward, per layer
    (executors/cpattn.py; tests/test_exec_cp.py counts it)."""
    return tokens_per_group * m.kv_elements_per_token() / m.layers * BYTES / m.kv_tp_shards(tp)


def cp_kv_exchange(m: ModelArch, par: Parallel, tokens_per_group: float, link: Link) -> float:
    """One layer's context-parallel exchange in one pass: the K and V of the
    `tokens_per_group` tokens of a cp group, gathered over cp ranks (`cp_kv_bytes`); under TP
    each TP rank gathers its own KV heads, the tp gathers side by side (Megatron-Core and
    Transformer Engine split CP's K and V by head like the attention)."""
    if par.cp <= 1 or tokens_per_group <= 0:
        return 0.0
    return all_gather(cp_kv_bytes(m, tokens_per_group, par.tp), par.cp, link)


def linear_state_bytes(m: ModelArch, eff: Efficiency) -> float:
    """Bytes of the fixed state one sequence keeps in a hybrid model's Gated DeltaNet layers
    (whole replica): the recurrent state at `Efficiency.linear_state_bytes` per element and the
    convolution window in BF16, as SGLang sizes it (python/sglang/srt/configs/mamba_utils.py
    `mamba_cache_per_req`). 0 without linear attention."""
    rec, conv = m.linear_state_elements()
    return rec * eff.linear_state_bytes + conv * BYTES


def state_split(m: ModelArch, par: Parallel) -> int:
    """Devices of a replica that each hold a distinct part of a sequence's GDN state: pp stages
    times the TP ranks, up to key_heads (SGLang and vLLM shard the state and the convolution
    window by head: `Mamba2StateShape.create` divides both by the TP size)."""
    la = m.linear_attention
    return par.pp * (max(min(par.tp, la.key_heads), 1) if la is not None else 1)


def state_tokens(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> float:
    """A sequence's GDN state counted in KV tokens of the same devices (its bytes per device /
    KV bytes per token per device, the KV split as `costmodel.kv_split`): the room it takes
    from the KV pool besides its context. 0 without linear attention."""
    state = linear_state_bytes(m, eff)
    if state <= 0:
        return 0.0
    kv_token = m.kv_elements_per_token() * BYTES
    if dev.kind is DeviceKind.lpu:  # one SRAM pool per replica (`kv_capacity_tokens`)
        return state / kv_token
    kv_dev = kv_token * par.kv_scale / (par.pp * m.kv_tp_shards(par.tp))
    return state / state_split(m, par) / kv_dev
