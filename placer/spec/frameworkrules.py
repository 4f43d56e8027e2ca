"""The framework profile: what one RL framework a plan targets can run and what it costs.

A job names its target with `framework:` (or `--framework` on plan, compare and sweep); without
one it is planned for `native`, `placer execute` itself, exactly as before profiles existed.
Each target is one `FrameworkProfile` (the registry, `placer.spec.framework.PROFILES`, holds
them with their sources), and the planner asks it, never its name:

  layout_problem(...)   why a role's layout (device kind, trainer / engine TP, PP, EP, HSDP
                        shard group, data-parallel attention) cannot run there, or None;
                        the candidate table keeps only the layouts it can run
  splits_roles          whether one role may be split over pools (a split part per pool)
  job_problem(...)      why the job itself cannot run there (a critic, async steps, partial
                        rollout), or None: `placer plan` then exits 3 naming it
  factors               its overheads as efficiency factors that replace the shared ones
                        (`placer.cost.efficiency.Efficiency`): the driver's dispatch, the
                        weight-sync bucket and sender, where an offloaded optimizer steps
  hybrid_engine         roles that must share one slot (EasyR1 builds actor, rollout and
                        reference in one worker group over every GPU: `Pricer.colocated_roles`)
  colocated_switch      roles that give their slot's devices up every RL step whenever the
                        rollout shares the actor's slot, whether or not the members fit
                        (`switches_every_step`, `placer.cost.timing.slot_switch`): NeMo-RL's
                        policy and engine, verl's and EasyR1's engine (the actor moves where parked)
  async_apart           roles an asynchronous job must keep in slots of their own (NeMo-RL's
                        async GRPO asserts its vLLM generation is not colocated: `apart_roles`,
                        `Pricer.apart_roles`; the ILP gives them no shared slot)
  park_scheme,          how it moves a parked or streamed role's state: keys of
  stream_scheme         `placer.cost.offload.PARK_SCHEMES` / `STREAM_SCHEMES` (the scheme and
                        its source live there, once)
  micro_batch_samples   its dynamic batching's sequences per device per micro-batch, {forward,
                        update}: the token budget is that count x the padded length
                        (`micro_token_budget`), used where the job sets no `micro_token_budget`
  host_image_prep       roles whose ranks re-run the image processor on a VLM's images inside
                        the step (EasyR1's engine and FSDP worker), at its factor
                        `host_image_prep_s_per_patch`
  megatron_optimizer_bytes  the bytes a parameter of the optimizer state its Megatron-Core
                        trainer holds (NeMo-RL's precision-aware optimizer keeps the fp32
                        master's low 16 bits only: 10, not the cost model's 12; None: 12),
                        where a layout trains with Megatron (`optimizer_bytes`)
  fsdp_grad_reduce_bytes, megatron_grad_reduce_bytes  bytes a gradient element moves in its
                        FSDP / ZeRO and its Megatron-Core trainer's gradient reduction: 4 where
                        it reduces in fp32 (FSDP's `reduce_dtype`, Megatron's
                        `grad_reduce_in_fp32`), 2 in BF16 (`grad_reduce_bytes`)
  pads_packed_bins      whether its pipelined trainer pads every packed micro-batch of a rank
                        to the rank's longest bin (`placer.cost.packing.pad_factor`)
  rollout_sleep_level   its colocated rollout engine's vLLM sleep level (`SLEEP_LEVELS`): 1
                        moves the weights to the host and back, 2 discards them (the refit
                        rewrites them; verl with vLLM >= 0.8.5); a job's setting replaces it

Colocation forms, the old-log-prob source and engine sleep/wake are recorded (`colocation`,
`old_log_probs`, `sleep_wake`) but priced by the shared model: every profile colocates the roles
it shares devices between, recomputes old log-probs with the trainer by default and sleeps its
engine with the engine library's own call, at `rollout_sleep_level` (every step, fit or not, for
the roles of `colocated_switch`: NeMo-RL's policy and vLLM engine, verl's and EasyR1's engine). This module
holds the class, its rules and the vocabularies they use (`SLEEP_LEVELS`, `COLOCATED_INFERENCE`,
`JOB_FEATURES`); `placer.spec.framework` the profiles themselves.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from placer.base.roles import Role

FrameworkName = Literal["native", "verl", "verl-megatron", "openrlhf", "nemo-rl", "miles",
                        "easyr1"]
DEFAULT_FRAMEWORK = "native"


# vLLM's sleep levels, as its GPU worker implements them (vllm-project/vllm
# @0012cf691b7e69423244d2b1405f4b6832156e19 vllm/v1/worker/gpu_worker.py `Worker.sleep`: the
# allocator's `sleep(offload_tags=("weights",))` at level 1, `offload_tags=()` at level 2, which
# saves only the model's small named buffers to the CPU; `wake_up` maps the memory back and, at
# level 2, restores those buffers: the weights' values are whatever is written next, the refit)
SLEEP_LEVELS: Mapping[int, str] = MappingProxyType({
    1: "weights copied to pinned host memory and back, KV cache discarded",
    2: "weights and KV cache discarded; the refit writes the weights again",
})

# the roles whose sharing of one slot makes a run's generation colocated with its policy
# (NeMo-RL's policy.generation.colocated.enabled): `FrameworkProfile.switches_every_step`
COLOCATED_INFERENCE: tuple[str, ...] = (Role.ACTOR, Role.ROLLOUT)

# what a job may use that a framework may lack (a `FrameworkProfile` flag each): the refusal
JOB_FEATURES: Mapping[str, str] = MappingProxyType({
    "critic": "has no critic (the ppo algorithm's value model)",
    "async_steps": "has no asynchronous pipeline (pipeline.mode async)",
    "partial_rollout": "has no partial rollout (tail_policy.kind partial)",
    "reward_model": "has no reward model worker (models.reward: a rule or reward function "
                    "only)",
})


def frozen(d: Mapping[str, float] | None = None) -> Mapping[str, float]:
    """A read-only copy of a profile's factors."""
    return MappingProxyType(dict(d or {}))


def frozen_ints(d: Mapping[str, int] | None = None) -> Mapping[str, int]:
    """A read-only copy of a profile's counts (`micro_batch_samples`)."""
    return MappingProxyType(dict(d or {}))


def _no_sources() -> Mapping[str, str]:
    return MappingProxyType({})



@dataclass(frozen=True)
class FrameworkProfile:
    """One framework target: the layouts it runs and the overheads it adds.

    Limits are the largest degree the framework's configuration can express (None: any the
    planner tries); `sources` maps each rule and factor to where it was read."""

    name: str
    title: str
    version: str
    exporter: str | None  # the `placer export` target that writes its configuration
    gpu_models: bool = True  # roles with a model run on GPUs only (no LPU or CPU engines)
    hsdp: bool = True  # trainer shard groups (`roles.NAME.shard`)
    megatron_trainer: bool = False  # trains with Megatron-Core whatever the layout
    splits_roles: bool = False  # one role over several pools
    trainer_tp: int | None = None
    trainer_pp: int | None = None
    trainer_ep: int | None = None
    engine_tp: int | None = None
    engine_pp: int | None = None
    engine_ep: int | None = None
    attn_dp: bool = True  # engines with data-parallel attention
    critic: bool = True
    async_steps: bool = True  # rollout ahead of training (pipeline mode async)
    partial_rollout: bool = True  # the `partial` tail policy: cut long samples, carry them over
    # a frozen model's forward (reference, reward model) FSDP / ZeRO-3-sharded over its dp ranks
    # (`Parallel.sharded_weights`) as well as whole copies
    frozen_shards: bool = False
    # frozen roles (reference, reward model) whose FSDP-sharded weights it can hold in host
    # memory and stream to the GPU unit by unit on every forward micro-batch (FSDP's CPU
    # parameter offload, `Parallel.stream_params_bytes`, `placer.cost.offload.stream_time`),
    # and the bytes a parameter of its host copy; 0: it cannot
    stream_frozen: tuple[str, ...] = ()
    stream_scheme: str = ""  # a key of `placer.cost.offload.STREAM_SCHEMES` ("": streams none)
    # frozen roles (reference) it keeps as a host state dict and swaps into the policy's model
    # for each pass and back (`placer.cost.refswap`): no weights of their own on the GPU
    swap_frozen: tuple[str, ...] = ()
    # worker processes its rule reward checks a step's answers on, whatever the CPU pool's
    # cores (0: one per core, `placer.cost.rulecheck`)
    rule_workers: int = 0
    # trained roles whose optimizer state it parks in host memory between phases, stepped on
    # the GPU (`Parallel.park_optimizer`, `placer.cost.optpark`)
    park_optimizer: tuple[str, ...] = ()
    # how it moves parked state: a key of `placer.cost.offload.PARK_SCHEMES` ("": the model's
    # own state bytes, `offload.GENERIC`)
    park_scheme: str = ""
    # roles (those the job has) that must share one slot: one worker group holds them all
    hybrid_engine: tuple[str, ...] = ()
    # roles that pay their onload every RL step while the rollout shares the actor's slot, fit
    # or not (`switches_every_step`, `placer.cost.timing.onload_time`)
    colocated_switch: tuple[str, ...] = ()
    # roles that may not share a slot when the job's pipeline is asynchronous (`apart_roles`)
    async_apart: tuple[str, ...] = ()
    # its dynamic batching: sequences per device per micro-batch, by pass ("forward" / "update"),
    # each micro-batch `micro_batch_samples[kind]` x the padded length tokens; none: the job's
    # `micro_token_budget` or the cost model's default
    micro_batch_samples: Mapping[str, int] = field(default_factory=frozen_ints)
    # roles whose ranks prepare a VLM's images on the host inside the step (the image processor
    # re-run per prompt, `placer.cost.vision.host_prep_s`), at its `host_image_prep_s_per_patch`
    host_image_prep: tuple[str, ...] = ()
    reward_model: bool = True  # a model-scored reward (a scalar reward model or a judge)
    # a trainer's dp ranks take equal shares of every mini-batch's samples
    even_batch: bool = False
    # ... and of the iteration's prompts (EasyR1 chunks the prompts over every GPU to generate)
    even_prompts: bool = False
    colocation: str = ""
    old_log_probs: str = "trainer"
    sleep_wake: str = ""
    # bytes a parameter of its Megatron-Core trainer's optimizer state (`optimizer_bytes`);
    # None: the cost model's mixed-precision Adam (`placer.cost.sharding.OPTIMIZER_BYTES`)
    megatron_optimizer_bytes: float | None = None
    # bytes a gradient element moves in its trainer's gradient reduction (`grad_reduce_bytes`):
    # its FSDP / ZeRO trainer's and its Megatron-Core trainer's; 4 is fp32, 2 BF16
    fsdp_grad_reduce_bytes: int = 4
    megatron_grad_reduce_bytes: int = 4
    # whether its pipelined Megatron trainer packs each pass's sequences into bins of the
    # micro-batch budget and pads every bin of a rank to the rank's longest
    # (`placer.cost.packing`): the tokens a pipelined pass computes
    pads_packed_bins: bool = False
    # the vLLM sleep level its colocated rollout engine sleeps at between generations
    # (`SLEEP_LEVELS`): 1 copies the weights to pinned host memory and back, 2 discards them
    # (the refit sends them again every step); a job's `rollout_sleep_level` replaces it
    rollout_sleep_level: int = 1
    # how it refits an engine that shares the trainer's GPUs, a key of
    # `placer.cost.refit.COLOCATED_REFITS`; "": the shared local path (`sync_local_gbs`)
    colocated_refit: str = ""
    factors: Mapping[str, float] = field(default_factory=frozen)
    sources: Mapping[str, str] = field(default_factory=_no_sources)

    def layout_problem(self, role: str, *, training: bool, has_model: bool, on_gpu: bool,
                       tp: int, pp: int, ep: int, shard: int, attn_dp: int, dp: int = 1,
                       mini_batch_samples: int = 0, prompts: int = 0) -> str | None:
        """Why `role` cannot run this layout under the framework, or None when it can."""
        if has_model and self.gpu_models and not on_gpu:
            return f"runs {role}'s model on GPUs only"
        if training and self.even_batch and mini_batch_samples % dp:
            return (f"splits each mini-batch's {mini_batch_samples} samples evenly over a "
                    f"trainer's data-parallel ranks (got dp {dp} for {role})")
        if training and self.even_prompts and prompts % dp:
            return (f"splits the {prompts} prompts evenly over a trainer's data-parallel ranks "
                    f"(got dp {dp} for {role})")
        if training and shard and not self.hsdp:
            return "has no HSDP shard group for a trainer"
        limits = ((self.trainer_tp, self.trainer_pp, self.trainer_ep) if training
                  else (self.engine_tp, self.engine_pp, self.engine_ep))
        kind = "trainer" if training else "engine"
        for dim, value, top in zip(("tp", "pp", "ep"), (tp, pp, ep), limits):
            if top is not None and value > top:
                return f"runs {kind}s with {dim} <= {top} (got {dim} {value} for {role})"
        if attn_dp > 1 and not self.attn_dp:
            return f"has no data-parallel attention for the {role}'s engines"
        return None

    def job_problem(self, *, critic: bool, async_steps: bool, partial_rollout: bool,
                    reward_model: bool = False) -> str | None:
        """Why the job cannot run under the framework at all, or None: the first feature the
        job uses (`JOB_FEATURES`) that the profile lacks."""
        used = {"critic": critic, "async_steps": async_steps,
                "partial_rollout": partial_rollout, "reward_model": reward_model}
        return next((why for feature, why in JOB_FEATURES.items()
                     if used[feature] and not getattr(self, feature)), None)

    def switches_every_step(self, roles: Iterable[str]) -> frozenset[str]:
        """The members of a slot holding `roles` that give its devices up every RL step whether
        or not the members fit together: `colocated_switch` where the slot holds the actor and
        the rollout (`COLOCATED_INFERENCE`: the generation colocated with the policy), else
        none."""
        held = set(roles)
        if not set(COLOCATED_INFERENCE) <= held:
            return frozenset()
        return frozenset(self.colocated_switch) & held

    def apart_roles(self, *, async_steps: bool) -> tuple[str, ...]:
        """Roles no two of which may share a slot: `async_apart` for a job whose pipeline is
        asynchronous (`pipeline.mode async`), else none."""
        return self.async_apart if async_steps else ()

    def trains_with_megatron(self, *, pp: int, ep: int) -> bool:
        """Whether a trainer of pipeline `pp` and expert `ep` parallelism runs on Megatron-Core
        here: always for a Megatron trainer (`megatron_trainer`), else where the layout needs
        pipeline or expert parallelism (NeMo-RL's DTensor path has TP and CP only:
        `placer.interop.nemorl.uses_megatron`)."""
        return self.megatron_trainer or pp > 1 or ep > 1

    def optimizer_bytes(self, *, pp: int, ep: int) -> float | None:
        """Bytes a parameter of a trainer's on-device optimizer state under this framework at
        pipeline `pp` and expert `ep` parallelism: `megatron_optimizer_bytes` where it trains
        with Megatron-Core (`trains_with_megatron`), else None (the cost model's own)."""
        return self.megatron_optimizer_bytes if self.trains_with_megatron(pp=pp, ep=ep) else None

    def grad_reduce_bytes(self, *, pp: int, ep: int) -> int:
        """Bytes a gradient element moves in the gradient reduction of a trainer of pipeline `pp`
        and expert `ep` parallelism here: the Megatron-Core trainer's where it trains with
        Megatron-Core (`trains_with_megatron`), else the FSDP / ZeRO trainer's."""
        return (self.megatron_grad_reduce_bytes if self.trains_with_megatron(pp=pp, ep=ep)
                else self.fsdp_grad_reduce_bytes)

    def micro_token_budget(self, kind: str, padded_len: int) -> int | None:
        """Tokens per device per micro-batch of a `kind` pass ("forward" / "update") its dynamic
        batching cuts: `micro_batch_samples[kind]` x the padded length (the longest prompt,
        image tokens included, plus the longest response); None where it sets none."""
        n = self.micro_batch_samples.get(kind)
        return n * padded_len if n else None

    def limits(self) -> str:
        """The layout rules, in one line for messages."""
        out = []
        if self.gpu_models:
            out.append("models on GPUs")
        if not self.hsdp:
            out.append("no HSDP")
        if not self.splits_roles:
            out.append("no role split over pools")
        for kind, dims in (("trainer", (self.trainer_tp, self.trainer_pp, self.trainer_ep)),
                           ("engine", (self.engine_tp, self.engine_pp, self.engine_ep))):
            out += [f"{kind} {d} <= {v}" for d, v in zip(("tp", "pp", "ep"), dims)
                    if v is not None]
        if not self.attn_dp:
            out.append("no data-parallel attention")
        return ", ".join(out) or "any layout"
