"""The ILP is never worse than any baseline on any example, under the same cost model.

Every baseline is a point of the ILP's search space (same cost table, one pool per slot, pool
capacities), so an optimal solve can only tie or win; the plans compared are the assembled ones,
priced by the same `timing.iteration_time`.
"""
from __future__ import annotations

import pytest
from specdata import EXAMPLES, ROOT

from placer.baselines import baseline_assignments, colocated, partitions, training_pool
from placer.catalog import resolve
from placer.costmodel import Calibration
from placer.ilp import score
from placer.ilp_solve import solve
from placer.planner import build_problem, plan_assignment, plan_job, to_plan
from placer.spec import load_job

# the cost objective walks the (time, rate) frontier, which is long on the 1,000-node examples
SLOW_COST = {"large-1k-nodes", "longtail-replay"}


@pytest.fixture(scope="module", params=EXAMPLES, ids=lambda p: p.stem)
def case(request):
    res = resolve(load_job(request.param))
    calib = Calibration()
    problem = build_problem(res, calib)
    plan = to_plan(problem, solve(problem, time_limit_s=30.0))
    return res, calib, plan, problem, baseline_assignments(problem)


def test_ilp_never_slower_than_a_baseline(case) -> None:
    res, calib, ilp, problem, baselines = case
    assert ilp.solver.status == "optimal"
    for name, a in baselines.items():
        if a is None:
            continue
        plan = plan_assignment(problem, a, name)
        assert ilp.predicted_iteration_s <= plan.predicted_iteration_s * (1 + 1e-6), name


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW_COST else p for p in EXAMPLES],
    ids=lambda p: p.stem)
def test_ilp_never_dearer_than_a_baseline_under_the_cost_objective(path) -> None:
    res = resolve(load_job(path))
    problem = build_problem(res, Calibration(), "cost")
    sol = solve(problem, time_limit_s=60.0)
    assert sol.status == "OPTIMAL"
    got = score(problem, sol.assignment)[1]
    assert got == pytest.approx(sol.objective, rel=1e-5)
    for name, a in baseline_assignments(problem).items():
        if a is not None:
            assert got <= score(problem, a)[1] * (1 + 1e-6), name


def test_baselines_have_their_shapes(case) -> None:
    res, calib, _, problem, baselines = case
    pool = training_pool(problem)
    co = baselines["colocated"]
    assert co.choice == colocated(problem).choice
    gpu_roles = [r for r, c in co.choice.items() if c.pool == pool]
    assert len({co.slot_of[r] for r in gpu_roles}) == 1  # everything on the pool shares one slot
    sp = baselines["split"]
    if sp is not None:
        assert sp.slot_of["rollout"] == "rollout"  # rollout alone on its share
        used = sp.choice["rollout"].devices + max(
            c.devices for r, c in sp.choice.items() if r != "rollout" and c.pool == pool)
        assert used <= problem.capacity()[pool]
    best = baselines["enumerate"]
    assert score(problem, best)[0] <= score(problem, co)[0] + 1e-9  # colocated is one grouping


def test_partitions_are_the_bell_numbers() -> None:
    assert [sum(1 for _ in partitions(list("abcde"[:n]))) for n in range(6)] == [1, 1, 2, 5, 15, 52]


def test_hetero_ilp_beats_every_homogeneous_baseline() -> None:
    """Using the LPU pool for the frozen models is worth something no homogeneous plan has."""
    res = resolve(load_job(ROOT / "examples" / "ppo-llama8b-hetero.yaml"))
    calib = Calibration()
    ilp = plan_job(res, calib)
    problem = build_problem(res, calib)
    for name, a in baseline_assignments(problem).items():
        assert ilp.predicted_iteration_s < score(problem, a)[0] * 0.95, name
