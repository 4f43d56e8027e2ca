"""The fleet's floors (`placer.fleet.floors`): a bound on a job's time on an allocation it was
not planned on, from its cost table on its cap. Checked against the full inner plan on every
vector of small grids (a split rollout among them), against the brute-force oracle as the
allocation search's bound, and for plans made for cost per sample."""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from fleet_oracle import brute_force, oracle_checked, random_fleet
from test_fleet import _tiny_fleet

from placer.cost.calibration import load_calibration
from placer.fleet.alloc import Vec
from placer.fleet.floors import plan_low
from placer.fleet.inner import JobPlanner
from placer.fleet.relax import lagrange_bound
from placer.fleet.spec import fleet_from_dict
from placer.fleet.workers import plan_on
from placer.solve.planfile import Plan
from placer.spec.load import load_job

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _checked(planner: JobPlanner) -> tuple[int, int]:
    """Every job's floor against its plan on every vector of its grid: never above the plan's
    time where the plan is proven optimal, and None exactly where no plan places the job.
    Returns (vectors whose floor beats every larger vector's time, vectors checked)."""
    beats = checked = 0
    for j, grid in enumerate(planner.grids()):
        times = {a: planner.time(j, a) for a in grid}
        for a, t in times.items():
            f = planner.floor(j, a)
            if t is None:
                continue
            assert f is not None, (j, a)
            assert planner.plan(j, a).solver.gap == 0.0, (j, a)  # the plan is the optimum
            assert f <= t * (1 + 1e-9), (j, a, f, t)
            checked += 1
            above = [s for b, s in times.items() if b != a and s is not None
                     and all(x <= y for x, y in zip(a, b))]
            beats += bool(above) and f > max(above) * (1 + 1e-9)
    return beats, checked


def test_floors_hold_on_every_vector_of_a_real_fleet() -> None:
    """The tiny fleet (two kinds, GPU and CPU pools): each floor is at most the optimal plan's
    time, and on some vectors it is more than every larger vector's time, the bound the search
    had there before (so the floor is no vacuous 0)."""
    fleet = fleet_from_dict(_tiny_fleet(), EXAMPLES, "tiny")
    beats, checked = _checked(JobPlanner(fleet, load_calibration(None), workers=1))
    assert checked > 20 and beats > 0


def test_floors_hold_where_the_rollout_may_split() -> None:
    """A job whose rollout may split over two accelerator pools (H100, H20, L40S and CPU
    nodes): on vectors with two such pools the rollout bounds nothing (a split may beat every
    single-pool candidate), on the rest it does; the floor is below the optimum everywhere."""
    doc = load_job(EXAMPLES / "hetero-split.yaml").model_dump(mode="json", exclude={"cluster"})
    pools = [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8, "nodes": 2},
             {"name": "h20", "device": "H20", "devices_per_node": 8, "nodes": 1},
             {"name": "l40s", "device": "L40S", "devices_per_node": 8, "nodes": 2},
             {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}]
    fleet = fleet_from_dict({
        "name": "split", "cluster": {"pools": pools},
        "teams": {"a": {"quota": {p["name"]: {"nominal": p["nodes"]} for p in pools}}},
        "jobs": [{"name": "s", "team": "a", "job": doc}]}, EXAMPLES, "split")
    planner = JobPlanner(fleet, load_calibration(None), workers=1, time_limit_s=30.0)
    beats, checked = _checked(planner)
    assert checked > 5
    table = planner.tables[(0, planner.cap(0))]
    assert table is not None and table.splits  # the rollout may split here


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
def test_floors_keep_the_oracle_optimum(objective: str) -> None:
    """Random small fleets (seeded) with floors below the times (a seeded fraction of each):
    the search still finds the brute-force optimum and proves it; with the floors exact it
    plans fewer vectors than without any (the bound rules vectors out unplanned)."""
    plain = exact = 0
    for seed in range(24):
        pr, time_of = random_fleet(seed, objective)
        rng = random.Random(seed)
        share: dict[tuple[int, Vec], float] = {}

        def below(j: int, a: Vec, time_of=time_of, rng=rng, share=share) -> float | None:
            t = time_of(j, a)
            return None if t is None else t * share.setdefault((j, a), rng.uniform(0.3, 1.0))
        oracle_checked(replace(pr, floor_of=below, known=[], lows=[]), time_of, seed)
        a = oracle_checked(replace(pr, known=[], lows=[]), time_of, seed)
        b = oracle_checked(replace(pr, floor_of=time_of, known=[], lows=[]), time_of, seed)
        if a is not None and b is not None:
            plain += a.evaluated
            exact += b.evaluated
    assert exact < plain


def test_a_cost_plan_bounds_its_time_by_the_floor() -> None:
    """A plan made for cost per sample proves a bound on its cost: its time counts as the
    optimum's only where it is proven optimal, else the floor (any plan's bound) stands in,
    never T (1 - cost gap). A plan made for time keeps the better of its own bound and the
    floor."""
    job = load_job(EXAMPLES / "tiny-cpu.yaml")
    nodes = {p.name: p.nodes for p in job.cluster.pools} if job.cluster else {}
    for objective in ("time", "cost"):
        got = plan_on(job.model_copy(update={"objective": objective}), nodes,
                      load_calibration(None), 10.0, 0)
        assert isinstance(got, Plan) and got.objective == objective
        t = got.predicted_iteration_s
        early = got.model_copy(update={"solver": got.solver.model_copy(update={"gap": 0.3})})
        if objective == "cost":
            assert plan_low(got, t, 0.1 * t) == (t if got.solver.gap == 0.0 else 0.1 * t)
            assert plan_low(early, t, 0.1 * t) == pytest.approx(0.1 * t)
        else:
            assert plan_low(early, t, 0.1 * t) == pytest.approx(0.7 * t)
            assert plan_low(early, t, 0.9 * t) == pytest.approx(0.9 * t)


def test_the_relaxed_bound_holds_against_brute_force() -> None:
    """Random small throughput fleets (seeded), the floors a seeded fraction of the times and
    only the grids' tops planned: the Lagrangian bound is at least the brute-force optimum over
    the times, and on some fleets below every job at its fastest at once (the bound it
    replaces when no round is solved), so the pools' capacities count in it."""
    tighter = 0
    for seed in range(30):
        pr, time_of = random_fleet(seed, "throughput")
        rng = random.Random(seed)
        share: dict[tuple[int, Vec], float] = {}

        def below(j: int, a: Vec, time_of=time_of, rng=rng, share=share) -> float | None:
            t = time_of(j, a)
            return None if t is None else t * share.setdefault((j, a), rng.uniform(0.5, 1.0))
        best = brute_force(pr, time_of)
        if best is None:
            continue
        run = replace(pr, floor_of=below, known=[], lows=[])
        run.fetch([(j, max(job.grid, key=sum)) for j, job in enumerate(run.jobs)])
        for target in (None, best):
            got = lagrange_bound(run, target)
            assert got is not None and got >= best * (1 - 1e-9), seed
        fastest = sum(run.value(j, t) for j, job in enumerate(run.jobs)
                      if (t := run.lower(j, max(job.grid, key=sum))) is not None)
        tighter += lagrange_bound(run, best) < fastest * (1 - 1e-6)
    assert tighter > 0
