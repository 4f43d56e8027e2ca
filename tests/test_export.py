"""`placer export verl|openrlhf` and the export CLI: every example's plan, validated by the
frameworks' own configuration code (tests/frameworks.py), and what they cannot express named in
warnings. KubeRay's objects: tests/test_export_kuberay.py."""
from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest
import yaml
from calibdata import hand_plan
from exportplans import PLANS
from frameworks import (
    openrlhf_parse,
    verl_compose,
    verl_validate,
)
from omegaconf import OmegaConf

from placer.base.errors import SpecError
from placer.cost.efficiency import Calibration
from placer.interop import target_of
from placer.interop.common import hsdp_roles
from placer.interop.openrlhf import command_args
from placer.interop.verl import VERL_VERSION, config_name, launch_args, overrides, uses_megatron
from placer.solve.planfile import Plan, calibration_of, save_plan
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from simulator.handplans import plan_for

# several agents co-trained: every target that runs one policy per job refuses them (below)
AGENT_PLANS = sorted(n for n, p in PLANS.items() if p.spec.agents is not None)
# verl and OpenRLHF refuse a role split over pools (tests/test_split_render.py checks how)
ONE_POOL = sorted(n for n, p in PLANS.items() if not any(r.parts for r in p.roles.values())
                  and n not in AGENT_PLANS)
# ... and an HSDP shard group where they have none: OpenRLHF always, verl under Megatron
HSDP = [n for n in ONE_POOL if hsdp_roles(PLANS[n])]
VERL_LAYOUT_OK = [n for n in ONE_POOL if n not in HSDP or not uses_megatron(PLANS[n])]


def uneven_for_verl(plan: Plan) -> bool:
    """verl's validate_config asks an iteration's samples to divide over the trainer pool's
    GPUs (FSDP), or over its Megatron data-parallel ranks x the micro-batch."""
    b, a = plan.spec.batch, plan.roles["actor"]
    unit = a.dp * max(a.micro_batch, 1) if uses_megatron(plan) else a.devices
    return (b.prompts * b.samples_per_prompt) % unit != 0


# ... and a batch that does not divide over the actor's GPUs (verl's validate_config)
UNEVEN = [n for n in VERL_LAYOUT_OK if uneven_for_verl(PLANS[n])]
VERL_OK = [n for n in VERL_LAYOUT_OK if n not in UNEVEN]
OPENRLHF_OK = [n for n in ONE_POOL if n not in HSDP]


def without_hsdp(plan: Plan) -> Plan:
    """The plan with every trainer's state sharded over all its dp ranks (no `shard`)."""
    return plan.model_copy(update={"roles": {n: r.model_copy(update={"shard": 0})
                                             for n, r in plan.roles.items()}})


def replanned(plan: Plan, refusal: str) -> Plan:
    """The plan's job planned again with the pin the refusal names (the fix it offers)."""
    found = re.search(r"`pin: (\{.*\}\})` to the job", refusal)
    assert found, refusal
    pin = yaml.safe_load(found.group(1))
    job = plan.spec.model_dump(mode="json", exclude_none=True)
    job["pin"] = {**job.get("pin", {}), **pin}
    return plan_for(resolve(job_from_dict(job), plan.spec.name), Calibration())


@pytest.mark.parametrize("name", AGENT_PLANS)
def test_a_multi_agent_plan_is_refused_by_every_one_policy_target_naming_agents(name: str) -> None:
    from placer.interop.targets import TARGETS
    plan = PLANS[name]
    for target in TARGETS.values():
        if target.runs_agents:
            continue
        with pytest.raises(SpecError, match=rf"^agents: {re.escape(target.title)} runs one "
                                            r"policy per job; this plan co-trains 2 agents"):
            target.export(plan)


def test_the_examples_hold_a_multi_agent_plan() -> None:
    assert AGENT_PLANS


def test_the_examples_cover_hsdp_with_fsdp_and_with_megatron() -> None:
    """The HSDP tests below run on the examples' own plans; they must hold both kinds."""
    assert [n for n in HSDP if n not in VERL_OK] and [n for n in HSDP if n in VERL_OK]


# --------------------------------------------------------------------------------------- verl
@pytest.mark.parametrize("name", VERL_OK)
def test_verl_overrides_compose_with_verls_own_config(name: str) -> None:
    plan = PLANS[name]
    flat, _ = overrides(plan)
    args = launch_args(plan, flat)
    cfg = verl_compose(config_name(plan), args[1:])  # raises on a key verl's config lacks
    for key, value in flat.items():
        assert OmegaConf.select(cfg, key) == value, key
    job = plan.spec
    assert cfg.data.train_batch_size == job.batch.prompts
    assert cfg.actor_rollout_ref.rollout.n == job.batch.samples_per_prompt
    actor = plan.roles["actor"]
    if config_name(plan) == "ppo_megatron_trainer":
        assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == actor.tp
    roll = plan.roles["rollout"]
    r = cfg.actor_rollout_ref.rollout  # data-parallel attention: verl's rollout TP x DP
    assert r.tensor_model_parallel_size * r.data_parallel_size == roll.tp
    # the engine's admission cap the plan was priced with (placer.cost.admission), not its first wave
    dev = plan.resolved().device_of(roll.pool)
    cap = calibration_of(plan).for_device(dev).max_num_seqs
    assert cfg.actor_rollout_ref.rollout.max_num_seqs == cap == 1024
    if roll.slot != actor.slot and plan.resolved().device_of(roll.pool).kind == "gpu":
        assert cfg.trainer.v1.trainer_mode == "separate_async"
        assert (cfg.actor_rollout_ref.rollout.nnodes * cfg.actor_rollout_ref.rollout.n_gpus_per_node
                == roll.devices)


@pytest.mark.parametrize("name", [n for n in HSDP if n in VERL_OK])
def test_verl_fsdp_takes_the_shard_group_and_a_plan_without_one_is_unchanged(name: str) -> None:
    plan = PLANS[name]
    flat, _ = overrides(plan)
    cfg = verl_compose(config_name(plan), launch_args(plan, flat)[1:])
    for role, r in hsdp_roles(plan).items():
        key = "actor_rollout_ref.actor.fsdp_config" if role == "actor" else "critic.fsdp"
        assert OmegaConf.select(cfg, f"{key}.fsdp_size") == r.shard * r.tp * r.cp
    plain, _ = overrides(without_hsdp(plan))
    assert not any(k.endswith("fsdp_size") for k in plain)  # verl's default -1: all ranks
    assert plain == {k: v for k, v in flat.items() if not k.endswith("fsdp_size")}


@pytest.mark.parametrize("name", [n for n in HSDP if n not in VERL_OK])
def test_verl_refuses_hsdp_under_megatron_and_its_fix_exports(name: str) -> None:
    plan = PLANS[name]
    role, r = next(iter(hsdp_roles(plan).items()))
    with pytest.raises(SpecError, match=rf"roles\.{role}\.shard: {r.shard}: verl's Megatron "
                                        r"trainer cannot .* Re-plan with plain ZeRO") as e:
        overrides(plan)
    assert "export kuberay" in str(e.value)
    again = replanned(plan, str(e.value))
    assert not hsdp_roles(again) and uses_megatron(again)
    flat, _ = overrides(again)
    verl_compose(config_name(again), launch_args(again, flat)[1:])


@pytest.mark.parametrize("name", VERL_OK)
def test_verl_export_passes_verls_own_config_checks(name: str) -> None:
    """What `verl.trainer.main_ppo.main` runs before it starts Ray: validate_config and every
    config dataclass's checks (tests/frameworks.py `verl_validate`, verl 0.9.1's own code)."""
    plan = PLANS[name]
    flat, _ = overrides(plan)
    cfg = verl_compose(config_name(plan), launch_args(plan, flat)[1:])
    verl_validate(cfg)
    actor = cfg.actor_rollout_ref.actor
    assert actor.ppo_micro_batch_size_per_gpu >= 1
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu >= 1
    if "reference" in plan.roles:
        assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu >= 1
    # the micro-batch the planner chose and priced (its activations at the longest context)
    mbs = actor.ppo_micro_batch_size_per_gpu
    assert plan.roles["actor"].micro_batch > 0
    assert mbs == plan.roles["actor"].micro_batch
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == mbs


def test_verls_own_checks_can_fail() -> None:
    """The validator refuses what the issue reported: no micro-batch size."""
    plan = PLANS["tiny-cpu"]
    flat, _ = overrides(plan)
    flat = {k: v for k, v in flat.items() if "micro_batch" not in k}
    cfg = verl_compose(config_name(plan), launch_args(plan, flat)[1:])
    with pytest.raises(Exception, match="ppo_micro_batch_size"):
        verl_validate(cfg)


def test_verl_carries_expert_and_context_parallelism() -> None:
    """The MoE example's actor trains with EP 8 and its rollout serves with EP 16 over
    data-parallel attention; a CP 2 actor gets Megatron's context_parallel_size."""
    # the native plan may shard the optimizer in HSDP groups, which verl's Megatron refuses
    # (test_verl_refuses_hsdp_under_megatron_and_its_fix_exports): ZeRO over every dp rank
    plan = without_hsdp(PLANS["grpo-qwen3-30b-a3b"])
    actor, roll = plan.roles["actor"], plan.roles["rollout"]
    assert actor.ep == 8 and roll.ep == 16 and roll.attn_dp == 16, "the example's plan moved"
    flat, _ = overrides(plan)
    cfg = verl_compose(config_name(plan), launch_args(plan, flat)[1:])
    meg = cfg.actor_rollout_ref.actor.megatron
    assert (meg.expert_model_parallel_size, meg.pipeline_model_parallel_size) == (8, actor.pp)
    r = cfg.actor_rollout_ref.rollout
    assert (r.tensor_model_parallel_size * r.data_parallel_size, r.expert_parallel_size) == (16, 16)
    roles = dict(plan.roles)
    roles["actor"] = actor.model_copy(update={"cp": 2, "ep": 1, "pp": 1, "shard": 0,
                                              "dp": actor.devices // 2})
    cp = plan.model_copy(update={"roles": roles})
    flat, _ = overrides(cp)
    assert flat["actor_rollout_ref.actor.megatron.context_parallel_size"] == 2
    verl_validate(verl_compose(config_name(cp), launch_args(cp, flat)[1:]))


def test_verl_offload_is_verls_parking_and_a_host_step_is_warned() -> None:
    """verl's offload parks state between phases (the plan's slot switch); the plan's own
    offload (optimizer state on the host through the step) is named in a warning."""
    plan = PLANS["ppo-34b-a100"]
    assert plan.breakdown.switch_s.get(plan.roles["actor"].slot, 0) > 0
    flat, warn = overrides(plan)
    engine = "megatron" if uses_megatron(plan) else "fsdp_config"
    assert flat[f"actor_rollout_ref.actor.{engine}.optimizer_offload"] is True
    assert not any("offload" in w for w in warn)
    roles = dict(plan.roles)
    roles["actor"] = plan.roles["actor"].model_copy(update={"offload": True})
    _, warn = overrides(plan.model_copy(update={"roles": roles}))
    assert any(w.startswith("roles.actor.offload:") for w in warn)


@pytest.mark.parametrize("name", UNEVEN)
def test_verl_refuses_a_batch_its_trainer_pool_cannot_split_and_its_fix_exports(name) -> None:
    plan = PLANS[name]
    with pytest.raises(SpecError, match=r"roles\.actor\.devices: \d+: verl 0\.9\.1 needs") as e:
        overrides(plan)
    again = replanned(plan, str(e.value))
    flat, _ = overrides(again)
    verl_validate(verl_compose(config_name(again), launch_args(again, flat)[1:]))


def test_the_examples_cover_an_uneven_verl_batch() -> None:
    assert UNEVEN


def test_every_export_names_its_framework_version() -> None:
    plan = without_hsdp(PLANS["tiny-cpu"])
    for name, version in (("verl", VERL_VERSION), ("openrlhf", "0.11.2"),
                          ("kuberay", "KubeRay 1.7.0, Ray 2.52.0")):
        e = target_of(name).export(plan)
        assert e.version == version
        number = version.split(",")[0].split()[-1]
        assert all(number in text for text in e.files.values()), name


def test_verl_composition_refuses_an_unknown_key() -> None:
    """The validator can fail: a key verl's config does not have."""
    from hydra.errors import ConfigCompositionException
    with pytest.raises(ConfigCompositionException):
        verl_compose("ppo_trainer", ["actor_rollout_ref.rollout.tensor_parallel=2"])


def test_verl_names_what_it_cannot_express() -> None:
    e = target_of("verl").export(PLANS["ppo-llama8b-hetero"])  # reference and reward on LPUs
    text = "\n".join(e.warnings)
    assert "reference:" in text and "reward:" in text and "LPU" in text.upper()
    assert "environment:" in text
    assert all(f"# WARNING: {w}" in e.files["overrides.yaml"] for w in e.warnings)
    sync = target_of("verl").export(PLANS["split-sync"])
    assert any(w.startswith("pipeline:") for w in sync.warnings)


def test_verl_gives_a_reward_model_on_its_own_gpus_a_resource_pool() -> None:
    """PPO with the rollout and the reward model on L40S slots of their own (tests/calibdata.py):
    each gets nnodes x n_gpus_per_node of its devices, the reward model a pool of its own."""
    plan = hand_plan()
    flat, warnings = overrides(plan)
    cfg = verl_compose(config_name(plan), launch_args(plan, flat)[1:])
    rm, roll = cfg.reward.reward_model, cfg.actor_rollout_ref.rollout
    assert rm.enable_resource_pool is True
    assert rm.nnodes * rm.n_gpus_per_node == plan.roles["reward"].devices
    assert roll.nnodes * roll.n_gpus_per_node == plan.roles["rollout"].devices
    assert not any(w.startswith(("reward:", "rollout:")) for w in warnings)


# ------------------------------------------------------------------------------------ OpenRLHF
@pytest.mark.parametrize("name", OPENRLHF_OK + [f"{n}-noshard" for n in HSDP])
def test_openrlhf_command_parses_with_openrlhfs_own_parser(name: str) -> None:
    plan = PLANS[name] if name in PLANS else without_hsdp(PLANS[name.removesuffix("-noshard")])
    export = target_of("openrlhf").export(plan)
    argv = shlex.split(export.command)[3:]  # after `python3 -m openrlhf.cli.train_ppo_ray`
    assert argv == command_args(plan)[0]
    args = openrlhf_parse(argv)  # OpenRLHF's argparse, its checks and train()'s asserts
    job = plan.spec
    assert args.rollout.batch_size == job.batch.prompts
    assert args.rollout.n_samples_per_prompt == job.batch.samples_per_prompt
    roll = plan.roles["rollout"]
    assert args.vllm.tensor_parallel_size == roll.tp
    if not args.train.colocate_all and plan.resolved().device_of(roll.pool).kind == "gpu":
        assert args.vllm.num_engines * args.vllm.tensor_parallel_size == roll.devices
    assert args.ds.zpg == 1  # ZeRO over all ranks: no hpZ group (it is not HSDP)


@pytest.mark.parametrize("name", HSDP)
def test_openrlhf_refuses_an_hsdp_plan_and_names_the_fix(name: str) -> None:
    """OpenRLHF 0.11 has no shard group (its --ds.zpg is ZeRO++ hpZ, not HSDP): the export
    names every role's `shard`, and the pin it offers re-plans into a plan OpenRLHF runs."""
    plan = PLANS[name]
    hsdp = hsdp_roles(plan)
    with pytest.raises(SpecError, match=r"OpenRLHF cannot shard .* \(HSDP\).*--ds\.zpg") as e:
        target_of("openrlhf").export(plan)
    msg = str(e.value)
    assert msg.startswith(", ".join(f"roles.{n}.shard: {r.shard}" for n, r in hsdp.items()))
    for n, r in hsdp.items():
        assert f"{n}: {{dp: {r.dp}, shard: {r.dp}}}" in msg
    assert ("export verl" in msg) is (not uses_megatron(plan))


def test_the_pin_an_openrlhf_refusal_offers_plans_without_hsdp() -> None:
    plan = PLANS["grpo-qwen7b-h100"]
    assert hsdp_roles(plan), "the example's actor is expected to take HSDP"
    with pytest.raises(SpecError) as e:
        command_args(plan)
    again = replanned(plan, str(e.value))
    assert not hsdp_roles(again) and again.roles["actor"].dp == plan.roles["actor"].dp
    openrlhf_parse(command_args(again)[0])


def test_openrlhf_parser_check_can_fail() -> None:
    with pytest.raises(AssertionError, match="num_engines"):  # colocate_all with 3 x 1 != 8 GPUs
        openrlhf_parse(["--train.colocate_all", "--actor.num_gpus_per_node", "8",
                        "--vllm.num_engines", "3", "--actor.model_name_or_path", "m",
                        "--algo.advantage.estimator", "group_norm",
                        "--rollout.n_samples_per_prompt", "4"])
    with pytest.raises(SystemExit):
        openrlhf_parse(["--vllm.tp_size", "2"])  # not an OpenRLHF flag


def test_openrlhf_carries_micro_batches_and_context_parallelism_and_names_ep() -> None:
    """CP as ring attention (parsed by OpenRLHF, and imported back as cp); EP, which DeepSpeed
    ZeRO has not, named in a warning with its field."""
    from placer.interop.importers import import_openrlhf
    plan = without_hsdp(PLANS["tiny-cpu"])
    roles = dict(plan.roles)
    roles["actor"] = roles["actor"].model_copy(update={"cp": 2, "dp": 1})
    cp = plan.model_copy(update={"roles": roles})
    argv, _ = command_args(cp)
    args = openrlhf_parse(argv)
    assert args.ds.ring_attn_size == 2 and args.train.micro_batch_size >= 1
    assert args.rollout.micro_batch_size == args.train.micro_batch_size
    data, _ = import_openrlhf(" ".join(shlex.quote(a) for a in argv), "cmd")
    assert data["current"]["roles"]["actor"]["cp"] == 2
    moe = without_hsdp(PLANS["grpo-qwen3-30b-a3b"])
    _, warn = command_args(moe)
    assert any(w.startswith("roles.actor.ep: OpenRLHF 0.11.2") for w in warn)


def test_openrlhf_names_what_it_cannot_express() -> None:
    e = target_of("openrlhf").export(without_hsdp(PLANS["ppo-llama8b-hetero"]))
    text = "\n".join(e.warnings)
    assert "colocation:" in text and "reference:" in text and "environment:" in text


# ----------------------------------------------------------------------------------------- CLI
def test_cli_writes_files_and_warns_on_stderr(tmp_path, placer_cmd) -> None:
    plan = tmp_path / "plan.json"
    save_plan(PLANS["ppo-llama8b-hetero"], plan)
    out = subprocess.run(placer_cmd + ["export", "verl", str(plan), "-o", str(tmp_path / "v")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("python3 -m verl.trainer.main_ppo --config-name=")
    assert f"placer: written for verl {VERL_VERSION}" in out.stderr
    assert "placer: warning: reference:" in out.stderr
    assert (tmp_path / "v" / "launch.sh").stat().st_mode & 0o100
    text = (tmp_path / "v" / "launch.sh").read_text()
    assert f"written for verl {VERL_VERSION}" in text and "installed=" in text
    script = shlex.split(text[text.index("python3 -m verl"):].replace("\\\n", " "))
    assert script[:3] == ["python3", "-m", "verl.trainer.main_ppo"] and script[-1] == "$@"
    refused = subprocess.run(placer_cmd + ["export", "openrlhf", str(plan), "--json"],
                             capture_output=True, text=True)  # HSDP actor and critic
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("placer: error: roles.actor.shard: 8, roles.critic.shard: 8")
    plain = tmp_path / "plain.json"
    save_plan(without_hsdp(PLANS["ppo-llama8b-hetero"]), plain)
    cmd = subprocess.run(placer_cmd + ["export", "openrlhf", str(plain), "--json"],
                         capture_output=True, text=True)
    doc = json.loads(cmd.stdout)
    assert doc["framework"] == "openrlhf" and doc["warnings"] and doc["version"] == "0.11.2"
    kr = subprocess.run(placer_cmd + ["export", "kuberay", str(plan), "-o", str(tmp_path / "k"),
                                      "--image", "example.com/p:1"], capture_output=True, text=True)
    assert kr.returncode == 0, kr.stderr
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == [
        "plan-configmap.yaml", "raycluster.yaml", "rayjob.yaml"]


@pytest.mark.parametrize("argv, field", [
    (["verl", "PLAN"], "--output"),
    (["openrlhf", "PLAN", "--image", "x"], "--image"),
    (["kuberay", "PLAN", "-o", "K", "--steps", "0"], "--steps"),
    (["verl", "missing.json", "-o", "V"], "missing.json"),
])
def test_cli_bad_input_exits_2(tmp_path, placer_cmd, argv, field) -> None:
    plan = tmp_path / "plan.json"
    save_plan(PLANS["tiny-cpu"], plan)
    argv = [a.replace("PLAN", str(plan)).replace("K", str(tmp_path / "k"))
            .replace("V", str(tmp_path / "v")) if a in ("PLAN", "K", "V") else a for a in argv]
    out = subprocess.run(placer_cmd + ["export", *argv], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("placer: error: ") and field in out.stderr
