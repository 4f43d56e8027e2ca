"""A rollout split over pools in the simulator (`simulator.groups`): each part's engines run its
own contiguous range of the batch on its own pool, weight sync reaches every part over its own
links, a slow device slows only its part's replica, and the split plan the ILP makes for
examples/hetero-split.yaml agrees with its prediction and beats the best single-pool plan."""
from __future__ import annotations

import math
from collections import defaultdict
from functools import cache

import numpy as np
import pytest
from simplans import EXAMPLES, for_job, hetero_split_plans

from placer.base.roles import Role
from placer.cost import rollout_tail
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.split import deal
from placer.solve.assemble import reprice
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict, read_structured
from placer.spec.tailpolicy import TailPolicy
from simulator import iteration
from simulator.api import simulate_plan
from simulator.config import Failures, SimConfig
from simulator.faults import failure_rate_per_s
from simulator.steady import steady_state

TOL = 0.02


def split_plan(mode: str = "async", tail: TailPolicy | None = None) -> Plan:
    plan = hetero_split_plans()[0]
    job = plan.spec
    update: dict[str, object] = {}
    if mode != job.pipeline.mode:
        update["pipeline"] = job.pipeline.model_copy(update={"mode": mode})
    if tail is not None:
        update["tail_policy"] = tail
    return for_job(plan, job.model_copy(update=update)) if update else plan


@cache
def tool_split_plan() -> Plan:
    """hetero-split with a tool call between two turns, on 8 CPU nodes: the ILP still splits."""
    d = read_structured(EXAMPLES / "hetero-split.yaml")
    d["environment"] = {"kind": "tool", "turns": 2, "cpu_per_call": 1, "tool_output_tokens": 64,
                        "tool_latency_s": {"kind": "fixed", "value": 1.0}}
    d["cluster"]["pools"][-1]["nodes"] = 8
    return plan_job(Pricer(resolve(job_from_dict(d), "hetero-split-tools"), Calibration()))


def engine_pools(result) -> dict[int, set[str]]:
    """Engine index -> the pools its prefill and decode events were recorded on."""
    out: dict[int, set[str]] = defaultdict(set)
    for name, _cat, _ts, _dur, pid, tid, _args in result._rec.rows:
        if name in ("prefill", "decode"):
            out[int(tid.rsplit("/engine", 1)[1])].add(pid)
    return out


def ranges(plan: Plan) -> list[tuple[str, int, int]]:
    """(pool, first, end) of each part's samples: contiguous, in part order."""
    out, start = [], 0
    for q in plan.roles[Role.ROLLOUT].parts:
        out.append((q.pool, start, start + q.samples))
        start += q.samples
    return out


def test_the_example_plan_splits_its_rollout_over_two_device_types():
    plan = split_plan()
    parts = plan.roles[Role.ROLLOUT].parts
    res = plan.resolved()
    assert len(parts) >= 2
    assert len({res.device_of(q.pool).name for q in parts}) == len(parts)
    assert sum(q.samples for q in parts) == plan.spec.batch.samples


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_no_variance_split_run_agrees_with_the_prediction(mode):
    plan = split_plan(mode)
    assert plan.mode == mode and plan.roles[Role.ROLLOUT].parts
    r = simulate_plan(plan, iterations=9 if mode == "async" else 1, seed=0,
                      config=SimConfig.no_variance())
    # async: the steady state's time-average over whole pipeline cycles (`simulator.steady`);
    # a plan whose actor slot also holds the reference alternates a long and a short step
    # (45.5 s, 67.0 s), whose p50 is either one, not the period's mean the placer prices
    sim = (steady_state(r).iteration_s if mode == "async" else r.metrics.iteration_s.mean)
    pred = reprice(plan, rollout_tail.at_means(plan.spec), Calibration()).iteration_s
    assert abs(sim - pred) <= TOL * pred, f"simulated {sim:.3f} s vs predicted {pred:.3f} s"
    if mode == "sync":  # the rollout stage itself: the slower part, as the planner prices it
        rollout = reprice(plan, rollout_tail.at_means(plan.spec), Calibration()).stage_s["rollout"]
        assert abs(r.metrics.stage_s.rollout - rollout) <= TOL * rollout


def test_each_part_runs_its_own_samples_on_its_own_pool():
    plan = split_plan()
    r = simulate_plan(plan, iterations=2, seed=3)
    pools = engine_pools(r)
    assert all(len(p) == 1 for p in pools.values()), pools  # an engine lives on one pool
    per_pool: dict[str, int] = defaultdict(int)
    for p in pools.values():
        per_pool[next(iter(p))] += 1
    assert per_pool == {q.pool: q.dp for q in plan.roles[Role.ROLLOUT].parts}
    for rec in r.run.iterations:
        assert len(rec.engine_of) == plan.spec.batch.samples
        for pool, first, end in ranges(plan):
            for sid in range(first, end):
                assert pools[rec.engine_of[sid]] == {pool}, (sid, pool)
    # every part's devices count on its own pool
    util = r.metrics.utilization.pool
    assert all(util[q.pool] > 0.3 for q in plan.roles[Role.ROLLOUT].parts), util


def test_every_parts_tool_calls_share_the_one_environment_pool():
    plan = tool_split_plan()
    parts = plan.roles[Role.ROLLOUT].parts
    assert len(parts) >= 2 and Role.ENVIRONMENT in plan.roles
    r = simulate_plan(plan, iterations=5, seed=0, config=SimConfig.no_variance())
    pred = reprice(plan, rollout_tail.at_means(plan.spec), Calibration()).iteration_s
    sim = r.metrics.iteration_s.p50
    assert abs(sim - pred) <= TOL * pred, f"simulated {sim:.3f} s vs predicted {pred:.3f} s"
    env_pool = plan.roles[Role.ENVIRONMENT].pool
    called: dict[str, set[int]] = defaultdict(set)
    for name, _c, _t, _d, pid, _tid, args in r._rec.rows:
        if name == "tool":
            called[pid] |= set(dict(zip(*args))["sample_ids"])
    assert set(called) == {env_pool}
    assert called[env_pool] == set(range(plan.spec.batch.samples))  # every part's samples


def test_weight_sync_reaches_every_part_over_its_own_links():
    plan = split_plan("sync")
    r = simulate_plan(plan, iterations=1, seed=0, config=SimConfig.no_variance())
    syncs = [row for row in r._rec.rows if row[0] == "weight sync"]
    parts = plan.roles[Role.ROLLOUT].parts
    assert sorted(row[4] for row in syncs) == sorted(q.pool for q in parts)
    links = syncs[0][6]["links"]
    assert all(f"recv@{q.pool}" in links for q in parts), links
    # one broadcast every part joins: as long as the slowest part's transfer alone
    # (the planner's max over parts), and no part is left out
    sim = r.run.iterations[0].sync_s
    assert sim == pytest.approx(plan.breakdown.sync_s, rel=1e-6)


def test_a_slow_device_slows_only_its_parts_replica(monkeypatch):
    plan = split_plan("sync")
    parts = plan.roles[Role.ROLLOUT].parts
    slot = plan.roles[Role.ROLLOUT].slot
    # the second part's last device: its last replica (engines are numbered part by part)
    slow_dev = parts[0].devices + parts[1].devices - 1
    slow_engine = parts[0].dp + parts[1].dp - 1
    cfg = SimConfig.no_variance()

    def run(factor: float) -> dict[int, list[float]]:
        def slowdowns(plan, _cfg, _seed, _i):
            out = {s.name: np.ones(s.devices) for s in plan.slots}
            out[slot][slow_dev] = factor
            return out
        monkeypatch.setattr(iteration, "device_slowdowns", slowdowns)
        r = simulate_plan(plan, iterations=1, seed=0, config=cfg)
        durs: dict[int, list[float]] = defaultdict(list)
        for name, _c, _t, dur, _p, tid, _a in r._rec.rows:
            if name in ("prefill", "decode"):
                durs[int(tid.rsplit("/engine", 1)[1])].append(dur)
        return durs

    base, slowed = run(1.0), run(2.0)
    assert set(base) == set(slowed) == set(range(parts[0].dp + parts[1].dp))
    for k in base:
        want = [2.0 * d for d in base[k]] if k == slow_engine else base[k]
        assert slowed[k] == pytest.approx(want, rel=1e-9), k


def test_failures_count_each_parts_device_type():
    plan = split_plan()
    res = plan.resolved()
    h20 = next(q for q in plan.roles[Role.ROLLOUT].parts if res.device_of(q.pool).name == "H20")
    rate = failure_rate_per_s(res, plan, Failures(mtbf_hours={"H20": 1000.0}))
    assert rate == pytest.approx(h20.devices / (1000.0 * 3600.0))


def test_overprovisioning_keeps_one_quota_over_every_part():
    tail = TailPolicy(kind="overprovision", fraction=0.25)
    plan = split_plan("sync", tail)
    n = plan.spec.batch.samples
    r = simulate_plan(plan, iterations=1, seed=1)
    rec = r.run.iterations[0]
    generated = math.ceil(n * 1.25)
    assert rec.generated == generated and rec.committed == n
    # the extra rows follow the parts' shares, each part's range contiguous
    counts = deal(generated, [q.samples for q in plan.roles[Role.ROLLOUT].parts])
    assert sum(counts) == generated
    pools = engine_pools(r)
    start = 0
    for q, c in zip(plan.roles[Role.ROLLOUT].parts, counts):
        assert c >= q.samples
        assert all(pools[rec.engine_of[s]] == {q.pool}
                   for s in range(start, start + c) if s in rec.engine_of)
        start += c


def test_partial_rollouts_run_over_the_split():
    plan = split_plan("sync", TailPolicy(kind="partial", token_budget=2048))
    r = simulate_plan(plan, iterations=3, seed=2)
    n = plan.spec.batch.samples
    assert all(rec.generated <= n for rec in r.run.iterations)  # carried rows count in the n
    assert sum(rec.committed for rec in r.run.iterations) > 0
    assert r.metrics.tail_policy.carried_tokens_per_iteration > 0


@pytest.mark.parametrize(("n", "kept", "want"), [
    (10, [6, 4], [6, 4]),
    (13, [6, 4], [8, 5]),  # 3 extra: 1.8 and 1.2 -> 1 + 1, the larger remainder takes the third
    (5, [6, 4], [3, 2]),
    (7, [7], [7]),
    (0, [6, 4], [0, 0]),
])
def test_deal_follows_the_shares_by_largest_remainder(n, kept, want):
    assert deal(n, kept) == want


def test_the_split_plan_beats_the_best_single_pool_plan_in_simulation():
    split, single = hetero_split_plans()
    assert not any(r.parts for r in single.roles.values())
    sims = [simulate_plan(p, iterations=8, seed=0).metrics.iteration_s.mean
            for p in (split, single)]
    assert sims[0] < sims[1], sims
