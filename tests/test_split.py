"""Roles split over pools (`placer.cost.split`): the balance point, the split candidate's pricing, the
ILP's choice on a cluster where a split pays, and the plan file's checks of its parts."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from placer.base.errors import SpecError
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.cost.split import PartTimer, SplitSpace, _cap, balance, split_estimates
from placer.cost.timing import Placed
from placer.solve.assemble import placed_estimate
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import solve
from placer.solve.planfile import check_plan
from placer.solve.planner import build_problem, to_plan
from placer.solve.problem import Problem
from placer.spec.catalog import resolve
from placer.spec.load import load_job

EXAMPLE = "examples/hetero-split.yaml"


@pytest.fixture(scope="module")
def problem() -> Problem:
    return build_problem(Pricer(resolve(load_job(EXAMPLE)), Calibration()))


def _split_cands(problem: Problem):
    return [c for c in problem.cands["rollout"] if c.split]


def _unbounded_splits(problem: Problem):
    singles = {p: [c.est for c in problem.cands["rollout"] if not c.split and c.pool == p]
               for p in ("h100", "h20", "l40s")}
    return split_estimates(Pricer(problem.res, problem.calib), "rollout", singles)


def test_split_candidates_cover_pool_pairs(problem):
    """Unbounded, every pair of pools has splits (the table's bound may prune some: on this
    job, the splits with the L40S cannot beat the H100 + H20 one)."""
    splits = _unbounded_splits(problem)
    pairs = {tuple(p.est.pool for p in e.parts) for e in splits}
    assert {("h100", "h20"), ("h100", "l40s"), ("h20", "l40s")} <= pairs
    for e in splits + [c.est for c in _split_cands(problem)]:
        assert e.devices == sum(p.est.devices for p in e.parts)
        assert sum(p.samples for p in e.parts) == problem.res.job.batch.samples
        assert all(p.samples % problem.res.job.batch.samples_per_prompt == 0 for p in e.parts)
        assert e.time_s == pytest.approx(max(p.est.time_s for p in e.parts))


def test_balance_is_the_crossing(problem):
    """`balance` finds the split where moving one GRPO group either way never lowers the slower
    part; the table's candidates (balanced at the means, corrected once on the tail model) are
    within 5% of that exact balance."""
    res, calib = problem.res, problem.calib
    timer = PartTimer.of(Pricer(res, calib), "rollout")
    group, total = res.job.batch.samples_per_prompt, res.job.batch.samples
    for c in _split_cands(problem)[:6]:
        a, b = (p.est for p in c.est.parts)
        n, worst = balance(a, b, total, group, timer)
        assert c.time_s == pytest.approx(worst, rel=0.05) and c.time_s >= worst * (1 - 1e-9)
        for m in (n - group, n + group):
            ta, tb = timer(a, m), timer(b, total - m)
            other = max(ta.time_s if ta else math.inf, tb.time_s if tb else math.inf)
            assert other >= worst * (1 - 1e-9)


def test_part_is_the_single_estimate_on_its_samples(problem):
    """A part is priced exactly as a single-pool rollout on a job of its samples, except that
    its tail is the longest sample of the whole step's draws (`PriceContext.with_samples`):
    on a job of its own samples alone, the part is priced no slower (a longest sample no
    longer; here both reach the cap), which made two halves of a pool faster than the pool."""
    c = _split_cands(problem)[0]
    for p in c.est.parts:
        part = Pricer(problem.res, problem.calib).with_samples(p.samples)
        assert part.step_draws == problem.res.job.batch.samples
        again = part.estimate("rollout", part.res.cluster.pool(p.est.pool), p.est.par)
        assert again.stage_s == p.est.stage_s
        pres = problem.res.with_samples(p.samples)
        alone = Pricer(pres, problem.calib).estimate("rollout", pres.cluster.pool(p.est.pool),
                                                     p.est.par)
        assert alone.time_s <= p.est.time_s


def test_two_halves_of_a_pool_are_priced_as_the_pool():
    """The invariance at its cause: a rollout on 2k identical replicas of one pool, and the
    same replicas as two parts of k on two copies of the pool with half the batch each, are
    priced the same (each part's busiest replica holds as many samples as the pool's and the
    step's longest sample), on a long-tailed job."""
    job = load_job("examples/agentic-code.yaml")
    h100 = job.cluster.pool("h100")
    halves = [h100.model_copy(update={"nodes": 1}),
              h100.model_copy(update={"name": "h100-b", "nodes": 1})]
    px = Pricer(resolve(job.model_copy(update={"cluster": job.cluster.model_copy(
        update={"pools": [p for p in job.cluster.pools if p.name != "h100"] + halves})})),
        Calibration())
    whole = Pricer(resolve(job.model_copy(update={"cluster": job.cluster.model_copy(
        update={"pools": [p for p in job.cluster.pools if p.name != "h100"]
                + [h100.model_copy(update={"nodes": 2})]})})), Calibration())
    total = job.batch.samples
    single = whole.estimate("rollout", whole.res.cluster.pool("h100"), Parallel(tp=2, dp=8))
    part = px.with_samples(total // 2)
    parts = [part.estimate("rollout", part.res.cluster.pool(p.name), Parallel(tp=2, dp=4))
             for p in halves]
    assert single.feasible and all(p.feasible for p in parts)
    assert max(p.time_s for p in parts) == pytest.approx(single.time_s, rel=1e-12)


def test_sync_to_a_split_is_its_slowest_part(problem):
    res, calib = problem.res, problem.calib
    actor = Placed("actor", problem.cands["actor"][0].est)
    c = _split_cands(problem)[0]
    per_part = [Pricer(res, calib).sync_time(actor, Placed("rollout", p.est)) for p in c.est.parts]
    assert Pricer(res, calib).sync_time(actor, Placed("rollout", c.est)) == pytest.approx(max(per_part))


def test_splits_cover_every_count_each_pool_has_alone(problem):
    """Without a bound every pair of single-pool layouts is searched and priced: the parts of
    the splits kept take every device count the role has alone on their pools, and each pair
    of pools has one split per pair of counts less those another split beats."""
    res, calib = problem.res, problem.calib
    singles = {p: [c.est for c in problem.cands["rollout"] if not c.split and c.pool == p]
               for p in ("h100", "h20", "l40s")}
    space = SplitSpace()
    splits = split_estimates(Pricer(res, calib), "rollout", singles, None, space)
    counts = {p: {e.devices for e in es} for p, es in singles.items()}
    pairs = sum(len(a) * len(b) for a, b in
                ((singles["h100"], singles["h20"]), (singles["h100"], singles["l40s"]),
                 (singles["h20"], singles["l40s"])))
    assert space.pairs == pairs and space.pruned_by_bound == 0
    assert space.kept == len(splits) == pairs - space.dominated
    used = {p: {q.est.devices for s in splits for q in s.parts if q.est.pool == p} for p in counts}
    assert any(len(used[p]) > 4 for p in used)  # more counts than a thinned list had
    assert all(used[p] <= counts[p] for p in counts)


def test_cap_is_the_most_groups_within_the_limit(problem):
    """`_cap`: the largest group count whose tail-aware time `keep` accepts, found by a doubling
    search and bisection, equals a scan over every count."""
    res, calib = problem.res, problem.calib
    timer = PartTimer.of(Pricer(res, calib), "rollout")
    group, total = res.job.batch.samples_per_prompt, res.job.batch.samples
    part = next(c.est for c in problem.cands["rollout"] if c.pool == "l40s" and not c.split)
    other = next(c.est for c in problem.cands["rollout"] if c.pool == "h20" and not c.split)
    times = [timer(part, g * group).time_s for g in range(1, total // group + 1)]
    for limit in (times[0] * 0.5, times[len(times) // 3], times[-1] * 2):
        keep = lambda _parts, t, limit=limit: t <= limit  # noqa: E731
        want = max((g for g, t in enumerate(times, 1) if t <= limit), default=0)
        assert _cap(part, (part, other), total, group, timer, keep) == want


def test_ilp_splits_rollout_when_it_pays(problem):
    """On the example neither generation pool keeps up alone: the ILP splits the rollout and its
    plan is faster than the best plan without split candidates (each solved to optimality)."""
    sol = solve(problem, time_limit_s=30, workers=1)
    chosen = sol.assignment.choice["rollout"]
    assert sol.status == "OPTIMAL" and chosen.split
    singles = replace(problem, cands={r: [c for c in cs if not c.split]
                                      for r, cs in problem.cands.items()})
    alone = solve(singles, time_limit_s=30, workers=1)
    assert alone.status == "OPTIMAL"
    assert score(problem, sol.assignment)[0] < score(singles, alone.assignment)[0] * 0.97
    # the split role sits alone in its slot
    slot = sol.assignment.slot_of["rollout"]
    assert [r for r, s in sol.assignment.slot_of.items() if s == slot] == ["rollout"]


def test_plan_file_records_parts(problem):
    sol = solve(problem, time_limit_s=30, workers=1)
    plan = to_plan(problem, sol)
    r = plan.roles["rollout"]
    assert len(r.parts) == 2 and r.devices == sum(p.devices for p in r.parts)
    assert sum(p.share for p in r.parts) == pytest.approx(1.0)
    assert r.pool == r.parts[0].pool
    slot = next(s for s in plan.slots if s.name == r.slot)
    assert [(p.pool, p.devices) for p in slot.parts] == r.pool_devices()
    for p in slot.parts:  # every part's devices are named in bundles of its own pool
        held = sum(len(b.devices) for b in plan.bundles if b.slot == slot.name and b.pool == p.pool)
        assert held == p.devices and p.nodes
    # re-pricing the plan's role gives the estimate the ILP priced
    again = placed_estimate(Pricer(problem.res, problem.calib), "rollout", r)
    assert again.time_s == pytest.approx(r.time_s)
    # a part's pool gets a weight-sync route
    assert {route.dst.split(":")[0] for route in plan.sync_routes} >= {p.pool for p in r.parts}


def test_check_plan_names_inconsistent_parts(problem):
    plan = to_plan(problem, solve(problem, time_limit_s=30, workers=1))
    r = plan.roles["rollout"]
    bad = plan.model_copy(update={"roles": {**plan.roles, "rollout": r.model_copy(
        update={"devices": r.devices + 1})}})
    with pytest.raises(SpecError, match=r"roles.rollout.devices: .* its parts hold"):
        check_plan(bad, problem.res)
    first = r.parts[0].model_copy(update={"samples": r.parts[0].samples + 1})
    bad = plan.model_copy(update={"roles": {**plan.roles, "rollout": r.model_copy(
        update={"parts": [first, *r.parts[1:]]})}})
    with pytest.raises(SpecError, match=r"roles.rollout.parts: the parts' samples add up"):
        check_plan(bad, problem.res)
    ghost = r.parts[1].model_copy(update={"pool": "nowhere"})
    bad = plan.model_copy(update={"roles": {**plan.roles, "rollout": r.model_copy(
        update={"parts": [r.parts[0], ghost]})}})
    with pytest.raises(SpecError, match=r"roles.rollout.parts.1.pool: no pool 'nowhere'"):
        check_plan(bad, problem.res)
