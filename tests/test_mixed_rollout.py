"""A mixed rollout in sync mode (`placer.cost.split.colocated`): one part of the rollout
time-shares the actor's slot (its devices serve the actor's phases in turn), the other runs on
a pool of its own alongside. The ILP prices it from the same cost table as every candidate;
the brute-force oracle covers it on a small cluster; the plan it makes passes the plan checks,
the simulator (variance off) agrees with its prediction, `--explain` names it, and the executor
seats it as planned."""
from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ilp_oracle import brute_force

from placer.base.roles import Role
from placer.cost import rollout_tail
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.timing import Placed
from placer.solve import splitwhy
from placer.solve.assemble import reprice
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import solve
from placer.solve.planfile import Plan, check_plan
from placer.solve.planner import build_problem, to_plan
from placer.solve.problem import Problem
from placer.spec.catalog import resolve
from placer.spec.job import Job
from placer.spec.load import job_from_dict
from simulator.api import simulate_plan
from simulator.config import SimConfig


def small_job(mode: str = "sync") -> Job:
    """A 7B GRPO job whose actor fills a 4-H100 node, with two H20s beside it."""
    return job_from_dict({
        "name": "mixed", "algorithm": "grpo",
        "models": {"policy": "Qwen2.5-7B", "reward": "rule", "use_reference": False},
        "batch": {"prompts": 64, "samples_per_prompt": 4},
        "lengths": {"prompt": {"kind": "fixed", "value": 256},
                    "response": {"kind": "lognormal", "median": 512, "sigma": 1.0, "cap": 4096}},
        "pipeline": {"mode": mode, "max_staleness": 1 if mode == "async" else 0},
        "objective": "time",
        "cluster": {"pools": [
            {"name": "h100", "device": "H100-SXM", "devices_per_node": 4, "nodes": 1},
            {"name": "h20", "device": "H20", "devices_per_node": 2, "nodes": 1},
            {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}]},
    })


@cache
def table() -> Problem:
    return build_problem(Pricer(resolve(small_job()), Calibration()), bounded=False)


def mixed_only(problem: Problem) -> Problem:
    """The table with the rollout's mixed candidates only (every other role's kept)."""
    cands = dict(problem.cands)
    cands[Role.ROLLOUT] = [c for c in cands[Role.ROLLOUT] if c.colocated]
    return Problem(problem.px, cands, problem.objective)


@cache
def mixed_plan() -> Plan:
    problem = mixed_only(table())
    return to_plan(problem, solve(problem, time_limit_s=20.0, workers=1))


def test_mixed_candidates_exist_in_sync_mode_only():
    """Every split is offered both alone in its slot and mixed, its first part on a pool where
    the actor may run; the mixed one's memory is that part's (what its slot must hold)."""
    mixed = [c for c in table().cands[Role.ROLLOUT] if c.colocated]
    assert mixed
    actor_pools = {c.pool for c in table().cands[Role.ACTOR]}
    for c in mixed:
        first = c.est.parts[0].est
        assert c.pool == first.pool and c.pool in actor_pools
        assert c.est.memory == first.memory
        assert c.time_s == max(p.est.time_s for p in c.est.parts)
    async_table = build_problem(Pricer(resolve(small_job("async")), Calibration()),
                                bounded=False)
    assert not [c for c in async_table.cands[Role.ROLLOUT] if c.colocated]
    assert [c for c in async_table.cands[Role.ROLLOUT] if c.split]


def test_the_ilp_prices_a_mixed_rollout_as_the_brute_force_does():
    """With only mixed rollout candidates, the ILP's optimum is the exhaustive search's over
    every choice and slot grouping, and the rollout shares the actor's slot."""
    problem = mixed_only(table())
    sol = solve(problem, time_limit_s=20.0, workers=1)
    assert sol.status == "OPTIMAL"
    expect = brute_force(problem)
    assert score(problem, sol.assignment)[0] == pytest.approx(expect, rel=1e-5)
    assert sol.objective == pytest.approx(expect, rel=1e-4)
    slot = sol.assignment.slot_of
    assert slot[Role.ROLLOUT] == slot[Role.ACTOR]


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mixed_splits_among_every_candidate_match_brute_force(data):
    """A few single-pool candidates per role with every split (alone and mixed): the ILP's
    optimum equals the exhaustive search's."""
    full = table()
    singles = {r: [c for c in cs if not c.split] for r, cs in full.cands.items()}
    cands = {r: data.draw(st.lists(st.sampled_from(cs), min_size=1, max_size=2, unique_by=id),
                          label=r) for r, cs in singles.items()}
    cands[Role.ROLLOUT] += [c for c in full.cands[Role.ROLLOUT] if c.split]
    problem = Problem(full.px, cands, full.objective)
    sol = solve(problem, time_limit_s=30.0, workers=1)
    assert sol.status == "OPTIMAL"
    assert score(problem, sol.assignment)[0] == pytest.approx(brute_force(problem), rel=1e-5)


def test_a_mixed_plan_holds_the_shared_devices_once():
    """The slot holds the actor's and the shared part's devices once (the larger) on their
    pool, the other part's on its own; the plan passes the plan checks; the shared part takes
    its weights locally, the other over its links (the sync is the slower)."""
    plan = mixed_plan()
    check_plan(plan, plan.resolved())
    r, a = plan.roles[Role.ROLLOUT], plan.roles[Role.ACTOR]
    assert r.slot == a.slot and r.pool == a.pool == "h100"
    slot = next(s for s in plan.slots if s.name == r.slot)
    assert [(p.pool, p.devices) for p in slot.parts] == [
        ("h100", max(a.devices, r.parts[0].devices)), ("h20", r.parts[1].devices)]
    px = Pricer(plan.resolved(), Calibration())
    problem = mixed_only(table())
    est = next(c.est for c in problem.cands[Role.ROLLOUT]
               if [(p.est.pool, p.est.devices, p.samples) for p in c.est.parts]
               == [(q.pool, q.devices, q.samples) for q in r.parts])
    actor = next(c.est for c in problem.cands[Role.ACTOR]
                 if c.est.par == a.par and c.pool == a.pool)
    both = px.sync_time(Placed(a.slot, actor), Placed(r.slot, est))
    local = px.sync_time(Placed(a.slot, actor), Placed(a.slot, est.parts[0].est))
    apart = px.sync_time(Placed(a.slot, actor), Placed("own", est.parts[1].est))
    assert local < apart and both == pytest.approx(apart)
    assert plan.breakdown.sync_s == pytest.approx(apart)


def test_the_simulator_agrees_with_a_mixed_plan():
    """Variance off, one sync iteration of the mixed plan lasts what the placer predicts for
    the placement at the job's means (within 2%, as tests/test_sim_agreement.py)."""
    plan = mixed_plan()
    r = simulate_plan(plan, iterations=1, seed=0, config=SimConfig.no_variance())
    pred = reprice(plan, rollout_tail.at_means(plan.spec), Calibration()).iteration_s
    assert r.metrics.iteration_s.mean == pytest.approx(pred, rel=0.02)


def test_explain_names_the_mixed_rollout():
    plan = mixed_plan()
    px = Pricer(plan.resolved(), Calibration())
    why = splitwhy.split(plan, px, time_limit_s=10.0)[Role.ROLLOUT]
    assert why.shares_with == [Role.ACTOR]
    text = "\n".join(splitwhy.split_lines(Role.ROLLOUT, why))
    assert "mixed rollout: its part on h100" in text and "time-shares its slot with actor" in text


def test_the_executor_seats_the_planned_mixed_rollout():
    """The planner's mixed plan, as `placer execute` runs it (tests/test_exec_mixed.py runs one
    on Ray): the actor on the slot's h100 bundles only, the shared part's engines in those same
    bundles and asleep while it trains, the other part's on the h20 bundles, running apart."""
    from executors.runplan import resolve_plan  # lazy: the executor's side
    plan = mixed_plan()
    run = resolve_plan(plan)
    r = plan.roles[Role.ROLLOUT]
    pools = {b.index: b.pool for b in plan.bundles}
    seats = [(s.role, s.part, pools[s.bundle.index], s.bundle.index) for s in run.seats]
    actor = {b for role, _, _, b in seats if role == Role.ACTOR}
    assert {pools[b] for b in actor} == {"h100"}
    engines = [(part, pool, b) for role, part, pool, b in seats if role == Role.ROLLOUT]
    assert [part for part, _, _ in engines] == [0] * r.parts[0].dp + [1] * r.parts[1].dp
    assert all(b in actor for part, _, b in engines if part == 0)
    assert all(pool == "h20" and b not in actor for part, pool, b in engines if part == 1)
    assert [(g.pool, g.colocated) for g in run.roles[Role.ROLLOUT].engines] == [
        ("h100", True), ("h20", False)]
