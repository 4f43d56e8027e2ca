"""`placer execute`: bad input exits 2 with one line naming the field; a real run prints one
JSON document on stdout (progress on stderr), writes the trace and says which pools are emulated.
"""
from __future__ import annotations

import json
import re

import pytest
from exec_util import GRPO_LAYOUT, GRPO_STEPS, hand_plan

from placer.cli import main
from placer.solve.planfile import save_plan
from traces.schema import read_trace


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "plan.json"
    save_plan(hand_plan(GRPO_LAYOUT), path)
    return path


@pytest.mark.parametrize("argv, needle", [
    (["execute", "missing.json"], "missing.json: no such file"),
    (["execute", "{plan}", "--steps", "0"], "--steps: must be at least 1 (got 0)"),
    (["execute", "{plan}", "--backend", "tpu"], "--backend: unknown backend 'tpu'"),
    (["execute", "{plan}", "--max-restarts", "-1"], "--max-restarts: must be >= 0"),
    (["execute", "{plan}", "--deadline", "reward=1"], "--deadline: role must be rollout or"),
    (["execute", "{plan}", "--deadline", "rollout=0"], "--deadline: seconds must be a positive"),
])
def test_bad_arguments_exit_2(plan_file, capsys, argv, needle) -> None:
    rc = main([a.replace("{plan}", str(plan_file)) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_corrupt_plan_names_the_field(tmp_path, plan_file, capsys) -> None:
    doc = json.loads(plan_file.read_text())
    doc["roles"]["actor"]["dp"] = 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["execute", str(bad)]) == 2
    assert "roles.actor.dp" in capsys.readouterr().err


def test_too_large_model_is_refused(tmp_path, plan_file, capsys) -> None:
    doc = json.loads(plan_file.read_text())
    doc["job"]["models"]["policy"] = "Llama-3-8B"
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    rc = main(["execute", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "plan.job.models.policy" in err


@pytest.mark.ray
def test_execute_runs_and_prints_one_json_document(grpo_cli_run) -> None:
    """The suite's shared CLI run (tests/conftest.py): `placer execute PLAN --steps 12 --resume
    --json --trace T --out O`, two steps after the shared API run's ten."""
    doc, stderr = grpo_cli_run.doc, grpo_cli_run.stderr
    assert [s["step"] for s in doc["steps"]] == [GRPO_STEPS, GRPO_STEPS + 1]
    assert doc["ledger_balanced"] and set(doc["emulated_pools"]) == {"gpu", "lpu"}
    assert f"step {GRPO_STEPS}: reward" in stderr and "emulated" in stderr
    assert all(r["on_plan_node"] and r["in_bundle"] for r in doc["placement"])
    assert read_trace(grpo_cli_run.trace).metadata["source"] == "execute"


@pytest.mark.ray
def test_execute_names_its_set_up_on_stderr(grpo_cli_run) -> None:
    """Under --json (no bar) stderr gets a line as each set-up phase begins, in order, before
    the first step's line; the document times them, and they add up to the set-up time."""
    stderr, doc = grpo_cli_run.stderr, grpo_cli_run.doc
    phases = ["checking the plan", "preparing the initial model", "starting Ray",
              "reserving placement groups", "starting actors, loading models",
              "checking placement", "forming the trainers' process group",
              f"restoring the checkpoint of step {GRPO_STEPS - 1}"]  # a resumed run's last
    said = re.findall(r"^set-up [0-9.]+s: (.+)$", stderr, re.M)
    assert said == phases, stderr[-2000:]
    assert stderr.index(f": {phases[-1]}") < stderr.index(f"step {GRPO_STEPS}: reward")
    assert [p["phase"] for p in doc["setup_phases"]] == phases
    assert doc["setup_s"] == pytest.approx(sum(p["s"] for p in doc["setup_phases"]), abs=0.05)
    means = doc["mean_per_step"]
    for step in doc["steps"]:
        for role, wall in step["role_wall_s"].items():
            assert wall <= step["step_s"] and step["role_rank_s"][role] >= wall
    assert set(means["role_wall_s"]) == set(means["role_rank_s"]) >= {"actor", "rollout"}
    assert set(means["role_device_s"]) == set(means["role_rank_s"])


@pytest.mark.ray
def test_execute_reports_the_rl_statistics(grpo_cli_run) -> None:
    """Every step's RL statistics (traces/schema.py RL_SERIES: clip and truncation fractions,
    KL, entropy, gradient norm, response lengths and rewards) are in the --json document, in
    the trace as one `rl` counter per step with the same values, and on the step's line."""
    from traces.schema import RL_SERIES
    doc, trace = grpo_cli_run.doc, read_trace(grpo_cli_run.trace)
    counters = [c for c in trace.counters if c.name == "rl"]
    assert len(counters) == len(doc["steps"]) == 2
    for step, c in zip(doc["steps"], counters):
        rl = step["rl"]
        assert set(rl) == set(RL_SERIES) == set(c.values)
        assert rl == {k: pytest.approx(v, abs=1e-6) for k, v in c.values.items()}
        assert 0 <= rl["clip_frac"] <= 1 and 0 <= rl["tis_truncated"] <= 1
        assert rl["entropy"] > 0 and rl["grad_norm"] > 0  # a live policy and a real step
        assert rl["kl"] >= 0  # k3 (the default estimator) is never negative
        assert rl["response_len_min"] <= rl["response_len_mean"] <= rl["response_len_max"]
        assert rl["reward_min"] <= rl["reward_mean"] <= rl["reward_max"]
        assert rl["reward_mean"] == pytest.approx(step["reward"], abs=1e-4)
    steps = re.findall(r"^step \d+: .*\| kl [0-9.]+ entropy [0-9.]+ clip .* grad-norm [0-9.]+",
                       grpo_cli_run.stderr, re.M)
    assert len(steps) == 2, grpo_cli_run.stderr[-2000:]
