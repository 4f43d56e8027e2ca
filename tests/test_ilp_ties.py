"""The ILP's plan is one plan: ties on the objective resolve the same way every time.

On `examples/agentic-code.yaml` the rule reward shares the environment's slot on the CPU pool,
which holds 8 nodes for the environment: the reward on 1 to 8 of them gives the same iteration
time, the same rate and the same devices held, so CP-SAT alone returned whichever it met first
(the plan moved with the search workers and the load). The drivers break such ties by the
canonical order (`placer.solve.ilp`, "Ties"): each role in role order its fastest config. The
checks: the same plan for every worker count and seed, and from a warm start at every tied
alternative (CP-SAT keeps a hinted optimum when nothing ranks it below another).
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from placer.cost.calibration import load_calibration
from placer.cost.pricer import Pricer
from placer.solve.ilp import canonical_order
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import rate_units, solve
from placer.solve.planner import build_problem
from placer.solve.problem import Assignment, Hint, LayoutKey, Problem, candidate_key
from placer.spec.catalog import resolve
from placer.spec.load import load_job

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "agentic-code.yaml"


@cache
def _problem() -> Problem:
    return build_problem(Pricer(resolve(load_job(EXAMPLE), "agentic-code"),
                                load_calibration(None)))


@cache
def _reference() -> Assignment:
    return solve(_problem(), workers=1).assignment


def _placement(a: Assignment) -> tuple[tuple[str, LayoutKey, str], ...]:
    return tuple((r, candidate_key(c), a.slot_of[r]) for r, c in a.choice.items())


def _ties(problem: Problem, a: Assignment) -> list[Assignment]:
    """`a` with one role's config swapped for another on the same pool that fits the devices
    its slot holds in no more memory and gives the same iteration time and rate."""
    t, rate = score(problem, a)[0], rate_units(problem, a)
    out = []
    for r, mine in a.choice.items():
        held = max(a.choice[o].devices for o in a.choice if a.slot_of[o] == a.slot_of[r])
        for c in problem.cands[r]:
            if (c is mine or c.pool != mine.pool or c.split or c.devices > held
                    or c.est.memory.total > mine.est.memory.total):
                continue
            b = Assignment({**a.choice, r: c}, a.slot_of)
            if score(problem, b)[0] == pytest.approx(t, rel=1e-9) and rate_units(problem, b) == rate:
                out.append(b)
    return out


def _rank(problem: Problem, a: Assignment) -> list[int]:
    return [canonical_order(problem.cands[r]).index(problem.cands[r].index(a.choice[r]))
            for r in problem.roles]


def test_the_example_has_tied_placements_and_the_plan_is_the_first_in_canonical_order() -> None:
    problem, ref = _problem(), _reference()
    ties = _ties(problem, ref)
    assert any(b.choice["reward"].devices != ref.choice["reward"].devices for b in ties)
    for b in ties:
        assert _rank(problem, ref) < _rank(problem, b)


@pytest.mark.parametrize(("workers", "seed"), [(1, 1), (2, 0), (4, 0), (8, 3)])
def test_the_plan_does_not_move_with_the_workers_or_the_seed(workers: int, seed: int) -> None:
    got = solve(_problem(), workers=workers, seed=seed).assignment
    assert _placement(got) == _placement(_reference())


def test_a_warm_start_at_a_tied_plan_gives_the_canonical_one() -> None:
    problem, ref = _problem(), _reference()
    for b in _ties(problem, ref):
        groups: dict[str, list[str]] = {}
        for r in problem.roles:
            groups.setdefault(b.slot_of[r], []).append(r)
        hint = Hint({r: candidate_key(c) for r, c in b.choice.items()}, list(groups.values()))
        got = solve(problem, hint=hint, workers=2).assignment
        assert _placement(got) == _placement(ref), f"warm start {_placement(b)}"
