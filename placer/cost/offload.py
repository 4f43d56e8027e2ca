"""Offloaded training state as each framework moves it: what crosses the host link, and when.

Two mechanisms keep a role's state in host memory, and they cost different copies.

Parking (`Parallel.park_params`, `Parallel.park_optimizer`): the state lives on the host between
phases and is loaded onto the GPU before each phase that uses it and offloaded after, all
synchronous (verl's `param_offload` / `grad_offload` / `optimizer_offload`, EasyR1's
`offload_params` / `offload_optimizer`, NeMo-RL's optimizer offload before the refit). Each
framework moves its own tensors, at its own precision, before its own phases; `PARK_SCHEMES`
records them per framework (`Move`: the state, its bytes per parameter, the phases that load
it), and `parked_moves_gb` prices one RL step of a role: every load is one copy in and one out.
The phases of a role are read off its estimate's stages (`phases_of`).

  verl, FSDP (volcengine/verl @b178a3cd56f58b2d502255daba591e92833930a7,
  verl/workers/fsdp_workers.py): the actor's module is built in fp32 (`_build_model_optimizer`,
  lines 324-326: `torch.float32 if self._is_actor`), so its FSDP flat-parameter shard is 4 B a
  parameter and is the optimizer's master copy; `optimizer_offload` moves Adam's `exp_avg` and
  `exp_avg_sq` (verl/utils/fsdp_utils.py `offload_fsdp_optimizer`, 8 B). Parameters are loaded
  and offloaded by `rollout_mode` (681-721, the refit), `compute_log_prob` (993, 1033) and
  `update_actor` (895, 928), the optimizer by `update_actor` only (897, 931). Gradients are not
  moved: `update_policy` ends with `zero_grad()`. EasyR1 (hiyouga/EasyR1 @b44b311b, v0.3.2), a
  fork of verl's single controller, does the same: verl/workers/fsdp_workers.py
  `update_actor` (557-598), `compute_log_probs` (639-659), and the refit in
  verl/workers/sharding_manager/fsdp_vllm.py `_sync_weight_to_vllm`; its actor is fp32 too
  (fsdp_workers.py:198-199).
  verl, Megatron (same commit, verl/workers/megatron_workers.py): `param_offload` moves the
  BF16 parameter buffers, split over tp x pp only (not over data parallelism;
  verl/utils/megatron_utils.py `offload_megatron_model_to_cpu`, whose docstring lists "bf16
  parameter data chunked in model parallel group"), in `rollout_mode` (681, 732),
  `compute_log_prob` (866, 903) and `update_actor` (744, 776); `grad_offload` frees the gradient
  buffer and re-allocates it zeroed (no copy); `optimizer_offload` moves the distributed
  optimizer's fp32 master shard (`offload_megatron_copy_params`) and Adam's two moments, 12 B a
  parameter of its shard, in `update_actor` (747, 779). The reference's `param_offload` moves its
  parameters around `compute_ref_log_prob` (844, 855).
  Any other framework: the model's own state (`Memory.weights` at 2 B, `Memory.optimizer` at
  12 B a parameter), the parameters for every phase, the optimizer for the update (NeMo-RL's
  parked optimizer, `placer.cost.optpark`).

Parameters per device are read off the role's memory (`Memory.weights` / 2 B,
`Memory.optimizer` / 12 B: each already split as the layout shards it), so a scheme's bytes per
parameter scale the shard the layout holds.

A host-stepped optimizer (`Parallel.offload`: Megatron-Core's HybridDeviceOptimizer, DeepSpeed's
ZeRO-Offload) keeps its state on the host and steps there: per optimizer step it copies each
parameter's gradient to the host and the updated parameter back, in fp32 (`host_step_gb`).
NVIDIA/Megatron-LM @be37e2c95ce2bf12ca1ca58cab68da58402a6293
megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py: `_set_sub_optimizer_grads` copies
each CPU parameter's gradient into a pinned host buffer of the parameter's dtype, the fp32 main
parameter of the distributed optimizer's shard, and `param_copy_back_gpu_hook` copies the
stepped parameter back; DeepSpeed's stage 1/2 CPU offload likewise casts each gradient to fp32
before its copy to the host (`async_inplace_copy_grad_to_fp32_buffer_from_gpu`). 4 + 4 B per
parameter of the optimizer's shard, where the moments never cross the link. What it holds in host
memory (`HOST_OPTIMIZER_BYTES`, `host_optimizer_gb`): per parameter of its shard, the fp32
parameter the CPU sub-optimizer steps (radixark/Megatron-LM
@235952df607b3820716e5e67728a5ab470ca33ae hybrid_optimizer.py `_get_sub_optimizer_param_groups`,
274: `param.detach().clone().cpu().pin_memory()`, the distributed optimizer's fp32 main
parameter), the CPU AdamW's `exp_avg` and `exp_avg_sq` (fp32, 8 B), and the pinned gradient
buffer `_set_sub_optimizer_grads` allocates once per parameter and keeps (109-111:
`torch.empty(param.shape, dtype=param.dtype, pin_memory=self.pin_cpu_grads, device="cpu")`,
fp32): 16 B, not the 12 B of the optimizer's own state. DeepSpeed's ZeRO-Offload keeps the same
four (fp32 partition, two moments, the fp32 gradient partition it copies into).

What parking holds in host memory is what it moved there (`host_parked_gb`): the framework's
bytes per parameter of each parked state, as `PARK_SCHEMES` records them; verl's FSDP worker
parks 12 B a parameter (the fp32 flat parameter 4 B, `offload_fsdp_model_to_cpu`, and Adam's
two moments 8 B, `offload_fsdp_optimizer`: verl/utils/fsdp_utils.py 144-166, 204-212 @b178a3cd),
not the model's 14 (BF16 weights 2 + fp32 master and moments 12). A rollout engine's sleep moves
its own BF16 weights (`GENERIC`), whatever framework drives it, at vLLM's sleep level 1; at
level 2 (verl's hybrid engine with vLLM >= 0.8.5) it discards them and parks nothing
(`SLEEP_COPIES`).

Streamed weights (`Parallel.stream_params_bytes`): FSDP's CPU parameter offload keeps a frozen
model's flat-parameter shard in pinned host memory and copies it to the GPU in every FSDP unit's
pre-forward unshard, before that unit's all-gather, on every forward; the reshard after the
forward points the parameter back at the host shard, with no copy back (forward only). So each
forward micro-batch copies the device's whole shard once, at the host copy's dtype
(pytorch 2.13.0, torch/distributed/fsdp/_flat_param.py: `init_flat_param_attributes` pins
`_local_shard`, 1258-1260; `pre_unshard`, 1307-1340: `_use_low_precision_shard` copies
`_local_shard.to(device)` before the cast to the compute dtype, else `flat_param_to(device)`;
`_use_sharded_flat_param`, 1823-1843; _runtime_utils.py `_pre_forward_unshard`, 411-434). Who
does it, `STREAM_SCHEMES`: verl's FSDP reference, always (volcengine/verl @b178a3cd
verl/workers/fsdp_workers.py 524-526: `CPUOffload(offload_params=True)` for any role but the
actor, FSDP1, the default `strategy: fsdp`; 552 for FSDP2, `CPUOffloadPolicy(pin_memory=True)`),
held in fp32 (the reference's `fsdp_config` inherits verl/trainer/config/engine/fsdp.yaml:33
`model_dtype: fp32`, read at fsdp_workers.py:324-326), and EasyR1's reference
(hiyouga/EasyR1 @b44b311b, v0.3.2: examples/config.yaml `ref.fsdp.enable_cpu_offload: true`,
verl/workers/fsdp_workers.py:298-299), held in BF16 (fsdp_workers.py:198-199: the reference's
`torch_dtype` defaults to bfloat16). The copies are not overlapped with compute: both build FSDP1
with `forward_prefetch=False` (EasyR1 fsdp_workers.py:319; verl engine/fsdp.yaml:30), so no unit
is unsharded ahead of the forward that needs it, and the compute stream waits for the unshard
stream before each unit (`_pre_forward_unshard`). Only the CPU's launch lead over the GPU could
hide part of a copy, so `stream_time` is the copies' full time: an upper bound where it does.
The micro-batches are the framework's (`layercomm.micro_tokens`): EasyR1's `dynamic_batching`
cuts each rank's log-prob batch into ceil(its tokens / budget) micro-batches, the budget being
`micro_batch_size_per_device_for_experience` x the padded length (verl/workers/actor/dp_actor.py
198-199, verl/utils/seqlen_balancing.py `rearrange_micro_batches`).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from placer.base.roles import Role, base_role
from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import micro_tokens
from placer.cost.roofline import Memory
from placer.cost.sharding import OPTIMIZER_BYTES, Parallel

State = Literal["params", "optimizer"]
Phase = Literal["refit", "forward", "update"]

# bytes a parameter of each state takes in the model's own memory accounting
# (`sharding.train_state_bytes`: BF16 weights, fp32 master weights and Adam moments)
MODEL_BYTES: Mapping[State, float] = MappingProxyType({"params": 2.0,
                                                      "optimizer": OPTIMIZER_BYTES})

# an estimate's stages -> the phases that run the role's module (`placer.cost.estimate`)
STAGE_PHASES: Mapping[str, Phase] = MappingProxyType({"score": "forward", "train": "update"})
# roles whose weights every refresh reads (verl's `rollout_mode` loads them for the export)
REFIT_ROLES: frozenset[str] = frozenset({Role.ACTOR})

# a host-stepped optimizer's copies per optimizer step: fp32 gradient out, fp32 parameter in
HOST_STEP_BYTES = 8.0
# host memory a host-stepped optimizer holds per parameter of its shard: fp32 parameter 4, Adam's
# two fp32 moments 8, the pinned fp32 gradient buffer 4 (Megatron-Core's HybridDeviceOptimizer)
HOST_OPTIMIZER_BYTES = 16.0
# roles whose module a framework's trainer workers hold (their parking follows `PARK_SCHEMES`);
# a rollout engine's sleep moves its BF16 weights whatever the framework, at the share its vLLM
# sleep level copies
ENGINE_ROLES: frozenset[str] = frozenset({Role.ROLLOUT})
# share of a rollout engine's weights each vLLM sleep level (`placer.spec.framework.SLEEP_LEVELS`)
# copies to the host and back (vllm-project/vllm @0012cf691b7e69423244d2b1405f4b6832156e19
# vllm/v1/worker/gpu_worker.py `Worker.sleep`: offload_tags ("weights",) at level 1, () at 2)
SLEEP_COPIES: Mapping[int, float] = MappingProxyType({1: 1.0, 2: 0.0})


@dataclass(frozen=True)
class Move:
    """One parked state: `bytes_per_param` of each parameter the device holds, loaded before
    (and offloaded after) each of `phases`."""

    state: State
    bytes_per_param: float
    phases: frozenset[Phase]


@dataclass(frozen=True)
class ParkScheme:
    """What a framework moves when it parks a role's state, with where it was read."""

    moves: tuple[Move, ...]
    source: str

    def move(self, state: State) -> Move | None:
        return next((m for m in self.moves if m.state == state), None)


_EVERY: frozenset[Phase] = frozenset({"refit", "forward", "update"})
_UPDATE: frozenset[Phase] = frozenset({"update"})
_VERL = "volcengine/verl @b178a3cd56f58b2d502255daba591e92833930a7"

GENERIC = ParkScheme(
    (Move("params", MODEL_BYTES["params"], _EVERY),
     Move("optimizer", MODEL_BYTES["optimizer"], _UPDATE)),
    "the model's own state bytes (sharding.train_state_bytes)")

PARK_SCHEMES: Mapping[str, ParkScheme] = MappingProxyType({
    "verl": ParkScheme(
        (Move("params", 4.0, _EVERY), Move("optimizer", 8.0, _UPDATE)),
        f"{_VERL} verl/workers/fsdp_workers.py rollout_mode, compute_log_prob, update_actor; "
        "fp32 actor module (324-326); verl/utils/fsdp_utils.py offload_fsdp_optimizer "
        "(exp_avg, exp_avg_sq). hiyouga/EasyR1 @b44b311b verl/workers/fsdp_workers.py alike"),
    "verl-megatron": ParkScheme(
        (Move("params", 2.0, _EVERY), Move("optimizer", 12.0, _UPDATE)),
        f"{_VERL} verl/workers/megatron_workers.py rollout_mode, compute_log_prob, "
        "update_actor, compute_ref_log_prob; verl/utils/megatron_utils.py "
        "offload_megatron_model_to_cpu (bf16 param buffers; grad buffers freed), "
        "offload_megatron_optimizer (fp32 master shard, exp_avg, exp_avg_sq)"),
})


def scheme_of(framework: str) -> ParkScheme:
    """The parking scheme `framework` names (a profile's `FrameworkProfile.park_scheme`:
    EasyR1's is verl's, whose FSDP worker it forked; `GENERIC` for one not in `PARK_SCHEMES`)."""
    return PARK_SCHEMES.get(framework, GENERIC)


def phases_of(role: str, stages: Iterable[str]) -> frozenset[Phase]:
    """The phases a role's module runs in one RL step: its estimate's stages (`STAGE_PHASES`)
    and, for a role every refresh reads (`REFIT_ROLES`), the refit."""
    out = {STAGE_PHASES[s] for s in stages if s in STAGE_PHASES}
    if role in REFIT_ROLES:
        out.add("refit")
    return frozenset(out)


def parked_states(par: Parallel) -> tuple[State, ...]:
    """The states `par` parks between phases. A host-stepped optimizer (`offload`) is on the
    host already: nothing of it is parked."""
    out: list[State] = []
    if par.park_params:
        out.append("params")
    if par.park_optimizer and not par.offload:
        out.append("optimizer")
    return tuple(out)


def _params_held(mem: Memory, state: State) -> float:
    """Parameters (in G) of `state` one device holds, from the role's memory (GB)."""
    gb = mem.weights if state == "params" else mem.optimizer
    return gb / MODEL_BYTES[state]


def parked_moves_gb(mem: Memory, par: Parallel, framework: str,
                    phases: Iterable[Phase]) -> float:
    """GB per device that one RL step copies each way for the states `par` parks: per state,
    the framework's bytes per parameter (`scheme_of`) x the parameters the device holds x the
    role's phases that load it. A round trip of it is `model.host_round_trip_time`."""
    scheme, ran = scheme_of(framework), frozenset(phases)
    total = 0.0
    for state in parked_states(par):
        move = scheme.move(state) or GENERIC.move(state)
        assert move is not None  # GENERIC moves every state
        total += move.bytes_per_param * _params_held(mem, state) * len(move.phases & ran)
    return total


def host_parked_gb(mem: Memory, role: str, framework: str,
                   states: Iterable[State] = ("params", "optimizer"),
                   sleep_level: int = 1) -> float:
    """GB per device of host memory that parking `states` of a role's memory `mem` fills: per
    state, the bytes per parameter the framework moves (`scheme_of`; `GENERIC` for a rollout
    engine, `ENGINE_ROLES`, at the share its `sleep_level` copies, `SLEEP_COPIES`) x the
    parameters the device holds. A whole switch parks both."""
    engine = base_role(role) in ENGINE_ROLES
    scheme = GENERIC if engine else scheme_of(framework)
    share = SLEEP_COPIES[sleep_level] if engine else 1.0
    total = 0.0
    for state in states:
        move = scheme.move(state) or GENERIC.move(state)
        assert move is not None  # GENERIC moves every state
        total += move.bytes_per_param * _params_held(mem, state)
    return share * total


def host_optimizer_gb(optimizer_gb: float) -> float:
    """GB per device a host-stepped optimizer (`Parallel.offload`) holds in host memory, from its
    shard's state (`optimizer_gb` at `MODEL_BYTES['optimizer']` a parameter):
    `HOST_OPTIMIZER_BYTES` a parameter, the pinned gradient buffer included."""
    return HOST_OPTIMIZER_BYTES * optimizer_gb / MODEL_BYTES["optimizer"]


def unparked_gb(mem: Memory, par: Parallel) -> float:
    """GB per device of the state a whole switch moves beyond what the role parks: its weights
    and on-device optimizer state (`model.switched_gb`) less the parked states."""
    held = {"params": mem.weights, "optimizer": mem.optimizer}
    return sum(v for k, v in held.items() if k not in parked_states(par))


def host_step_gb(optimizer_gb: float) -> float:
    """GB per device a host-stepped optimizer (`Parallel.offload`) copies per optimizer step,
    both directions together: `HOST_STEP_BYTES` per parameter of its shard, whose state
    (`optimizer_gb` at `MODEL_BYTES['optimizer']` a parameter) stays on the host."""
    return HOST_STEP_BYTES * optimizer_gb / MODEL_BYTES["optimizer"]


@dataclass(frozen=True)
class StreamScheme:
    """A framework whose frozen model streams its weights from the host each forward micro-batch:
    the host copy's bytes per parameter, with where it was read."""

    bytes_per_param: float
    source: str


STREAM_SCHEMES: Mapping[str, StreamScheme] = MappingProxyType({
    "verl-fsdp-ref": StreamScheme(
        4.0, f"{_VERL} verl/workers/fsdp_workers.py 524-526, 552 (CPU offload of every role "
        "but the actor); verl/trainer/config/engine/fsdp.yaml:33 model_dtype fp32"),
    "easyr1-ref": StreamScheme(
        2.0, "hiyouga/EasyR1 @b44b311b examples/config.yaml ref.fsdp.enable_cpu_offload; "
        "verl/workers/fsdp_workers.py:198-199 (BF16 reference), 298-299, 319"),
})


def stream_micro_batches(rank_tokens: float, budget: float) -> int:
    """Forward micro-batches one rank runs over `rank_tokens` tokens at `budget` tokens each:
    ceil(tokens / budget), at least one (EasyR1's and verl's `rearrange_micro_batches`)."""
    return max(math.ceil(rank_tokens / budget), 1)


def stream_time(weights_gb: float, par: Parallel, rank_tokens: float, seq: float,
                eff: Efficiency) -> float:
    """Seconds one forward pass spends copying streamed weights to the GPU: per micro-batch
    (`stream_micro_batches` at the layout's budget, `layercomm.micro_tokens`) the device's
    shard, `weights_gb` of BF16 weights (as the layout holds them) at the host copy's
    `par.stream_params_bytes` a parameter, over the host link at `offload_gbs`, not overlapped
    with compute. 0 where the layout streams nothing."""
    if par.stream_params_bytes <= 0:
        return 0.0
    shard_gb = par.stream_params_bytes * weights_gb / MODEL_BYTES["params"]
    return stream_micro_batches(rank_tokens, micro_tokens(par, seq)) * shard_gb / eff.offload_gbs


def streamed(weights_gb: float, par: Parallel, rank_tokens: float, seq: float,
             eff: Efficiency) -> tuple[float, float]:
    """A frozen forward's (seconds it adds, BF16 weights GB it keeps on the GPU) for a device
    holding `weights_gb`: a streaming layout pays `stream_time` and keeps none resident (its
    shard lives on the host; what it gathers per FSDP unit is held like activations, so a
    colocated slot's switch has none of its weights to move); any other keeps them all."""
    if par.stream_params_bytes <= 0:
        return 0.0, weights_gb
    return stream_time(weights_gb, par, rank_tokens, seq, eff), 0.0
