"""One agent of a multi-agent job seen as a single-policy job: what its own roles must hold.

Each agent's roles (actor, engines, reference, reward) are sized as a single-policy job's are,
on the agent's own view of the episode (`agent_job`): its policy and reward; a prompt that
already holds every turn taken before its first (their mean tokens); its own response length
per turn; and, when it takes several turns, the other agents' turns between two of its own as
the context it reads in between (the role `tool_output_tokens` plays for a tool). The wait for
the other agents is not the agent's work, so its stand-in tool call takes no time worth
pricing (`GAP_LATENCY_S`). The other agents' turns count at their mean lengths, the agent's own
at its distribution; `placer validate` shows per agent the sizes drawn from this view (memory
floors, the longest context, the layouts that fit).
"""
from __future__ import annotations

from placer.spec.agents import Agents
from placer.spec.distributions import Distribution
from placer.spec.job import Job
from placer.spec.sections import Environment, Models

GAP_LATENCY_S = 1e-9  # the stand-in tool call between an agent's turns: no work of its own


def turn_means(job: Job) -> list[float]:
    """Mean tokens generated at each turn of the schedule (by the agent whose turn it is)."""
    agents = _agents(job)
    return [job.response_of(t).mean_value() for t in agents.turns]


def gaps_of(job: Job, name: str) -> tuple[float, list[float]]:
    """(mean tokens before the agent's first turn, mean tokens the other agents generate
    between each two of its consecutive turns)."""
    agents = _agents(job)
    means = turn_means(job)
    mine = [i for i, t in enumerate(agents.turns) if t == name]
    before = sum(means[:mine[0]])
    between = [sum(means[a + 1:b]) for a, b in zip(mine, mine[1:])]
    return before, between


def agent_job(job: Job, name: str) -> Job:
    """Agent `name`'s own view of the episode as a single-policy job (see the module text)."""
    agents = _agents(job)
    a = agents.members[name]
    models = Models(policy=a.policy, reference=a.reference,
                    reward="rule" if a.reward == "none" else a.reward,
                    use_reference=a.trained and a.use_reference)
    before, between = gaps_of(job, name)
    prompt = job.lengths.prompt.model_copy(update={"offset": job.lengths.prompt.offset + before})
    lengths = job.lengths.model_copy(update={"prompt": prompt, "response": job.response_of(name)})
    env = Environment()
    if between:
        env = Environment(kind="tool", turns=len(between) + 1,
                          tool_latency_s=Distribution(kind="fixed", value=GAP_LATENCY_S),
                          tool_output_tokens=int(round(sum(between) / len(between))))
    return job.model_copy(update={"name": f"{job.name}.{name}", "models": models,
                                  "lengths": lengths, "environment": env, "agents": None})


def _agents(job: Job) -> Agents:
    assert job.agents is not None, "a single-policy job has no agents"
    return job.agents
