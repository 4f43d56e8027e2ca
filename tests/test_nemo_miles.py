"""NeMo-RL and Miles as export and import targets (`placer export|import nemo-rl|miles`).

Exports are checked with the frameworks' own definitions (tests/frameworks.py: NeMo-RL's base
recipes and config classes, Miles' argument parser table); imports read real recipes and
scripts from the frameworks' repositories (tests/data/nemo-rl, tests/data/miles, SOURCE.md)
and the imported jobs compare against their `current` placement.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from frameworks import NEMO_RL_CONFIGS, miles_parse, nemo_rl_errors

from placer import api
from placer.cli import main
from placer.interop.miles import export_miles, import_miles
from placer.interop.nemorl import export_nemo_rl, import_nemo_rl
from placer.solve.planfile import Plan
from placer.spec.load import job_from_dict

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MILES = Path(__file__).resolve().parent / "data" / "miles"
LAYOUT = ("devices", "tp", "pp", "cp", "ep")


def _plan(name: str, framework: str) -> Plan:
    return api.plan(EXAMPLES / f"{name}.yaml", framework=framework, time_limit=2.0, workers=1)


def _current(text: str, importer, source: str) -> tuple[dict, list[str]]:
    data, notes = importer(text, source, device="H100-SXM", name="imported")
    job = job_from_dict(data)  # a valid job: the placement fits the cluster it describes
    assert job.current is not None
    return data, notes


def _same_layout(plan: Plan, current: dict, roles: tuple[str, ...]) -> None:
    for role in roles:
        want, got = plan.roles[role], current["roles"][role]
        assert tuple(got.get(k, 1) for k in LAYOUT) == tuple(getattr(want, k) for k in LAYOUT), \
            role
        if role in ("actor", "critic"):
            assert got["offload"] == want.offload, role


def _compare_ok(tmp_path: Path, data: dict, capsys) -> dict:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["compare", str(job), "--json", "--time-limit", "2", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plans"]["current"]["applicable"] and "current" in doc["ranking"]
    return doc


# ------------------------------------------------------------------------------------ NeMo-RL
@pytest.mark.parametrize("name", ["grpo-qwen7b-h100", "grpo-qwen3-30b-a3b", "ppo-34b-a100"])
def test_nemo_rl_export_passes_its_schema_and_imports_back(name: str) -> None:
    plan = _plan(name, "nemo-rl")
    export = export_nemo_rl(plan)
    (file, text), = export.files.items()
    assert export.version == "NeMo-RL 0.6.0" and "written for NeMo-RL 0.6.0" in text
    assert nemo_rl_errors(text) == []
    data, _ = _current(text, import_nemo_rl, str(NEMO_RL_CONFIGS / file))
    cur = data["current"]
    assert data["algorithm"] == plan.spec.algorithm
    assert data["batch"] == plan.spec.batch.model_dump(include={"prompts", "samples_per_prompt",
                                                                "mini_batches"})
    _same_layout(plan, cur, ("actor", "rollout"))
    if "critic" in plan.roles:
        _same_layout(plan, cur, ("critic",))
    together = plan.roles["rollout"].slot == plan.roles["actor"].slot
    assert any({"actor", "rollout"} <= set(g) for g in cur["colocate"]) == together
    assert ("reference" in cur["roles"]) == ("reference" in plan.roles)
    assert (data["pipeline"]["mode"] == "async") == plan.spec.pipeline.mechanism.overlaps_steps


def test_nemo_rl_schema_check_can_fail() -> None:
    bad = "defaults: grpo_math_1B.yaml\npolicy:\n  foo: 1\n  train_micro_batch_size: x\n"
    errors = nemo_rl_errors(bad)
    assert any("policy.foo" in e and "PolicyConfig" in e for e in errors)
    assert any("train_micro_batch_size" in e for e in errors)


# recipe -> (model, GPUs, actor layout, rollout devices and TP, colocated, async, reference)
RECIPES = {
    "grpo_math_8B_megatron.yaml": ("Llama-3.1-8B", 8, {"pp": 2}, (8, 1), True, False, True),
    "grpo_math_qwen30ba3b_megatron.yaml": ("Qwen3-30B-A3B", 64, {"tp": 2, "ep": 8}, (64, 4),
                                           True, False, True),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated.yaml":
        ("Llama-3.1-8B", 16, {}, (8, 1), False, False, True),
    "recipes/llm/grpo-cispo-mm1-async-lag1-highoffpolicy-qwen3-30ba3b-3n8g-megatron-cispo.yaml":
        ("Qwen3-30B-A3B", 24, {"tp": 2, "ep": 8}, (8, 4), False, True, False),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_nemo_rl_recipes_from_its_repository_import(recipe: str) -> None:
    model, gpus, layout, (r_devices, r_tp), together, is_async, ref = RECIPES[recipe]
    path = NEMO_RL_CONFIGS / recipe
    data, _ = _current(path.read_text(), import_nemo_rl, str(path))
    cur = data["current"]["roles"]
    assert data["models"]["policy"] == model and data["models"]["use_reference"] is ref
    assert data["framework"] == "nemo-rl"  # compare prices it with NeMo-RL's profile
    assert sum(p["devices_per_node"] * p["nodes"] for p in data["cluster"]["pools"]
               if p["name"] == "gpu") == gpus
    assert {k: v for k, v in cur["actor"].items() if k in ("tp", "pp", "ep") and v > 1} == layout
    assert (cur["rollout"]["devices"], cur["rollout"]["tp"]) == (r_devices, r_tp)
    assert cur["actor"]["devices"] == (gpus if together else gpus - r_devices)
    assert (data["pipeline"]["mode"] == "async") is is_async
    # vllm_cfg.gpu_memory_utilization: grpo_math_qwen30ba3b_megatron.yaml sets 0.7 (and the
    # CISPO recipe on it keeps it), the others keep grpo_math_1B.yaml's 0.6 (the engine's share
    # of a GPU, `engine.memory_fraction`)
    share = 0.7 if "30ba3b" in recipe else 0.6
    assert data["engine"] == {"memory_fraction": share}


@pytest.mark.parametrize("recipe", ["grpo_math_8B_megatron.yaml", list(RECIPES)[2]])
def test_imported_nemo_rl_recipe_compares_against_its_placement(recipe, tmp_path, capsys) -> None:
    path = NEMO_RL_CONFIGS / recipe
    assert main(["import", "nemo-rl", str(path), "-o", str(tmp_path / "job.yaml")]) == 0
    data = yaml.safe_load((tmp_path / "job.yaml").read_text())
    capsys.readouterr()
    doc = _compare_ok(tmp_path, data, capsys)
    # the ILP's space holds this placement: it can only be as fast or faster
    assert doc["plans"]["ilp"]["predicted_iteration_s"] <= \
        doc["plans"]["current"]["predicted_iteration_s"] * (1 + 1e-6)


def test_a_recipe_whose_defaults_are_missing_is_named(tmp_path, capsys) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("defaults: grpo_math_1B.yaml\npolicy:\n  model_name: Qwen/Qwen3-8B\n")
    assert main(["import", "nemo-rl", str(recipe), "-o", str(tmp_path / "j.yaml")]) == 2
    err = capsys.readouterr().err
    assert "defaults: 'grpo_math_1B.yaml' not found" in err and "Traceback" not in err


def _recipe_on_8b(tmp_path: Path, vllm: str) -> Path:
    """A recipe on grpo_math_8B_megatron.yaml (copied beside it) with its own vLLM lines."""
    for f in NEMO_RL_CONFIGS.glob("*.yaml"):  # the defaults chain
        (tmp_path / f.name).write_text(f.read_text())
    recipe = tmp_path / "r.yaml"
    recipe.write_text("defaults: grpo_math_8B_megatron.yaml\npolicy:\n  generation:\n" + vllm)
    return recipe


def test_a_recipes_engine_settings_become_the_jobs(tmp_path: Path) -> None:
    # the FP8 DeepSeek-V3 performance recipe's form (NVIDIA-NeMo/RL v0.6.0 @5fb58893
    # grpo-deepseek-v3-64n8g-async-1off.yaml:25, -fp8-async-1off.yaml:24)
    recipe = _recipe_on_8b(tmp_path, "    vllm_cfg:\n      gpu_memory_utilization: 0.8\n"
                                     "    vllm_kwargs:\n      max_num_seqs: 32\n")
    data, _ = _current(recipe.read_text(), import_nemo_rl, str(recipe))
    assert data["engine"] == {"memory_fraction": 0.8, "max_num_seqs": 32}


def test_a_bad_engine_share_in_a_recipe_is_named(tmp_path: Path, capsys) -> None:
    recipe = _recipe_on_8b(tmp_path, "    vllm_cfg:\n      gpu_memory_utilization: 1.5\n")
    assert main(["import", "nemo-rl", str(recipe), "-o", str(tmp_path / "j.yaml")]) == 2
    err = capsys.readouterr().err
    assert "policy.generation.vllm_cfg.gpu_memory_utilization" in err and "1.5" in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------------------- Miles
@pytest.mark.parametrize("name", ["grpo-qwen7b-h100", "grpo-qwen3-30b-a3b", "ppo-34b-a100"])
def test_miles_export_parses_with_its_arguments_and_imports_back(name: str) -> None:
    plan = _plan(name, "miles")
    export = export_miles(plan)
    (script,) = export.files.values()
    assert "Miles 0.1.0 @31f1ca96" in export.version and export.version in script
    argv = shlex.split(export.command)
    args = miles_parse(argv[2:])
    r = plan.roles["rollout"]
    assert args.rollout_num_gpus_per_engine == r.tp * r.pp
    assert args.micro_batch_size >= 1 and args.rollout_batch_size == plan.spec.batch.prompts
    if not args.colocate:  # Miles divides the rollout GPUs into whole engines
        assert args.rollout_num_gpus % args.rollout_num_gpus_per_engine == 0
    data, _ = _current(script, import_miles, "run-miles.sh")
    _same_layout(plan, data["current"], ("actor", "rollout"))
    assert data["algorithm"] == plan.spec.algorithm
    assert bool(args.colocate) == (plan.roles["rollout"].slot == plan.roles["actor"].slot)


def test_miles_argument_check_can_fail() -> None:
    with pytest.raises(SystemExit):
        miles_parse(["--rollout-batch-size", "x"])
    with pytest.raises(SystemExit):
        miles_parse(["--advantage-estimator", "dpo"])
    with pytest.raises(SystemExit):
        miles_parse(["--no-such-flag"])


# script -> (model, actor GPUs, actor layout, rollout GPUs and engine TP, colocated)
SCRIPTS = {
    "run-qwen3-4b-mis.sh": ("Qwen3-4B", 8, {"tp": 2, "cp": 2}, (8, 1), True),
    "run_qwen3_4B.sh": ("Qwen3-4B", 2, {"tp": 2}, (2, 1), True),
    "run-qwen3-8B-opd-megatron.sh": ("Qwen3-8B", 2, {"tp": 2}, (4, 1), False),
}


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_miles_scripts_from_its_repository_import(script: str) -> None:
    model, gpus, layout, (r_devices, r_tp), together = SCRIPTS[script]
    data, notes = _current((MILES / script).read_text(), import_miles, script)
    cur = data["current"]["roles"]
    assert data["models"]["policy"] == model and data["models"]["use_reference"]
    assert data["framework"] == "miles"
    assert cur["actor"]["devices"] == gpus
    assert {k: v for k, v in cur["actor"].items() if k in ("tp", "pp", "cp", "ep")} == layout
    assert (cur["rollout"]["devices"], cur["rollout"]["tp"]) == (r_devices, r_tp)
    assert any({"actor", "rollout"} <= set(g) for g in data["current"]["colocate"]) is together
    assert any("MODEL_ARGS" in n for n in notes)  # the flags it fills at run time, said


@pytest.mark.parametrize("script", ["run-qwen3-4b-mis.sh", "run-qwen3-8B-opd-megatron.sh"])
def test_imported_miles_script_compares_against_its_placement(script, tmp_path, capsys) -> None:
    assert main(["import", "miles", str(MILES / script), "-o", str(tmp_path / "job.yaml")]) == 0
    data = yaml.safe_load((tmp_path / "job.yaml").read_text())
    capsys.readouterr()
    _compare_ok(tmp_path, data, capsys)


def test_a_miles_variable_the_script_does_not_set_is_asked_for(tmp_path, capsys) -> None:
    script = tmp_path / "run.sh"
    script.write_text("ARGS=(\n  --rollout-batch-size 8  # prompts (per step)\n"
                      "  --n-samples-per-prompt 4\n)\n"
                      "python3 train.py --hf-checkpoint /m/Qwen3-4B --colocate \\\n"
                      "  --actor-num-gpus-per-node ${GPUS} ${ARGS[@]}\n")
    out = tmp_path / "job.yaml"
    assert main(["import", "miles", str(script), "-o", str(out)]) == 2
    assert "--set GPUS=VALUE" in capsys.readouterr().err
    assert main(["import", "miles", str(script), "-o", str(out), "--set", "GPUS=4"]) == 0
    data = yaml.safe_load(out.read_text())
    assert data["current"]["roles"]["actor"]["devices"] == 4 and data["batch"]["prompts"] == 8


# ------------------------------------------------------------------- refusals and warnings
@pytest.mark.parametrize("framework", ["nemo-rl", "miles"])
def test_hsdp_and_split_plans_are_refused_naming_the_field(framework, tmp_path, capsys) -> None:
    from simplans import example_plan

    for name, field in (("grpo-qwen3-next", "roles.actor.shard"),
                        ("hetero-split", "roles.rollout.parts")):
        path = tmp_path / f"{name}.json"
        path.write_text(example_plan(name).model_dump_json())
        assert main(["export", framework, str(path)]) == 2
        err = capsys.readouterr().err
        assert field in err and len(err.strip().splitlines()) == 1, err


def test_data_parallel_attention_is_vllms_dp_inside_the_engine_and_types_are_warned() -> None:
    """NeMo-RL runs vLLM DP x TP with EP over both (EP = DP x TP): the plan's attention groups
    are expressed, not dropped; the GPU types of two pools are a warning naming `cluster`."""
    plan = _plan("grpo-qwen3-30b-a3b", "nemo-rl")
    r = plan.roles["rollout"]
    assert r.attn_dp > 1 and r.ep == r.tp
    export = export_nemo_rl(plan)
    vllm = yaml.safe_load(next(iter(export.files.values())))["policy"]["generation"]["vllm_cfg"]
    assert (vllm["tensor_parallel_size"], vllm["expert_parallel_size"]) == (r.par.attn_tp, r.ep)
    assert not any("attn_dp" in w for w in export.warnings)
    assert any(w.startswith("cluster: NeMo-RL sizes pools in GPUs") for w in export.warnings)


def test_cli_writes_the_recipe_and_the_script_and_names_the_version(tmp_path, capsys) -> None:
    path = tmp_path / "plan.json"
    path.write_text(_plan("grpo-qwen7b-h100", "nemo-rl").model_dump_json())
    recipe = tmp_path / "grpo-placer.yaml"
    assert main(["export", "nemo-rl", str(path), "-o", str(recipe), "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["version"] == "NeMo-RL 0.6.0" and "written for NeMo-RL 0.6.0" in out.err
    assert recipe.read_text() == next(iter(doc["files"].values()))
    assert not recipe.stat().st_mode & 0o111  # a recipe, not a program
    script = tmp_path / "run.sh"
    assert main(["export", "miles", str(path), "-o", str(script)]) == 0
    assert script.stat().st_mode & 0o100 and "python3 train.py" in capsys.readouterr().out


def test_without_output_the_recipe_itself_is_printed(tmp_path, capsys) -> None:
    path = tmp_path / "plan.json"
    path.write_text(_plan("grpo-qwen7b-h100", "nemo-rl").model_dump_json())
    assert main(["export", "nemo-rl", str(path)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["defaults"].startswith("grpo_math_1B") and "policy" in printed
