"""Multi-agent jobs: the `agents:` section, its graph checks, each agent's own view of the
episode (`placer.spec.agentjob`) and `placer validate` per agent. Pure functions and in-process
CLI calls only (fast). The bad agent graphs of the issue are files under tests/bad_jobs/
(agent_*), run through the CLI by tests/test_bad_input.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from placer.base.inputs import SpecErrors
from placer.cli import main
from placer.spec.agentjob import agent_job, gaps_of
from placer.spec.agents import split_role
from placer.spec.load import dump_job, job_from_dict, load_job

HERE = Path(__file__).resolve().parent
JOB = HERE.parent / "examples" / "multiagent-solver-verifier.yaml"


def _raw() -> dict:
    return yaml.safe_load(JOB.read_text())


def test_roles_are_named_per_agent_and_models_follow_the_first_turn() -> None:
    job = load_job(JOB)
    assert job.role_names() == [
        "solver.actor", "solver.rollout", "solver.reference", "solver.reward",
        "verifier.actor", "verifier.rollout", "verifier.reward"]  # the verifier: no KL term
    assert job.models.policy == "Qwen2.5-7B"  # the solver takes the first turn
    assert split_role("solver.rollout") == ("solver", "rollout")
    assert split_role("rollout") == (None, "rollout")


def test_a_frozen_agent_runs_engines_only_and_a_none_reward_has_no_reward_role() -> None:
    raw = _raw()
    raw["agents"]["members"]["verifier"].update(trained=False, reward="none")
    job = job_from_dict(raw)
    assert [r for r in job.role_names() if r.startswith("verifier.")] == ["verifier.rollout"]


def test_each_agent_reads_the_turns_before_it() -> None:
    """The verifier's prompt holds the solver's first turn; the solver reads the verifier's
    turn between its two (as the context a tool would add)."""
    job = load_job(JOB)
    solver_mean = job.response_of("solver").mean_value()
    verifier_mean = job.response_of("verifier").mean_value()
    assert gaps_of(job, "verifier") == (pytest.approx(solver_mean), [])
    assert gaps_of(job, "solver") == (0.0, [pytest.approx(verifier_mean)])
    v = agent_job(job, "verifier")
    assert v.agents is None and v.models.policy == "Qwen3-4B"
    assert v.lengths.prompt.mean_value() == pytest.approx(
        job.lengths.prompt.mean_value() + solver_mean)
    assert v.environment.turns == 1
    s = agent_job(job, "solver")
    assert (s.environment.turns, s.environment.tool_output_tokens) == (2, round(verifier_mean))
    # the longest context: every turn at its longest, after the prompt
    assert job.max_context == 1024 + 2048 + 1024 + 2048


def test_a_single_policy_job_dumps_without_agents() -> None:
    job = load_job(HERE.parent / "examples" / "tiny-cpu.yaml")
    assert "agents" not in dump_job(job) and "agents" not in job.model_dump(mode="json")


def test_an_agent_job_round_trips_through_its_dump() -> None:
    job = load_job(JOB)
    assert job_from_dict(dump_job(job)) == job


@pytest.mark.parametrize(("change", "field"), [
    (lambda r: r["agents"]["members"]["solver"].update(policy="GPT-9"),
     "agents.members.solver.policy: unknown model 'GPT-9'"),
    (lambda r: r.update(models={"policy": "Qwen3-4B"}), "models.policy: 'Qwen3-4B'"),
    (lambda r: r["agents"].update(shared_engines=[{"agents": ["solver", "critic"]}]),
     "agents.shared_engines.0.agents: 'critic' is no agent"),
    (lambda r: r["agents"]["members"]["verifier"].update(trained=False, reference="Qwen3-4B"),
     "agents.members.verifier.reference"),
    (lambda r: r.update(environment={"kind": "tool", "turns": 2}), "environment.kind"),
    (lambda r: r.update(tail_policy={"kind": "partial", "token_budget": 4096}),
     "tail_policy.kind"),
    (lambda r: r.update(framework="verl"), "framework"),
    # a turn that is no name (found by tests/test_spec_hypothesis.py): an error, not a TypeError
    (lambda r: r["agents"]["turns"].__setitem__(0, []), "agents.turns.0"),
])
def test_bad_agent_settings_name_the_field(change, field) -> None:
    raw = _raw()
    change(raw)
    with pytest.raises(SpecErrors) as e:
        job_from_dict(raw, "j")
    assert any(line.startswith("j: ") and field in line for line in e.value.lines), e.value.lines


def test_validate_explains_every_agents_roles(capsys) -> None:
    assert main(["validate", str(JOB), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["turns"] == ["solver", "verifier", "solver"]
    assert doc["agents"]["solver"]["turns"] == [0, 2]
    assert doc["agents"]["verifier"]["engines"] == "own"
    roles = doc["roles"]
    assert roles["solver.actor"]["model"] == "Qwen2.5-7B"
    assert roles["verifier.actor"]["model"] == "Qwen3-4B"
    # a 4B actor's floor is below a 7B's (each sized with its own model)
    assert roles["verifier.actor"]["memory_floor_gb"] < roles["solver.actor"]["memory_floor_gb"]
    assert roles["solver.reward"]["min_devices"] == {"cpu": 1}
    assert main(["validate", str(JOB)]) == 0
    text = capsys.readouterr().out
    assert "turns: solver -> verifier -> solver" in text
    assert "agent verifier: Qwen3-4B, trained, 1 turn" in text and "verifier.rollout" in text


def test_plan_places_every_agents_roles_by_their_names(capsys) -> None:
    assert main(["plan", str(JOB), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert list(plan["roles"]) == load_job(JOB).role_names()
    assert all(r in plan["breakdown"]["slot_busy_s"] for r in {v["slot"] for v in
                                                                 plan["roles"].values()})
