"""A plan as a Miles (slime) launch script, and a Miles launch script as a job.

Written for Miles `MILES_VERSION` (setup.py 0.1.0 at commit 31f1ca96): the flags are Miles' own
(miles/utils/arguments.py), Megatron-LM's (the trainer's layout and CPU optimizer, which Miles'
parser extends) and SGLang's server arguments prefixed `--sglang-` (miles/backends/sglang_utils/
arguments.py), as Miles' shipped scripts pass them.

Miles trains with Megatron on `--actor-num-nodes x --actor-num-gpus-per-node` GPUs (a critic on
`--critic-num-nodes x --critic-num-gpus-per-node`) and generates with SGLang engines of
`--rollout-num-gpus-per-engine` GPUs each (the engine's TP), `--rollout-num-gpus` in all, on
nodes of `--num-gpus-per-node`. `--colocate` puts the engines on the actor's GPUs (the rollout
count is then the actor's) and turns on `--offload-train` / `--offload-rollout`: each side's
state parked in host memory while the other runs, which is the job model's colocated slot
switch. The plan's own `offload` (optimizer state on the host through the step) is Megatron's
`--optimizer-cpu-offload` (its hybrid CPU optimizer). Experts: Megatron's
`--expert-model-parallel-size` for the trainer, SGLang's `--sglang-ep-size` (and
`--sglang-enable-dp-attention --sglang-dp-size` for data-parallel attention) for the engines.
Micro-batches: `--micro-batch-size` as verl's export derives it. An async pipeline is
`train_async.py` (one rollout ahead; it refuses `--colocate`, train_async.py).

Engine pipeline parallelism, LPU pools, a reward model or an environment on devices of their
own, and GPU types are warned about; a role split over pools and HSDP shard groups are refused
(SpecError, exit 2), as for verl.
"""
from __future__ import annotations

import re
import shlex
from typing import Any

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
    refuse_park,
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
from placer.interop.verl import micro_batch, parked
from placer.solve.planfile import Plan
from placer.spec.hardware import DeviceKind
from placer.spec.sections import Algorithm

MILES_VERSION = "Miles 0.1.0 @31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
SYNC_ENTRY, ASYNC_ENTRY = "train.py", "train_async.py"
ESTIMATOR = {Algorithm.grpo: "grpo", Algorithm.ppo: "ppo", Algorithm.rloo: "grpo"}
HSDP_REFUSAL = ("Miles trains with Megatron's distributed optimizer over all data-parallel "
                "ranks, without partial distributed-optimizer instances")
MEGATRON_SIZES = (("tp", "tensor-model-parallel-size"), ("pp", "pipeline-model-parallel-size"),
                  ("cp", "context-parallel-size"), ("ep", "expert-model-parallel-size"),
                  ("etp", "expert-tensor-parallel-size"))


def _shapes(plan: Plan, warn: list[str]) -> list[str]:
    nodes, per = node_shape(plan, Role.ACTOR, warn)
    args = ["--actor-num-nodes", str(nodes), "--actor-num-gpus-per-node", str(per)]
    if Role.CRITIC in plan.roles:
        c_nodes, c_per = node_shape(plan, Role.CRITIC, warn)
        args += ["--critic-num-nodes", str(c_nodes), "--critic-num-gpus-per-node", str(c_per)]
    return args


def _rollout(plan: Plan, warn: list[str], colocate: bool) -> list[str]:
    r = plan.roles[Role.ROLLOUT]
    args = ["--rollout-num-gpus-per-engine", str(r.tp * r.pp)]
    if not colocate:
        pool = plan.resolved().cluster.pool(r.pool)
        args += ["--rollout-num-gpus", str(r.devices),
                 "--num-gpus-per-node", str(pool.devices_per_node)]
    args += ["--sglang-mem-fraction-static", str(memory_fraction(plan, Role.ROLLOUT))]
    if r.ep > 1:
        args += ["--sglang-ep-size", str(r.ep)]
    if r.attn_dp > 1:
        args += ["--sglang-enable-dp-attention", "--sglang-dp-size", str(r.attn_dp)]
    if r.pp > 1:
        warn.append(f"roles.rollout.pp: Miles gives each SGLang engine "
                    f"--rollout-num-gpus-per-engine GPUs as one TP group; the plan's PP {r.pp} "
                    f"x TP {r.tp} becomes TP {r.tp * r.pp}")
    return args


def _trainer(plan: Plan, role: Role) -> list[str]:
    r = plan.roles[role]
    args: list[str] = []
    for short, flag in MEGATRON_SIZES:
        args += [f"--{flag}", str(getattr(r, short) if short != "etp" or r.ep > 1 else 1)]
    if r.tp > 1:
        args.append("--sequence-parallel")
    if r.offload:  # Megatron's hybrid CPU optimizer: the step on the host
        args += ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
                 "--use-precision-aware-optimizer"]
    return args


def _batch(plan: Plan) -> list[str]:
    job = plan.spec
    b = job.batch
    prompt, response = lengths(plan)
    turns = job.environment.turns
    response = turns * response + (turns - 1) * job.environment.tool_output_tokens
    args = ["--rollout-batch-size", str(b.prompts), "--n-samples-per-prompt",
            str(b.samples_per_prompt), "--global-batch-size", str(max(b.samples // b.mini_batches,
                                                                       1)),
            "--micro-batch-size", str(micro_batch(plan, Role.ACTOR)),
            "--rollout-max-prompt-len", str(prompt), "--rollout-max-response-len", str(response),
            "--advantage-estimator", ESTIMATOR[job.algorithm]]
    if Role.REFERENCE in plan.roles and job.algorithm is not Algorithm.ppo:
        args.append("--use-kl-loss")
    return args


def _outside(plan: Plan, warn: list[str], colocate: bool) -> None:
    res = plan.resolved()
    if Role.REFERENCE in plan.roles and not colocated(plan, Role.REFERENCE, Role.ACTOR):
        ref = plan.roles[Role.REFERENCE]
        warn.append(f"reference: Miles computes reference log-probs with the actor's Megatron "
                    f"workers (--ref-load); the plan's {ref.pool}x{ref.devices} [{ref.slot}] is "
                    "not expressible")
    if res.model_of(Role.REWARD) is not None:
        r = plan.roles[Role.REWARD]
        warn.append(f"reward: the plan's reward model on {r.pool}x{r.devices} is not "
                    "expressible; Miles scores with --rm-type or a --custom-rm-path function")
    if Role.ENVIRONMENT in plan.roles:
        e = plan.roles[Role.ENVIRONMENT]
        warn.append(f"environment: Miles runs tools in its rollout function's process "
                    f"(--custom-generate-function-path); the plan's {e.pool}x{e.devices} CPU "
                    "nodes come from the Ray cluster (placer export kuberay)")
    if plan.spec.pipeline.mechanism.overlaps_steps and colocate:
        warn.append("pipeline: Miles' async trainer (train_async.py) refuses --colocate; the "
                    "plan's colocated async pipeline is exported as train.py (synchronous)")
    elif plan.spec.pipeline.mechanism.overlaps_steps and plan.spec.pipeline.max_staleness > 1:
        warn.append(f"pipeline.max_staleness: Miles' train_async.py generates one rollout ahead "
                    f"of training; the plan's staleness {plan.spec.pipeline.max_staleness} "
                    "becomes 1")
    if kind_of(plan, Role.ROLLOUT) is not DeviceKind.gpu:
        warn.append(f"rollout: Miles generates with SGLang on GPUs; the plan's "
                    f"{plan.roles[Role.ROLLOUT].pool} rollout is exported on the actor's GPUs")


def command_args(plan: Plan) -> tuple[str, list[str], list[str]]:
    """(entry script, argv after it, warnings); SpecError for a role split over pools or an
    HSDP shard group (`HSDP_REFUSAL`)."""
    refuse_split(plan, "Miles")
    refuse_park(plan, "Miles", "export verl or nemo-rl (optimizer_offload)")
    refuse_hsdp(plan, "Miles", HSDP_REFUSAL,
                "export kuberay, which runs this plan as it is (`placer execute`)")
    warn: list[str] = []
    colocate = colocated(plan, Role.ROLLOUT, Role.ACTOR) or \
        kind_of(plan, Role.ROLLOUT) is not DeviceKind.gpu
    args = _shapes(plan, warn)
    if colocate:
        args.append("--colocate")  # Miles then parks both sides between phases
    elif parked(plan, Role.ACTOR):
        args.append("--offload-train")
    args += ["--hf-checkpoint", hf_path(plan.resolved(), Role.ACTOR, warn)]
    args += _rollout(plan, warn, colocate) + _trainer(plan, Role.ACTOR) + _batch(plan)
    _outside(plan, warn, colocate)
    device_warnings(plan, warn, "Miles")
    entry = ASYNC_ENTRY if plan.spec.pipeline.mechanism.overlaps_steps and not colocate \
        else SYNC_ENTRY
    return entry, args, warn


def _flag_lines(args: list[str]) -> list[str]:
    """One line per flag with its values, quoted for the shell."""
    lines: list[str] = []
    for a in args:
        if a.startswith("--") or not lines:
            lines.append(shlex.quote(a))
        else:
            lines[-1] += " " + shlex.quote(a)
    return lines


def export_miles(plan: Plan) -> Export:
    entry, args, warn = command_args(plan)
    command = f"python3 {entry} " + " ".join(shlex.quote(a) for a in args)
    script = ("#!/bin/bash\n# Miles with the plan's placement (placer export miles); append the "
              "model's Megatron arguments\n# (scripts/models/*.sh), --ref-load, --prompt-data "
              f"and any other flag.\n# written for {MILES_VERSION} (its train.py flags)\n"
              + "".join(f"# WARNING: {w}\n" for w in warn) + "set -e\n"
              + f"python3 {entry} \\\n  " + " \\\n  ".join(_flag_lines(args))
              + ' \\\n  "$@"\n')
    return Export("miles", {"run-miles.sh": script}, command, warn, version=MILES_VERSION)


# ------------------------------------------------------------------------------------ import
# Miles' defaults (miles/utils/arguments.py; Megatron-LM's for the parallel sizes)
MILES_DEFAULTS: dict[str, Any] = {
    "actor-num-nodes": 1, "actor-num-gpus-per-node": 8, "rollout-num-gpus-per-engine": 1,
    "num-gpus-per-node": 8, "n-samples-per-prompt": 1, "advantage-estimator": "grpo",
    "rollout-max-response-len": 1024, "sglang-ep-size": 1, "sglang-dp-size": 1,
    **{flag: 1 for _, flag in MEGATRON_SIZES},
}
# "${MODEL_ARGS[@]}": an array the script fills by running a command (the model's Megatron
# architecture flags, scripts/models/*.sh), or "$@": the script's caller's flags; neither holds
# the flags read here
ARRAY_REFERENCE = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\[[@*]\]\}|[@*]|\{[@*]\})$")
ALGORITHMS = {"grpo": "grpo", "gspo": "grpo", "reinforce_plus_plus": "rloo",
              "reinforce_plus_plus_baseline": "rloo", "ppo": "ppo"}


def miles_settings(text: str, source: str, variables: dict[str, str] | None = None
                   ) -> tuple[str, Settings]:
    """(entry script, flag -> value: True for a switch, a list for several values) of the
    script's `train*.py` command, its shell variables and arrays expanded."""
    for entry in (ASYNC_ENTRY, SYNC_ENTRY):
        if entry in text:
            argv = script_argv(text, source, entry, variables)
            if argv and any(w.endswith(entry) for w in argv):
                break
    else:
        raise SpecError(f"{source}: no `python3 train.py` (or train_async.py) command in it")
    start = next(i for i, w in enumerate(argv) if w.endswith(entry)) + 1
    out: dict[str, Any] = {}
    flag: str | None = None
    for tok in argv[start:]:
        if ARRAY_REFERENCE.match(tok):  # flags the script reads at run time (MODEL_ARGS)
            out.setdefault("_unexpanded", []).append(tok)
            flag = None
        elif tok.startswith("--"):
            flag, eq, value = tok[2:].partition("=")
            out[flag] = scalar(value) if eq else True
            if eq:
                flag = None
        elif flag is not None:
            prev = out[flag]
            out[flag] = scalar(tok) if prev is True else (
                prev + [scalar(tok)] if isinstance(prev, list) else [prev, scalar(tok)])
    return entry, Settings(out, source)


def import_miles(text: str, source: str, device: str = "H100-SXM",
                 name: str = "imported-miles", variables: dict[str, str] | None = None
                 ) -> tuple[dict[str, Any], list[str]]:
    """(job dict, notes) from a Miles launch script."""
    entry, given = miles_settings(text, source, variables)
    a = Settings({**MILES_DEFAULTS, **given}, source)
    num = a.whole
    algorithm = a.choice("advantage-estimator", ALGORITHMS)
    policy = model_name(a.get("hf-checkpoint"), f"{source}: --hf-checkpoint")
    per = num("actor-num-gpus-per-node")
    actor: dict[str, Any] = {"pool": "gpu", "devices": num("actor-num-nodes") * per}
    for short, flag in MEGATRON_SIZES:
        if num(flag) > 1:
            actor[short] = num(flag)
    if "ep" not in actor:
        actor.pop("etp", None)
    actor["offload"] = bool(a.get("optimizer-cpu-offload"))
    rollout: dict[str, Any] = {"pool": "gpu", "tp": num("rollout-num-gpus-per-engine")}
    if num("sglang-ep-size") > 1:
        rollout["ep"] = num("sglang-ep-size")
    colocate = bool(a.get("colocate"))
    shared = ["actor"]
    roles: dict[str, Any] = {"actor": actor, "rollout": rollout}
    if colocate:
        rollout["devices"] = actor["devices"]
        shared.append("rollout")
    else:
        if a.get("rollout-num-gpus") is None:
            raise SpecError(f"{source}: --rollout-num-gpus: a rollout apart from the actor (no "
                            "--colocate) needs its GPU count")
        rollout["devices"] = num("rollout-num-gpus")
    use_ref = bool(a.get("use-kl-loss")) or (a.get("kl-coef") not in (None, 0, 0.0))
    if use_ref:  # the reference runs in the actor's Megatron workers
        roles["reference"] = {**actor, "offload": False}
        shared.append("reference")
    models: dict[str, Any] = {"policy": policy, "use_reference": use_ref, "reward": "rule"}
    gpus = actor["devices"] + (0 if colocate else rollout["devices"])
    if algorithm == "ppo":
        c_per = num("critic-num-gpus-per-node") if a.get("critic-num-gpus-per-node") else per
        c_nodes = num("critic-num-nodes") if a.get("critic-num-nodes") else num("actor-num-nodes")
        models["critic"] = policy
        roles["critic"] = {"pool": "gpu", "devices": c_nodes * c_per,
                           **{k: v for k, v in actor.items() if k not in ("pool", "devices")}}
        gpus += c_nodes * c_per
    roles["reward"] = {"pool": "cpu", "devices": 1}
    prompts = num("rollout-batch-size")
    samples = prompts * num("n-samples-per-prompt")
    gbs = num("global-batch-size") if a.get("global-batch-size") else samples
    batch = {"prompts": prompts, "samples_per_prompt": num("n-samples-per-prompt"),
             "mini_batches": max(samples // max(gbs, 1), 1)}
    response = num("rollout-max-response-len")
    notes = [f"{ref}: not expanded (the script fills it by running a command); its flags are "
             "taken to be the model's architecture, which the catalog gives"
             for ref in dict.get(a, "_unexpanded", []) if "[" in ref]
    if a.get("rollout-max-prompt-len"):
        prompt = num("rollout-max-prompt-len")
    else:
        prompt = max(response // 4, 1)
        notes.append(f"lengths: no --rollout-max-prompt-len; prompts taken to be up to {prompt} "
                     "tokens (a quarter of the response cap)")
    pools = [{"name": "gpu", "device": device, "devices_per_node": per,  # the GPUs it uses
              "nodes": -(-gpus // per)},
             {"name": "cpu", "device": CPU_DEVICE, "devices_per_node": 1, "nodes": 1}]
    colocate_groups = [shared] if len(shared) > 1 else []
    current = {"source": f"miles: {source}", "roles": roles, "colocate": colocate_groups}
    job = job_dict(name, algorithm, models, batch, assumed_lengths(prompt, response), pools, current)
    # priced with the framework's profile: the ILP searches what miles can run
    job = {"name": job["name"], "framework": "miles", **job}
    if entry == ASYNC_ENTRY or a.get("fully-async"):
        job["pipeline"] = {"mode": "async", "max_staleness": 1}
    return job, assumed_notes(device) + notes
