"""Work the fleet's search does once and reuses: a role's device needs reduced to those no
other implies (`inner._least_needs`, what the allocation grid is cut by), each kind's grid
built once per team, and the split bound's per-pair memo (`ilp_bound.split_keep`) giving the
plans a fresh table gives."""
from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from test_fleet_scale import two_kind_fleet

from placer.cost.calibration import load_calibration
from placer.fleet.inner import JobPlanner, _least_needs
from placer.fleet.spec import fleet_from_dict
from placer.fleet.workers import Pricers
from placer.solve.candidates import flat, single_candidates
from placer.solve.ilp_bound import _left_floors
from placer.solve.problem import Problem

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _fits(c: dict[str, int] | tuple[tuple[str, int], ...], have: dict[str, int]) -> bool:
    items = c.items() if isinstance(c, dict) else c
    return all(n <= have.get(p, 0) for p, n in items)


def test_least_needs_fit_exactly_where_the_candidates_do() -> None:
    """On random candidate sets and holdings, some reduced need fits exactly when some
    candidate does, and no reduced need implies another."""
    rng = random.Random(7)
    pools = ["a", "b", "c"]
    for _ in range(300):
        cands = [{p: rng.choice([0, 1, 2, 4, 8]) for p in rng.sample(pools, rng.randint(1, 3))}
                 for _ in range(rng.randint(1, 12))]
        least = _least_needs(cands)
        assert len(least) <= len({tuple(sorted(c.items())) for c in cands})
        for _ in range(20):
            have = {p: rng.choice([0, 1, 2, 3, 4, 8]) for p in pools}
            assert any(_fits(c, have) for c in cands) == any(_fits(c, have) for c in least)


def test_grid_built_once_per_kind_is_the_grid_of_each_job() -> None:
    """Identical jobs of one team share one grid object, equal to the grid built for each on
    its own, and every vector of it is one some role's candidates fit (or the top)."""
    fleet = fleet_from_dict(two_kind_fleet(), EXAMPLES, "reuse")
    planner = JobPlanner(fleet, load_calibration(None), 5.0, 0, 1)
    grids = planner.grids()
    assert grids[0] is grids[1]
    for j, grid in enumerate(grids):
        table = planner.tables[(planner.kind_of[j], planner.cap(j))]
        assert grid == planner.grid(j, table)
        assert grid and all(any(a) for a in grid)
        per_node = {p.name: p.devices_per_node for p in fleet.cluster.pools}
        top = tuple(max(x) for x in zip(*grid))
        roles = [] if table is None else table.devices()
        for a in grid:
            have = {p: n * per_node[p] for p, n in zip(planner.pools, a)}
            assert a == top or all(any(_fits(c, have) for c in cs) for cs in roles), a


def _left_reference(problem: Problem, role: str, held: tuple[tuple[str, int], ...]
                    ) -> tuple[float, float] | None:
    """`ilp_bound._left_floors` written out candidate by candidate."""
    free = dict(problem.capacity())
    for pool, n in held:
        free[pool] = free.get(pool, 0) - n
    own = {st for c in problem.cands.get(role, []) for st in c.est.stage_s}
    stage: dict[str, float] = {}
    slowest = 0.0
    for r, cs in problem.cands.items():
        if r == role:
            continue
        fit = [c for c in cs if all(n <= free.get(p, 0) for p, n in c.pool_devices().items())]
        if not fit:
            return None
        slowest = max(slowest, min(c.time_s for c in fit))
        for st in {st for c in fit for st in c.est.stage_s} - own:
            stage[st] = max(stage.get(st, 0.0), min(c.est.stage_s.get(st, 0.0) for c in fit))
    return sum(stage.values()), slowest


def test_split_bound_floors_match_the_candidate_by_candidate_rule() -> None:
    """The other roles' floors beside a split's holding, from the candidate arrays, are the
    candidate-by-candidate rule's on every holding of every pair of pools tried (those past a
    pool's devices included)."""
    fleet = fleet_from_dict(two_kind_fleet(), EXAMPLES, "reuse")
    calib = load_calibration(None)
    for fj in fleet.jobs[1:]:
        px = Pricers(calib).on(fj.job, {"gpu": 4, "cpu": 4})
        problem = Problem(px, flat(single_candidates(px)), px.res.job.objective)
        for role in problem.cands:
            left = _left_floors(problem, role)
            for a, b in itertools.product((0, 1, 2, 4, 8, 16), repeat=2):
                held = (("cpu", a), ("gpu", b))
                got, want = left(held), _left_reference(problem, role, held)
                assert (got is None) == (want is None), (role, held)
                if got is not None and want is not None:
                    assert got[1] == want[1] and got[0] == pytest.approx(want[0], rel=1e-12)
