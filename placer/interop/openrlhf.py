"""A plan as an OpenRLHF run: the `openrlhf.cli.train_ppo_ray` command line (OpenRLHF 0.11).

OpenRLHF gives every model its own Ray actor group sized `--<role>.num_nodes x
--<role>.num_gpus_per_node` (actor, ref, critic, reward), generates with `--vllm.num_engines`
vLLM engines of `--vllm.tensor_parallel_size` GPUs, and shares GPUs only in three fixed ways:
`--train.colocate_all` (every model and the engines on the actor's GPUs, which must equal
engines x TP), `--train.colocate_actor_ref` and `--train.colocate_critic_reward` (same shapes).
Training is DeepSpeed ZeRO (`--ds.zero_stage`, `--ds.adam_offload`, AutoTP as
`--ds.tensor_parallel_size`, context parallelism as ring attention `--ds.ring_attn_size`,
micro-batches per GPU as verl's export derives them); there is no pipeline or expert parallelism
(warned, naming the field).

Anything else the plan does (other colocations, LPU or CPU pools for models, pipeline stages,
a rule reward or an environment, which OpenRLHF runs as a reward function or agent script) is
named in `Export.warnings`. A role split over pools (`roles.NAME.parts`) is refused (SpecError,
exit 2): the vLLM engines are one group of one device type (`common.refuse_split`). So is an HSDP
shard group (`roles.NAME.shard` below dp): OpenRLHF has no hybrid sharding (`HSDP_REFUSAL`).
"""
from __future__ import annotations

import shlex

from placer.base.roles import Role
from placer.interop.common import (
    Export,
    colocated,
    gpu_roles,
    hf_path,
    kind_of,
    lengths,
    memory_fraction,
    node_shape,
    refuse_hsdp,
    refuse_park,
    refuse_split,
)
from placer.interop.verl import micro_batch, uses_megatron
from placer.solve.planfile import Plan
from placer.spec.hardware import DeviceKind
from placer.spec.sections import Algorithm

OPENRLHF_VERSION = "0.11.2"  # the release whose parser and checks the command is written for
ENTRYPOINT = "python3 -m openrlhf.cli.train_ppo_ray"
ESTIMATOR = {Algorithm.grpo: "group_norm", Algorithm.ppo: "gae", Algorithm.rloo: "rloo"}
# plan role -> OpenRLHF's argument prefix for a model's actor group
GROUPS = {Role.ACTOR: "actor", Role.REFERENCE: "ref", Role.CRITIC: "critic", Role.REWARD: "reward"}
# Why an HSDP plan (`Parallel.shard`: state sharded inside groups of `shard` dp ranks, the groups
# all-reducing the gradient shards) has no OpenRLHF 0.11.2 form. Its trainers are DeepSpeed ZeRO
# over the whole data-parallel world; the one group option, `--ds.zpg` (openrlhf/cli/
# train_ppo_ray.py, "ZeRO++ max partition size"), becomes DeepSpeed's `zero_hpz_partition_size`
# (openrlhf/utils/deepspeed/deepspeed_utils.py, get_train_ds_config): ZeRO++ hpZ, a secondary
# copy of the parameters inside the group for the backward's gathers only; gradients and the
# optimizer state stay sharded over every rank and the forward gathers and the gradient
# reduce-scatter still span them (deepspeed.ai/tutorials/zeropp). DeepSpeed's HSDP
# (MiCS, `mics_shard_size`) is not among OpenRLHF's options, and --ds.tensor_parallel_size is
# AutoTP, not a shard group.
HSDP_REFUSAL = ("OpenRLHF 0.11 trains with DeepSpeed ZeRO over all data-parallel ranks, and its "
                "--ds.zpg (ZeRO++ hpZ) only keeps a parameter copy inside the group for the "
                "backward pass (gradients and optimizer state stay sharded over every rank), "
                "which is not the layout the plan priced")


def _shape_args(plan: Plan, role: Role, shape: tuple[int, int]) -> list[str]:
    g = GROUPS[role]
    return [f"--{g}.num_nodes", str(shape[0]), f"--{g}.num_gpus_per_node", str(shape[1])]


def _colocation(plan: Plan, warn: list[str]) -> tuple[list[str], dict[Role, Role]]:
    """The colocation flags, and role -> the partner whose group shape it must take."""
    models = [r for r in (Role.ACTOR, Role.ROLLOUT, Role.REFERENCE, Role.CRITIC, Role.REWARD)
              if r in plan.roles and (r is not Role.REWARD or plan.resolved().model_of(r))]
    if all(colocated(plan, r, Role.ACTOR) for r in models) and len(models) > 1:
        return (["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"],
                {r: Role.ACTOR for r in models if r is not Role.ACTOR})
    flags: list[str] = []
    forced: dict[Role, Role] = {}
    if colocated(plan, Role.ACTOR, Role.REFERENCE):
        flags.append("--train.colocate_actor_ref")
        forced[Role.REFERENCE] = Role.ACTOR
    if colocated(plan, Role.CRITIC, Role.REWARD) and plan.resolved().model_of(Role.REWARD):
        flags.append("--train.colocate_critic_reward")
        forced[Role.REWARD] = Role.CRITIC
    expressed = {frozenset({Role.ACTOR, Role.REFERENCE}), frozenset({Role.CRITIC, Role.REWARD})}
    for s in plan.slots:
        group = {Role(r) for r in s.roles} & set(models)
        if len(group) > 1 and frozenset(group) not in expressed:
            warn.append(f"colocation: OpenRLHF shares GPUs only as colocate_all, actor+ref or "
                        f"critic+reward; the plan's slot {s.name} ({'+'.join(sorted(group))}) "
                        "gets separate GPUs")
    return flags, forced


def _models(plan: Plan, warn: list[str], forced: dict[Role, Role]) -> list[str]:
    res = plan.resolved()
    args: list[str] = []
    actor_shape = node_shape(plan, Role.ACTOR, warn)
    for role in (Role.ACTOR, Role.REFERENCE, Role.CRITIC, Role.REWARD):
        if role not in plan.roles or res.model_of(role) is None:
            continue
        r = plan.roles[role]
        if kind_of(plan, role) is not DeviceKind.gpu:
            warn.append(f"{role}: OpenRLHF runs models on GPUs only; the plan's {r.pool} "
                        f"({kind_of(plan, role)}) placement is not expressible and the export "
                        f"gives it the actor's shape")
            shape = actor_shape
        elif role in forced:  # colocated groups must have the partner's shape
            shape = node_shape(plan, forced[role], warn)
        else:
            shape = node_shape(plan, role, warn)
        args += _shape_args(plan, role, shape)
        if role is not Role.REFERENCE:  # the reference loads the actor's model
            args += [f"--{GROUPS[role]}.model_name_or_path", hf_path(res, role, warn)]
        if role in (Role.ACTOR, Role.CRITIC) and r.pp > 1:
            warn.append(f"{role}: OpenRLHF has no pipeline parallelism; the plan's PP={r.pp} "
                        "is dropped (ZeRO-3 data parallel instead)")
    return args


def _rollout(plan: Plan, warn: list[str], colocate_all: bool) -> list[str]:
    r = plan.roles[Role.ROLLOUT]
    if colocate_all:  # OpenRLHF asserts engines x TP == the actor's GPUs
        nodes, per = node_shape(plan, Role.ACTOR, [])
        engines, tp = max(nodes * per // r.tp, 1), r.tp
        if engines * tp != r.devices:
            warn.append(f"rollout: colocate_all runs vLLM on all the actor's {nodes * per} GPUs; "
                        f"the plan's {r.devices} become {engines} engines x TP {tp}")
    elif kind_of(plan, Role.ROLLOUT) is not DeviceKind.gpu:
        warn.append(f"rollout: OpenRLHF's vLLM engines run on GPUs; the plan's {r.pool} "
                    f"({kind_of(plan, Role.ROLLOUT)}) rollout is not expressible and the export "
                    "sizes the engines to the actor's GPUs")
        a = plan.roles[Role.ACTOR]
        engines, tp = max(a.devices // r.tp, 1), r.tp
    else:
        engines, tp = r.devices // r.tp, r.tp
    return ["--vllm.num_engines", str(engines), "--vllm.tensor_parallel_size", str(tp),
            "--vllm.gpu_memory_utilization", str(memory_fraction(plan, Role.ROLLOUT))]


def _training(plan: Plan, warn: list[str]) -> list[str]:
    a = plan.roles[Role.ACTOR]
    mbs = str(micro_batch(plan, Role.ACTOR))  # the derivation verl's export uses
    args = ["--ds.zero_stage", str(a.zero), "--actor.gradient_checkpointing_enable",
            "--train.micro_batch_size", mbs, "--rollout.micro_batch_size", mbs]
    if a.offload:
        args.append("--ds.adam_offload")
    if a.tp > 1:
        args += ["--ds.tensor_parallel_size", str(a.tp)]
    if a.cp > 1:  # ring attention is OpenRLHF's context parallelism (it packs samples for it)
        args += ["--ds.ring_attn_size", str(a.cp)]
    for role in (Role.ACTOR, Role.CRITIC):
        r = plan.roles.get(role)
        if r is not None and r.ep > 1:
            warn.append(f"roles.{role}.ep: OpenRLHF {OPENRLHF_VERSION} trains with DeepSpeed "
                        f"ZeRO, which has no expert parallelism; the plan's EP {r.ep} is "
                        "dropped and every rank holds its ZeRO shard of all experts")
    return args


def _batch(plan: Plan) -> list[str]:
    job = plan.spec
    prompt_len, response_len = lengths(plan)
    turns = job.environment.turns
    response = turns * response_len + (turns - 1) * job.environment.tool_output_tokens
    b = job.batch
    args = ["--rollout.batch_size", str(b.prompts),
            "--rollout.n_samples_per_prompt", str(b.samples_per_prompt),
            "--train.batch_size", str(max(b.samples // b.mini_batches, 1)),
            "--rollout.max_new_tokens", str(response),
            "--data.max_len", str(prompt_len + response),
            "--algo.advantage.estimator", ESTIMATOR[job.algorithm]]
    if Role.REFERENCE not in plan.roles:
        args += ["--algo.kl.init_coef", "0"]  # OpenRLHF builds no reference without a KL term
    elif job.algorithm is not Algorithm.ppo:
        args += ["--algo.kl.use_loss", "--algo.kl.estimator", "k3"]  # GRPO's KL loss
    if job.pipeline.mechanism.overlaps_steps:
        args += ["--train.async_enable", "--train.async_queue_size",
                 str(job.pipeline.max_staleness)]
    return args


def _outside(plan: Plan, warn: list[str]) -> None:
    res = plan.resolved()
    if Role.REWARD in plan.roles and res.model_of(Role.REWARD) is None:
        r = plan.roles[Role.REWARD]
        warn.append(f"reward: a rule reward is an OpenRLHF reward function (--reward.remote_url "
                    f"FILE.py) run by the driver; the plan's {r.pool}x{r.devices} placement is "
                    "not expressible")
    if Role.ENVIRONMENT in plan.roles:
        e = plan.roles[Role.ENVIRONMENT]
        warn.append(f"environment: OpenRLHF runs tools from an agent script "
                    f"(--train.agent_func_path) in its rollout workers; the plan's "
                    f"{e.pool}x{e.devices} CPU pool is not expressible")
    if len({res.device_of(plan.roles[r].pool).name for r in gpu_roles(plan)}) > 1:
        warn.append("cluster: OpenRLHF sizes groups in GPUs, not GPU types; start the Ray "
                    "cluster so each pool's nodes carry its type (placer export kuberay)")


def command_args(plan: Plan) -> tuple[list[str], list[str]]:
    """(argv after the entrypoint, warnings); SpecError when a role is split over pools
    (OpenRLHF's vLLM engines are one group of one device type: `refuse_split`) or a trainer's
    state is sharded in HSDP groups (`HSDP_REFUSAL`)."""
    refuse_split(plan, "OpenRLHF")
    kuberay = "kuberay, which runs this plan as it is (`placer execute`)"
    refuse_park(plan, "OpenRLHF", "export verl or nemo-rl (optimizer_offload)")
    refuse_hsdp(plan, "OpenRLHF", HSDP_REFUSAL, "export " + kuberay if uses_megatron(plan)
                else f"export verl (FSDP's fsdp_size is the shard group) or {kuberay}")
    warn: list[str] = []
    flags, forced = _colocation(plan, warn)
    args = _models(plan, warn, forced) \
        + _rollout(plan, warn, "--train.colocate_all" in flags) + flags + _training(plan, warn) \
        + _batch(plan)
    _outside(plan, warn)
    return args, warn


def export_openrlhf(plan: Plan) -> Export:
    args, warn = command_args(plan)
    command = ENTRYPOINT + " " + " ".join(shlex.quote(a) for a in args)
    script = ("#!/bin/sh\n# OpenRLHF with the plan's placement (placer export openrlhf); append "
              "--data.prompt_dataset ... and any other flag.\n"
              f"# written for OpenRLHF {OPENRLHF_VERSION} (its train_ppo_ray flags and checks)\n"
              + "".join(f"# WARNING: {w}\n" for w in warn) + "set -e\n"
              + ENTRYPOINT + " \\\n  " + " \\\n  ".join(shlex.quote(a) for a in args)
              + ' \\\n  "$@"\n')
    return Export("openrlhf", {"train_ppo_ray.sh": script}, command, warn,
                  version=OPENRLHF_VERSION)
