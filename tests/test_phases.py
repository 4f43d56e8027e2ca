"""Named phases (placer/base/phases.py) and the per-role step times (executors/context.py):
a phase clock tells its listener each phase in order and times them; a role's wall time in a
step is the union of its calls cut to the step, its rank-seconds their sum."""
from __future__ import annotations

import pytest

from executors.context import StepCounters
from placer.base.phases import PhaseClock


def test_phases_are_told_in_order_and_timed() -> None:
    told: list[str | None] = []
    clock = PhaseClock(told.append)
    clock.begin("starting Ray")
    assert clock.current == "starting Ray"
    clock.begin("starting actors, loading models")
    clock.end()
    clock.end()  # nothing under way: the listener is not told again
    assert told == ["starting Ray", "starting actors, loading models", None]
    assert [name for name, _ in clock.spans] == told[:2]
    assert all(s >= 0 for _, s in clock.spans)
    assert clock.total_s() == pytest.approx(sum(s for _, s in clock.spans))
    assert clock.current is None


def test_a_clock_without_a_listener_still_times() -> None:
    clock = PhaseClock()
    clock.begin("a")
    clock.end()
    assert [n for n, _ in clock.spans] == ["a"]


def test_wall_time_is_the_union_of_calls_cut_to_the_step() -> None:
    c = StepCounters()
    # two trainer ranks overlapping: 10-14 and 11-15 -> wall 5, rank-s 8
    c.busy("actor", [(10.0, 4.0), (11.0, 4.0)])
    # a rollout call that began 2 s before the step (async mode) and one nested in it
    c.busy("rollout", [(8.0, 5.0), (9.0, 1.0)])
    # a reward call that ran past the end of the window (cut there)
    c.busy("reward", [(19.0, 3.0)])
    # a gap between batches is not busy time
    c.busy("environment", [(11.0, 1.0)])
    c.busy("environment", [(13.0, 2.0)])
    wall, ranks = c.wall_s(10.0, 20.0), c.rank_s()
    assert wall == pytest.approx({"actor": 5.0, "rollout": 3.0, "reward": 1.0,
                                  "environment": 3.0})
    assert ranks == pytest.approx({"actor": 8.0, "rollout": 6.0, "reward": 3.0,
                                   "environment": 3.0})
    for role in ranks:
        assert wall[role] <= 10.0 and ranks[role] >= wall[role]
