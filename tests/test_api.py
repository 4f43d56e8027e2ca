"""The Python API (`import placer; placer.plan(job)`): the CLI's commands as functions, the same
results as the CLI, and `placer --version`."""
from __future__ import annotations

import json
import subprocess

import pytest

import placer
from placer import api
from placer.base.errors import SpecError
from placer.solve.planfile import Plan

TINY = "examples/tiny-cpu.yaml"


def test_plan_takes_a_path_a_job_or_a_dict_and_matches_the_cli(placer_cmd, tmp_path) -> None:
    job = placer.load_job(TINY)
    by_path = placer.plan(TINY, time_limit=5)
    assert isinstance(by_path, Plan)
    assert placer.plan(job, time_limit=5).roles == by_path.roles
    assert placer.plan(job.model_dump(mode="json"), time_limit=5).roles == by_path.roles
    out = subprocess.run(placer_cmd + ["plan", TINY, "--json", "--time-limit", "5"],
                         capture_output=True, text=True)
    cli = Plan.model_validate(json.loads(out.stdout))
    assert cli.roles == by_path.roles
    assert cli.predicted_iteration_s == pytest.approx(by_path.predicted_iteration_s)
    # the plan file's module (placer.solve.planfile) does not shadow the API's call
    assert placer.plan is api.plan and placer.plan.__module__ == "placer.api"


def test_compare_ranks_ilp_first_and_simulate_runs() -> None:
    plans = placer.compare(TINY, time_limit=5)
    assert "ilp" in plans and "colocated" in plans
    times = [p.predicted_iteration_s for p in plans.values() if p is not None]
    assert times == sorted(times)
    assert plans["ilp"].predicted_iteration_s == min(times)
    sim = placer.simulate(plans["ilp"], iterations=1)
    assert sim.metrics.iterations == 1


def test_export_and_import_run(tmp_path) -> None:
    plan = placer.plan(TINY, time_limit=5)
    ex = placer.export(plan, "openrlhf")
    assert ex.command.startswith("python3 -m openrlhf.cli.train_ppo_ray")
    with pytest.raises(SpecError, match="framework"):
        placer.export(plan, "slime")
    job = placer.import_run("openrlhf", "--actor.model_name_or_path Qwen/Qwen3-8B "
                            "--algo.advantage.estimator group_norm "
                            "--rollout.n_samples_per_prompt 4", device="H100-SXM")
    assert job.current is not None and job.models.policy == "Qwen3-8B"


def test_errors_are_the_clis() -> None:
    with pytest.raises(SpecError):
        placer.plan("examples/does-not-exist.yaml")
    with pytest.raises(AttributeError):
        _ = placer.no_such_command


def test_version(placer_cmd) -> None:
    out = subprocess.run(placer_cmd + ["--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"placer {placer.__version__}"


def test_execute_plans_a_job_first() -> None:
    """`placer.execute(job)` runs what `placer.plan(job)` gives (a run: tests/test_exec_grpo.py)."""
    by_path = placer.plan(TINY, time_limit=5)
    assert api._planned(TINY).roles == by_path.roles
    assert api._planned(placer.load_job(TINY)).roles == by_path.roles
    assert api._planned(by_path) is by_path


@pytest.mark.ray
@pytest.mark.slow  # tests/test_exec_grpo.py runs its Ray through placer.execute and checks this
def test_execute_stops_the_ray_it_started(tmp_path) -> None:
    """A notebook's kernel outlives the run: the embedded Ray must not (killed with the kernel,
    Ray's SIGTERM handler prints stack traces)."""
    ray = pytest.importorskip("ray")
    seen = []
    run = placer.execute(TINY, steps=1, out=tmp_path / "run", on_step=seen.append)
    assert [s.step for s in seen] == [0] and run.ledger_ok
    assert not ray.is_initialized()


def test_examples_are_found_from_the_package_whatever_the_directory(tmp_path, monkeypatch) -> None:
    """`placer.example(NAME)` does not depend on the working directory (the notebooks use it
    from a copy of notebooks/ anywhere); a bad name or folder is one SpecError naming it."""
    monkeypatch.chdir(tmp_path)
    root = placer.examples_dir()
    assert (root / "tiny-cpu.yaml").is_file() and root.is_absolute()
    assert placer.example("tiny-cpu.yaml") == root / "tiny-cpu.yaml"
    assert placer.load_job(placer.example("tiny-cpu.yaml")).name == "tiny-cpu"
    assert placer.example("published").is_dir()
    with pytest.raises(SpecError, match="'no-such.yaml': no such example .*tiny-cpu.yaml"):
        placer.example("no-such.yaml")
    with pytest.raises(SpecError, match="not a path inside"):
        placer.example("../pyproject.toml")
    monkeypatch.setenv("PLACER_EXAMPLES", str(tmp_path))
    (tmp_path / "mine.yaml").write_text("name: mine\n")
    assert placer.example("mine.yaml") == tmp_path / "mine.yaml"
    monkeypatch.setenv("PLACER_EXAMPLES", str(tmp_path / "nowhere"))
    with pytest.raises(SpecError, match=r"nowhere: no such folder \(from \$PLACER_EXAMPLES"):
        placer.examples_dir()
