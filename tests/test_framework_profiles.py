"""Framework profiles (`placer.spec.framework`): the registry, the layouts each framework can run,
its overheads, and plans made for a framework that export to it without refusal."""
from __future__ import annotations

import json
import shlex
from dataclasses import fields, replace
from pathlib import Path
from typing import get_args

import pytest
from frameworks import easyr1_errors, miles_parse, nemo_rl_errors, openrlhf_parse, verl_compose
from simplans import small_job

from placer import api
from placer.base.errors import Infeasible, SpecError
from placer.base.roles import Role
from placer.cli import main
from placer.cost.context import framework_calibration
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.interop import target_of
from placer.interop.verl import config_name, launch_args, overrides
from placer.solve.planfile import Plan
from placer.solve.planner import framework_check
from placer.spec.catalog import resolve
from placer.spec.framework import PROFILES, FrameworkName, profile_of
from placer.spec.load import dump_job, job_from_dict, load_job

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def test_the_job_format_names_exactly_the_registered_profiles() -> None:
    assert set(get_args(FrameworkName)) == set(PROFILES)
    assert profile_of(None) is PROFILES["native"]
    for name, p in PROFILES.items():
        assert p.name == name


def test_every_profile_factor_is_an_efficiency_factor_and_every_rule_cites_its_source() -> None:
    known = {f.name for f in fields(Efficiency)}
    for p in PROFILES.values():
        assert set(p.factors) <= known, p.name
        for factor in p.factors:  # each overhead names where its value comes from
            assert factor in p.sources, (p.name, factor)
        if p.name != "native":
            assert p.sources and all(p.version in s for s in p.sources.values()), p.name
            assert "@" in p.version, p.name  # the commit the rules were read at


# rule -> the source keys that may cite it (a trainer's or an engine's limits cite its config)
RULE_SOURCES = {"gpu_models": ("gpu_models",), "hsdp": ("hsdp", "trainer"), "splits_roles": ("splits_roles",),
                "critic": ("critic",), "async_steps": ("async_steps",),
                "partial_rollout": ("partial_rollout",), "attn_dp": ("engine",),
                "trainer_tp": ("trainer",), "trainer_pp": ("trainer",), "trainer_ep": ("trainer",),
                "engine_tp": ("engine",), "engine_pp": ("engine",), "engine_ep": ("engine",)}


def test_every_rule_that_narrows_the_search_cites_where_the_framework_says_so() -> None:
    native = PROFILES["native"]
    for p in PROFILES.values():
        narrowed = [rule for rule in RULE_SOURCES if getattr(p, rule) != getattr(native, rule)]
        for rule in narrowed:
            assert any(k in p.sources for k in RULE_SOURCES[rule]), (p.name, rule)


def _problem(name: str, role: str = Role.ACTOR, training: bool = True, **dims: int) -> str | None:
    par = {"tp": 1, "pp": 1, "ep": 1, "shard": 0, "attn_dp": 1, **dims}
    return PROFILES[name].layout_problem(role, training=training, has_model=True, on_gpu=True,
                                         **par)


def test_layout_rules() -> None:
    assert all(_problem("native", **d) is None
               for d in ({"tp": 8}, {"pp": 4}, {"ep": 8}, {"shard": 8}))
    assert "tp <= 1" in (_problem("verl", tp=2) or "")  # FSDP2: data parallel only
    assert _problem("verl", shard=8) is None  # FSDP's fsdp_size
    assert _problem("verl-megatron", tp=4, pp=2, ep=8) is None
    assert "HSDP" in (_problem("verl-megatron", shard=8) or "")
    assert "HSDP" in (_problem("openrlhf", shard=8) or "")
    assert _problem("openrlhf", tp=2) is None  # DeepSpeed AutoTP
    assert "pp <= 1" in (_problem("openrlhf", role=Role.ROLLOUT, training=False, pp=2) or "")
    assert "data-parallel attention" in (_problem("openrlhf", role=Role.ROLLOUT, training=False,
                                                  tp=8, attn_dp=8) or "")
    lpu = PROFILES["verl"].layout_problem(Role.ROLLOUT, training=False, has_model=True,
                                          on_gpu=False, tp=1, pp=1, ep=1, shard=0, attn_dp=1)
    assert lpu is not None and "GPUs" in lpu
    assert PROFILES["native"].layout_problem(Role.ROLLOUT, training=False, has_model=True,
                                             on_gpu=False, tp=1, pp=1, ep=1, shard=0,
                                             attn_dp=1) is None


def test_job_rules() -> None:
    no_critic = replace(PROFILES["nemo-rl"], critic=False)
    assert "critic" in (no_critic.job_problem(critic=True, async_steps=False,
                                              partial_rollout=False) or "")
    assert PROFILES["nemo-rl"].job_problem(critic=False, async_steps=True,
                                           partial_rollout=True) is not None
    assert PROFILES["native"].job_problem(critic=True, async_steps=True,
                                          partial_rollout=True) is None


def test_a_job_without_a_framework_is_written_as_before_and_one_with_it_keeps_it() -> None:
    job = job_from_dict(small_job())
    assert "framework" not in dump_job(job) and job.profile is PROFILES["native"]
    verl = job_from_dict({**small_job(), "framework": "verl"})
    assert dump_job(verl)["framework"] == "verl"
    assert job_from_dict(dump_job(verl)) == verl
    with pytest.raises(SpecError, match="framework"):
        job_from_dict({**small_job(), "framework": "deepspeed-chat"})


def test_native_prices_with_the_given_factors_themselves() -> None:
    """Regression guard: no profile factors, the same calibration object (native plans
    unchanged, byte for byte)."""
    calib = Calibration()
    assert framework_calibration(calib, PROFILES["native"].factors) is calib
    px = Pricer(resolve(job_from_dict(small_job())), calib)
    assert px.calib is calib and px.given is calib


def test_miles_prices_no_driver_dispatch_and_its_own_sender() -> None:
    """Each trainer pass of a verl job pays the driver's dispatch; Miles' ranks fetch the batch
    themselves, so the same pass is cheaper by exactly that dispatch."""
    verl = Pricer(resolve(job_from_dict({**small_job(), "framework": "verl"})), Calibration())
    miles = Pricer(resolve(job_from_dict({**small_job(), "framework": "miles"})), Calibration())
    pool = verl.res.cluster.pools[0]
    par = Parallel(dp=4)
    a, b = verl.estimate(Role.ACTOR, pool, par), miles.estimate(Role.ACTOR, pool, par)
    eff = verl.eff(pool)
    ship = (verl.res.job.batch.samples * verl.res.job.max_context
            * eff.dispatch_bytes_per_token / (eff.dispatch_gbs * 1e9))
    assert ship > 0
    assert a.stage_s["score"] - b.stage_s["score"] == pytest.approx(ship)
    assert miles.eff(pool).sync_sender_gbs == PROFILES["miles"].factors["sync_sender_gbs"]
    assert miles.given.default == Efficiency()  # the plan records the calibration as given


def test_megatron_trainers_on_ray_step_an_offloaded_optimizer_on_the_host() -> None:
    """Miles' and verl's Megatron CPU Adam (Megatron's HybridDeviceOptimizer on the one thread Ray
    gives a rank) is priced at the host's AdamW rate; other profiles give no rate, so only the
    step's copies are priced."""
    assert [n for n, p in PROFILES.items() if p.factors.get("host_adam_gparams_s", 0) > 0] == [
        "verl-megatron", "miles"]
    par = Parallel(tp=2, dp=2, zero=1, offload=True)
    extra = {}
    for name in ("native", "verl-megatron", "miles"):
        px = Pricer(resolve(job_from_dict({**small_job(), "framework": name})), Calibration())
        pool = px.res.cluster.pools[0]
        on, off = (px.estimate(Role.ACTOR, pool, p).stage_s["train"]
                   for p in (par, replace(par, offload=False)))
        extra[name] = on - off
    policy = small_job()["models"]["policy"]
    shard = resolve(job_from_dict(small_job())).models[policy].params() / 4  # TP 2 x DP 2
    steps = small_job()["batch"]["mini_batches"]
    for name in ("verl-megatron", "miles"):
        rate = PROFILES[name].factors["host_adam_gparams_s"] * 1e9
        assert extra[name] == pytest.approx(steps * shard / rate)
    assert extra["native"] == pytest.approx(steps * 8 * shard / (Efficiency().offload_gbs * 1e9))


def test_a_framework_that_cannot_run_the_job_is_refused_before_planning() -> None:
    job = job_from_dict({**small_job(), "framework": "nemo-rl",
                         "tail_policy": {"kind": "partial", "token_budget": 4096}})
    with pytest.raises(Infeasible, match="framework: nemo-rl .*partial rollout"):
        framework_check(job)
    pinned = job_from_dict({**small_job(), "framework": "verl", "pin": {"actor": {"tp": 2}}})
    with pytest.raises(Infeasible, match="tp <= 1.*pin.actor"):
        framework_check(pinned)


def test_plan_exits_3_naming_what_the_framework_cannot_run(capsys) -> None:
    assert main(["plan", str(EXAMPLES / "tiny-moe.yaml"), "--framework", "verl"]) == 3
    err = capsys.readouterr().err
    assert "framework: verl" in err and "pin.actor" in err


def test_an_unknown_framework_is_bad_input(capsys) -> None:
    assert main(["plan", str(EXAMPLES / "tiny-moe.yaml"), "--framework", "deepspeed"]) == 2
    assert "--framework" in capsys.readouterr().err
    with pytest.raises(SpecError, match="--framework: unknown framework 'deepspeed'"):
        api.plan(EXAMPLES / "tiny-moe.yaml", framework="deepspeed")


# ------------------------------------------- plans made for a framework export to it as they are
EXPORTERS = ("verl", "verl-megatron", "openrlhf", "nemo-rl", "miles", "easyr1")
# The examples the exporters refused before profiles (a split rollout; HSDP under OpenRLHF or
# verl's Megatron trainer) with the framework that refused them, and two small ones; every
# other (example, framework) pair runs in the slow matrix below.
FAST = [("grpo-qwen3-next", "verl"), ("grpo-qwen3-next", "verl-megatron"),
        ("grpo-qwen7b-h100", "openrlhf"), ("longtail-replay", "openrlhf"),
        ("ppo-llama8b-hetero", "openrlhf"), ("tiny-moe", "verl-megatron"),
        ("hetero-split", "verl"), ("grpo-qwen3-next", "nemo-rl"), ("hetero-split", "miles"),
        ("ppo-34b-a100", "nemo-rl"), ("grpo-qwen3-30b-a3b", "miles"),
        ("vlm-qwen25vl-7b", "easyr1"), ("hetero-split", "easyr1")]
SLOW = [(n, f) for n in sorted(p.stem for p in EXAMPLES.glob("*.yaml")) for f in EXPORTERS
        if (n, f) not in FAST]


def _export_checked(plan: Plan, framework: str) -> None:
    """`placer export` of the plan succeeds and the framework's own checks accept it."""
    target = PROFILES[framework].exporter
    assert target is not None
    export = target_of(target).export(plan)
    if target == "verl":
        flat, _ = overrides(plan)
        verl_compose(config_name(plan), launch_args(plan, flat)[1:])
    elif target == "nemo-rl":
        assert nemo_rl_errors(next(iter(export.files.values()))) == []
    elif target == "miles":
        miles_parse(shlex.split(export.command)[2:])
    elif target == "easyr1":
        assert easyr1_errors(export.files["easyr1.yaml"]) == []
    else:
        openrlhf_parse(shlex.split(export.command)[3:])


def _plan_or_refusal(name: str, framework: str) -> Plan | None:
    try:
        return api.plan(EXAMPLES / f"{name}.yaml", framework=framework, time_limit=2.0,
                        workers=1)
    except Infeasible as e:  # the planner names the framework and what it cannot run
        assert f"framework: {framework}" in str(e)
        return None


@pytest.mark.parametrize(("name", "framework"), FAST)
def test_a_plan_for_a_framework_exports_to_it(name: str, framework: str) -> None:
    plan = _plan_or_refusal(name, framework)
    if plan is not None:
        assert not any(r.parts for r in plan.roles.values())
        _export_checked(plan, framework)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "framework"), SLOW)
def test_every_example_planned_for_a_framework_exports_to_it(name: str, framework: str) -> None:
    plan = _plan_or_refusal(name, framework)
    if plan is not None:
        _export_checked(plan, framework)


def test_compare_all_frameworks_has_one_plan_per_framework(capsys) -> None:
    assert main(["compare", str(EXAMPLES / "tiny-cpu.yaml"), "--framework", "all", "--json",
                 "--time-limit", "2", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["frameworks"]) == set(PROFILES)
    for name, row in doc["frameworks"].items():
        assert ("plan" in row) != ("refused" in row), name
        if "plan" in row:
            plan = Plan.model_validate(row["plan"])
            assert plan.spec.profile is PROFILES[name]
            assert row["cost_per_sample"] == plan.cost_per_sample
            assert row["usd_per_hour"] == plan.used_usd_per_hour
            assert row["ratio_to_fastest"] >= 1.0


# ------------------------------------------------- published rows priced with their own profile
# The framework a row's source names (its first word) -> the profiles it may be priced with.
RAN_UNDER = {"verl": ("verl", "verl-megatron"), "easyr1": ("easyr1",), "miles": ("miles",),
             "nemo-rl": ("nemo-rl",)}


def test_published_rows_name_the_framework_they_ran_and_its_profile_can_run_their_layout() -> None:
    from placer.base.roles import TRAINING_ROLES
    from workflows.published_rows import ROWS, SYNC_ROWS

    for row in ROWS:
        job = load_job(EXAMPLES / "published" / row.file)
        assert job.framework in RAN_UNDER[row.source.split()[0].lower()], row.name
        for role, use in row.layout.items():
            if use.pool == "cpu":
                continue
            assert job.profile.layout_problem(
                role, training=role in TRAINING_ROLES, has_model=True, on_gpu=True, tp=use.tp,
                pp=use.pp, ep=use.ep, shard=use.shard, attn_dp=1) is None, (row.name, role)
    for sync in SYNC_ROWS:
        assert sync.framework in RAN_UNDER[sync.name.split()[0].lower()], sync.name
