"""The roles of an RL iteration: a leaf module that imports nothing of the project.

`Role` is a `StrEnum`, so a role compares equal to its name (`Role.ACTOR == "actor"`) and
serialises as that name in plans, traces and JSON; code that still holds a bare string keeps
working while every new line names the role through the enum.
"""
from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    ACTOR = "actor"  # policy training
    ROLLOUT = "rollout"  # generation
    REFERENCE = "reference"  # frozen policy for the KL term
    REWARD = "reward"  # reward model or rule/verifier
    CRITIC = "critic"  # PPO value model
    ENVIRONMENT = "environment"  # tool calls and code execution between turns


TRAINING_ROLES: frozenset[Role] = frozenset({Role.ACTOR, Role.CRITIC})


def base_role(name: str) -> str:
    """The role a plan's role name runs: `actor` of `solver.actor` (a multi-agent job's
    `AGENT.ROLE`), the name itself otherwise."""
    return name.rpartition(".")[2]


def is_training(name: str) -> bool:
    """Whether a role name (`actor`, `solver.actor`) trains its model."""
    return base_role(name) in TRAINING_ROLES
