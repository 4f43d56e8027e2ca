"""The fleet's bound over job plans that stopped before proving their optimum: each job plan's
proven lower bound (not its incumbent time) enters the fleet's bound, so the reported gap
covers what the job plans may still lose, against a brute force over the lower bounds."""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from fleet_oracle import brute_force, random_fleet
from test_fleet import _tiny_fleet

from placer.cost.calibration import load_calibration
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.fleet.alloc import AllocProblem, Vec, allocate
from placer.fleet.inner import JobPlanner, alloc_problem
from placer.fleet.spec import fleet_from_dict
from placer.solve.ilp_solve import _fallback, solve
from placer.solve.planfile import Plan
from placer.solve.planner import build_problem
from placer.spec.catalog import resolve
from placer.spec.load import load_job

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _stopped_early(jobs: int, time_of: Callable[[int, Vec], float | None], seed: int
                   ) -> Callable[[int, Vec], float]:
    """Lower bounds where one job's plans (drawn from the seed) stopped early, each vector's
    plan with its own gap (5% to 40%); every other job's plans optimal."""
    rng = random.Random(seed)
    late = rng.randrange(jobs)
    gaps: dict[Vec, float] = {}

    def low_of(j: int, a: Vec) -> float:
        t = time_of(j, a)
        assert t is not None
        return t if j != late else t * (1 - gaps.setdefault(a, rng.uniform(0.05, 0.4)))
    return low_of


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
def test_fleet_bound_holds_over_job_plan_bounds(objective: str) -> None:
    """Random small fleets (seeded) where one job's plans stopped early, each with its own gap:
    the allocation is still the brute-force optimum of the incumbent times, and the fleet's
    bound is no better than the brute-force optimum over the lower bounds, so the gap is at
    least what the job plans may lose; the fleet is not called optimal then."""
    early = 0
    for seed in range(30):
        pr, time_of = random_fleet(seed, objective)
        low_of = _stopped_early(len(pr.jobs), time_of, seed)
        best = brute_force(pr, time_of)
        if best is None:
            continue
        run = replace(pr, low_of=low_of, known=[], lows=[])
        a = allocate(run, workers=1, seed=seed)
        assert a.objective == pytest.approx(best, rel=1e-6), seed

        def least(j: int, v: Vec, run: AllocProblem = run) -> float | None:
            """The fastest job j may truly run on v, given what the search proved: at least
            the lower bound of every evaluated vector holding as many nodes (more nodes never
            slow a job), no more. The tops are evaluated: each vector has one above it."""
            above = [b for b in run.known[j] if all(x <= y for x, y in zip(v, b))]
            if any(run.known[j][b] is None for b in above):
                return None
            return max(run.lows[j].get(b, t) for b in above if (t := run.known[j][b]) is not None)

        top = brute_force(pr, least)  # the best fleet any such job plans allow
        assert top is not None
        if objective == "throughput":
            assert a.bound >= top * (1 - 1e-6), seed
            assert a.gap >= (top - a.objective) / top - 1e-6, seed
        else:
            assert a.bound <= top * (1 + 1e-6), seed
            assert a.gap >= (a.objective - top) / a.objective - 1e-6, seed
        if a.gap > 0:
            early += 1
            assert not a.optimal, seed
    assert early  # some fleet's gap came from its job plans alone


class _StoppedEarly(JobPlanner):
    """A job planner whose every plan stopped at a 25% gap of its own (as a plan that ran out
    of time does; the plans themselves are the real ones)."""

    def _keep(self, key: tuple[int, Vec], got: object) -> None:
        if isinstance(got, Plan):
            got = got.model_copy(update={"solver": got.solver.model_copy(
                update={"gap": 0.25, "status": "feasible"})})
        super()._keep(key, got)


def test_a_job_plan_that_stopped_early_widens_the_fleet_gap() -> None:
    """On the tiny real fleet, job plans that proved only 75% of their time as a bound: the
    allocation is the one the optimal plans give, but it has a gap where it had none. Each job's
    bound is the better of its plan's 75% and its floor (`placer.fleet.floors`, which proves
    more than 75% here), so every job's throughput may be up to T / L of what its plan shows and
    the gap is at least 1 - max L / T."""
    fleet = fleet_from_dict(_tiny_fleet(), EXAMPLES, "tiny")
    calib = load_calibration(None)
    sure, late = JobPlanner(fleet, calib, workers=1), _StoppedEarly(fleet, calib, workers=1)
    exact = allocate(alloc_problem(sure), workers=1)
    early = allocate(alloc_problem(late), workers=1)
    lows = [late.low(j, a) for j, a in enumerate(early.vectors)]
    for j, (a, low) in enumerate(zip(early.vectors, lows)):
        assert low == pytest.approx(max(0.75 * early.times[j], late.floor(j, a) or 0.0))
    most = max(low / t for low, t in zip(lows, early.times))
    assert most < 1.0
    assert exact.optimal and exact.gap == 0.0
    assert early.vectors == exact.vectors and early.objective == exact.objective
    assert early.gap >= 1 - most - 1e-6 and not early.optimal
    assert early.bound >= exact.objective / most * (1 - 1e-6)
    assert math.isfinite(early.bound)


@pytest.mark.parametrize("name", ["tiny-agent.yaml", "hetero-split.yaml", "ppo-llama8b-hetero.yaml"])
def test_a_job_plan_out_of_time_keeps_a_time_bound(name: str) -> None:
    """A job plan whose solver ran out of time before any solution (the heuristic plan) still
    proves a bound on its time, each role's least time floor: above 0 and no more than the
    optimum, so the fleet's bound stays finite with such a plan in it."""
    res = resolve(load_job(EXAMPLES / name), name)
    problem = build_problem(Pricer(res, Calibration()), "time")
    best = solve(problem, workers=1)
    out = _fallback(problem, time.perf_counter())
    assert 0.0 < out.bound <= best.objective * (1 + 1e-9)
    assert out.gap == pytest.approx((out.objective - out.bound) / out.objective)
    assert out.gap < 1.0
