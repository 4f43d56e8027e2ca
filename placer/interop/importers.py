"""An existing verl or OpenRLHF run as a job spec, its placement recorded under `current:`.

What a run's configuration says is kept: the models (matched to the catalog by their Hugging Face
repository; release variants, instruct, chat, base or dated, share their base model's architecture:
`placer.spec.names`), the batch, the length caps, the algorithm, nodes x GPUs of every resource
pool or actor group, TP/PP sizes and which roles share GPUs. What it does not say is assumed, and
every assumption is returned as a note: the GPU type (`device`), the length distributions (a prompt
at half its cap, responses lognormal with the median at a quarter of the cap: long-tailed
reasoning), and one CPU node for rule rewards and tools (verl and OpenRLHF run them on the
driver's and workers' CPUs).

verl's keys are read from a YAML config (nested, or flat dotted keys) or a launch script's
`key=value` Hydra overrides; absent keys take verl 0.9's defaults (`VERL_DEFAULTS`). OpenRLHF's
flags are read from its command line, in 0.11's dotted form or the older underscore form
(`OPENRLHF_ALIASES`). A script's shell variables are expanded as its shell would
(`placer.interop.shellvars`: assignments earlier in the script, `${VAR:-default}`, arithmetic),
the environment given as `variables` (`placer import --set VAR=VALUE`); a key the importer reads
whose value still names a variable is an error naming it (`Settings`).

Layouts keep their meaning: Megatron's TP, PP, CP, EP and expert TP of the actor, reference and
critic. verl's `param_offload` / `grad_offload` / `optimizer_offload` (FSDP or Megatron) park
state in host memory between phases and run the optimizer step on the GPU
(verl/workers/megatron_workers.py and fsdp_workers.py offload before the rollout and load back
before `update_actor`): that is the job model's colocated slot switch, priced when the slot's
roles do not fit together, not its `offload` (optimizer state on the host through the step).
Megatron's CPU optimizer (`actor.optim.override_optimizer_config.optimizer_cpu_offload`, Megatron-
Core's HybridDeviceOptimizer: the step runs on the host for `optimizer_offload_fraction` of the
state) is the job model's `offload`, and said in a note.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

from placer.base.errors import SpecError
from placer.interop.shellvars import script_words, unresolved
from placer.spec.catalog import shipped_models
from placer.spec.names import catalog_model, did_you_mean, model_hint, suggest_model

CPU_DEVICE = "cpu-node"
VERL_ALGORITHMS = {"grpo": "grpo", "gae": "ppo", "rloo": "rloo"}
# REINFORCE++-baseline (openrlhf/trainer/ppo_utils/experience_maker.py: the group's mean reward
# as baseline) needs no critic and several responses a prompt: placed as GRPO is. Plain
# REINFORCE++ (a batch baseline, one response a prompt) has no placer algorithm yet.
OPENRLHF_ALGORITHMS = {"group_norm": "grpo", "dr_grpo": "grpo", "gae": "ppo", "rloo": "rloo",
                       "reinforce_baseline": "grpo"}
# verl 0.9.1's defaults (verl/trainer/config/_generated_ppo_trainer.yaml) for the keys read here
VERL_DEFAULTS: dict[str, Any] = {
    "algorithm.adv_estimator": "gae", "data.train_batch_size": 1024,
    "data.max_prompt_length": 512, "data.max_response_length": 512,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256, "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.actor.use_kl_loss": False, "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.nnodes": 0, "trainer.nnodes": 1, "trainer.n_gpus_per_node": 8,
    "reward.reward_model.enable": False, "reward.reward_model.enable_resource_pool": False,
    "reward.reward_model.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.multi_turn.enable": False,
}


def model_name(path: Any, field: str) -> str:
    """The catalog model a Hugging Face path names, or a release variant of it (instruct, chat,
    base, dated: `placer.spec.names.catalog_model`); SpecError naming `field` otherwise, with
    the closest entries."""
    if not isinstance(path, str) or not path:
        raise SpecError(f"{field}: a model path is needed (got {path!r})")
    sources = {name: m.source for name, m in shipped_models().items()}
    found = catalog_model(sources, path)
    if found:
        return found
    near = did_you_mean(suggest_model(path, sources), model_hint(path))
    raise SpecError(f"{field}: model {path!r} is not in the catalog{near} (known: "
                    f"{', '.join(sorted(sources))}); a fine-tune of one of them: "
                    f"--model {path}=NAME")


def with_models(text: str, models: dict[str, str]) -> str:
    """The source with each fine-tune's path (`--model PATH=CATALOG`) replaced, wherever it
    stands as a whole word, by the catalog model it was tuned from, so the importer prices it as
    that model: a checkpoint's name says nothing of its shape, and a guess would price another
    model. SpecError naming `--model` for a name the catalog lacks or a path the source never
    mentions."""
    for path, name in models.items():
        if name not in shipped_models():
            raise SpecError(f"--model: {name!r} is not in the catalog (known: "
                            f"{', '.join(sorted(shipped_models()))})")
        pattern = re.compile(rf"(?<![\w./-]){re.escape(path)}(?![\w./-])")
        if not pattern.search(text):
            raise SpecError(f"--model: {path!r} does not appear in the source")
        text = pattern.sub(name, text)
    return text


# a float as Python and argparse read it, exponent without a dot included (YAML 1.1 reads
# `1e-3`, which OpenRLHF's scripts write, as a string)
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def scalar(text: str) -> Any:
    """A command-line value as YAML reads it (1024, true, 0.6, [a, b]; and 1e-3 as a number, as
    the frameworks' argparse reads it); a shell variable or text YAML cannot read stays the
    string it is."""
    if "$" in text:
        return text
    if _EXPONENT.fullmatch(text.strip()):
        return float(text)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


class Settings(dict[str, Any]):
    """A run's settings (key -> value); reading one whose value still names a shell variable
    the script did not set is a SpecError naming the key, the variable and `--set`."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        super().__init__(data)
        self.source = source

    def _checked(self, key: str, value: Any) -> Any:
        name = unresolved(value) if isinstance(value, str) else None
        if name is not None:
            raise SpecError(f"{self.source}: {key}: {value!r} needs the shell variable {name}, "
                            f"which the script does not set; give its value with "
                            f"--set {name}=VALUE")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return self._checked(key, super().get(key, default))

    def __getitem__(self, key: str) -> Any:
        return self._checked(key, super().__getitem__(key))

    def whole(self, flag: str) -> int:
        """The command-line flag `--flag`'s value, which must be a whole number."""
        v = self.get(flag)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SpecError(f"{self.source}: --{flag}: expected a whole number (got {v!r})")
        return v

    def choice(self, flag: str, table: dict[str, Any]) -> Any:
        """What the flag `--flag`'s value maps to in `table`, or a SpecError naming the choices."""
        v = self[flag]
        if v not in table:
            raise SpecError(f"{self.source}: --{flag}: placer plans {', '.join(table)} "
                            f"(got {v!r})")
        return table[v]


def script_argv(text: str, source: str, marker: str | None, variables: dict[str, str] | None
                 ) -> list[str] | None:
    """The words of the script's `marker` command, its variables expanded (None: no such line)."""
    try:
        return script_words(text, dict(variables or {}), marker)
    except ValueError as e:  # "No closing quotation"
        raise SpecError(f"{source}: cannot read it as a command line: {e}") from None


def verl_settings(text: str, source: str, variables: dict[str, str] | None = None
                  ) -> Settings:
    """Dotted key -> value from a verl YAML config or a launch script's Hydra overrides."""
    if "verl.trainer.main_ppo" in text:
        argv = script_argv(text, source, "verl.trainer.main_ppo", variables)
        if argv is None or "verl.trainer.main_ppo" not in argv:
            raise SpecError(f"{source}: no `python3 -m verl.trainer.main_ppo` command in it")
        start = argv.index("verl.trainer.main_ppo") + 1
        out: dict[str, Any] = {}
        for tok in argv[start:]:
            if tok.startswith("--config-name"):
                out["_config_name"] = tok.partition("=")[2]
            elif "=" in tok and not tok.startswith("-"):
                key, _, value = tok.lstrip("+~").partition("=")
                out[key] = scalar(value)
        return Settings(out, source)
    from placer.base.inputs import load_yaml
    data = load_yaml(text, source)
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a verl config mapping or a launch script")
    return Settings(_flatten(data), source)


def _int(cfg: dict[str, Any], key: str, source: str) -> int:
    v = cfg.get(key, VERL_DEFAULTS.get(key))
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SpecError(f"{source}: {key}: expected a whole number (got {v!r})")
    return v


def _bool(cfg: dict[str, Any], key: str) -> bool:
    v = cfg.get(key, VERL_DEFAULTS.get(key, False))
    return v is True or (isinstance(v, str) and v.lower() == "true")


def assumed_lengths(prompt_cap: int, response_cap: int) -> dict[str, Any]:
    return {"prompt": {"kind": "fixed", "value": max(prompt_cap // 2, 1)},
            "response": {"kind": "lognormal", "median": max(response_cap // 4, 1), "sigma": 0.8,
                         "cap": response_cap}}


def job_dict(name: str, algorithm: str, models: dict[str, Any], batch: dict[str, Any],
         lengths: dict[str, Any], pools: list[dict[str, Any]], current: dict[str, Any],
         environment: dict[str, Any] | None = None) -> dict[str, Any]:
    job: dict[str, Any] = {"name": name, "algorithm": algorithm, "models": models,
                           "batch": batch, "lengths": lengths}
    if environment:
        job["environment"] = environment
    job.update({"pipeline": {"mode": "sync"}, "objective": "time",
                "cluster": {"pools": pools}, "current": current})
    return job


def assumed_notes(device: str) -> list[str]:
    return [f"device: the GPUs are taken to be {device} (--device)",
            "lengths: prompts at half their cap, responses lognormal with the median at a quarter "
            "of their cap; replace them with your data's",
            f"cluster: one {CPU_DEVICE} node for rule rewards and tools (the driver's CPUs)"]


MEGATRON_SIZES = (("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
                  ("cp", "context_parallel_size"), ("ep", "expert_model_parallel_size"),
                  ("etp", "expert_tensor_parallel_size"))
CPU_OPTIMIZER = "optim.override_optimizer_config.optimizer_cpu_offload"


def _layout(cfg: Settings, prefix: str, megatron: bool, source: str,
            notes: list[str]) -> dict[str, Any]:
    """A trained or forward role's Megatron sizes (those above 1) and its `offload`: Megatron's
    CPU optimizer only; verl's own offload flags park state between phases (module docstring)."""
    out: dict[str, Any] = {}
    for short, key in MEGATRON_SIZES if megatron else ():
        full = f"{prefix}.megatron.{key}"
        v = cfg.get(full)
        if v is None:  # unset, or null (expert TP: follows TP)
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(f"{source}: {full}: expected a whole number (got {v!r})")
        if v > 1:
            out[short] = v
    parks = [k for k in (f"{prefix}.{sec}.{flag}" for sec in ("megatron", "fsdp_config", "fsdp")
                         for flag in ("param_offload", "grad_offload", "optimizer_offload"))
             if _bool(cfg, k)]
    if parks:
        notes.append(f"{parks[0].rsplit('.', 1)[0]}: verl's offload parks state in host memory "
                     "between phases and steps on the GPU; the job prices that as its colocated "
                     "slot's switch, not as `offload`")
    out["offload"] = _bool(cfg, f"{prefix}.{CPU_OPTIMIZER}")
    if out["offload"]:
        frac = cfg.get(f"{prefix}.optim.override_optimizer_config.optimizer_offload_fraction", 1.0)
        notes.append(f"{prefix}.{CPU_OPTIMIZER}: Megatron's CPU optimizer ({frac} of the state "
                     "stepped on the host) is priced as `offload` (optimizer state on the host "
                     "through the step)")
    return out


def import_verl(text: str, source: str, device: str = "H100-SXM",
                name: str = "imported-verl", variables: dict[str, str] | None = None
                ) -> tuple[dict[str, Any], list[str]]:
    """(job dict, notes) from a verl config or launch script's text; `variables`: the
    environment the script's shell variables are expanded in (`--set`)."""
    cfg = verl_settings(text, source, variables)
    notes: list[str] = []
    key = "algorithm.adv_estimator"
    est = cfg.get(key, VERL_DEFAULTS[key])
    if est not in VERL_ALGORITHMS:
        raise SpecError(f"{source}: {key}: placer plans {', '.join(VERL_ALGORITHMS)} "
                        f"(got {est!r})")
    algorithm = VERL_ALGORITHMS[est]
    policy = model_name(cfg.get("actor_rollout_ref.model.path"),
                        f"{source}: actor_rollout_ref.model.path")
    megatron = "megatron" in str(cfg.get("_config_name", "")) or any(".megatron." in k for k in cfg)
    nodes, per = _int(cfg, "trainer.nnodes", source), _int(cfg, "trainer.n_gpus_per_node", source)
    total = nodes * per
    pools = [{"name": "gpu", "device": device, "devices_per_node": per, "nodes": nodes},
             {"name": "cpu", "device": CPU_DEVICE, "devices_per_node": 1, "nodes": 1}]

    def par(prefix: str) -> dict[str, Any]:
        return {"pool": "gpu", "devices": total, "tp": 1, "pp": 1,
                **_layout(cfg, prefix, megatron, source, notes)}

    actor = par("actor_rollout_ref.actor")
    roles: dict[str, Any] = {"actor": actor}
    shared = ["actor"]
    r_nodes = _int(cfg, "actor_rollout_ref.rollout.nnodes", source)
    r_tp = _int(cfg, "actor_rollout_ref.rollout.tensor_model_parallel_size", source)
    if r_nodes > 0:  # separate_async: the rollout's own pool
        r_per = _int(cfg, "actor_rollout_ref.rollout.n_gpus_per_node", source) \
            if "actor_rollout_ref.rollout.n_gpus_per_node" in cfg else per
        pools.append({"name": "rollout", "device": device, "devices_per_node": r_per,
                      "nodes": r_nodes})
        roles["rollout"] = {"pool": "rollout", "devices": r_nodes * r_per, "tp": r_tp}
    else:
        roles["rollout"] = {"pool": "gpu", "devices": total, "tp": r_tp}
        shared.append("rollout")
    use_ref = _bool(cfg, "actor_rollout_ref.actor.use_kl_loss") or _bool(
        cfg, "algorithm.use_kl_in_reward")
    if use_ref:
        ref = par("actor_rollout_ref.ref")
        if megatron and "actor_rollout_ref.ref.megatron.tensor_model_parallel_size" not in cfg:
            ref.update({k: v for k, v in actor.items() if k in ("tp", "pp", "cp", "ep", "etp")})
        roles["reference"] = {**ref, "offload": False}  # verl: the ref follows the actor's
        shared.append("reference")
    models: dict[str, Any] = {"policy": policy, "use_reference": use_ref, "reward": "rule"}
    cpu_roles = []
    if _bool(cfg, "reward.reward_model.enable"):
        models["reward"] = model_name(cfg.get("reward.reward_model.model_path"),
                                      f"{source}: reward.reward_model.model_path")
        rm_tp = _int(cfg, "reward.reward_model.rollout.tensor_model_parallel_size", source)
        if _bool(cfg, "reward.reward_model.enable_resource_pool"):
            rn = _int(cfg, "reward.reward_model.nnodes", source)
            rp = _int(cfg, "reward.reward_model.n_gpus_per_node", source)
            pools.append({"name": "reward", "device": device, "devices_per_node": rp, "nodes": rn})
            roles["reward"] = {"pool": "reward", "devices": rn * rp, "tp": rm_tp}
        else:
            roles["reward"] = {"pool": "gpu", "devices": total, "tp": rm_tp}
            shared.append("reward")
    else:
        roles["reward"] = {"pool": "cpu", "devices": 1}
        cpu_roles.append("reward")
    if algorithm == "ppo":
        models["critic"] = model_name(cfg.get("critic.model.path", cfg.get(
            "actor_rollout_ref.model.path")), f"{source}: critic.model.path")
        roles["critic"] = par("critic")
        shared.append("critic")
    environment = None
    if _bool(cfg, "actor_rollout_ref.rollout.multi_turn.enable"):
        key = "actor_rollout_ref.rollout.multi_turn.max_assistant_turns"
        turns = _int(cfg, key, source) if cfg.get(key) is not None else 2
        environment = {"kind": "tool", "turns": max(turns, 1)}
        roles["environment"] = {"pool": "cpu", "devices": 1}
        cpu_roles.append("environment")
    prompts = _int(cfg, "data.train_batch_size", source)
    mini = max(_int(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size", source), 1)
    batch = {"prompts": prompts, "samples_per_prompt": _int(cfg, "actor_rollout_ref.rollout.n",
                                                              source),
             "mini_batches": max(prompts // mini, 1)}
    lengths = assumed_lengths(_int(cfg, "data.max_prompt_length", source),
                       _int(cfg, "data.max_response_length", source))
    colocate = [g for g in (shared, cpu_roles) if len(g) > 1]
    current = {"source": f"verl: {source}", "roles": roles, "colocate": colocate}
    job = job_dict(name, algorithm, models, batch, lengths, pools, current, environment)
    if cfg.get("trainer.v1.trainer_mode", "sync") != "sync" or r_nodes > 0:
        key = "trainer.v1.sampler.max_off_policy_threshold"  # what `placer export verl` sets
        job["pipeline"] = {"mode": "async",
                           "max_staleness": max(_int(cfg, key, source), 1) if key in cfg else 1}
    return job, assumed_notes(device) + notes


# ---------------------------------------------------------------------------------- OpenRLHF
# OpenRLHF before 0.11 spelled its flags with underscores; 0.11 groups them with dots
OPENRLHF_ALIASES = {
    "pretrain": "actor.model_name_or_path", "reward_pretrain": "reward.model_name_or_path",
    "critic_pretrain": "critic.model_name_or_path", "remote_rm_url": "reward.remote_url",
    "colocate_all_models": "train.colocate_all", "colocate_actor_ref": "train.colocate_actor_ref",
    "colocate_critic_reward": "train.colocate_critic_reward",
    "vllm_num_engines": "vllm.num_engines", "vllm_tensor_parallel_size": "vllm.tensor_parallel_size",
    "rollout_batch_size": "rollout.batch_size", "n_samples_per_prompt": "rollout.n_samples_per_prompt",
    "train_batch_size": "train.batch_size", "generate_max_len": "rollout.max_new_tokens",
    "prompt_max_len": "data.prompt_max_len", "max_len": "data.max_len",
    "advantage_estimator": "algo.advantage.estimator", "init_kl_coef": "algo.kl.init_coef",
    "use_kl_loss": "algo.kl.use_loss", "async_train": "train.async_enable",
    "zero_stage": "ds.zero_stage", "adam_offload": "ds.adam_offload",
    "ds_tensor_parallel_size": "ds.tensor_parallel_size", "ring_attn_size": "ds.ring_attn_size",
    **{f"{g}_{k}": f"{g}.{k}" for g in ("actor", "ref", "critic", "reward")
       for k in ("num_nodes", "num_gpus_per_node")},
}
# OpenRLHF 0.11's defaults (openrlhf/cli/train_ppo_ray.py) for the flags read here
OPENRLHF_DEFAULTS: dict[str, Any] = {
    "rollout.batch_size": 1024, "rollout.n_samples_per_prompt": 1, "train.batch_size": 128,
    "data.max_len": 2048, "algo.advantage.estimator": "gae", "algo.kl.init_coef": 0.01,
    "vllm.tensor_parallel_size": 1, "train.async_queue_size": 1, "ds.tensor_parallel_size": 1,
    "ds.ring_attn_size": 1,
    **{f"{g}.{k}": d for g in ("actor", "ref", "critic", "reward")
       for k, d in (("num_nodes", 1), ("num_gpus_per_node", 8))},
}


def openrlhf_settings(text: str, source: str = "command line",
                      variables: dict[str, str] | None = None) -> Settings:
    """Flag -> value (True for a switch) from an OpenRLHF command line or script."""
    marker = "openrlhf.cli.train_ppo_ray"
    argv = script_argv(text, source, marker if marker in text else None, variables) or []
    if marker in argv:
        argv = argv[argv.index(marker) + 1:]
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if not tok.startswith("--"):
            continue
        flag, eq, value = tok[2:].partition("=")
        flag = OPENRLHF_ALIASES.get(flag, flag)
        if eq:
            out[flag] = scalar(value)
        elif i < len(argv) and not argv[i].startswith("--"):
            out[flag] = scalar(argv[i])
            i += 1
        else:
            out[flag] = True
    return Settings(out, source)


def import_openrlhf(text: str, source: str, device: str = "H100-SXM",
                    name: str = "imported-openrlhf", variables: dict[str, str] | None = None
                    ) -> tuple[dict[str, Any], list[str]]:
    """(job dict, notes) from an OpenRLHF train_ppo_ray command line."""
    a = Settings({**OPENRLHF_DEFAULTS, **openrlhf_settings(text, source, variables)}, source)
    num = a.whole
    algorithm = a.choice("algo.advantage.estimator", OPENRLHF_ALGORITHMS)
    policy = model_name(a.get("actor.model_name_or_path"), f"{source}: --actor.model_name_or_path")
    coef = a["algo.kl.init_coef"]
    if isinstance(coef, bool) or not isinstance(coef, (int, float)):
        raise SpecError(f"{source}: --algo.kl.init_coef: expected a number (got {coef!r})")
    use_ref = bool(a.get("algo.kl.use_loss")) or coef > 0
    all_ = bool(a.get("train.colocate_all"))
    models: dict[str, Any] = {"policy": policy, "use_reference": use_ref, "reward": "rule"}
    groups: dict[str, int] = {}  # role -> devices of its own actor group
    per = num("actor.num_gpus_per_node")
    groups["actor"] = num("actor.num_nodes") * per
    if use_ref:
        groups["reference"] = num("ref.num_nodes") * num("ref.num_gpus_per_node")
    if a.get("reward.model_name_or_path"):
        models["reward"] = model_name(a["reward.model_name_or_path"],
                                      f"{source}: --reward.model_name_or_path")
        groups["reward"] = num("reward.num_nodes") * num("reward.num_gpus_per_node")
    if algorithm == "ppo":
        models["critic"] = model_name(a.get("critic.model_name_or_path")
                                      or a.get("reward.model_name_or_path") or policy,
                                      f"{source}: --critic.model_name_or_path")
        groups["critic"] = num("critic.num_nodes") * num("critic.num_gpus_per_node")
    engines = num("vllm.num_engines") if a.get("vllm.num_engines") is not None else 0
    tp = num("vllm.tensor_parallel_size")
    shared = {"actor": ["actor"], "critic": ["critic"]}
    if all_:
        shared["actor"] = [r for r in ("actor", "reference", "critic", "reward") if r in groups]
    else:
        if a.get("train.colocate_actor_ref") and "reference" in groups:
            shared["actor"].append("reference")
        if a.get("train.colocate_critic_reward") and "reward" in groups and "critic" in groups:
            shared["critic"].append("reward")
    roles: dict[str, Any] = {r: {"pool": "gpu", "devices": n} for r, n in groups.items()}
    roles["actor"]["offload"] = bool(a.get("ds.adam_offload"))
    for r in ("actor", "critic"):  # DeepSpeed AutoTP and ring attention: the trained models
        if r in roles:
            roles[r]["tp"] = num("ds.tensor_parallel_size")
            if num("ds.ring_attn_size") > 1:  # OpenRLHF's context parallelism
                roles[r]["cp"] = num("ds.ring_attn_size")
    if engines and not all_:
        roles["rollout"] = {"pool": "gpu", "devices": engines * tp, "tp": tp}
    else:  # colocate_all, or no vLLM: generation on the actor's GPUs
        roles["rollout"] = {"pool": "gpu", "devices": groups["actor"], "tp": tp}
        shared["actor"].append("rollout")
    colocate = [g for g in shared.values() if len(g) > 1 and all(r in roles for r in g)]
    grouped = {r for g in colocate for r in g}
    slots = [max(roles[r]["devices"] for r in g) for g in colocate]
    slots += [roles[r]["devices"] for r in roles if r not in grouped]
    total = sum(slots)
    pools = [{"name": "gpu", "device": device, "devices_per_node": per, "nodes": -(-total // per)},
             {"name": "cpu", "device": CPU_DEVICE, "devices_per_node": 1, "nodes": 1}]
    if "reward" not in roles:
        roles["reward"] = {"pool": "cpu", "devices": 1}
    max_len = num("data.max_len")
    response = num("rollout.max_new_tokens") if a.get("rollout.max_new_tokens") else max_len // 2
    prompt = num("data.prompt_max_len") if a.get("data.prompt_max_len") else max_len - response
    if prompt < 1 or response < 1:
        raise SpecError(f"{source}: --data.max_len: {max_len} leaves no room for a prompt and a "
                        f"response of {response} tokens")
    samples = num("rollout.batch_size") * num("rollout.n_samples_per_prompt")
    batch = {"prompts": num("rollout.batch_size"),
             "samples_per_prompt": num("rollout.n_samples_per_prompt"),
             "mini_batches": max(samples // max(num("train.batch_size"), 1), 1)}
    current = {"source": f"openrlhf: {source}", "roles": roles, "colocate": colocate}
    job = job_dict(name, algorithm, models, batch, assumed_lengths(prompt, response), pools, current)
    if a.get("train.async_enable"):
        job["pipeline"] = {"mode": "async", "max_staleness": max(num("train.async_queue_size"), 1)}
    return job, assumed_notes(device)
