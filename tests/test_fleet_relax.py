"""The fleet's Lagrangian bound (`placer.fleet.relax`) against the brute-force oracle: random
small fleets (seeded), both objectives, with and without a shared pool or a sharing choice; the
floors a seeded fraction of the times and only the grids' tops planned, so the bound rests on
the floors as it does early in a search."""
from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from fleet_oracle import brute_force, random_fleet

from placer.fleet.alloc import AllocJob, AllocProblem, TeamQuota, Vec, allocate
from placer.fleet.relax import lagrange_bound
from placer.fleet.relaxrows import rows_of
from placer.fleet.sharing import ShareGroup

SEEDS = range(30)
VARIANTS: dict[str, dict[str, Any]] = {"plain": {}, "shared": {"shared": True}, "shared-charged-second": {
    "shared": True, "charged": 1}, "choice": {"choice": True}}


def _early(pr: AllocProblem, time_of, seed: int) -> AllocProblem:
    """`pr` with floors a seeded fraction (0.5 to 1) of the times and only the grids' tops
    planned: what the bound knows before any round."""
    rng = random.Random(seed)
    share: dict[tuple[int, Vec], float] = {}

    def below(j: int, a: Vec) -> float | None:
        t = time_of(j, a)
        return None if t is None else t * share.setdefault((j, a), rng.uniform(0.5, 1.0))
    run = replace(pr, floor_of=below, known=[], lows=[])
    run.fetch([(j, max(job.grid, key=sum)) for j, job in enumerate(run.jobs)])
    return run


def _trivial(pr: AllocProblem) -> float:
    """Every unit at its best row at once: the bound before the pools are priced."""
    rows = rows_of(pr)
    assert rows is not None
    if pr.objective == "throughput":
        return float(np.maximum.reduceat(rows.value, rows.starts).sum())
    return float(rows.unit_min(rows.value).max())


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_bound_holds_against_brute_force(objective: str, variant: str) -> None:
    """Never beyond the brute-force optimum (above it for throughput, below it for makespan),
    never looser than every unit at its best at once, and strictly tighter on some fleets."""
    tighter = checked = 0
    for seed in SEEDS:
        pr, time_of = random_fleet(seed, objective, **VARIANTS[variant])
        best = brute_force(pr, time_of)
        if best is None:
            continue
        run = _early(pr, time_of, seed)
        got = lagrange_bound(run, None)
        assert got is not None, seed
        if objective == "throughput":
            assert got >= best * (1 - 1e-9), seed
            polyak = lagrange_bound(run, best)  # the steps sized by the optimum
            assert polyak is not None and polyak >= best * (1 - 1e-9), seed
            assert got <= _trivial(run) * (1 + 1e-9), seed
            tighter += got < _trivial(run) * (1 - 1e-6)
        else:
            assert got <= best * (1 + 1e-9), seed
            assert got >= _trivial(run) * (1 - 1e-9), seed
            tighter += got > _trivial(run) * (1 + 1e-6)
        checked += 1
    assert checked > 10 and tighter > 0


def test_a_makespan_bound_sees_the_pool_is_too_small() -> None:
    """Two jobs of 8 iterations each, one pool of 4 nodes: each runs in 80 / n s on n nodes, so
    both at their fastest (4 nodes, 20 s an iteration) do not fit; the best is 2 + 2 nodes,
    makespan 8 x 40 = 320 s, which the bound proves (the trivial bound says 160)."""
    grid = ((1,), (2,), (4,))
    pr = AllocProblem(("p",), (4,), {"t": TeamQuota("t", None, (4,), (4,))},
                      [AllocJob("a", "t", 1.0, 8, grid), AllocJob("b", "t", 1.0, 8, grid)],
                      "makespan", lambda j, a: 80.0 / a[0])
    pr.fetch([(j, a) for j in range(2) for a in grid])
    assert _trivial(pr) == pytest.approx(160.0)
    assert lagrange_bound(pr) == pytest.approx(320.0)
    assert brute_force(pr, pr.time_of) == pytest.approx(320.0)


def test_a_shared_pool_is_charged_once_in_the_bound() -> None:
    """Two jobs sharing a pool of 4 nodes hold one count of it: both at 4 nodes fit, so the
    bound is both at their fastest, where charging each its whole count would rule that out
    (the relaxation must not be tighter than the model)."""
    grid = ((1,), (2,), (4,))
    for objective, want in (("throughput", 2 * 3600 / 20.0), ("makespan", 160.0)):
        pr = AllocProblem(("p",), (4,), {"t": TeamQuota("t", None, (4,), (4,))},
                          [AllocJob("a", "t", 1.0, 8, grid), AllocJob("b", "t", 1.0, 8, grid)],
                          objective, lambda j, a: 80.0 / a[0], shared=(ShareGroup(0, (0, 1)),))
        pr.fetch([(j, a) for j in range(2) for a in grid])
        assert brute_force(pr, pr.time_of) == pytest.approx(want)
        assert lagrange_bound(pr) == pytest.approx(want, rel=1e-6)


def test_a_pool_charged_to_another_team_costs_the_member_no_quota() -> None:
    """A rollout pool shared by jobs of two teams is charged to its first member's team: team
    b, with no quota of the pool, still holds its count through the group, so the bound lets
    both run at their fastest; the whole count on b's quota would rule that out."""
    grid = ((1,), (2,), (4,))
    teams = {"a": TeamQuota("a", "k", (4,), (4,)), "b": TeamQuota("b", "k", (0,), (0,))}
    for objective, want in (("throughput", 2 * 3600 / 20.0), ("makespan", 160.0)):
        pr = AllocProblem(("p",), (4,), teams,
                          [AllocJob("a", "a", 1.0, 8, grid), AllocJob("b", "b", 1.0, 8, grid)],
                          objective, lambda j, a: 80.0 / a[0], shared=(ShareGroup(0, (0, 1)),))
        pr.fetch([(j, a) for j in range(2) for a in grid])
        assert brute_force(pr, pr.time_of) == pytest.approx(want)
        assert lagrange_bound(pr) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_makespan_search_reports_a_bound_that_holds(variant: str) -> None:
    """The lazy loop with a short round: whatever bound it reports for makespan (its rounds'
    or the relaxation's) is at most the brute-force optimum."""
    for seed in range(8):
        pr, time_of = random_fleet(seed, "makespan", **VARIANTS[variant])
        best = brute_force(pr, time_of)
        if best is None:
            continue
        a = allocate(_early(pr, time_of, seed), workers=1, seed=seed)
        assert a.bound <= best * (1 + 1e-6) and a.objective >= best * (1 - 1e-6), seed
        assert not math.isinf(a.bound)
