"""The refresh's survey (`executors.syncsurvey`): the trainer's version and senders and every
member's process asked in one batch of calls, waited on once; an engine that does not answer is
recorded (it matters only if the refresh targets it), a trainer rank that does not answer ends
the refresh. Members are plain stand-ins answering from a table (no Ray, no processes)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from executors.context import TrainingLost
from executors.runtime import Outcome
from executors.syncsurvey import ask_revived, ask_survey, missing


class _M:
    def __init__(self, role: str, rank: int) -> None:
        self.role, self.rank = role, rank


class _Group:
    """`outcomes` over a table of answers by (role, rank, method); counts its batches."""

    def __init__(self, answers: dict[tuple[str, int, str], Any]) -> None:
        self.answers, self.batches, self.calls = answers, 0, 0

    def outcomes(self, calls: Sequence[tuple[Any, str, tuple[object, ...]]]) -> list[Outcome]:
        self.batches += 1
        self.calls += len(calls)
        out = []
        for m, method, args in calls:
            v = self.answers[(m.role, m.rank, method)]
            v = v(*args) if callable(v) else v
            out.append(Outcome(False, error=v.args[0]) if isinstance(v, Exception)
                       else Outcome(True, v))
        return out


ACTORS = [_M("actor", 1), _M("actor", 0)]
ENGINES = [_M("rollout", 0), _M("rollout", 1)]


def _answers() -> dict[tuple[str, int, str], Any]:
    a: dict[tuple[str, int, str], Any] = {
        ("actor", 0, "weights_info"): (3, 1000, False),
        ("actor", 0, "sync_senders"): lambda bucketed: [0, 1] if bucketed else [0],
        ("actor", 0, "sync_member"): ("cpu", 1, 100), ("actor", 1, "sync_member"): ("cpu", 1, 101),
        ("rollout", 0, "sync_member"): ("cpu", 2, 200),
        ("rollout", 1, "sync_member"): ("cpu", 2, 201)}
    return a


def test_every_question_goes_in_one_batch() -> None:
    g = _Group(_answers())
    s = ask_survey(g, ACTORS, ENGINES, {True, False}, info=True)  # type: ignore[arg-type]
    assert (g.batches, g.calls) == (1, 1 + 2 + 4)  # version, senders twice, four members
    assert s.info == (3, 1000, False)
    assert s.senders == {True: [0, 1], False: [0]}
    assert s.members[("rollout", 1)] == ("cpu", 2, 201) and len(s.members) == 4
    assert not s.errors and missing(s, ENGINES) is None  # type: ignore[arg-type]


def test_an_engine_that_does_not_answer_matters_only_as_a_target() -> None:
    g = _Group(_answers())
    g.answers[("rollout", 1, "sync_member")] = RuntimeError("actor died")
    s = ask_survey(g, ACTORS, ENGINES, {True})  # type: ignore[arg-type]
    assert s.info is None and ("rollout", 1) not in s.members
    assert missing(s, ENGINES[:1]) is None  # type: ignore[arg-type]
    assert missing(s, ENGINES) == "actor died"  # type: ignore[arg-type]


def test_a_trainer_rank_that_does_not_answer_ends_the_refresh() -> None:
    g = _Group(_answers())
    g.answers[("actor", 1, "sync_member")] = RuntimeError("trainer rank 1 lost")
    with pytest.raises(TrainingLost, match="trainer rank 1 lost"):
        ask_survey(g, ACTORS, ENGINES, {True}, info=True)  # type: ignore[arg-type]


def test_a_restarting_engine_is_waited_for_and_asked_again() -> None:
    g = _Group(_answers())
    g.answers[("rollout", 1, "sync_member")] = RuntimeError("ActorUnavailableError: restarting")
    revived: list[tuple[int, str]] = []

    def revive(m: _M, error: str) -> None:  # Ray brings it back: a new process answers
        revived.append((m.rank, error))
        g.answers[("rollout", 1, "sync_member")] = ("cpu", 2, 999)
    s = ask_revived(g, ACTORS, ENGINES, {True}, revive, info=True)  # type: ignore[arg-type]
    assert revived == [(1, "ActorUnavailableError: restarting")]
    assert g.batches == 2 and not s.errors
    assert s.members[("rollout", 1)] == ("cpu", 2, 999)  # the restarted process


def test_a_survey_every_engine_answers_revives_nothing() -> None:
    g = _Group(_answers())
    s = ask_revived(g, ACTORS, ENGINES, {True}, lambda m, e: pytest.fail("revived"),  # type: ignore[arg-type]
                    info=True)
    assert g.batches == 1 and not s.errors


def test_an_engine_that_cannot_come_back_ends_the_refresh() -> None:
    g = _Group(_answers())
    g.answers[("rollout", 0, "sync_member")] = RuntimeError("node lost")

    def revive(m: _M, error: str) -> None:
        raise TrainingLost(f"rollout{m.rank} did not come back: {error}")
    with pytest.raises(TrainingLost, match="rollout0 did not come back: node lost"):
        ask_revived(g, ACTORS, ENGINES, {True}, revive)  # type: ignore[arg-type]
