"""EasyR1 as a framework: its profile (`placer.spec.framework`, wired to the offload schemes of
`placer.cost.offload`), the planner keeping its hybrid engine in one slot, the published rows
priced with it, and `placer export|import easyr1` (`placer.interop.easyr1`) checked key for key
against EasyR1's own examples/config.yaml and config dataclasses (tests/data/easyr1)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from frameworks import EASYR1, easyr1_errors, easyr1_keys
from simplans import small_job

from placer import api
from placer.base.errors import Infeasible, SpecError
from placer.base.roles import Role
from placer.cli import main
from placer.cost.efficiency import Calibration
from placer.cost.estimate import budgeted
from placer.cost.offload import PARK_SCHEMES, STREAM_SCHEMES
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.interop import target_of
from placer.interop.easyr1 import config, import_easyr1
from placer.solve.planner import framework_check
from placer.spec.catalog import resolve
from placer.spec.framework import PROFILES
from placer.spec.load import job_from_dict, load_job

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EASY = PROFILES["easyr1"]
# keys the export may set that EasyR1's examples/config.yaml leaves to the dataclass defaults
# (each a field of its config classes: `easyr1_errors` checks that)
BEYOND_EXAMPLE = {"worker.rollout.max_num_batched_tokens", "worker.actor.fsdp.fsdp_size",
                  "worker.ref.fsdp.enable_cpu_offload"}


# -------------------------------------------------------------------------------- the profile
def _problem(role: str = Role.ACTOR, training: bool = True, **dims: int) -> str | None:
    par = {"tp": 1, "pp": 1, "ep": 1, "shard": 0, "attn_dp": 1, **dims}
    return EASY.layout_problem(role, training=training, has_model=True, on_gpu=True, **par)


def test_easyr1_runs_fsdp_trainers_and_tp_only_vllm_engines() -> None:
    assert "tp <= 1" in (_problem(tp=2) or "")
    assert "pp <= 1" in (_problem(pp=2) or "")
    assert _problem(shard=4) is None  # fsdp_size: HYBRID_SHARD
    assert _problem(Role.ROLLOUT, training=False, tp=8) is None
    assert "pp <= 1" in (_problem(Role.ROLLOUT, training=False, pp=2) or "")
    assert "ep <= 1" in (_problem(Role.ROLLOUT, training=False, ep=2) or "")
    assert "data-parallel attention" in (_problem(Role.ROLLOUT, training=False, attn_dp=2) or "")


def test_easyr1_refuses_what_its_trainer_has_not() -> None:
    off = {"critic": False, "async_steps": False, "partial_rollout": False, "reward_model": False}
    assert EASY.job_problem(**off) is None
    assert EASY.job_problem(**{**off, "critic": True}) is None  # gae's critic worker
    for feature in ("async_steps", "partial_rollout", "reward_model"):
        assert EASY.job_problem(**{**off, feature: True}) is not None, feature
    judged = job_from_dict({**small_job(), "framework": "easyr1",
                            "models": {"policy": "Qwen2.5-7B", "reward": "Qwen2.5-7B"}})
    with pytest.raises(Infeasible, match="framework: easyr1 .*reward model"):
        framework_check(judged)


def test_every_profiles_schemes_are_registered_offload_schemes() -> None:
    for p in PROFILES.values():
        assert p.park_scheme == "" or p.park_scheme in PARK_SCHEMES, p.name
        assert (p.stream_scheme in STREAM_SCHEMES) == bool(p.stream_frozen), p.name
    assert EASY.park_scheme == "verl" and EASY.stream_scheme == "easyr1-ref"
    for key in ("park_optimizer", "stream_frozen", "micro_batch_samples", "hybrid_engine"):
        assert key in EASY.sources


def test_its_micro_batches_are_its_samples_times_the_padded_length() -> None:
    """No job budget: EasyR1's 2 sequences a forward micro-batch and 1 an update one, at the
    job's longest context; a job's own budget or a layout's count still wins."""
    job = {**small_job(), "framework": "easyr1"}
    res = resolve(job_from_dict(job))
    ctx = res.job.max_context
    assert budgeted(res, Parallel(dp=8), "forward").micro_token_budget == 2 * ctx
    assert budgeted(res, Parallel(dp=8), "update").micro_token_budget == ctx
    assert budgeted(res, Parallel(dp=8, micro_batch=4), "update").micro_token_budget == 0
    own = resolve(job_from_dict({**job, "micro_token_budget": {"forward": 1000}}))
    assert budgeted(own, Parallel(dp=8), "forward").micro_token_budget == 1000
    verl = resolve(job_from_dict({**small_job(), "framework": "verl"}))
    assert budgeted(verl, Parallel(dp=8), "forward").micro_token_budget == 0


def test_the_published_easyr1_rows_take_the_profiles_budgets() -> None:
    for name in ("r13-grpo-vl7b-8xh100-colocate", "r14-grpo-vl32b-8xh100-colocate"):
        res = resolve(load_job(EXAMPLES / "published" / f"{name}.yaml"))
        assert res.job.framework == "easyr1" and res.job.micro_token_budget is None
        assert res.job.max_context == 4096  # 2,048 prompt (image tokens included) + 2,048
        assert budgeted(res, Parallel(dp=8), "forward").micro_token_budget == 8192
        assert budgeted(res, Parallel(dp=8), "update").micro_token_budget == 4096


def test_the_planner_keeps_easyr1s_hybrid_engine_in_one_slot() -> None:
    px = Pricer(resolve(job_from_dict({**small_job(), "framework": "easyr1"})), Calibration())
    assert px.colocated_roles() == [[Role.ACTOR, Role.ROLLOUT, Role.REFERENCE]]
    plan = api.plan(job_from_dict({**small_job(), "framework": "easyr1"}), time_limit=5.0,
                    workers=1)
    slots = {plan.roles[r].slot for r in (Role.ACTOR, Role.ROLLOUT, Role.REFERENCE)}
    assert len(slots) == 1
    native = Pricer(resolve(job_from_dict(small_job())), Calibration())
    assert native.colocated_roles() == []


def test_the_planner_runs_easyr1s_hybrid_engine_over_one_device_set() -> None:
    # EasyR1's one worker group runs the actor, the rollout and the reference over every GPU
    # of its pool: the plan prices each on that count, so the export warns of nothing. This
    # job's planner, left to choose, trained the actor on 16 GPUs of the slot's 32
    job = load_job(EXAMPLES / "grpo-qwen3-next.yaml")
    easy = job.model_copy(update={"framework": "easyr1"})
    assert Pricer(resolve(easy), Calibration()).same_devices_roles() == [
        [Role.ACTOR, Role.ROLLOUT, Role.REFERENCE]]
    assert Pricer(resolve(job), Calibration()).same_devices_roles() == []
    plan = api.plan(easy, time_limit=5.0, workers=1)
    counts = {r: plan.roles[r].devices for r in (Role.ACTOR, Role.ROLLOUT, Role.REFERENCE)}
    assert len(set(counts.values())) == 1, counts
    assert not [w for w in target_of("easyr1").export(plan).warnings if "whole pool" in w]


# ------------------------------------------------------------------------------------ export
@pytest.fixture(scope="module")
def vlm_plan():
    return api.plan(EXAMPLES / "vlm-qwen25vl-7b.yaml", framework="easyr1", time_limit=5.0,
                    workers=1)


def test_the_export_is_easyr1s_config_key_for_key(vlm_plan) -> None:
    export = target_of("easyr1").export(vlm_plan)
    text = export.files["easyr1.yaml"]
    assert easyr1_errors(text) == []
    doc = yaml.safe_load(text)
    example = yaml.safe_load((EASYR1 / "examples" / "config.yaml").read_text())
    assert list(doc) == ["data", "algorithm", "worker", "trainer"]
    assert set(doc) <= set(example)
    assert easyr1_keys(doc) - easyr1_keys(example) <= BEYOND_EXAMPLE
    plan = vlm_plan
    assert doc["trainer"]["nnodes"] * doc["trainer"]["n_gpus_per_node"] == plan.roles["actor"].devices
    assert doc["worker"]["rollout"]["tensor_parallel_size"] == plan.roles["rollout"].tp
    assert doc["data"]["rollout_batch_size"] == plan.spec.batch.prompts
    assert doc["worker"]["rollout"]["n"] == plan.spec.batch.samples_per_prompt
    assert doc["data"]["max_prompt_length"] + doc["data"]["max_response_length"] == \
        plan.resolved().job.max_context  # image tokens counted in the prompt


def test_the_validator_catches_what_easyr1_would_refuse() -> None:
    assert easyr1_errors((EASYR1 / "examples" / "config.yaml").read_text()) == []
    bad = "worker:\n  rollout:\n    tensor_parallel_sizes: 2\n    n: two\n  actor:\n" \
          "    global_batch_size_per_device: 4\n"
    errs = easyr1_errors(bad)
    assert len(errs) == 3, errs


def test_export_then_import_gives_the_plans_job_back(vlm_plan, tmp_path) -> None:
    text = target_of("easyr1").export(vlm_plan).files["easyr1.yaml"]
    job, _ = import_easyr1(text, "easyr1.yaml")
    spec = vlm_plan.spec
    assert job["framework"] == "easyr1" and job["models"]["policy"] == spec.models.policy
    assert job["batch"] == {"prompts": spec.batch.prompts,
                            "samples_per_prompt": spec.batch.samples_per_prompt,
                            "mini_batches": spec.batch.mini_batches}
    cur = job["current"]["roles"]
    assert cur["rollout"]["tp"] == vlm_plan.roles["rollout"].tp
    assert cur["actor"]["devices"] == vlm_plan.roles["actor"].devices
    assert job_from_dict(job).current is not None


def test_importing_the_r13_launch_script_gives_the_published_rows_job(tmp_path) -> None:
    """The row's own script (config=examples/config.yaml, read from its repository's root)."""
    root = tmp_path / "EasyR1"
    shutil.copytree(EASYR1 / "examples", root / "examples")
    script = root / "examples" / "qwen2_5_vl_7b_geo3k_grpo.sh"
    job, _ = import_easyr1(script.read_text(), str(script))
    row = load_job(EXAMPLES / "published" / "r13-grpo-vl7b-8xh100-colocate.yaml")
    assert job["batch"] == row.batch.model_dump()
    assert job["kl"] == {"coef": row.kl.coef, "estimator": row.kl.estimator, "in": "loss"}
    assert job["current"]["roles"]["rollout"] == {"pool": "gpu", "devices": 8, "tp": 2}
    assert job["models"]["policy"] == "Qwen2.5-VL-7B"


# --------------------------------------------------------------------------------- bad input
def test_a_plan_easyr1_cannot_run_is_refused_naming_the_field(capsys, tmp_path) -> None:
    """A verl plan with the rollout apart from the actor: EasyR1 has one hybrid engine."""
    plan = api.plan(job_from_dict({**small_job(), "framework": "verl",
                                   "pin": {"rollout": {"devices": 4}, "actor": {"devices": 4}}}),
                    time_limit=5.0, workers=1)
    assert plan.roles["rollout"].slot != plan.roles["actor"].slot  # verl may run it apart
    with pytest.raises(SpecError, match=r"roles\.(rollout|reference)\.slot"):
        config(plan)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    assert main(["export", "easyr1", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ".slot" in err[0]


@pytest.mark.parametrize(("yaml_text", "field"), [
    ("worker:\n  actor:\n    model:\n      model_path: Qwen/Qwen2.5-7B-Instruct\n"
     "  rollout:\n    tensor_parallel_size: 3\n", "worker.rollout.tensor_parallel_size"),
    ("algorithm:\n  adv_estimator: remax\n", "algorithm.adv_estimator"),
    ("worker:\n  actor:\n    model:\n      model_path: Qwen/Qwen2.5-7B-Instruct\n"
     "data:\n  rollout_batch_size: -4\n", "data.rollout_batch_size"),
])
def test_a_bad_config_exits_2_naming_the_field(yaml_text: str, field: str, tmp_path,
                                               capsys) -> None:
    src = tmp_path / "config.yaml"
    src.write_text(yaml_text)
    assert main(["import", "easyr1", str(src), "-o", str(tmp_path / "job.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0], err


def test_a_batch_easyr1s_checks_refuse_exits_2_naming_the_field(tmp_path, capsys) -> None:
    """12 prompts over 8 GPUs: EasyR1's DataProto.chunk asserts equal chunks (protocol.py:555).
    A plan made for easyr1 keeps to it (`even_prompts`); one made for native does not."""
    job = {**small_job(), "batch": {"prompts": 12, "samples_per_prompt": 8, "mini_batches": 1},
           "pin": {"actor": {"devices": 8, "tp": 1, "pp": 1},
                   "rollout": {"devices": 8, "tp": 2, "pp": 1}, "reference": {"devices": 8}}}
    with pytest.raises(Infeasible, match="framework: easyr1"):
        api.plan(job_from_dict({**job, "framework": "easyr1"}), time_limit=5.0, workers=1)
    plan = api.plan(job_from_dict(job), time_limit=5.0, workers=1)
    assert plan.roles["actor"].devices == 8
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    assert main(["export", "easyr1", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("placer: error: batch.prompts:"), err
