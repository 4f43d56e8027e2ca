"""A multi-agent episode as the executor builds it (`executors.agents`): the turn schedule with
each agent's budget, the shared context every turn reads, and each agent's own training
samples (its turns in the loss, the other agents' as context). Pure functions: no workers."""
from __future__ import annotations

from pathlib import Path

import pytest

from executors.agents import Episode, Turn, agent_samples, roles_by_agent, turn_plan
from placer.spec.load import load_job

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "multiagent-tiny-cpu.yaml"


def _plan() -> list[Turn]:
    job = load_job(TINY)
    assert job.agents is not None
    return turn_plan(job.agents, job.lengths.response)


def test_turns_follow_the_schedule_with_each_agents_budget() -> None:
    assert _plan() == [Turn(0, "solver", 8), Turn(1, "verifier", 4), Turn(2, "solver", 8)]


def test_each_turn_reads_the_whole_episode_so_far() -> None:
    turns = _plan()
    e = Episode([1, 2])
    assert e.context() == [1, 2]
    e.append(turns[0], [3, 4], [-0.1, -0.2])
    assert e.context() == [1, 2, 3, 4]
    e.append(turns[1], [5], [-0.3])
    e.append(turns[2], [6, 7], [-0.4, -0.5])
    assert e.context() == [1, 2, 3, 4, 5, 6, 7]
    assert e.last_of("solver") == [6, 7] and e.last_of("verifier") == [5]
    assert e.last_of("nobody") == []


def test_turns_run_only_in_schedule_order() -> None:
    turns = _plan()
    e = Episode([1])
    with pytest.raises(ValueError, match="turn 1 .verifier. appended after 0"):
        e.append(turns[1], [5], [-0.3])
    e.append(turns[0], [3], [-0.1])
    with pytest.raises(ValueError, match="turn 0"):
        e.append(turns[0], [3], [-0.1])  # the same turn twice
    with pytest.raises(ValueError, match="2 tokens, 1 log-probs"):
        e.append(turns[1], [5, 6], [-0.3])


def test_each_agent_trains_on_its_own_turns_only() -> None:
    turns = _plan()
    e = Episode([1, 2])
    e.append(turns[0], [3, 4], [-0.1, -0.2])
    e.append(turns[1], [5], [-0.3])
    e.append(turns[2], [6], [-0.4])
    solver = agent_samples([e], ["s0"], ["p0"], "solver", 3)
    verifier = agent_samples([e], ["s0"], ["p0"], "verifier", 2)
    for s in (solver, verifier):  # both read the same episode
        assert s.prompts == [[1, 2]] and s.responses == [[3, 4, 5, 6]] and s.group == ["p0"]
    assert solver.gen_mask == [[1, 1, 0, 1]] and solver.logprobs == [[-0.1, -0.2, 0.0, -0.4]]
    assert verifier.gen_mask == [[0, 0, 1, 0]] and verifier.logprobs == [[0.0, 0.0, -0.3, 0.0]]
    assert (solver.version, verifier.version) == (3, 2)
    assert solver.generated_tokens() == 3 and verifier.generated_tokens() == 1
    assert solver.answer(0) == [6]  # after the last token it did not generate


def test_roles_group_by_agent() -> None:
    got = roles_by_agent(["solver.actor", "solver.rollout", "verifier.actor", "environment"])
    assert got == {"solver": {"actor": "solver.actor", "rollout": "solver.rollout"},
                   "verifier": {"actor": "verifier.actor"}, "": {"environment": "environment"}}
