"""Several agents in one episode: who takes which turn, what each runs and trains.

A multi-agent job (a solver and a verifier, a proposer and a critic) names its agents in the
job's `agents:` section. Each agent has its own policy model, is trained (an actor, its weight
sync and, optionally, a reference for its KL term) or frozen (engines only), has its own reward
and its own response length per turn. `turns` is the episode's schedule: every sample's episode
runs these turns in order (solver -> verifier -> solver), each on the engines of the agent whose
turn it is, each reading the whole context so far (prompt and every earlier turn).

Agents may share an engine pool (`shared_engines`): either one base model with one LoRA adapter
per agent (`adapters: lora`; the engines hold the base once and batch every agent's turns), or
full weights of one architecture swapped in turn (`adapters: none`; the engines reload weights
whenever the turn passes to another agent). An engine pool serves one architecture, so every
agent on it runs the same policy model. Every role of every agent is named `AGENT.ROLE`
(`solver.actor`, `verifier.rollout`): the names plans, traces and runners use.

Written as the job's `agents:` section, absent for a single-policy job (which reads and plans as
it always did). `check_agents` finds a bad agent graph, one line naming the agent and the field.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StringConstraints

from placer.base.roles import Role
from placer.spec.base import Strict
from placer.spec.distributions import Distribution

AgentName = Annotated[str, StringConstraints(strict=True, pattern=r"^[a-z][a-z0-9_]{0,31}$")]


class Agent(Strict):
    """One agent: the policy it runs, whether it trains, its reward and its turns' lengths."""

    policy: str = Field(description="the agent's policy model (a catalog name)")
    trained: StrictBool = Field(
        True, description="true: an actor trains the policy and syncs its weights to the "
        "agent's engines every step; false: frozen, engines only")
    use_reference: StrictBool = Field(
        True, description="trained agents: a frozen copy of the policy for the KL term")
    reference: str | None = Field(None, description="the reference model; default: the policy")
    reward: str = Field(
        "rule", description="the agent's reward: 'rule' (a verifier on CPU), 'none' (the agent "
        "is scored through another's reward), or a reward model's catalog name")
    response: Distribution | None = Field(
        None, description="tokens the agent generates per turn; default: lengths.response")


class SharedEngines(Strict):
    """One engine pool serving the rollouts of several agents."""

    agents: list[AgentName] = Field(min_length=2, description="the agents whose turns it runs")
    adapters: Literal["lora", "none"] = Field(
        "lora", description="lora: one base model, one LoRA adapter per agent, every agent's "
        "turns batched together; none: each agent's full weights, swapped in at every turn "
        "that passes to another agent")
    adapter_rank: Annotated[int, Field(strict=True, gt=0, le=4096)] = Field(
        64, description="lora: the adapters' rank (sets their bytes and FLOPs)")


class Agents(Strict):
    """The agents of a multi-agent job and the turn schedule of its episodes."""

    members: dict[AgentName, Agent] = Field(
        min_length=1, description="the agents by name (lower-case; roles become NAME.ROLE)")
    turns: list[str] = Field(
        min_length=1, max_length=10_000,
        description="the episode's turns in order, each an agent's name, e.g. [solver, "
        "verifier, solver]")
    shared_engines: list[SharedEngines] = Field(
        [], description="engine pools shared by several agents (LoRA adapters on one base, "
        "or full weights swapped in turn)")

    def turns_of(self, name: str) -> int:
        return sum(1 for t in self.turns if t == name)

    def first(self) -> str:
        """The agent of the first turn (the job's `models` describe its policy)."""
        return self.turns[0]

    def shared_of(self, name: str) -> int | None:
        """Index of the shared engine pool serving `name`'s turns, None for engines of its own."""
        return next((i for i, s in enumerate(self.shared_engines) if name in s.agents), None)

    def roles_of(self, name: str) -> list[Role]:
        """The roles agent `name` runs, in the single-policy job's order."""
        a = self.members[name]
        out = [Role.ACTOR] if a.trained else []
        out.append(Role.ROLLOUT)
        if a.trained and a.use_reference:
            out.append(Role.REFERENCE)
        if a.reward != "none":
            out.append(Role.REWARD)
        return out


def role_name(agent: str, role: str) -> str:
    """The name of an agent's role in plans and traces: `AGENT.ROLE`."""
    return f"{agent}.{role}"


def split_role(name: str) -> tuple[str | None, str]:
    """(agent, role) of a role name; (None, role) for a single-policy job's role."""
    agent, dot, role = name.partition(".")
    return (agent, role) if dot else (None, name)


def model_names(agents: Agents) -> list[tuple[str, str]]:
    """(field path, catalog name) of every model the agents name."""
    out = []
    for name, a in agents.members.items():
        where = f"agents.members.{name}"
        out.append((f"{where}.policy", a.policy))
        if a.reference is not None:
            out.append((f"{where}.reference", a.reference))
        if a.reward not in ("rule", "none"):
            out.append((f"{where}.reward", a.reward))
    return out


def check_agents(agents: Agents, source: str) -> list[str]:
    """One line per mistake in the agent graph, naming the agent and the field: a turn naming
    no agent, an agent that takes no turn, an agent on two shared pools or on one it is not
    among the agents of, a shared pool whose agents run different models, settings that
    mean nothing for a frozen agent. Unknown model names are the catalog's check
    (`placer.spec.catalog.names_used`)."""
    out: list[str] = []
    names = list(agents.members)
    known = ", ".join(names)
    for i, t in enumerate(agents.turns):
        if t not in agents.members:
            out.append(f"{source}: agents.turns.{i}: {t!r} is no agent of the job (agents: "
                       f"{known})")
    for name, a in agents.members.items():
        if name not in agents.turns:
            out.append(f"{source}: agents.members.{name}: agent {name!r} takes no turn in "
                       f"agents.turns ({', '.join(agents.turns)}); add a turn or drop it")
        if not a.trained and (a.reference is not None):
            out.append(f"{source}: agents.members.{name}.reference: agent {name!r} is frozen "
                       "(trained: false) and has no KL term; drop reference")
    seen: dict[str, int] = {}
    for i, pool in enumerate(agents.shared_engines):
        out += _check_shared(agents, i, pool, seen, source, known)
    return out


def _check_shared(agents: Agents, i: int, pool: SharedEngines, seen: dict[str, int],
                  source: str, known: str) -> list[str]:
    """`check_agents` for shared engine pool `i` (`seen`: agent -> the pool it was met on)."""
    out = []
    where = f"{source}: agents.shared_engines.{i}.agents"
    for name in pool.agents:
        if name not in agents.members:
            out.append(f"{where}: {name!r} is no agent of the job (agents: {known})")
        elif name in seen:
            out.append(f"{where}: agent {name!r} is already on shared_engines.{seen[name]}; "
                       "an agent's turns run on one engine pool")
        else:
            seen[name] = i
    members = [n for n in pool.agents if n in agents.members]
    if not members:
        return out
    base = agents.members[members[0]].policy
    for name in members[1:]:
        policy = agents.members[name].policy
        if policy != base:
            how = ("LoRA adapters share one base model" if pool.adapters == "lora" else
                   "without adapters the engines swap full weights of one architecture")
            out.append(f"{where}: agent {name!r} runs {policy!r} but {members[0]!r} runs "
                       f"{base!r} on the same engines; {how}: give them one policy or engines "
                       "of their own")
    return out

