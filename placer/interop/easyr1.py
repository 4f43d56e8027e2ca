"""A plan as an EasyR1 run: its config YAML (`python3 -m verl.trainer.main config=...`), and an
EasyR1 config (or launch script) as a job.

Written for EasyR1 at the commit its published baselines cite (`EASYR1_VERSION`,
hiyouga/EasyR1 @b44b311b, 0.3.3.dev0; v0.3.2 plus 44 commits): every key is a field of that
commit's config dataclasses (verl/trainer/config.py `PPOConfig`: data, algorithm, worker,
trainer; verl/workers/actor/config.py, rollout/config.py, critic/config.py, reward/config.py)
and the file follows the layout of its examples/config.yaml.

EasyR1 runs one hybrid engine (verl/trainer/main.py:54-66, ray_trainer.py:256-263): one
resource pool of `trainer.nnodes x trainer.n_gpus_per_node` GPUs, on which a single FSDPWorker
group holds the actor, the vLLM rollout (`worker.rollout.tensor_parallel_size`) and the
reference, and the critic's group shares the pool. So a plan exports when:
  * its actor, rollout, reference and critic share one slot (`placer plan --framework easyr1`
    keeps them so: `FrameworkProfile.hybrid_engine`), else SpecError naming `roles.NAME.slot`;
  * each role's layout is one EasyR1 runs (the profile's `layout_problem`: FSDP data parallel
    only, vLLM TP only), else SpecError naming `roles.NAME`;
  * the batch splits as EasyR1's checks want (ray_trainer.py:211-219, fsdp_workers.py:146-151,
    protocol.py:555: the prompts over the GPUs, a mini-batch over the GPUs in whole
    micro-batches), else SpecError naming the field.
A role on fewer GPUs than the pool is run over all of them (warned); so is one on another pool.
Parking: `offload.offload_params` / `offload_optimizer` where the plan parks the role's state or
its slot switches (as `placer.interop.verl` exports verl's); the reference streamed from the
host (`roles.reference.stream_params_bytes`) is `ref.fsdp.enable_cpu_offload`. Micro-batches:
the plan's own sequences per device, else the profile's (`micro_batch_samples`).

The importer reads a config YAML, or a launch script's `config=FILE` (read from the script's
folder or the first folder above it that has it, as the script runs from its repository's root,
else from the working directory) and its `key=value` overrides; keys absent from both take EasyR1's
dataclass defaults (`EASYR1_DEFAULTS`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from placer.base.errors import SpecError
from placer.base.roles import TRAINING_ROLES, Role
from placer.interop.common import (
    Export,
    device_warnings,
    gpu_roles,
    hf_path,
    memory_fraction,
    mini_batch_prompts,
    node_shape,
    refuse_split,
)
from placer.interop.importers import (
    CPU_DEVICE,
    Settings,
    assumed_lengths,
    assumed_notes,
    job_dict,
    model_name,
    scalar,
    script_argv,
)
from placer.interop.verl import parked
from placer.solve.planfile import Plan
from placer.spec.framework import PROFILES
from placer.spec.hardware import DeviceKind
from placer.spec.sections import Algorithm

EASYR1_VERSION = "0.3.3.dev0 @b44b311b"
ENTRYPOINT = "python3 -m verl.trainer.main"
PROFILE = PROFILES["easyr1"]
ADV_ESTIMATOR = {Algorithm.grpo: "grpo", Algorithm.ppo: "gae", Algorithm.rloo: "rloo"}
# placer's KL estimators as EasyR1's kl_penalty (verl/trainer/core_algos.py:579-594)
KL_PENALTY = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
# EasyR1's own reward function for math answers (examples/config.yaml:90): a rule reward
RULE_REWARD = "./examples/reward_function/math.py:compute_score"
# vLLM's token budget per engine step (worker.rollout.max_num_batched_tokens, rollout/config.py:38);
# vllm_rollout_spmd.py:113 requires it to hold a whole prompt plus response
VLLM_BATCHED_TOKENS = 8192
# EasyR1's dataclass defaults for the keys the importer reads (verl/trainer/config.py:35-146,
# verl/workers/actor/config.py:96-134, rollout/config.py:23-41 at b44b311b)
EASYR1_DEFAULTS: dict[str, Any] = {
    "data.max_prompt_length": 512, "data.max_response_length": 512,
    "data.rollout_batch_size": 512, "algorithm.adv_estimator": "grpo",
    "algorithm.disable_kl": False, "algorithm.use_kl_loss": False, "algorithm.kl_penalty": "kl",
    "algorithm.kl_coef": 1e-3, "worker.actor.global_batch_size": 256,
    "worker.critic.global_batch_size": 256, "worker.rollout.n": 1,
    "worker.rollout.tensor_parallel_size": 2, "worker.rollout.temperature": 1.0,
    "trainer.nnodes": 1, "trainer.n_gpus_per_node": 8,
}
HYBRID = tuple(PROFILE.hybrid_engine)


# ------------------------------------------------------------------------------------ export
def _refuse_layouts(plan: Plan) -> None:
    """SpecError naming the first role whose slot or layout EasyR1 cannot run (module doc)."""
    home = plan.roles[Role.ACTOR].slot
    for role, r in plan.roles.items():
        if role in HYBRID and r.slot != home and kind_is_gpu(plan, role):
            raise SpecError(
                f"roles.{role}.slot: {r.slot}: EasyR1 runs the {role} in its one hybrid engine "
                f"with the actor (slot {home}; verl/trainer/ray_trainer.py:256-263). Re-plan with "
                "--framework easyr1, or export verl, which runs a rollout apart")
        why = PROFILE.layout_problem(role, training=role in TRAINING_ROLES,
                                     has_model=plan.resolved().model_of(role) is not None,
                                     on_gpu=kind_is_gpu(plan, role), tp=r.tp, pp=r.pp, ep=r.ep,
                                     shard=r.shard if 0 < r.shard < r.dp else 0, attn_dp=r.attn_dp)
        if why is not None:
            raise SpecError(f"roles.{role}: EasyR1 {why}. Re-plan with --framework easyr1")


def kind_is_gpu(plan: Plan, role: str) -> bool:
    return plan.resolved().device_of(plan.roles[role].pool).kind is DeviceKind.gpu


def _micro(plan: Plan, role: str, kind: str) -> int:
    """Sequences per device per micro-batch: the plan's own (`roles.NAME.micro_batch`) for an
    update, else the profile's (EasyR1's examples/config.yaml)."""
    own = plan.roles[role].micro_batch if kind == "update" else 0
    return own or PROFILE.micro_batch_samples[kind]


def _refuse_uneven(plan: Plan, gpus: int, update_micro: int, forward_micro: int) -> None:
    """SpecError (exit 2) naming the field EasyR1's own checks would refuse (module doc)."""
    b = plan.spec.batch
    n, mini = b.samples_per_prompt, mini_batch_prompts(plan)
    per_device = mini * n // gpus
    checks = (
        (b.prompts % gpus == 0, "batch.prompts",
         f"{b.prompts} prompts do not split evenly over {gpus} GPUs (verl/protocol.py:555)"),
        (b.prompts % b.mini_batches == 0, "batch.mini_batches",
         f"{b.prompts} prompts are not {b.mini_batches} mini-batches of whole prompts "
         "(worker.actor.global_batch_size counts prompts; ray_trainer.py:211)"),
        (per_device > 0 and per_device % update_micro == 0, "roles.actor.micro_batch",
         f"a mini-batch's {mini * n} samples over {gpus} GPUs are not whole micro-batches of "
         f"{update_micro} (fsdp_workers.py:146-151)"),
        (b.prompts * n % forward_micro == 0, "batch.samples_per_prompt",
         f"{b.prompts * n} samples are not whole experience micro-batches of {forward_micro} "
         "(ray_trainer.py:214-219)"),
    )
    for ok, fld, why in checks:
        if not ok:
            raise SpecError(f"{fld}: EasyR1 {EASYR1_VERSION} would refuse this plan: {why}")


def _world(plan: Plan, warn: list[str]) -> tuple[int, int]:
    """(nnodes, GPUs per node) of EasyR1's one pool: the actor's; every other GPU role of the
    hybrid engine runs over all of them (warned where the plan gives it fewer or others)."""
    nodes, per = node_shape(plan, Role.ACTOR, warn)
    a = plan.roles[Role.ACTOR]
    for role in gpu_roles(plan):
        r = plan.roles[role]
        if role in HYBRID and role != Role.ACTOR and (r.devices, r.pool) != (a.devices, a.pool):
            warn.append(f"{role}: EasyR1 runs every role over its whole pool ({nodes * per} "
                        f"GPUs); the plan's {r.pool}x{r.devices} is exported on the actor's")
    return nodes, per


def _offload(plan: Plan, role: Role, warn: list[str]) -> dict[str, bool]:
    r = plan.roles[role]
    if r.offload:
        warn.append(f"roles.{role}.offload: EasyR1 steps the optimizer on the GPU; the plan's "
                    "host-stepped optimizer is exported as its offload_optimizer (parked)")
    park = r.offload or r.park_optimizer or parked(plan, role)
    return {"offload_params": park, "offload_optimizer": park}


def _trained(plan: Plan, role: Role, warn: list[str]) -> dict[str, Any]:
    r = plan.roles[role]
    fsdp: dict[str, Any] = {"enable_full_shard": True, "enable_cpu_offload": False}
    if 0 < r.shard < r.dp:  # HSDP: (ddp, fsdp) mesh, fsdp_workers.py:121-127
        fsdp["fsdp_size"] = r.shard
    return {"global_batch_size": mini_batch_prompts(plan),
            "micro_batch_size_per_device_for_update": _micro(plan, role, "update"),
            "micro_batch_size_per_device_for_experience": _micro(plan, role, "forward"),
            "padding_free": True, "dynamic_batching": True,
            "model": {"model_path": hf_path(plan.resolved(), role, warn)},
            "fsdp": fsdp, "offload": _offload(plan, role, warn)}


def _worker(plan: Plan, warn: list[str]) -> dict[str, Any]:
    job = plan.spec
    prompt, response = _lengths(plan)
    ro = plan.roles[Role.ROLLOUT]
    worker: dict[str, Any] = {
        "actor": _trained(plan, Role.ACTOR, warn),
        "rollout": {"n": job.batch.samples_per_prompt, "temperature": job.sampling.temperature,
                    "gpu_memory_utilization": memory_fraction(plan, Role.ROLLOUT),
                    "tensor_parallel_size": ro.tp,
                    "max_num_batched_tokens": max(VLLM_BATCHED_TOKENS, prompt + response)},
    }
    if Role.CRITIC in plan.roles:
        worker["critic"] = _trained(plan, Role.CRITIC, warn)
    if Role.REFERENCE in plan.roles:
        ref = plan.roles[Role.REFERENCE]
        worker["ref"] = {"fsdp": {"enable_full_shard": ref.sharded_weights or ref.dp == 1,
                                  "enable_cpu_offload": ref.stream_params_bytes > 0},
                         "offload": {"offload_params": parked(plan, Role.REFERENCE)}}
    if plan.resolved().model_of(Role.REWARD) is not None:  # the planner refuses it (profile)
        warn.append("reward: EasyR1 has no reward model worker; exported with its rule reward")
    worker["reward"] = {"reward_function": RULE_REWARD}
    return worker


def _lengths(plan: Plan) -> tuple[int, int]:
    """(data.max_prompt_length, data.max_response_length): the longest prompt, its image tokens
    included (EasyR1 counts the processed prompt), and the longest response."""
    lengths = plan.resolved().job.lengths
    return int(lengths.prompt.max_value()), int(lengths.response.max_value())


def config(plan: Plan) -> tuple[dict[str, Any], list[str]]:
    """(EasyR1's config as a nested mapping, warnings); SpecError for what it cannot run."""
    refuse_split(plan, "EasyR1")
    _refuse_layouts(plan)
    warn: list[str] = []
    job = plan.spec
    if job.environment.kind != "none":
        warn.append("environment: EasyR1 generates one turn with no tool environment; the "
                    "job's environment is not exported")
    nodes, per = _world(plan, warn)
    prompt, response = _lengths(plan)
    worker = _worker(plan, warn)
    _refuse_uneven(plan, nodes * per, worker["actor"]["micro_batch_size_per_device_for_update"],
                   worker["actor"]["micro_batch_size_per_device_for_experience"])
    ref = Role.REFERENCE in plan.roles
    doc = {
        "data": {"max_prompt_length": prompt, "max_response_length": response,
                 "rollout_batch_size": job.batch.prompts},
        "algorithm": {"adv_estimator": ADV_ESTIMATOR[job.algorithm], "disable_kl": not ref,
                      "use_kl_loss": ref and job.kl.where == "loss",
                      "kl_penalty": KL_PENALTY[job.kl.estimator], "kl_coef": job.kl.coef},
        "worker": worker,
        "trainer": {"experiment_name": job.name, "nnodes": nodes, "n_gpus_per_node": per},
    }
    return doc, warn


def export_easyr1(plan: Plan) -> Export:
    doc, warn = config(plan)
    device_warnings(plan, warn, "EasyR1")
    header = (f"# EasyR1 config for plan of job {plan.spec.name!r} (placer export easyr1)\n"
              f"# written for EasyR1 {EASYR1_VERSION}; its keys are that commit's "
              "examples/config.yaml / PPOConfig fields\n# launch: "
              f"{ENTRYPOINT} config=easyr1.yaml data.train_files=... data.val_files=...\n"
              + "".join(f"# WARNING: {w}\n" for w in warn))
    text = header + yaml.safe_dump(doc, sort_keys=False)
    return Export("easyr1", {"easyr1.yaml": text}, f"{ENTRYPOINT} config=easyr1.yaml", warn,
                  version=EASYR1_VERSION)


# ------------------------------------------------------------------------------------ import
def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _mapping(text: str, source: str) -> dict[str, Any]:
    from placer.base.inputs import load_yaml
    data = load_yaml(text, source)
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected an EasyR1 config mapping or a launch script")
    return _flat(data)


def _is_script(text: str) -> bool:
    """A launch script (a `verl.trainer.main` command that YAML does not read as a mapping),
    not a config (whose comments may name the command)."""
    if "verl.trainer.main" not in text:
        return False
    try:
        return not isinstance(yaml.safe_load(text), dict)
    except yaml.YAMLError:
        return True


def settings(text: str, source: str, variables: dict[str, str] | None = None) -> Settings:
    """Dotted key -> value of an EasyR1 config, or of a launch script's `config=FILE` (module
    doc) with its `key=value` overrides on top."""
    if not _is_script(text):
        return Settings(_mapping(text, source), source)
    argv = script_argv(text, source, "verl.trainer.main", variables)
    if argv is None or "verl.trainer.main" not in argv:
        raise SpecError(f"{source}: no `{ENTRYPOINT}` command in it")
    over = dict(tok.partition("=")[::2] for tok in argv[argv.index("verl.trainer.main") + 1:]
                if "=" in tok and not tok.startswith("-"))
    out: dict[str, Any] = {}
    if "config" in over:
        here = Path(source).resolve().parent  # run from its repository's root: a folder above
        path = next((p for p in (*(d / over["config"] for d in (here, *here.parents)),
                                 Path(over["config"])) if p.is_file()), None)
        if path is None:
            raise SpecError(f"{source}: config: {over['config']!r} is not a file in the "
                            "script's folder, one above it or the working directory")
        out = _mapping(path.read_text(), str(path))
    out.update({k: scalar(v) for k, v in over.items() if k != "config"})
    return Settings(out, source)


def _get(cfg: Settings, key: str) -> Any:
    return cfg.get(key, EASYR1_DEFAULTS.get(key))


def _whole(cfg: Settings, key: str) -> int:
    v = _get(cfg, key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(f"{cfg.source}: {key}: expected a positive whole number (got {v!r})")
    return v


def _on(cfg: Settings, key: str) -> bool:
    v = _get(cfg, key)
    return v is True or (isinstance(v, str) and v.lower() == "true")


def import_easyr1(text: str, source: str, device: str = "H100-SXM",
                  name: str = "imported-easyr1", variables: dict[str, str] | None = None
                  ) -> tuple[dict[str, Any], list[str]]:
    """(job dict, notes) from an EasyR1 config or launch script (module doc)."""
    cfg = settings(text, source, variables)
    algos = {v: k.value for k, v in ADV_ESTIMATOR.items()}
    adv = _get(cfg, "algorithm.adv_estimator")
    if adv not in algos:
        raise SpecError(f"{source}: algorithm.adv_estimator: placer plans "
                        f"{', '.join(algos)} (got {adv!r})")
    policy = model_name(cfg.get("worker.actor.model.model_path"),
                        f"{source}: worker.actor.model.model_path")
    nodes, per = _whole(cfg, "trainer.nnodes"), _whole(cfg, "trainer.n_gpus_per_node")
    total, tp = nodes * per, _whole(cfg, "worker.rollout.tensor_parallel_size")
    if total % tp:
        raise SpecError(f"{source}: worker.rollout.tensor_parallel_size: {tp} does not divide "
                        f"the {total} GPUs (vllm_rollout_spmd.py / fsdp_workers.py:384)")
    use_ref = not _on(cfg, "algorithm.disable_kl")
    roles: dict[str, Any] = {"actor": {"pool": "gpu", "devices": total},
                             "rollout": {"pool": "gpu", "devices": total, "tp": tp}}
    models: dict[str, Any] = {"policy": policy, "use_reference": use_ref, "reward": "rule"}
    if use_ref:
        roles["reference"] = {"pool": "gpu", "devices": total}
    if algos[adv] == "ppo":
        models["critic"] = model_name(cfg.get("worker.critic.model.model_path"),
                                      f"{source}: worker.critic.model.model_path")
        roles["critic"] = {"pool": "gpu", "devices": total}
    roles["reward"] = {"pool": "cpu", "devices": 1}
    prompts = _whole(cfg, "data.rollout_batch_size")
    mini = _whole(cfg, "worker.actor.global_batch_size")
    batch = {"prompts": prompts, "samples_per_prompt": _whole(cfg, "worker.rollout.n"),
             "mini_batches": max(prompts // mini, 1)}
    pools = [{"name": "gpu", "device": device, "devices_per_node": per, "nodes": nodes},
             {"name": "cpu", "device": CPU_DEVICE, "devices_per_node": 1, "nodes": 1}]
    current = {"source": f"easyr1: {source}", "roles": roles,
               "colocate": [[r for r in roles if r != "reward"]]}
    job = job_dict(name, algos[adv], models, batch,
                   assumed_lengths(_whole(cfg, "data.max_prompt_length"),
                                   _whole(cfg, "data.max_response_length")), pools, current)
    job = {"name": job["name"], "framework": "easyr1", **job}
    if use_ref:
        estimator = {v: k for k, v in KL_PENALTY.items()}.get(_get(cfg, "algorithm.kl_penalty"))
        coef = _get(cfg, "algorithm.kl_coef")
        if estimator is None or isinstance(coef, bool) or not isinstance(coef, (int, float)):
            raise SpecError(f"{source}: algorithm.kl_penalty / kl_coef: placer prices "
                            f"{', '.join(KL_PENALTY.values())} with a number coefficient (got "
                            f"{_get(cfg, 'algorithm.kl_penalty')!r}, {coef!r})")
        job["kl"] = {"coef": float(coef), "estimator": estimator,
                     "in": "loss" if _on(cfg, "algorithm.use_kl_loss") else "reward"}
    return job, assumed_notes(device) + [
        "micro-batches, parking and the reference's host copy: the easyr1 profile's (EasyR1's "
        "defaults)",
        "lengths.images_per_prompt: an EasyR1 config does not say how many images a prompt has "
        f"(data.image_key {_get(cfg, 'data.image_key') or 'images'!r}); for a "
        "vision-language run set it and take its image tokens off lengths.prompt (EasyR1's "
        "max_prompt_length counts them; placer adds them to the prompt)"]
