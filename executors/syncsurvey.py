"""The questions a weight refresh asks before any byte moves, asked together.

A refresh under Ray needs, from the trainer's lead rank, the version it holds and whether its
senders stream a kept copy (`weights_info`) and which ranks send for a bucketed or unbucketed
path (`sync_senders`), and from every sender and target engine where its side of a broadcast
lives and its process (`sync_member`: a restarted process is in no group, so the group is
formed anew). Asked one after the other these were a round trip each through Ray, and the
members' twice (once for the protocol, once for the group); here they are issued at once and
waited on once (`ask_survey`). An engine that fails to answer (dead, restarting) is
recorded, not raised: it matters only if the refresh targets it (`missing`), as a refresh
that skips an engine already holding the version never asked it before. An engine still
restarting from an earlier failure (Ray's `ActorUnavailableError`: its call was answered before
the restart finished) is waited for and asked again (`ask_revived`), as a failed rollout call is
re-run on its restarted worker, rather than ending the refresh with a lost-training error.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from executors.context import TrainingLost
from executors.placement import Member
from executors.runtime import Outcome

Members = dict[tuple[str, int], tuple[Any, ...]]  # `sync_member` answers by (role, rank)
ControlCall = tuple[Member, str, tuple[object, ...]]


class Asks(Protocol):
    """What the survey needs of the driver's refresh machinery (`weights.GroupRefresh`):
    calls issued together, waited on once, their outcomes in order."""

    def outcomes(self, calls: Sequence[ControlCall]) -> list[Any]: ...


@dataclass(frozen=True)
class Survey:
    """The answers: the trainer's version figures (`weights_info`; None when not asked), its
    senders per bucketing (`sync_senders`), every member's `sync_member` answer by (role,
    rank), and the error of each engine that did not answer."""

    info: tuple[Any, ...] | None
    senders: dict[bool, list[int]]
    members: Members
    errors: dict[tuple[str, int], str] = field(default_factory=dict)


def ask_survey(group: Asks, actors: list[Member], engines: list[Member], bucketed: set[bool],
               info: bool = False) -> Survey:
    """The refresh's questions to the trainer's lead rank (its version when `info`, its
    senders for each bucketing in `bucketed`) and to every trainer rank and engine
    (`sync_member`), issued at once: one round trip. A trainer rank's failure raises
    `TrainingLost`; an engine's is recorded (`missing`)."""
    lead = min(actors, key=lambda m: m.rank)
    flags = sorted(bucketed)
    calls: list[ControlCall] = [(lead, "weights_info", ())] if info else []
    calls += [(lead, "sync_senders", (b,)) for b in flags]
    members = [*actors, *engines]
    calls += [(m, "sync_member", ()) for m in members]
    outs: list[Outcome] = group.outcomes(calls)
    asked = len(calls) - len(members)
    bad = next((o.error for o in outs[:asked + len(actors)] if not o.ok), None)
    if bad is not None:  # the trainer's answers: without them there is no refresh
        raise TrainingLost(bad)
    vals = [o.value for o in outs]
    head = 1 if info else 0
    answers = dict(zip(((m.role, m.rank) for m in members), outs[asked:]))
    return Survey(tuple(vals[0]) if info else None,
                  {b: [int(r) for r in v] for b, v in zip(flags, vals[head:asked])},
                  {k: tuple(o.value) for k, o in answers.items() if o.ok},
                  {k: str(o.error) for k, o in answers.items() if not o.ok})


def missing(survey: Survey, targets: Sequence[Member]) -> str | None:
    """The error of the first target that did not answer the survey (None: all did)."""
    return next((survey.errors[(m.role, m.rank)] for m in targets
                 if (m.role, m.rank) in survey.errors), None)


def ask_revived(group: Asks, actors: list[Member], engines: list[Member], bucketed: set[bool],
                revive: Callable[[Member, str], None], info: bool = False) -> Survey:
    """`ask_survey`, then, for every engine that did not answer, `revive(engine, error)` (wait
    for its restarted process; raises when it cannot come back) and the survey once more: a
    restarted engine holds no weights and is in no group, which the second survey sees."""
    survey = ask_survey(group, actors, engines, bucketed, info)
    silent = [m for m in engines if (m.role, m.rank) in survey.errors]
    if not silent:
        return survey
    for m in silent:
        revive(m, survey.errors[(m.role, m.rank)])
    return ask_survey(group, actors, engines, bucketed, info)
