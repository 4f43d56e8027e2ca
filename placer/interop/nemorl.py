"""A plan as a NeMo-RL GRPO recipe (NeMo-RL 0.6.0), and a NeMo-RL recipe as a job.

Written for NeMo-RL `NEMO_RL_VERSION` (nemo_rl/package_info.py 0.6.0, commit 7ea279ab): the recipe
is a YAML file whose `defaults:` names the shipped base recipe it overrides
(examples/configs/grpo_math_1B.yaml for DTensor, grpo_math_1B_megatron.yaml for Megatron);
NeMo-RL resolves that name relative to the recipe's folder (nemo_rl/utils/config.py
`load_config_with_inheritance`), so the file goes in examples/configs/ and runs with
`uv run examples/run_grpo_math.py --config examples/configs/FILE`. Every key it sets exists in
that base recipe with the same type.

NeMo-RL runs the policy (trainer, old and reference log-probs) on one cluster of
`cluster.num_nodes x cluster.gpus_per_node` GPUs (nemo_rl/distributed/virtual_cluster.py):
  * colocated generation (`policy.generation.colocated.enabled`): vLLM on the policy's GPUs,
    asleep while the policy trains;
  * apart: `colocated.resources` takes `gpus_per_node` GPUs of a one-node cluster, or
    `num_nodes` whole nodes of a larger one, for vLLM; the policy gets the rest
    (nemo_rl/algorithms/grpo.py `setup`).
Training backends: DTensor (FSDP2 with tensor and context parallelism: `policy.dtensor_cfg`)
when the plan's trainer has PP = EP = 1, else Megatron (`policy.megatron_cfg`: TP, PP, CP, EP,
expert TP). Offload: the plan's `offload` (optimizer state on the host through the step) is
DTensor's `cpu_offload` (FSDP2 CPU offload steps on the host) or Megatron's
`optimizer_cpu_offload` with all of the state (`optimizer_offload_fraction` 1.0). Micro-batches:
`policy.train_micro_batch_size` and `logprob_batch_size` as verl's export derives them
(`placer.interop.verl.micro_batch`). An async pipeline is `grpo.async_grpo` with the plan's
staleness as `max_trajectory_age_steps`. Imported, a recipe's vLLM `gpu_memory_utilization`
and `vllm_kwargs.max_num_seqs` become the job's `engine` section (the engines' memory share and
sequence limit the job is priced at).

What NeMo-RL cannot express is warned (the reference, a reward model or an environment on
devices of their own; LPU pools; GPU types); a role split over pools and HSDP shard groups are
refused (SpecError, exit 2), as for verl.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.interop.common import (
    Export,
    colocated,
    device_warnings,
    hf_path,
    kind_of,
    lengths,
    memory_fraction,
    node_shape,
    refuse_hsdp,
    refuse_split,
)
from placer.interop.importers import (
    CPU_DEVICE,
    Settings,
    assumed_lengths,
    assumed_notes,
    job_dict,
    model_name,
)
from placer.interop.verl import micro_batch, to_nested
from placer.solve.planfile import Plan
from placer.spec.hardware import DeviceKind
from placer.spec.sections import Algorithm

NEMO_RL_VERSION = "NeMo-RL 0.6.0"  # nemo_rl/package_info.py at 7ea279abfbeb698b092856d0dab61e7cf39bc909
# the shipped base recipes an export overrides: (DTensor, Megatron) per algorithm section
BASES = {"grpo": ("grpo_math_1B.yaml", "grpo_math_1B_megatron.yaml"),
         "ppo": ("ppo_math_1B.yaml", "ppo_math_1B_megatron.yaml")}
RUNNERS = {"grpo": "uv run examples/run_grpo_math.py --config",
           "ppo": "uv run examples/run_ppo.py --config"}
HSDP_REFUSAL = ("NeMo-RL 0.6's dtensor_cfg shards FSDP2 over all data-parallel ranks (no "
                "replicate group) and its megatron_cfg builds no partial distributed-optimizer "
                "instances")


def uses_megatron(plan: Plan) -> bool:
    """Megatron when a trained model needs pipeline or expert parallelism (DTensor has TP and
    CP only) or the plan was made for a Megatron trainer."""
    return plan.spec.profile.megatron_trainer or any(
        plan.roles[r].pp > 1 or plan.roles[r].ep > 1
        for r in (Role.ACTOR, Role.CRITIC) if r in plan.roles)


def section(plan: Plan) -> str:
    """The recipe's algorithm section: `ppo` (with a value model) or `grpo` (GRPO and RLOO:
    NeMo-RL's GRPO takes a leave-one-out baseline)."""
    return "ppo" if plan.spec.algorithm is Algorithm.ppo else "grpo"


def _layout(plan: Plan, role: Role, key: str) -> dict[str, Any]:
    """A trained model's backend section (`policy` or `value`): its parallel sizes and offload."""
    a = plan.roles[role]
    if uses_megatron(plan):
        m = f"{key}.megatron_cfg"
        return {f"{m}.enabled": True, f"{m}.tensor_model_parallel_size": a.tp,
                f"{m}.pipeline_model_parallel_size": a.pp, f"{m}.context_parallel_size": a.cp,
                f"{m}.expert_model_parallel_size": a.ep,
                f"{m}.expert_tensor_parallel_size": a.etp if a.ep > 1 else 1,
                f"{m}.optimizer.optimizer_cpu_offload": a.offload,
                f"{m}.optimizer.optimizer_offload_fraction": 1.0 if a.offload else 0.0}
    d = f"{key}.dtensor_cfg"
    return {f"{d}.enabled": True, f"{d}.tensor_parallel_size": a.tp,
            f"{d}.context_parallel_size": a.cp, f"{d}.cpu_offload": a.offload}


def _park(plan: Plan, role: Role, key: str) -> dict[str, Any]:
    """The policy's optimizer parked between phases (`park_optimizer`): NeMo-RL moves it off
    the GPU before every refit in a colocated run already (`offload_optimizer_for_refit`, on
    unless set: nemo_rl/models/megatron/setup.py), and `offload_optimizer_for_logprob` keeps it
    off through the log-prob passes (examples/configs/grpo_math_1B.yaml:139; read by
    nemo_rl/models/policy/workers/dtensor_policy_worker.py:269 and megatron_policy_worker.py:514),
    at 7ea279a. The value model has no such key; its profile never parks it."""
    return {f"{key}.offload_optimizer_for_logprob": True} if plan.roles[role].park_optimizer else {}


def _policy(plan: Plan, warn: list[str]) -> dict[str, Any]:
    b = plan.spec.batch
    prompt, response = _caps(plan)
    mbs = micro_batch(plan, Role.ACTOR)
    o: dict[str, Any] = {
        "policy.model_name": hf_path(plan.resolved(), Role.ACTOR, warn),
        "policy.train_global_batch_size": max(b.samples // b.mini_batches, 1),
        "policy.train_micro_batch_size": mbs,
        "policy.logprob_batch_size": mbs,
        "policy.max_total_sequence_length": prompt + response,
    }
    o.update(_layout(plan, Role.ACTOR, "policy"))
    o.update(_park(plan, Role.ACTOR, "policy"))
    return o


def _caps(plan: Plan) -> tuple[int, int]:
    """(prompt cap, response cap): the response is the whole multi-turn answer."""
    prompt, response = lengths(plan)
    env = plan.spec.environment
    return prompt, env.turns * response + (env.turns - 1) * env.tool_output_tokens


def _engine(plan: Plan, warn: list[str]) -> tuple[int, int]:
    """(vLLM TP, EP) of the rollout. NeMo-RL runs vLLM's data parallelism inside an engine as
    EP = DP x TP (nemo_rl/models/generation/vllm/vllm_generation.py asserts EP % TP == 0): the
    plan's data-parallel attention (attn_dp groups of attn_tp, experts over all its TP) is
    TP attn_tp with EP = the engine's GPUs; other layouts it cannot express are warned."""
    r = plan.roles[Role.ROLLOUT]
    tp, ep = r.par.attn_tp, r.ep
    if r.attn_dp > 1 and ep != r.tp:
        warn.append(f"roles.rollout.attn_dp: NeMo-RL runs data-parallel attention only as vLLM's "
                    f"DP x TP with the experts over all of them (EP = DP x TP); the plan's "
                    f"{r.attn_dp} attention groups with EP {ep} become one TP {r.tp} group")
        tp = r.tp
    if ep > 1 and ep % tp:
        warn.append(f"roles.rollout.ep: NeMo-RL needs vLLM's EP to be a multiple of its TP "
                    f"(EP = DP x TP); the plan's EP {ep} with TP {tp} is exported as EP {tp}")
        ep = tp
    return tp, ep


def _generation(plan: Plan, warn: list[str]) -> dict[str, Any]:
    r = plan.roles[Role.ROLLOUT]
    key = "policy.generation"
    tp, ep = _engine(plan, warn)
    o: dict[str, Any] = {
        f"{key}.backend": "vllm", f"{key}.max_new_tokens": _caps(plan)[1],
        f"{key}.vllm_cfg.tensor_parallel_size": tp,
        f"{key}.vllm_cfg.pipeline_parallel_size": r.pp,
        f"{key}.vllm_cfg.expert_parallel_size": ep,
        f"{key}.vllm_cfg.gpu_memory_utilization": memory_fraction(plan, Role.ROLLOUT)}
    if r.pp > 1:  # NeMo-RL asserts the async engine for pipeline stages (vllm_generation.py)
        o[f"{key}.vllm_cfg.async_engine"] = True
        if ep not in (1, tp):  # ... and asserts it off for DP inside vLLM
            warn.append(f"roles.rollout.pp: NeMo-RL runs vLLM pipeline stages only with its async "
                        f"engine, which it refuses with DP inside vLLM (EP {ep} > TP {tp}); the "
                        f"plan's EP is exported as EP {tp}")
            o[f"{key}.vllm_cfg.expert_parallel_size"] = tp
    if kind_of(plan, Role.ROLLOUT) is not DeviceKind.gpu:
        warn.append(f"rollout: NeMo-RL generates with vLLM on GPUs; the plan's {r.pool} "
                    f"({kind_of(plan, Role.ROLLOUT)}) rollout is exported colocated")
    return o


def _cluster(plan: Plan, warn: list[str]) -> dict[str, Any]:
    """The cluster and generation placement: the policy's nodes, plus the rollout's apart."""
    nodes, per = node_shape(plan, Role.ACTOR, warn)
    together = colocated(plan, Role.ROLLOUT, Role.ACTOR) or \
        kind_of(plan, Role.ROLLOUT) is not DeviceKind.gpu
    key = "policy.generation.colocated"
    if together:
        return {f"{key}.enabled": True, "cluster.num_nodes": nodes, "cluster.gpus_per_node": per}
    r_nodes, r_per = node_shape(plan, Role.ROLLOUT, warn)
    if nodes == 1 and r_nodes == 1:  # one node: the rollout takes r_per of its GPUs
        return {f"{key}.enabled": False, f"{key}.resources.gpus_per_node": r_per,
                f"{key}.resources.num_nodes": 1, "cluster.num_nodes": 1,
                "cluster.gpus_per_node": per + r_per}
    pool = plan.resolved().cluster.pool(plan.roles[Role.ACTOR].pool)
    full = pool.devices_per_node
    if per != full or r_per != full:
        warn.append(f"cluster: NeMo-RL gives a non-colocated rollout whole nodes of a multi-node "
                    f"cluster; the plan's actor {nodes}x{per} and rollout {r_nodes}x{r_per} are "
                    f"exported as {nodes} + {r_nodes} nodes of {full} GPUs")
    return {f"{key}.enabled": False, f"{key}.resources.gpus_per_node": full,
            f"{key}.resources.num_nodes": r_nodes, "cluster.num_nodes": nodes + r_nodes,
            "cluster.gpus_per_node": full}


def _others(plan: Plan, warn: list[str]) -> dict[str, Any]:
    """The reference (the policy's own workers), the reward and the environment."""
    o: dict[str, Any] = {}
    job = plan.spec
    algo = section(plan)
    if algo == "ppo":  # PPO's base recipe has no KL term; the reference is computed for one
        o[f"{algo}.skip_reference_policy_logprobs_calculation"] = Role.REFERENCE not in plan.roles
    if Role.REFERENCE not in plan.roles or algo == "ppo":
        o["loss_fn.reference_policy_kl_penalty"] = 0.01 if Role.REFERENCE in plan.roles else 0.0
    if Role.REFERENCE in plan.roles and not colocated(plan, Role.REFERENCE, Role.ACTOR):
        ref = plan.roles[Role.REFERENCE]
        warn.append(f"reference: NeMo-RL computes reference log-probs with the policy's workers; "
                    f"the plan's {ref.pool}x{ref.devices} [{ref.slot}] is not expressible and "
                    "the export runs it on the policy's GPUs")
    if plan.resolved().model_of(Role.REWARD) is not None:
        r = plan.roles[Role.REWARD]
        warn.append(f"reward: the plan's reward model on {r.pool}x{r.devices} is not expressible "
                    "in this recipe; configure NeMo-RL's reward-model environment "
                    "(examples/configs/grpo_rm_1B.yaml) by hand")
    if job.environment.turns > 1:
        o[f"{algo}.max_rollout_turns"] = job.environment.turns
    if Role.ENVIRONMENT in plan.roles:
        e = plan.roles[Role.ENVIRONMENT]
        warn.append(f"environment: NeMo-RL runs environments as Ray CPU actors without a pool of "
                    f"their own; the plan's {e.pool}x{e.devices} CPU nodes come from the Ray "
                    "cluster (placer export kuberay)")
    if job.pipeline.mechanism.overlaps_steps:
        o.update({f"{algo}.async_{algo}.enabled": True,
                  f"{algo}.async_{algo}.max_trajectory_age_steps":
                      max(job.pipeline.max_staleness, 1)})
    return o


def _value(plan: Plan, warn: list[str]) -> dict[str, Any]:
    """PPO's value model: trained on the policy's cluster (nemo_rl/algorithms/ppo.py `setup`
    builds it on train_cluster), with the critic's own layout."""
    c = plan.roles[Role.CRITIC]
    if not colocated(plan, Role.CRITIC, Role.ACTOR):
        warn.append(f"critic: NeMo-RL trains the value model on the policy's GPUs; the plan's "
                    f"{c.pool}x{c.devices} [{c.slot}] is not expressible and the export runs it "
                    "there")
    return {"value.model_name": hf_path(plan.resolved(), Role.CRITIC, warn),
            "value.train_micro_batch_size": micro_batch(plan, Role.CRITIC),
            **_layout(plan, Role.CRITIC, "value")}


def recipe(plan: Plan) -> tuple[dict[str, Any], list[str]]:
    """(dotted key -> value, warnings); SpecError for a role split over pools or an HSDP shard
    group (`HSDP_REFUSAL`)."""
    refuse_split(plan, "NeMo-RL")
    refuse_hsdp(plan, "NeMo-RL", HSDP_REFUSAL,
                "export kuberay, which runs this plan as it is (`placer execute`)")
    warn: list[str] = []
    job = plan.spec
    algo = section(plan)
    o: dict[str, Any] = {f"{algo}.num_prompts_per_step": job.batch.prompts,
                         f"{algo}.num_generations_per_prompt": job.batch.samples_per_prompt}
    o.update(_others(plan, warn))
    o.update(_policy(plan, warn))
    if Role.CRITIC in plan.roles:
        o.update(_value(plan, warn))
    o.update(_generation(plan, warn))
    o.update(_cluster(plan, warn))
    device_warnings(plan, warn, "NeMo-RL")
    return o, warn


def export_nemo_rl(plan: Plan) -> Export:
    flat, warn = recipe(plan)
    algo = section(plan)
    base = BASES[algo][uses_megatron(plan)]
    name = f"{algo}-{plan.spec.name}-placer.yaml"
    header = (f"# NeMo-RL recipe for plan of job {plan.spec.name!r} (placer export nemo-rl)\n"
              f"# written for {NEMO_RL_VERSION}: its keys and types in examples/configs/{base}\n"
              f"# put it in examples/configs/ and run: {RUNNERS[algo]} examples/configs/{name}\n"
              + "".join(f"# WARNING: {w}\n" for w in warn))
    text = header + yaml.safe_dump({"defaults": base, **to_nested(flat)}, sort_keys=False)
    return Export("nemo-rl", {name: text}, f"{RUNNERS[algo]} examples/configs/{name}", warn,
                  version=NEMO_RL_VERSION)


# ------------------------------------------------------------------------------------ import
INTERPOLATION = re.compile(r"^\$\{([A-Za-z_.][A-Za-z0-9_.]*)\}$")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into `base` as NeMo-RL merges a recipe into its defaults (OmegaConf.merge;
    a mapping with `_override_: true` replaces the base's instead)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and v.get("_override_"):
            out[k] = {kk: vv for kk, vv in v.items() if kk != "_override_"}
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_recipe(text: str, source: str, depth: int = 0) -> dict[str, Any]:
    """A recipe with its `defaults` chain merged in (names relative to the recipe's folder)."""
    from placer.base.inputs import load_yaml, read_text
    data = load_yaml(text, source)
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a NeMo-RL recipe mapping")
    parents = data.pop("defaults", None)
    if parents is None:
        return data
    if depth > 8:
        raise SpecError(f"{source}: defaults: more than 8 levels of inheritance")
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else list(parents):
        path = Path(source).parent / str(parent)
        if not path.is_file():
            raise SpecError(f"{source}: defaults: {parent!r} not found at {path} (NeMo-RL "
                            "resolves it beside the recipe; import the recipe from its folder)")
        merged = _merge(merged, load_recipe(read_text(path), str(path), depth + 1))
    return _merge(merged, data)


class Recipe(Settings):
    """A merged recipe's dotted keys; `${a.b}` interpolations resolve to what they name."""

    def get(self, key: str, default: Any = None) -> Any:
        value = dict.get(self, key, default)
        for _ in range(8):
            m = INTERPOLATION.match(value) if isinstance(value, str) else None
            if m is None:
                break
            ref = m.group(1)
            if ref.startswith("."):  # relative to the key's own mapping
                ref = key.rsplit(".", 1)[0] + ref
            value = dict.get(self, ref, default)
        return value


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _num(cfg: Recipe, key: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SpecError(f"{cfg.source}: {key}: expected a whole number (got {v!r})")
    return v


def _on(cfg: Recipe, key: str) -> bool:
    v = cfg.get(key, False)
    return v is True or (isinstance(v, str) and v.lower() == "true")


def _trainer(cfg: Recipe, model: str) -> dict[str, Any]:
    """A trained model's layout (sizes above 1) and `offload` from its backend's section
    (`model`: policy or value)."""
    out: dict[str, Any] = {}
    if _on(cfg, f"{model}.megatron_cfg.enabled"):
        key = f"{model}.megatron_cfg"
        for short, name in (("tp", "tensor_model_parallel_size"),
                            ("pp", "pipeline_model_parallel_size"),
                            ("cp", "context_parallel_size"), ("ep", "expert_model_parallel_size"),
                            ("etp", "expert_tensor_parallel_size")):
            v = cfg.get(f"{key}.{name}")
            if v is not None and _num(cfg, f"{key}.{name}") > 1:
                out[short] = v
        out["offload"] = _on(cfg, f"{key}.optimizer.optimizer_cpu_offload")
    else:
        key = f"{model}.dtensor_cfg"
        for short, name in (("tp", "tensor_parallel_size"), ("cp", "context_parallel_size")):
            if _num(cfg, f"{key}.{name}", 1) > 1:
                out[short] = cfg.get(f"{key}.{name}")
        out["offload"] = _on(cfg, f"{key}.cpu_offload")
    if "ep" not in out:
        out.pop("etp", None)
    return out


def import_nemo_rl(text: str, source: str, device: str = "H100-SXM",
                   name: str = "imported-nemo-rl", variables: dict[str, str] | None = None
                   ) -> tuple[dict[str, Any], list[str]]:
    """(job dict, notes) from a NeMo-RL GRPO or PPO recipe (its `defaults` read beside it)."""
    cfg = Recipe(_flat(load_recipe(text, source)), source)
    algo = "ppo" if "ppo.num_prompts_per_step" in cfg else "grpo"
    notes: list[str] = []
    policy = model_name(cfg.get("policy.model_name"), f"{source}: policy.model_name")
    nodes, per = _num(cfg, "cluster.num_nodes"), _num(cfg, "cluster.gpus_per_node")
    total = nodes * per
    actor = {"pool": "gpu", "devices": total, "tp": 1, "pp": 1, **_trainer(cfg, "policy")}
    gen = "policy.generation.vllm_cfg"
    rollout: dict[str, Any] = {"pool": "gpu", "tp": _num(cfg, f"{gen}.tensor_parallel_size", 1),
                               "pp": _num(cfg, f"{gen}.pipeline_parallel_size", 1)}
    ep = _num(cfg, f"{gen}.expert_parallel_size", 1)
    if ep > 1:
        rollout["ep"] = ep
    if ep > rollout["tp"]:  # vLLM's DP inside the engine (EP = DP x TP): one engine of EP GPUs
        notes.append(f"{gen}.expert_parallel_size: {ep} over TP {rollout['tp']} is vLLM data "
                     f"parallelism inside the engine (data-parallel attention); `current` "
                     f"records it as engines of {ep} GPUs")
        rollout["tp"] = ep
    shared = ["actor"]
    if cfg.get("policy.generation.colocated.enabled", True) in (False, "false", "False"):
        res = "policy.generation.colocated.resources"
        if nodes == 1:
            rollout["devices"] = _num(cfg, f"{res}.gpus_per_node")
        else:
            rollout["devices"] = _num(cfg, f"{res}.num_nodes") * per
        actor["devices"] = total - rollout["devices"]
        if actor["devices"] < 1:
            raise SpecError(f"{source}: {res}: the generation takes all {total} GPUs of the "
                            "cluster; the policy needs some")
    else:
        rollout["devices"] = total
        shared.append("rollout")
    kl = cfg.get("loss_fn.reference_policy_kl_penalty", 0.01)
    use_ref = not isinstance(kl, (int, float)) or kl > 0
    if algo == "ppo":
        use_ref = not _on(cfg, "ppo.skip_reference_policy_logprobs_calculation")
    roles: dict[str, Any] = {"actor": actor, "rollout": rollout}
    if use_ref:  # the reference is a state dict swapped into the policy's workers
        roles["reference"] = {**actor, "offload": False}
        shared.append("reference")
    models: dict[str, Any] = {"policy": policy, "use_reference": use_ref, "reward": "rule"}
    if algo == "ppo":  # the value model trains on the policy's cluster
        models["critic"] = model_name(cfg.get("value.model_name"), f"{source}: value.model_name")
        roles["critic"] = {"pool": "gpu", "devices": actor["devices"], "tp": 1, "pp": 1,
                           **_trainer(cfg, "value")}
        shared.append("critic")
    roles["reward"] = {"pool": "cpu", "devices": 1}
    environment = None
    cpu_roles = ["reward"]
    turns = _num(cfg, f"{algo}.max_rollout_turns", 1)
    if turns > 1:
        environment = {"kind": "tool", "turns": turns}
        roles["environment"] = {"pool": "cpu", "devices": 1}
        cpu_roles.append("environment")
    prompts = _num(cfg, f"{algo}.num_prompts_per_step")
    samples = prompts * _num(cfg, f"{algo}.num_generations_per_prompt")
    batch = {"prompts": prompts, "samples_per_prompt": samples // max(prompts, 1),
             "mini_batches": max(samples // max(_num(cfg, "policy.train_global_batch_size"), 1),
                                 1)}
    total_len = _num(cfg, "policy.max_total_sequence_length")
    new = cfg.get("policy.generation.max_new_tokens", total_len)
    response = _num(cfg, "policy.generation.max_new_tokens") if isinstance(new, int) and \
        new < total_len else max(total_len * 3 // 4, 1)
    if response >= total_len:
        raise SpecError(f"{source}: policy.max_total_sequence_length: {total_len} leaves no room "
                        f"for a prompt beside {response} new tokens")
    if response == total_len * 3 // 4:
        notes.append(f"lengths: NeMo-RL caps prompt and response together "
                     f"(policy.max_total_sequence_length {total_len}); taken as {total_len - response} "
                     f"prompt and {response} response tokens")
    pools = [{"name": "gpu", "device": device, "devices_per_node": per, "nodes": nodes},
             {"name": "cpu", "device": CPU_DEVICE, "devices_per_node": 1, "nodes": 1}]
    colocate = [g for g in (shared, cpu_roles) if len(g) > 1]
    current = {"source": f"nemo-rl: {source}", "roles": roles, "colocate": colocate}
    job = job_dict(name, algo, models, batch, assumed_lengths(total_len - response, response), pools,
               current, environment)
    # priced with the framework's profile: the ILP searches what nemo-rl can run
    job = {"name": job["name"], "framework": "nemo-rl", **job}
    if _on(cfg, f"{algo}.async_{algo}.enabled"):
        key = f"{algo}.async_{algo}.max_trajectory_age_steps"
        job["pipeline"] = {"mode": "async", "max_staleness": max(_num(cfg, key, 1), 1)}
    engine = _engine_settings(cfg, gen)
    if engine:
        job["engine"] = engine
    return job, assumed_notes(device) + notes


def _engine_settings(cfg: Recipe, gen: str) -> dict[str, Any]:
    """The job's `engine` section from the recipe's vLLM settings: gpu_memory_utilization
    (grpo_math_1B.yaml's 0.6 where the recipe keeps it) and vllm_kwargs.max_num_seqs."""
    out: dict[str, Any] = {}
    frac = cfg.get(f"{gen}.gpu_memory_utilization")
    if frac is not None:
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
            raise SpecError(f"{cfg.source}: {gen}.gpu_memory_utilization: expected a share of "
                            f"memory in (0, 1] (got {frac!r})")
        out["memory_fraction"] = float(frac)
    if cfg.get("policy.generation.vllm_kwargs.max_num_seqs") is not None:
        out["max_num_seqs"] = _num(cfg, "policy.generation.vllm_kwargs.max_num_seqs")
    return out
