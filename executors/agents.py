"""A multi-agent episode as the executor builds it: whose turn, what it reads, what each agent trains on.

A multi-agent job (`placer.spec.agents`) runs every sample's episode as the job's turn schedule
(solver -> verifier -> solver): each turn is generated on the engines of the agent whose turn it
is, reading the whole episode so far (the prompt, then every earlier turn of every agent), and
its response is appended to that shared context. Each agent is then trained on its own samples:
the whole episode as the response, with only its own turns' tokens in the loss (`gen_mask` 1)
and the other agents' turns as context (mask 0, log-prob 0.0), exactly as a single policy's
multi-turn sample masks its tool outputs (`executors.trajectory`).

The pieces here are pure functions over plain lists (no worker, no Ray), so that the schedule,
the shared context and each agent's sample are tested on their own:

  turn_plan        the schedule as `Turn`s: index, agent, that agent's token budget;
  Episode          one sample's episode: its prompt and turns so far, the next turn's context;
  agent_samples    an agent's training samples from a batch of episodes;
  roles_by_agent   the plan's `AGENT.ROLE` names grouped by agent;
  answerer, judged_turn, literal_result, verdict_score: the agents' rule rewards.

The rule rewards (`reward: rule`). The agent of the episode's last turn answers: its last turn
is the answer, scored by the job's task as a single policy's answer is, except that it is read
as a number rather than run as code (a multi-agent plan has no environment role, so no answer
runs in the sandbox). Every other agent reviews: its last turn is a verdict on the answer just
before it, rewarded when the verdict agrees with the task's exactness of that answer (1.0),
less when it states the wrong verdict (0.4), and by the share of its characters that are verdict
words when it states none (up to 0.2), shaped as the arithmetic task's reward is so that a
random policy gets a signal from its first step.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from executors import rl
from executors.judge import parse_verdict
from placer.spec.agents import Agents, split_role
from placer.spec.distributions import Distribution


@dataclass(frozen=True)
class Turn:
    """One turn of the schedule: its place in the episode, its agent and that agent's budget
    (the most tokens it generates in one turn)."""

    index: int
    agent: str
    max_new_tokens: int


def turn_plan(agents: Agents, default_response: Distribution) -> list[Turn]:
    """The episode's turns in schedule order, each with its agent's per-turn token budget: the
    largest draw of the agent's `response` distribution (the job's `lengths.response` when the
    agent names none)."""
    def budget(name: str) -> int:
        dist = agents.members[name].response or default_response
        return max(int(dist.max_value()), 1)
    return [Turn(i, name, budget(name)) for i, name in enumerate(agents.turns)]


@dataclass
class Episode:
    """One sample's episode: its prompt and the turns generated so far, in schedule order."""

    prompt: list[int]
    agents: list[str] = field(default_factory=list)  # the agent of each turn so far
    turns: list[list[int]] = field(default_factory=list)  # each turn's tokens
    logprobs: list[list[float]] = field(default_factory=list)  # each turn's tokens' log-probs

    def context(self) -> list[int]:
        """What the next turn reads: the prompt, then every turn so far."""
        return self.prompt + [t for turn in self.turns for t in turn]

    def append(self, turn: Turn, tokens: Sequence[int], logprobs: Sequence[float]) -> None:
        """Add turn `turn`'s response; ValueError when it is not the schedule's next turn, or
        its log-probs do not match its tokens (a bug in the driver, never the user's input)."""
        if turn.index != len(self.turns):
            raise ValueError(f"turn {turn.index} ({turn.agent}) appended after "
                             f"{len(self.turns)} turn(s): turns run in schedule order")
        if len(tokens) != len(logprobs):
            raise ValueError(f"turn {turn.index}: {len(tokens)} tokens, {len(logprobs)} "
                             "log-probs")
        self.agents.append(turn.agent)
        self.turns.append(list(tokens))
        self.logprobs.append(list(logprobs))

    def last_of(self, agent: str) -> list[int]:
        """The agent's last turn (its final answer); [] when it has taken none."""
        return next((t for a, t in zip(reversed(self.agents), reversed(self.turns))
                     if a == agent), [])


def agent_samples(episodes: Sequence[Episode], ids: Sequence[str], groups: Sequence[str],
                  agent: str, version: int) -> rl.Samples:
    """Agent `agent`'s training samples: each episode's turns as the response, with the agent's
    own tokens in the loss (mask 1, their log-probs) and every other agent's as context (mask 0,
    log-prob 0.0). `version`: the agent's policy version its turns were generated with."""
    responses, logprobs, masks = [], [], []
    for e in episodes:
        resp: list[int] = []
        lps: list[float] = []
        mask: list[int] = []
        for who, toks, lp in zip(e.agents, e.turns, e.logprobs):
            own = who == agent
            resp += toks
            lps += lp if own else [0.0] * len(toks)
            mask += [int(own)] * len(toks)
        responses.append(resp)
        logprobs.append(lps)
        masks.append(mask)
    return rl.Samples(list(ids), [list(e.prompt) for e in episodes], responses, logprobs,
                      version, list(groups), [version] * len(episodes), masks)


def roles_by_agent(role_names: Iterable[str]) -> dict[str, dict[str, str]]:
    """{agent: {role: full name}} of a multi-agent plan's `AGENT.ROLE` names, in their order;
    a name without an agent (a shared role such as `environment`) is under the key ''."""
    out: dict[str, dict[str, str]] = {}
    for name in role_names:
        agent, role = split_role(name)
        out.setdefault(agent or "", {})[role] = name
    return out


def answerer(agents: Agents) -> str:
    """The agent whose last turn is the episode's answer: the agent of the last turn."""
    return agents.turns[-1]


def judged_turn(agents: Agents, agent: str) -> int:
    """The turn reviewer `agent`'s verdict is about: the last turn before its last one that
    another agent took; ValueError when it reviews nothing (it takes the first turn only)."""
    last = max(i for i, t in enumerate(agents.turns) if t == agent)
    before = [i for i in range(last) if agents.turns[i] != agent]
    if not before:
        raise ValueError(f"agent {agent!r} takes no turn after another agent's: nothing to "
                         "review")
    return before[-1]


def literal_result(answer: str) -> dict[str, str]:
    """The result an answer gives read as a number (nothing runs): its text when it is one."""
    text = answer.strip()
    try:
        float(text)
    except ValueError:
        return {"status": "error", "value": ""}
    return {"status": "ok", "value": text}


VERDICT_CHARS = set("yesnorightwrongcorrectincorrect /0123456789")


def verdict_score(verdict: str, answer_exact: bool) -> float:
    """A reviewer's reward: 1.0 when its stated verdict (`executors.judge.parse_verdict`: a
    score, a final yes or no) agrees with the answer's exactness, 0.4 when it states the wrong
    one, else 0.2 x the share of its characters that verdicts are written in."""
    stated = parse_verdict(verdict)
    if stated is not None:
        return 1.0 if (stated >= 0.5) == answer_exact else 0.4
    if not verdict:
        return 0.0
    return 0.2 * sum(c in VERDICT_CHARS for c in verdict.lower()) / len(verdict)
