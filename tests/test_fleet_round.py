"""One round of the fleet's allocation model at scale: the grid's maximal vectors found without
comparing every pair, and an incumbent given to CP-SAT as a complete, feasible hint (every
variable, the team usages, borrowing flags and sharing choices included), so a large fleet's
round starts from it as soon as presolve ends."""
from __future__ import annotations

import itertools
import random

from fleet_oracle import random_fleet
from ortools.sat.python import cp_model

from placer.fleet.alloc import _maximal, allocate
from placer.fleet.allocmodel import _model
from placer.fleet.allocproblem import AllocProblem, Vec, misses


def _all_pairs(grid: list[Vec]) -> list[Vec]:
    return [a for a in grid if not any(b != a and all(x <= y for x, y in zip(a, b))
                                       for b in grid)]


def test_maximal_vectors_are_those_no_other_dominates() -> None:
    rng = random.Random(7)
    for _ in range(200):
        dims = rng.randint(1, 4)
        axes = [sorted(rng.sample(range(9), rng.randint(1, 4))) for _ in range(dims)]
        grid = [a for a in itertools.product(*axes) if rng.random() < 0.7]
        assert _maximal(grid) == _all_pairs(grid)


def _values(pr: AllocProblem) -> list[dict[Vec, float]]:
    """Each job's evaluated vectors within its limits, at their values (as `fewest_nodes`)."""
    return [{a: pr.value(j, t) for a, t in pr.known[j].items()
             if t is not None and a in pr.options(j) and not misses(job, t)}
            for j, job in enumerate(pr.jobs)]


def test_the_hint_sets_every_variable_to_a_solution_of_the_model() -> None:
    checked = 0
    for seed in range(40):
        for kind in ({}, {"twins": True}, {"shared": True}, {"choice": True}):
            pr, _ = random_fleet(seed, "throughput" if seed % 2 else "makespan", **kind)
            try:
                a = allocate(pr, workers=1, seed=seed)
            except Exception:  # noqa: BLE001 - no allocation: nothing to hint
                continue
            m, _x, _k, _ = _model(pr, _values(pr), a.vectors)
            proto = m.proto
            assert sorted(proto.solution_hint.vars) == list(range(len(proto.variables)))
            solver = cp_model.CpSolver()
            solver.parameters.num_workers = 1
            solver.parameters.fix_variables_to_their_hinted_value = True
            assert solver.solve(m) in (cp_model.OPTIMAL, cp_model.FEASIBLE), (seed, kind)
            checked += 1
    assert checked > 50
