"""The allocation search on a budget (`placer.fleet.alloc.allocate`): where the job plans'
pace says the grids' tops will not be planned in time, they wait for a round to choose them
(bounded by their floors meanwhile), and where a round's choices will not be planned in time,
the search stops with its incumbent. Either way the fleet's gap stays a true bound, checked
against the brute-force oracle on seeded random fleets."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from fleet_oracle import brute_force, random_fleet, violations

from placer.fleet.alloc import AllocProblem, Vec, allocate


def _with_floors(pr: AllocProblem, time_of: Callable[[int, Vec], float | None],
                 pace: Callable[[], float | None]) -> AllocProblem:
    """`pr` with a floor at half each time (a true lower bound) and the given pace."""
    def floor(j: int, a: Vec) -> float | None:
        t = time_of(j, a)
        return None if t is None else t / 2
    return replace(pr, floor_of=floor, pace=pace, known=[], lows=[])


def _first_slow() -> Callable[[], float | None]:
    """A pace that rules out the first batch it is asked about (the tops), none after."""
    calls = [0]

    def pace() -> float:
        calls[0] += 1
        return 1e12 if calls[0] == 1 else 0.0
    return pace


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
def test_tops_left_to_the_rounds_still_reach_the_optimum(objective: str) -> None:
    """With the tops not planned first, the rounds (over floors where nothing is planned)
    still end at the brute-force optimum, proven, breaking no rule, and plan no top a round
    did not choose."""
    checked = 0
    for seed in range(30):
        pr, time_of = random_fleet(seed, objective)
        best = brute_force(pr, time_of)
        pr = _with_floors(pr, time_of, _first_slow())
        if best is None:
            continue
        a = allocate(pr, workers=1, seed=seed)
        assert a.optimal and a.objective == pytest.approx(best, rel=1e-6), seed
        assert violations(pr, a.vectors) == [], seed
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
def test_a_search_out_of_pace_keeps_a_true_bound(objective: str) -> None:
    """A pace no plan fits: the search plans the fair shares only, stops after its first
    round, and returns them with a bound the brute-force optimum does not pass."""
    checked = 0
    for seed in range(40):
        pr, time_of = random_fleet(seed, objective)
        best = brute_force(pr, time_of)
        pr = _with_floors(pr, time_of, lambda: 1e12)
        if best is None:
            continue
        a = allocate(pr, workers=1, seed=seed)
        assert violations(pr, a.vectors) == [], seed
        if objective == "throughput":
            assert a.objective <= best * (1 + 1e-9) and a.bound >= best * (1 - 1e-6), seed
        else:
            assert a.objective >= best * (1 - 1e-9) and a.bound <= best * (1 + 1e-6), seed
        assert a.gap >= (abs(a.objective - best) / max(a.objective, best)) * (1 - 1e-6), seed
        checked += 1
    assert checked >= 10
