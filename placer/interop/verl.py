"""A plan as a verl run: Hydra overrides of `verl.trainer.main_ppo` (verl 0.9) and its launch line.

verl places roles in Ray *resource pools* counted in GPUs (`nnodes x n_gpus_per_node`):
  * the trainer pool (`trainer.nnodes`, `trainer.n_gpus_per_node`) hosts the actor, the reference
    and the critic, colocated (verl's hybrid engine), and the rollout when it is colocated too;
  * a disaggregated rollout gets its own pool (`actor_rollout_ref.rollout.nnodes`,
    `n_gpus_per_node`) under the v1 trainer's `separate_async` mode (one step off-policy);
  * a reward model may get its own pool (`reward.reward_model.enable_resource_pool`).
Training layouts: FSDP (ZeRO-3 data parallel, `ppo_trainer`) when the actor has TP = PP = 1, else
Megatron (`ppo_megatron_trainer`, TP and PP sizes). Rollout: vLLM with the plan's TP, its memory
share as `gpu_memory_utilization` and the engine's `max_num_seqs` the plan was priced with (its
calibration's admission cap: `placer.cost.admission` admits by free KV up to that many sequences).

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

from placer.base.roles import Role
from placer.interop.common import (
    Export,
    colocated,
    hf_path,
    kind_of,
    lengths,
    memory_fraction,
    mini_batch_prompts,
    node_shape,
    refuse_hsdp,
    refuse_split,
)
from placer.solve.planfile import Plan, calibration_of
from placer.spec.hardware import DeviceKind
from placer.spec.sections import Algorithm

ADV_ESTIMATOR = {Algorithm.grpo: "grpo", Algorithm.ppo: "gae", Algorithm.rloo: "rloo"}
ENTRYPOINT = "python3 -m verl.trainer.main_ppo"
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
    any trained model needs tensor or pipeline parallelism (FSDP has neither)."""
    return plan.spec.profile.megatron_trainer or any(
        plan.roles[r].tp > 1 or plan.roles[r].pp > 1
        for r in (Role.ACTOR, Role.CRITIC) if r in plan.roles)


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
        "actor_rollout_ref.rollout.n": job.batch.samples_per_prompt,
    }
    o.update(_kl(plan))
    o.update(_pools(plan, warn))
    o.update(_training(plan, Role.ACTOR, "actor_rollout_ref.actor"))
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
        o.update(_training(plan, Role.CRITIC, "critic"))
    o.update(_rollout(plan, warn))
    o.update(_reward(plan, warn))
    o.update(_environment(plan, warn))
    o.update(_pipeline(plan, warn))
    return o, warn


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


def _training(plan: Plan, role: Role, key: str) -> dict[str, Any]:
    r = plan.roles[role]
    if uses_megatron(plan):
        return {f"{key}.megatron.tensor_model_parallel_size": r.tp,
                f"{key}.megatron.pipeline_model_parallel_size": r.pp,
                f"{key}.megatron.param_offload": r.offload,
                f"{key}.megatron.optimizer_offload": r.offload}
    # FSDP shards over all the role's devices (fsdp_size -1), which is the plan's ZeRO-3; an
    # HSDP plan's shard group is verl's fsdp_size (`create_device_mesh`: (ddp, fsdp) mesh)
    fsdp = "fsdp_config" if role is Role.ACTOR else "fsdp"
    out: dict[str, Any] = {f"{key}.{fsdp}.param_offload": r.offload,
                           f"{key}.{fsdp}.optimizer_offload": r.offload}
    if 0 < r.shard < r.dp:
        out[f"{key}.{fsdp}.fsdp_size"] = r.shard * r.tp * r.cp
    return out


def _reference(plan: Plan, warn: list[str]) -> dict[str, Any]:
    ref = plan.roles[Role.REFERENCE]
    if not colocated(plan, Role.REFERENCE, Role.ACTOR):
        warn.append(f"reference: verl runs the reference in the actor's pool (colocated); the "
                    f"plan's {ref.pool}x{ref.devices} [{ref.slot}] is not expressible and the "
                    "export colocates it with the actor")
    if uses_megatron(plan):
        return {"actor_rollout_ref.ref.megatron.tensor_model_parallel_size": ref.tp,
                "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size": ref.pp}
    return {}


def _rollout(plan: Plan, warn: list[str]) -> dict[str, Any]:
    r = plan.roles[Role.ROLLOUT]
    o: dict[str, Any] = {
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": r.tp,
        "actor_rollout_ref.rollout.gpu_memory_utilization": memory_fraction(plan, Role.ROLLOUT),
    }
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


def _lpu_and_types(plan: Plan, warn: list[str]) -> None:
    res = plan.resolved()
    for role, r in plan.roles.items():
        said = any(w.startswith(f"{role}:") for w in warn)  # one warning per role is enough
        if res.device_of(r.pool).kind is DeviceKind.lpu and not said:
            warn.append(f"{role}: verl has no LPU backend; the plan's {r.pool} (LPU) placement "
                        "is not expressible")
    types = {res.device_of(r.pool).name for r in plan.roles.values()
             if res.device_of(r.pool).kind is DeviceKind.gpu}
    if len(types) > 1:
        warn.append(f"cluster: verl sizes pools in GPUs, not GPU types ({', '.join(sorted(types))}); "
                    "start the Ray cluster so each pool's nodes carry its type "
                    "(placer export kuberay)")


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


def export_verl(plan: Plan) -> Export:
    flat, warn = overrides(plan)
    _lpu_and_types(plan, warn)
    args = launch_args(plan, flat)
    command = ENTRYPOINT + " " + " ".join(shlex.quote(a) for a in args)
    header = (f"# verl overrides for plan of job {plan.spec.name!r} (placer export verl)\n"
              f"# config: verl/trainer/config/{config_name(plan)}.yaml; launch: launch.sh\n"
              + "".join(f"# WARNING: {w}\n" for w in warn))
    script = ("#!/bin/sh\n# Launch verl with the plan's placement; append data.train_files=... "
              "data.val_files=... and any other override.\nset -e\n"
              + ENTRYPOINT + " \\\n  " + " \\\n  ".join(shlex.quote(a) for a in args)
              + ' \\\n  "$@"\n')
    files = {"overrides.yaml": header + yaml.safe_dump(to_nested(flat), sort_keys=False),
             "launch.sh": script}
    return Export("verl", files, command, warn)
