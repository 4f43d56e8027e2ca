"""A plan as a verl run: Hydra overrides of `verl.trainer.main_ppo` (verl 0.9.1) and its launch line.

Written for verl `VERL_VERSION` (0.9.1): every key exists in that release's trainer config and the
result passes its `validate_config` (verl/utils/config.py) and config dataclasses' checks; other
releases rename keys (verl's main has no `actor_rollout_ref.rollout.nnodes`), so the files name the
version and launch.sh warns when another is installed.

verl places roles in Ray *resource pools* counted in GPUs (`nnodes x n_gpus_per_node`):
  * the trainer pool (`trainer.nnodes`, `trainer.n_gpus_per_node`) hosts the actor, the reference
    and the critic, colocated (verl's hybrid engine), and the rollout when it is colocated too;
  * a disaggregated rollout gets its own pool (`actor_rollout_ref.rollout.nnodes`,
    `n_gpus_per_node`) under the v1 trainer's `separate_async` mode (one step off-policy);
  * a reward model may get its own pool (`reward.reward_model.enable_resource_pool`).
Training layouts: FSDP (ZeRO-3 data parallel, `ppo_trainer`) when the trained roles have
TP = PP = CP = EP = 1, else Megatron (`ppo_megatron_trainer`: TP, PP, CP, EP and expert TP sizes).
Micro-batches (`micro_batch`): the plan's own (`roles.NAME.micro_batch`, chosen and priced by the
planner); in a plan without one, whole sequences at the job's longest context, as many as fit in the
tokens of the micro-batch the cost model prices (`MICRO_TOKENS`, verl's own default token budget
per GPU), at least one, dividing a rank's share of a mini-batch, and fitting the device. Offload: verl's
`param_offload` / `optimizer_offload` park a role's state in host memory between phases and run the
optimizer step on the GPU; the plan prices exactly that when colocated roles do not fit together
(`Plan.breakdown.switch_s` of the slot), so those are exported as verl's offload. The plan's own
`offload` (optimizer state kept on the host through the step) has no verl form: warned.
Rollout: vLLM with the plan's TP (data-parallel attention and EP as verl's rollout DP and EP),
its memory share as `gpu_memory_utilization` and the engine's `max_num_seqs` the plan was priced
with (its calibration's admission cap: `placer.cost.admission` admits by free KV up to that many
sequences).

What verl cannot express is named in `Export.warnings`: LPU pools, a reference or critic outside
the actor's pool, colocations other than the hybrid engine's, and device types (verl counts GPUs;
which GPU type a pool lands on is the Ray cluster's business: `placer export kuberay`). A role
split over pools (`roles.NAME.parts`) is refused (SpecError, exit 2): verl's rollout is one group
of one device type (`common.refuse_split`). An HSDP shard group (`roles.NAME.shard`) is FSDP's
`fsdp_size`; under Megatron, which has no shard-group setting in verl, it is refused too
(`MEGATRON_HSDP`).
"""
from __future__ import annotations

import shlex
from typing import Any

import yaml

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.layercomm import MICRO_TOKENS
from placer.cost.model import train_memory
from placer.interop.common import (
    Export,
    colocated,
    device_warnings,
    hf_path,
    kind_of,
    lengths,
    memory_fraction,
    mini_batch_prompts,
    node_shape,
    refuse_hsdp,
    refuse_split,
)
from placer.solve.planfile import Plan, RolePlacement, calibration_of
from placer.spec.hardware import DeviceKind
from placer.spec.sections import Algorithm

ADV_ESTIMATOR = {Algorithm.grpo: "grpo", Algorithm.ppo: "gae", Algorithm.rloo: "rloo"}
ENTRYPOINT = "python3 -m verl.trainer.main_ppo"
VERL_VERSION = "0.9.1"  # the release whose trainer config and checks the overrides are written for
# Megatron-Core's HSDP is the partial distributed optimizer (`num_distributed_optimizer_instances`:
# the optimizer sharded inside each instance, the gradients all-reduced across them), whose groups
# `mpu.initialize_model_parallel` must build; verl 0.9.1's Megatron engine calls it without that
# argument (verl/workers/engine/megatron/transformer_impl.py, `_init_device_mesh`) and its
# megatron config (verl/trainer/config/engine/megatron.yaml) has no such key, so an HSDP plan
# trained with Megatron is refused rather than exported as plain ZeRO.
MEGATRON_HSDP = ("verl 0.9 builds Megatron's data-parallel groups without partial "
                 "distributed-optimizer instances (Megatron-Core's HSDP), and its megatron "
                 "config has no shard-group setting")


def uses_megatron(plan: Plan) -> bool:
    """Megatron when the plan was made for a Megatron trainer (`--framework verl-megatron`) or
    any trained model needs tensor, pipeline, context or expert parallelism (verl's FSDP engine
    has none of them)."""
    return plan.spec.profile.megatron_trainer or any(
        max(plan.roles[r].tp, plan.roles[r].pp, plan.roles[r].cp, plan.roles[r].ep) > 1
        for r in (Role.ACTOR, Role.CRITIC) if r in plan.roles)


def micro_batch(plan: Plan, role: Role) -> int:
    """Sequences per micro-batch on one GPU of `role`: as many whole sequences at the job's
    longest context as fit in `MICRO_TOKENS` (the micro-batch the cost model prices,
    `placer.cost.layercomm`; verl's default ppo_max_token_len_per_gpu), at least one; the largest
    such count that divides a data-parallel rank's share of one mini-batch (verl splits each
    rank's mini-batch into micro-batches of this size) and whose activations still fit the
    device beside the role's state (`train_memory`: the plan checked one sequence's). A plan
    that chose and priced a micro-batch (`roles.NAME.micro_batch`) gets that one."""
    r = plan.roles[role]
    if r.micro_batch > 0:
        return r.micro_batch
    job = plan.spec
    ctx = max(job.max_context, 1)
    cap = max(MICRO_TOKENS // ctx, 1)
    share = max(mini_batch_prompts(plan) * job.batch.samples_per_prompt // max(r.dp, 1), 1)
    res = plan.resolved()
    dev = res.device_of(r.pool)
    eff = calibration_of(plan).for_device(dev)
    m = res.arch_of(role)
    for k in range(min(cap, share), 1, -1):
        if share % k == 0 and train_memory(m, r.par, k * ctx, eff).total <= dev.memory_gb:
            return k
    return 1


def config_name(plan: Plan) -> str:
    return "ppo_megatron_trainer" if uses_megatron(plan) else "ppo_trainer"


def overrides(plan: Plan) -> tuple[dict[str, Any], list[str]]:
    """(dotted key -> value, warnings): every key exists in verl's shipped trainer config.
    SpecError when a role is split over pools (verl cannot express it: `refuse_split`), or
    when a trainer run with Megatron has an HSDP shard group (`MEGATRON_HSDP`)."""
    refuse_split(plan, "verl")
    if uses_megatron(plan):
        refuse_hsdp(plan, "verl's Megatron trainer", MEGATRON_HSDP,
                    "export kuberay, which runs this plan as it is (`placer execute`)")
    warn: list[str] = []
    job = plan.spec
    prompt_len, response_len = lengths(plan)
    turns = job.environment.turns
    o: dict[str, Any] = {
        "algorithm.adv_estimator": ADV_ESTIMATOR[job.algorithm],
        "data.train_batch_size": job.batch.prompts,
        "data.max_prompt_length": prompt_len,
        # verl caps the whole multi-turn response (tool outputs included) with one length
        "data.max_response_length": turns * response_len
        + (turns - 1) * job.environment.tool_output_tokens,
        "actor_rollout_ref.model.path": hf_path(plan.resolved(), Role.ACTOR, warn),
        "actor_rollout_ref.actor.ppo_mini_batch_size": mini_batch_prompts(plan),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro_batch(plan, Role.ACTOR),
        # the old log-probs: the actor's forward on its own GPUs
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu":
            micro_batch(plan, Role.ACTOR),
        "actor_rollout_ref.rollout.n": job.batch.samples_per_prompt,
    }
    o.update(_kl(plan))
    o.update(_pools(plan, warn))
    o.update(_training(plan, Role.ACTOR, "actor_rollout_ref.actor", warn))
    if Role.REFERENCE in plan.roles:
        o.update(_reference(plan, warn))
    if Role.CRITIC in plan.roles:
        c = plan.roles[Role.CRITIC]
        if not colocated(plan, Role.CRITIC, Role.ACTOR):
            warn.append(f"critic: verl runs the critic in the actor's pool (colocated); the "
                        f"plan's {c.pool}x{c.devices} [{c.slot}] is not expressible and the "
                        "export colocates it with the actor")
        o["critic.model.path"] = hf_path(plan.resolved(), Role.CRITIC, warn)
        o["critic.ppo_mini_batch_size"] = mini_batch_prompts(plan)
        o["critic.ppo_micro_batch_size_per_gpu"] = micro_batch(plan, Role.CRITIC)
        o.update(_training(plan, Role.CRITIC, "critic", warn))
    o.update(_rollout(plan, warn))
    o.update(_reward(plan, warn))
    o.update(_environment(plan, warn))
    o.update(_pipeline(plan, warn))
    _refuse_uneven_batch(plan, o)
    return o, warn


def _refuse_uneven_batch(plan: Plan, o: dict[str, Any]) -> None:
    """SpecError (exit 2) when verl would refuse the trainer pool's batch split: verl 0.9.1's
    `validate_config` (verl/utils/config.py) asserts an iteration's samples divide by the
    trainer pool's GPUs (FSDP) or by its Megatron data-parallel ranks x the micro-batch."""
    gpus = o["trainer.nnodes"] * o["trainer.n_gpus_per_node"]
    a = plan.roles[Role.ACTOR]
    unit = gpus
    if uses_megatron(plan):
        unit = gpus // (a.tp * a.pp * a.cp) * o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]
    samples = plan.spec.batch.prompts * plan.spec.batch.samples_per_prompt
    if samples % unit == 0:
        return
    fits = [d for d in range(1, gpus + 1) if samples % d == 0 and d % (a.tp * a.pp * a.cp) == 0]
    raise SpecError(
        f"roles.actor.devices: {a.devices}: verl {VERL_VERSION} needs an iteration's {samples} "
        f"samples to divide evenly over the trainer pool ({gpus} GPUs; its validate_config, "
        f"verl/utils/config.py, asks a multiple of {unit}). Re-plan with the actor on "
        f"{max(fits or [1])} GPUs (add `pin: {{actor: {{devices: {max(fits or [1])}}}}}` to the "
        "job), or export kuberay, which runs this plan as it is (`placer execute`)")


def _kl(plan: Plan) -> dict[str, Any]:
    # verl builds the reference only when a KL term uses it: KL as a loss (GRPO, RLOO: the
    # DeepSeekMath recipe) or as a reward penalty (PPO)
    ref = Role.REFERENCE in plan.roles
    if plan.spec.algorithm is Algorithm.ppo:
        return {"algorithm.use_kl_in_reward": ref, "actor_rollout_ref.actor.use_kl_loss": False}
    return {"algorithm.use_kl_in_reward": False, "actor_rollout_ref.actor.use_kl_loss": ref}


def _pools(plan: Plan, warn: list[str]) -> dict[str, Any]:
    nodes, per = node_shape(plan, Role.ACTOR, warn)
    actor = plan.roles[Role.ACTOR]
    if kind_of(plan, Role.ACTOR) is not DeviceKind.gpu:
        warn.append(f"actor: verl trains on GPUs only; pool {actor.pool} is not a GPU pool")
    return {"trainer.nnodes": nodes, "trainer.n_gpus_per_node": per}


def parked(plan: Plan, role: Role) -> bool:
    """Whether the plan prices `role`'s state moved to host memory and back each iteration:
    its slot's roles do not fit on its devices together (`Plan.breakdown.switch_s`)."""
    return plan.breakdown.switch_s.get(plan.roles[role].slot, 0.0) > 0.0


def _offload(plan: Plan, role: Role, warn: list[str]) -> bool:
    """verl's param_offload / optimizer_offload for a trained role: parked between phases (see
    the module docstring). A plan that keeps the optimizer state on the host through the step
    (`roles.NAME.offload`) is warned about: verl steps on the GPU, so the state the plan kept off
    the device is back on it for the step."""
    r = plan.roles[role]
    if r.offload:
        warn.append(f"roles.{role}.offload: the plan keeps the {role}'s optimizer state in host "
                    "memory through the optimizer step, which verl cannot run (its "
                    "optimizer_offload parks the state between phases and steps on the GPU); "
                    "exported as verl's offload, which needs the optimizer state's memory on "
                    "the GPU during the step")
    return r.offload or r.park_optimizer or parked(plan, role)


def _megatron_layout(r: RolePlacement, key: str) -> dict[str, Any]:
    """The Megatron parallel sizes of a role's layout (verl 0.9.1 engine/megatron.yaml)."""
    out: dict[str, Any] = {f"{key}.megatron.tensor_model_parallel_size": r.tp,
                           f"{key}.megatron.pipeline_model_parallel_size": r.pp,
                           f"{key}.megatron.context_parallel_size": r.cp,
                           f"{key}.megatron.expert_model_parallel_size": r.ep}
    if r.ep > 1:
        out[f"{key}.megatron.expert_tensor_parallel_size"] = r.etp
    return out


def _training(plan: Plan, role: Role, key: str, warn: list[str]) -> dict[str, Any]:
    r = plan.roles[role]
    off = _offload(plan, role, warn)
    if uses_megatron(plan):
        return {**_megatron_layout(r, key), f"{key}.megatron.param_offload": off,
                f"{key}.megatron.optimizer_offload": off}
    # FSDP shards over all the role's devices (fsdp_size -1), which is the plan's ZeRO-3; an
    # HSDP plan's shard group is verl's fsdp_size (`create_device_mesh`: (ddp, fsdp) mesh)
    fsdp = "fsdp_config" if role is Role.ACTOR else "fsdp"
    out: dict[str, Any] = {f"{key}.{fsdp}.param_offload": off,
                           f"{key}.{fsdp}.optimizer_offload": off}
    if 0 < r.shard < r.dp:
        out[f"{key}.{fsdp}.fsdp_size"] = r.shard * r.tp * r.cp
    return out


def _reference(plan: Plan, warn: list[str]) -> dict[str, Any]:
    ref = plan.roles[Role.REFERENCE]
    if not colocated(plan, Role.REFERENCE, Role.ACTOR):
        warn.append(f"reference: verl runs the reference in the actor's pool (colocated); the "
                    f"plan's {ref.pool}x{ref.devices} [{ref.slot}] is not expressible and the "
                    "export colocates it with the actor")
    key = "actor_rollout_ref.ref"
    o: dict[str, Any] = {f"{key}.log_prob_micro_batch_size_per_gpu":
                         micro_batch(plan, Role.REFERENCE)}
    if uses_megatron(plan):
        o.update(_megatron_layout(ref, key))
        o[f"{key}.megatron.param_offload"] = parked(plan, Role.REFERENCE)
    else:
        o[f"{key}.fsdp_config.param_offload"] = parked(plan, Role.REFERENCE)
    return o


def _rollout(plan: Plan, warn: list[str]) -> dict[str, Any]:
    r = plan.roles[Role.ROLLOUT]
    key = "actor_rollout_ref.rollout"
    o: dict[str, Any] = {
        f"{key}.name": "vllm",
        # data-parallel attention: attn_dp groups of tp / attn_dp ranks (verl: TP x DP, the
        # experts over EP = TP x DP, verl 0.9.1 rollout/rollout.yaml)
        f"{key}.tensor_model_parallel_size": r.par.attn_tp,
        f"{key}.gpu_memory_utilization": memory_fraction(plan, Role.ROLLOUT),
    }
    if r.attn_dp > 1:
        o[f"{key}.data_parallel_size"] = r.attn_dp
    if r.ep > 1:
        o[f"{key}.expert_parallel_size"] = r.ep
    if r.pp > 1:
        o[f"{key}.pipeline_model_parallel_size"] = r.pp
    dev = plan.resolved().device_of(r.pool)
    o["actor_rollout_ref.rollout.max_num_seqs"] = int(
        calibration_of(plan).for_device(dev).max_num_seqs)
    o.update(_own_gpu_pool(plan, Role.ROLLOUT, "actor_rollout_ref.rollout",
                           "generates with vLLM/SGLang", warn))
    return o


def _own_gpu_pool(plan: Plan, role: Role, prefix: str, serves: str, warn: list[str]
                  ) -> dict[str, Any]:
    """`prefix.nnodes` and `.n_gpus_per_node` of a GPU role verl runs in a resource pool of its
    own; nothing when it shares the actor's, or (with a warning) when its pool is not GPUs."""
    r, kind = plan.roles[role], kind_of(plan, role)
    if kind is not DeviceKind.gpu:
        warn.append(f"{role}: verl {serves} on GPUs; pool {r.pool} ({kind}) is not expressible")
        return {}
    if colocated(plan, role, Role.ACTOR):
        return {}
    nodes, per = node_shape(plan, role, warn)
    return {f"{prefix}.nnodes": nodes, f"{prefix}.n_gpus_per_node": per}


def _reward(plan: Plan, warn: list[str]) -> dict[str, Any]:
    res = plan.resolved()
    if res.model_of(Role.REWARD) is None:
        return {}  # a rule reward: verl's reward function (custom_reward_function), CPU
    r = plan.roles[Role.REWARD]
    o: dict[str, Any] = {
        "reward.reward_model.enable": True,
        "reward.reward_model.model_path": hf_path(res, Role.REWARD, warn),
        "reward.reward_model.rollout.name": "vllm",
        "reward.reward_model.rollout.tensor_model_parallel_size": r.tp,
    }
    own = _own_gpu_pool(plan, Role.REWARD, "reward.reward_model", "serves a reward model", warn)
    if own:
        o.update({"reward.reward_model.enable_resource_pool": True, **own})
    return o


def _environment(plan: Plan, warn: list[str]) -> dict[str, Any]:
    env = plan.spec.environment
    if env.kind == "none":
        return {}
    o: dict[str, Any] = {}
    if env.turns > 1:
        o = {"actor_rollout_ref.rollout.multi_turn.enable": True,
             "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": env.turns}
    e = plan.roles.get(Role.ENVIRONMENT)
    if e is not None:
        warn.append(f"environment: verl runs tool calls in its agent-loop workers (Ray CPU "
                    f"actors) without a pool of their own; the plan's {e.pool}x{e.devices} CPU "
                    "nodes come from the Ray cluster (placer export kuberay)")
    return o


def _pipeline(plan: Plan, warn: list[str]) -> dict[str, Any]:
    job = plan.spec
    split = not colocated(plan, Role.ROLLOUT, Role.ACTOR)
    overlaps = job.pipeline.mechanism.overlaps_steps
    if not overlaps and not split:
        return {}
    if split and not overlaps:
        warn.append("pipeline: verl runs a disaggregated rollout only asynchronously "
                    "(trainer.v1.trainer_mode=separate_async, one step off-policy); the plan's "
                    "sync pipeline becomes one-step-off")
    mode = "separate_async" if split else "colocate_async"
    o: dict[str, Any] = {"trainer.use_v1": True, "trainer.v1.trainer_mode": mode}
    if job.pipeline.mechanism.overlaps_steps:
        o["trainer.v1.sampler.max_off_policy_threshold"] = job.pipeline.max_staleness
    if split:
        o["trainer.v1.separate_async.parameter_sync_step"] = 1
    return o


def to_nested(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def launch_args(plan: Plan, flat: dict[str, Any]) -> list[str]:
    """argv after the entrypoint: the config name, then one `key=value` per override."""
    return [f"--config-name={config_name(plan)}"] + [f"{k}={hydra_value(v)}" for k, v in flat.items()]


def version_check(version: str) -> str:
    """Shell lines that warn on stderr when the installed verl is not `version`."""
    probe = "python3 -c 'import importlib.metadata as m; print(m.version(\"verl\"))'"
    return (f'installed=$({probe} 2>/dev/null || echo none)\n'
            f'[ "$installed" = {version} ] || echo "warning: written for verl {version}; '
            'found $installed (keys may differ)" >&2\n')


def export_verl(plan: Plan) -> Export:
    flat, warn = overrides(plan)
    device_warnings(plan, warn, "verl")
    args = launch_args(plan, flat)
    command = ENTRYPOINT + " " + " ".join(shlex.quote(a) for a in args)
    header = (f"# verl overrides for plan of job {plan.spec.name!r} (placer export verl)\n"
              f"# written for verl {VERL_VERSION} (pip install verl=={VERL_VERSION}): its keys "
              "and its config checks\n"
              f"# config: verl/trainer/config/{config_name(plan)}.yaml; launch: launch.sh\n"
              + "".join(f"# WARNING: {w}\n" for w in warn))
    script = ("#!/bin/sh\n# Launch verl with the plan's placement; append data.train_files=... "
              f"data.val_files=... and any other override.\n# Written for verl {VERL_VERSION}.\n"
              "set -e\n" + version_check(VERL_VERSION)
              + ENTRYPOINT + " \\\n  " + " \\\n  ".join(shlex.quote(a) for a in args)
              + ' \\\n  "$@"\n')
    files = {"overrides.yaml": header + yaml.safe_dump(to_nested(flat), sort_keys=False),
             "launch.sh": script}
    return Export("verl", files, command, warn, version=VERL_VERSION)
