"""`placer import verl|openrlhf`: a run's configuration -> a job whose `current` placement
`placer compare` prices beside the ILP's; export -> import keeps the placement."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from simplans import example_plan

from placer.base.errors import SpecError
from placer.interop.importers import import_openrlhf, import_verl
from placer.interop.openrlhf import export_openrlhf
from placer.interop.verl import export_verl
from placer.spec.load import job_from_dict

DATA = Path(__file__).resolve().parent / "data" / "verl"
MEGATRON = DATA / "run_qwen2_5-7b_math_megatron_diff_tp.sh"


def _compare(placer_cmd, job: Path) -> dict:
    out = subprocess.run(placer_cmd + ["compare", str(job), "--json", "--time-limit", "3"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_verl_example_round_trips_to_a_compared_job(tmp_path, placer_cmd) -> None:
    job = tmp_path / "job.yaml"
    out = subprocess.run(placer_cmd + ["import", "verl", str(MEGATRON), "-o", str(job)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "placer: assumed: device:" in out.stderr
    data = yaml.safe_load(job.read_text())
    assert data["models"]["policy"] == "Qwen2.5-7B"  # Qwen/Qwen2.5-7B-Instruct's architecture
    assert data["batch"] == {"prompts": 1024, "samples_per_prompt": 5, "mini_batches": 4}
    assert data["lengths"]["response"]["cap"] == 1024
    cur = data["current"]
    assert cur["roles"]["actor"] == {"pool": "gpu", "devices": 8, "tp": 2, "pp": 2,
                                     "offload": False}
    assert cur["roles"]["rollout"]["tp"] == 4
    assert ["actor", "rollout", "reference"] in cur["colocate"]
    doc = _compare(placer_cmd, job)
    row = doc["plans"]["current"]
    assert row["applicable"] and "current" in doc["ranking"]
    assert row["placement"]["actor"].startswith("gpux8 tp2 pp2")
    assert row["placement"]["rollout"].startswith("gpux8 tp4")
    # the ILP's space holds this placement: it can only be as fast or faster
    assert doc["plans"]["ilp"]["predicted_iteration_s"] <= row["predicted_iteration_s"] * (1 + 1e-6)


def test_verl_export_then_import_keeps_the_placement() -> None:
    plan = example_plan("grpo-qwen7b-h100")
    overrides = export_verl(plan).files["overrides.yaml"]
    data, _ = import_verl(overrides, "overrides.yaml", device="H100-SXM")
    job = job_from_dict(data)
    assert job.current is not None
    for role in ("actor", "rollout", "reference"):
        want, got = plan.roles[role], job.current.roles[role]
        assert (got.devices, got.tp, got.pp) == (want.devices, want.tp, want.pp), role
    assert job.batch == plan.spec.batch
    assert job.lengths.response.max_value() == plan.spec.lengths.response.max_value()


def test_verl_split_rollout_is_its_own_pool_and_async() -> None:
    text = ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
            "actor_rollout_ref.model.path=Qwen/Qwen3-8B trainer.nnodes=2 trainer.n_gpus_per_node=8 "
            "actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node=8 "
            "trainer.use_v1=true trainer.v1.trainer_mode=separate_async "
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1 data.train_batch_size=64 "
            "actor_rollout_ref.rollout.n=4")
    data, _ = import_verl(text, "cmd")
    job = job_from_dict(data)
    assert job.pipeline.mode == "async"
    assert [p.name for p in job.cluster.pools] == ["gpu", "cpu", "rollout"]
    assert job.current.roles["rollout"].pool == "rollout"
    assert job.current.roles["rollout"].devices == 8
    assert not any("rollout" in g for g in job.current.colocate)


def test_openrlhf_export_then_import_keeps_the_placement(tmp_path, placer_cmd) -> None:
    plan = example_plan("grpo-qwen7b-h100")  # colocate_all
    # OpenRLHF has no HSDP (the export refuses a shard group); nothing here depends on it
    plan = plan.model_copy(update={"roles": {n: r.model_copy(update={"shard": 0})
                                             for n, r in plan.roles.items()}})
    cmd = export_openrlhf(plan).command
    job = tmp_path / "job.yaml"
    out = subprocess.run(placer_cmd + ["import", "openrlhf", cmd, "-o", str(job)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = yaml.safe_load(job.read_text())
    assert data["current"]["colocate"] == [["actor", "reference", "rollout"]]
    roll, actor = plan.roles["rollout"], plan.roles["actor"]
    assert data["current"]["roles"]["rollout"] == {"pool": "gpu", "devices": roll.devices,
                                                   "tp": roll.tp}
    assert data["current"]["roles"]["actor"]["tp"] == actor.tp  # DeepSpeed AutoTP
    assert data["cluster"]["pools"][0]["nodes"] == 2
    doc = _compare(placer_cmd, job)
    assert doc["plans"]["current"]["applicable"]


def test_openrlhf_underscore_flags_and_separate_groups() -> None:
    """OpenRLHF before 0.11 (its README's Ray PPO example, flags with underscores)."""
    cmd = ("ray job submit -- python3 -m openrlhf.cli.train_ppo_ray --ref_num_nodes 1 "
           "--ref_num_gpus_per_node 2 --reward_num_nodes 1 --reward_num_gpus_per_node 2 "
           "--critic_num_nodes 1 --critic_num_gpus_per_node 2 --actor_num_nodes 1 "
           "--actor_num_gpus_per_node 2 --vllm_num_engines 2 --vllm_tensor_parallel_size 2 "
           "--pretrain OpenRLHF/Llama-3-8b-sft-mixture --reward_pretrain "
           "meta-llama/Meta-Llama-3-8B --micro_train_batch_size 8 --train_batch_size 128 "
           "--rollout_batch_size 1024 --max_samples 100000 --prompt_max_len 1024 "
           "--generate_max_len 1024 --zero_stage 3 --bf16 --init_kl_coef 0.01 "
           "--adam_offload --advantage_estimator gae")
    with pytest.raises(SpecError, match="Llama-3-8b-sft-mixture"):
        import_openrlhf(cmd, "cmd")  # a fine-tune the catalog does not name: said, not guessed
    data, _ = import_openrlhf(cmd.replace("OpenRLHF/Llama-3-8b-sft-mixture",
                                          "meta-llama/Meta-Llama-3-8B"), "cmd")
    job = job_from_dict(data)
    assert job.algorithm == "ppo" and job.models.reward == "Llama-3-8B"
    cur = job.current
    assert {r: cur.roles[r].devices for r in cur.roles if r != "reward"} == {
        "actor": 2, "reference": 2, "critic": 2, "rollout": 4}
    assert cur.roles["reward"].devices == 2 and cur.colocate == []
    assert cur.roles["actor"].offload
    assert job.cluster.pools[0].nodes * job.cluster.pools[0].devices_per_node == 12
    assert job.batch.mini_batches == 8


@pytest.mark.parametrize("argv, message", [
    (["verl", str(DATA / "run_qwen2-7b.sh")], "Qwen/Qwen2-7B-Instruct' is not in the catalog"),
    (["verl", str(MEGATRON), "--device", "H999"], "H999"),
    (["openrlhf", "--actor.model_name_or_path Qwen/Qwen3-8B --algo.advantage.estimator reinforce"],
     "--algo.advantage.estimator"),
    (["verl", "missing.yaml"], "missing.yaml"),
])
def test_bad_input_exits_2(tmp_path, placer_cmd, argv, message) -> None:
    out = subprocess.run(placer_cmd + ["import", *argv, "-o", str(tmp_path / "j.yaml")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("placer: error: ") and message in out.stderr


def test_a_bad_current_section_is_named(tmp_path, placer_cmd) -> None:
    data, _ = import_verl(MEGATRON.read_text(), "x")
    data["current"]["roles"]["rollout"]["pool"] = "nowhere"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(data))
    out = subprocess.run(placer_cmd + ["compare", str(job), "--time-limit", "2"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "job.current.roles.rollout.pool: no pool 'nowhere'" in out.stderr


@pytest.mark.parametrize("framework, text", [
    ("openrlhf", '--actor.model_name_or_path "Qwen/Qwen3-8B'),  # no closing quote
    ("openrlhf", "--actor.model_name_or_path Qwen/Qwen3-8B --vllm.num_engines two"),
    ("openrlhf", "--actor.model_name_or_path Qwen/Qwen3-8B --algo.kl.init_coef [1"),
    ("openrlhf", "--actor.model_name_or_path Qwen/Qwen3-8B --data.max_len 100 "
                 "--rollout.max_new_tokens 100"),
    ("openrlhf", "--actor.model_name_or_path [a, b]"),
    ("verl", "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen3-8B "
             "trainer.nnodes=-1"),
    ("verl", "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen3-8B "
             "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=x "
             "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4"),
    ("verl", "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path={ "),
    ("verl", "data:\n  train_batch_size: many\nactor_rollout_ref: {model: {path: Qwen/Qwen3-8B}}"),
    ("verl", "- a list"),
])
def test_hostile_input_is_one_error_line(tmp_path, placer_cmd, framework, text) -> None:
    src = tmp_path / "src.txt"
    src.write_text(text)
    out = subprocess.run(placer_cmd + ["import", framework, str(src), "-o",
                                       str(tmp_path / "j.yaml")], capture_output=True, text=True)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stderr.startswith("placer: error: ")


def test_a_placement_the_cluster_cannot_hold_is_refused_at_import(tmp_path, placer_cmd) -> None:
    """TP x PP = 4 on 2 GPUs: refused when imported (exit 2), not later by compare."""
    src = tmp_path / "run.sh"
    src.write_text(MEGATRON.read_text().replace("trainer.nnodes=1",
                                                "trainer.nnodes=1 trainer.n_gpus_per_node=2"))
    out = subprocess.run(placer_cmd + ["import", "verl", str(src), "-o", str(tmp_path / "j.yaml")],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "job.current.roles.actor: devices 2 is not a multiple of tp x pp = 4" in out.stderr
    assert not (tmp_path / "j.yaml").exists()
