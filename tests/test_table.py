"""The cost table (`placer.solve.planner.build_problem`): split candidates priced only where they may
beat the heuristic plan (`placer.solve.ilp_bound.split_keep`), and a large cluster's single-pool
candidates priced in worker processes (`placer.solve.candidates.single_candidates`), both without
changing what the solver finds."""
from __future__ import annotations

import sys

import pytest

import placer.solve.candidates as candidates
from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.ilp_bound import heuristic, score, split_keep
from placer.solve.ilp_solve import solve
from placer.solve.planner import build_problem
from placer.solve.problem import Problem, candidate_key
from placer.spec.catalog import resolve
from placer.spec.load import load_job

HETERO = "examples/hetero-split.yaml"


def _splits(problem: Problem) -> int:
    return sum(c.split for cs in problem.cands.values() for c in cs)


@pytest.fixture(scope="module")
def full_time_table() -> Problem:
    """hetero-split's unbounded table under its own objective (time), built once for the two
    tests that read it (neither changes it)."""
    res = resolve(load_job(HETERO))
    assert res.job.objective == "time"
    return build_problem(Pricer(res, Calibration()), bounded=False)


@pytest.mark.parametrize("objective", ["time", "cost"])
def test_a_bounded_table_prices_fewer_splits_and_keeps_the_optimum(
        objective: str, full_time_table: Problem) -> None:
    res = resolve(load_job(HETERO))
    bounded = build_problem(Pricer(res, Calibration()), objective)
    full = (full_time_table if objective == "time"
            else build_problem(Pricer(res, Calibration()), objective, bounded=False))
    assert _splits(bounded) <= _splits(full)
    if objective == "time":
        assert _splits(bounded) < _splits(full)  # the bound rules some out on this cluster
    singles = [c for cs in bounded.cands.values() for c in cs if not c.split]
    assert singles == [c for cs in full.cands.values() for c in cs if not c.split]
    a, b = solve(bounded, 60), solve(full, 60)
    assert a.status == b.status == "OPTIMAL"
    assert a.objective == pytest.approx(b.objective, rel=1e-9)


def test_split_keep_is_the_heuristic_plans_bound_on_a_plans_time(full_time_table: Problem) -> None:
    """`split_keep` rules a split out only when a lower bound on the time of any plan with it
    (its own time and weight sync, and the other roles' least time on the devices it leaves
    free) exceeds the heuristic plan's; monotone in the split's time; widened by a re-plan's
    slack; and the bounded table keeps, with the same time, every split of the unbounded one
    that it accepts at its own time."""
    res = resolve(load_job(HETERO))
    full = full_time_table
    singles = Problem(Pricer(res, full.calib), {r: [c for c in cs if not c.split]
                                        for r, cs in full.cands.items()})
    ub = score(singles, heuristic(singles))[0]
    keep = split_keep(singles)(Role.ROLLOUT)
    parts = tuple(next(c.est for c in singles.cands["rollout"] if c.pool == p)
                  for p in ("h100", "h20"))
    # None: the split alone in its slot (no part time-sharing another role's slot)
    assert keep(parts, 0.0, None) and not keep(parts, 1.01 * ub, None)
    seen = [keep(parts, t * ub / 50, None) for t in range(60)]
    assert seen == sorted(seen, reverse=True)  # true, then false from some time on
    # a re-plan's move costs let a plan that slow win: kept within that slack
    assert split_keep(singles, slack_s=ub)(Role.ROLLOUT)(parts, 1.01 * ub, None)
    bounded = {candidate_key(c): c.time_s for c in build_problem(Pricer(res, Calibration())).cands["rollout"]
               if c.split}
    useful = {candidate_key(c): c.time_s for c in full.cands["rollout"]
              if c.split and keep(tuple(p.est for p in c.est.parts), c.time_s,
                                  c.pool if c.colocated else None)}
    assert useful and all(bounded.get(k) == t for k, t in useful.items())


def _table(problem: Problem) -> dict[str, list[tuple]]:
    return {r: [(c.pool, c.est.par, c.est.stage_s, c.est.memory) for c in cs]
            for r, cs in problem.cands.items()}


def test_a_table_priced_in_worker_processes_is_the_same_table(monkeypatch) -> None:
    res = resolve(load_job(HETERO))
    alone = build_problem(Pricer(res, Calibration()), workers=1)
    monkeypatch.setattr(candidates, "PARALLEL_DEVICES", 1)  # this cluster counts as large
    seen = []
    real = candidates._priced_apart
    monkeypatch.setattr(candidates, "_priced_apart",
                        lambda *a: seen.append(a[-1]) or real(*a))

    def not_here(*_a: object) -> None:  # the caller's fallback would price here: it must not
        raise AssertionError("a worker failed and left its share to the caller")
    monkeypatch.setattr(candidates, "role_candidates", not_here)
    apart = build_problem(Pricer(res, Calibration()), workers=2)
    assert seen == [2]  # the workers priced all of it (they import role_candidates afresh)
    assert _table(apart) == _table(alone)


def test_a_failed_worker_leaves_its_share_to_the_caller(monkeypatch) -> None:
    res = resolve(load_job(HETERO))
    alone = candidates.single_candidates(Pricer(res, Calibration()))
    monkeypatch.setattr(candidates, "PARALLEL_DEVICES", 1)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # every worker exits 1 at once
    apart = candidates.single_candidates(Pricer(res, Calibration()), workers=2)
    assert {r: {p: [c.est.stage_s for c in cs] for p, cs in pools.items()}
            for r, pools in apart.items()} == {
        r: {p: [c.est.stage_s for c in cs] for p, cs in pools.items()}
        for r, pools in alone.items()}
