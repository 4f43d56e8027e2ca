"""A sample's trajectory in the executor: prompt, the policy's turns and the tool outputs between them.

What a rollout worker continues (prompt + response so far, prefilled), what the partial-rollout
carry holds between steps and checkpoints (`to_dict` / `from_dict`), and what becomes a training
sample (`as_samples`: tool tokens masked out of the loss).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from executors import rl
from executors.task import Target


@dataclass
class Traj:
    """One sample's trajectory (the partial-rollout carry is a list of these)."""

    id: str
    group: str  # its prompt's id (a GRPO group)
    prompt: list[int]
    target: Target
    seed: int
    response: list[int] = field(default_factory=list)  # turns and tool outputs so far
    logprobs: list[float] = field(default_factory=list)  # 0.0 on tool tokens
    mask: list[int] = field(default_factory=list)  # 1: the policy generated it; 0: tool output
    turn: int = 0
    turn_start: int = 0  # where the current turn begins in `response`
    started: int | None = None  # policy version of its first token
    version: int | None = None  # policy version of its newest token
    done: bool = False
    done_at: tuple[int, int, int] = (0, 0, 0)  # (round, shard, tokens) it finished with

    @property
    def turn_tokens(self) -> int:
        return len(self.response) - self.turn_start

    def as_samples(self) -> rl.Samples:
        return rl.Samples([self.id], [self.prompt], [self.response], [self.logprobs],
                          self.version or 0, [self.group], [self.started or 0], [self.mask])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Traj:
        return Traj(**{**d, "done_at": tuple(d["done_at"])})
