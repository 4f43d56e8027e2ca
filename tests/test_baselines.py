"""The ILP is never worse than any baseline on any example, under the same cost model.

Every baseline is a point of the ILP's search space (same cost table, one pool per slot, pool
capacities), so an optimal solve can only tie or win; the plans compared are the assembled ones,
priced by the same `timing.iteration_time`.
"""
from __future__ import annotations

import pytest
from specdata import EXAMPLES, ROOT

from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.baselines import (
    BASELINES,
    HYBRID_FIRST,
    REGISTRY,
    baseline_assignments,
    colocated,
    hybridflow_split,
    partitions,
    standalone,
    training_pool,
)
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import solve
from placer.solve.planner import build_problem, plan_assignment, to_plan
from placer.solve.problem import host_fits
from placer.spec.catalog import resolve
from placer.spec.load import load_job

# the cost objective walks the (time, rate) frontier, which is long on the 1,000-node examples
SLOW_COST = {"large-1k-nodes", "longtail-replay", "ppo-llama8b-hetero"}
HETERO = ROOT / "examples" / "ppo-llama8b-hetero.yaml"


def _planned(path):
    """The job's ILP plan, its problem and every baseline (the baselines take most of the time:
    ~8 s for the PPO example's groupings)."""
    res = resolve(load_job(path))
    calib = Calibration()
    problem = build_problem(Pricer(res, calib))
    plan = to_plan(problem, solve(problem, time_limit_s=30.0))
    return res, calib, plan, problem, baseline_assignments(problem)


@pytest.fixture(scope="module")
def hetero():
    """The PPO example planned once for its `case` and the tests of it below."""
    return _planned(HETERO)


@pytest.fixture(scope="module", params=EXAMPLES, ids=lambda p: p.stem)
def case(request):
    return request.getfixturevalue("hetero") if request.param == HETERO else _planned(request.param)


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
    problem = build_problem(Pricer(res, Calibration()), "cost")
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
    co, rule = baselines["colocated"], colocated(problem)
    assert rule is not None
    if co is None:  # its fastest configs park more than a node's host RAM holds
        assert not host_fits(problem, rule)
    else:
        assert co.choice == rule.choice
        gpu_roles = [r for r, c in co.choice.items() if c.pool == pool]
        assert len({co.slot_of[r] for r in gpu_roles}) == 1  # the pool's roles share one slot
    sp = baselines["split"]
    if sp is not None:
        assert sp.slot_of["rollout"] == "rollout"  # rollout alone on its share
        used = sp.choice["rollout"].devices + max(
            c.devices for r, c in sp.choice.items() if r != "rollout" and c.pool == pool)
        assert used <= problem.capacity()[pool]
    best = baselines["enumerate"]
    if co is not None:
        assert score(problem, best)[0] <= score(problem, co)[0] + 1e-9  # one of its groupings
    on = [r for r, c in rule.choice.items() if c.pool == pool]
    cap = problem.capacity()[pool]
    hf, sa = baselines["hybridflow-split"], baselines["standalone"]
    first, second = [r for r in on if r in HYBRID_FIRST], [r for r in on if r not in HYBRID_FIRST]
    if not second:
        assert hf is None  # nothing to split off: that plan is colocated
    if hf is not None:
        assert len({hf.slot_of[r] for r in first}) == 1 and len({hf.slot_of[r] for r in second}) == 1
        assert hf.slot_of[first[0]] != hf.slot_of[second[0]]
        assert _pool_devices(hf, on) <= cap
        assert score(problem, best)[0] <= score(problem, hf)[0] + 1e-9  # one of enumerate's
    if sa is not None:
        assert len({sa.slot_of[r] for r in on}) == len(on)  # every GPU role on its own devices
        assert _pool_devices(sa, on) <= cap
        assert score(problem, best)[0] <= score(problem, sa)[0] + 1e-9
    elif len(on) > 1:  # not applicable only when the smallest configs do not fit side by side
        assert sum(min(c.devices for c in problem.cands[r] if c.pool == pool) for r in on) > cap


def _pool_devices(a, on: list[str]) -> int:
    """Devices the assignment's slots take on the pool: each slot as large as its largest role."""
    per_slot: dict[str, int] = {}
    for r in on:
        per_slot[a.slot_of[r]] = max(per_slot.get(a.slot_of[r], 0), a.choice[r].devices)
    return sum(per_slot.values())


def test_every_baseline_is_registered_by_name() -> None:
    assert list(REGISTRY) == list(BASELINES)
    assert REGISTRY["hybridflow-split"] is hybridflow_split and REGISTRY["standalone"] is standalone


def test_hybridflow_placements_on_ppo(hetero) -> None:
    """PPO with a reward model and a critic: both HybridFlow placements apply and split as named."""
    problem = hetero[3]
    hf, sa = hybridflow_split(problem), standalone(problem)
    assert hf is not None and sa is not None
    assert hf.slot_of["actor"] == hf.slot_of["rollout"] == hf.slot_of["reference"]
    assert hf.slot_of["critic"] == hf.slot_of["reward"] != hf.slot_of["actor"]
    gpu = ["actor", "rollout", "reference", "critic", "reward"]
    assert len({sa.slot_of[r] for r in gpu}) == 5


def test_partitions_are_the_bell_numbers() -> None:
    assert [sum(1 for _ in partitions(list("abcde"[:n]))) for n in range(6)] == [1, 1, 2, 5, 15, 52]


def test_hetero_ilp_beats_every_homogeneous_baseline(hetero, planned_example) -> None:
    """Using the LPU pool for the frozen models is worth something no homogeneous plan has."""
    _, _, _, problem, baselines = hetero
    ilp = planned_example(HETERO)  # plan_job's plan (the default calibration, as `hetero`'s)
    for name, a in baselines.items():
        assert a is not None, name  # PPO on a GPU pool: every baseline applies
        assert ilp.predicted_iteration_s < score(problem, a)[0] * 0.95, name
