"""The ILP is optimal: on random small instances its plan equals an exhaustive search.

Instances: up to 4 roles, up to 3 pools, up to 32 devices, sync and async (staleness 1 or 2, so
the async chain bound binds on some), fixed and long-tailed response lengths, with or without a
periodic validation (`Job.validation`), time and cost objectives. The brute force
(tests/slot_oracle.py) enumerates, over the *same* cost table, every choice of one candidate
per role and every grouping of roles into colocation slots (one pool per slot, pool capacities
respected) and prices each with the same `ilp_bound.score` (which is `timing.iteration_time`).
A rollout split over two pools (`placer.cost.split`) is drawn into the table whenever the cluster has
one: it must sit alone in its slot and holds devices on each of its pools; in sync mode it may
instead be mixed (`Candidate.colocated`): its first part shares a slot with other roles on that
part's pool, and that slot holds the other part's devices on its pool. On two-GPU-pool
clusters every split the pools allow (each part at every layout and device count it has alone)
goes into the table at once (`test_split_parts_at_every_count_match_brute_force`).
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from slot_oracle import brute_force

from placer.base.errors import Infeasible
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import solve
from placer.solve.planner import build_problem
from placer.solve.problem import Problem
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict

DEVICES = ["H100-SXM", "A100-80G", "L40S", "H20", "groq-lpu", "cpu-node"]


@st.composite
def jobs(draw):
    n_pools = draw(st.integers(1, 3))
    budget, pools = 32, []
    kinds = draw(st.permutations(DEVICES))
    # the first pool trains (an actor needs one), the others are drawn freely
    first = draw(st.sampled_from(["H100-SXM", "A100-80G", "H20"]))
    names = [first] + [k for k in kinds if k != first][: n_pools - 1]
    for i, dev in enumerate(names):
        per = draw(st.sampled_from([1, 2, 4, 8]))
        nodes = draw(st.integers(1, max(1, min(4, (budget - (n_pools - i - 1)) // per))))
        budget -= per * nodes
        pools.append({"name": f"p{i}", "device": dev, "devices_per_node": per, "nodes": nodes})
    env = draw(st.booleans())
    use_ref = draw(st.booleans()) if env else True  # at most 4 roles
    reward = draw(st.sampled_from(["rule", "Qwen2.5-7B"]))
    if not any(p["device"] == "cpu-node" for p in pools) and (reward == "rule" or env):
        cpu = {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 2}
        if len(pools) == 3:  # a rule reward and an environment need a CPU pool
            pools[-1] = cpu
        else:
            pools.append(cpu)
    mode = draw(st.sampled_from(["sync", "async"]))
    # a periodic validation: a `validate` stage on the rollout's slot (placer.cost.validation)
    validation = draw(st.sampled_from([None, {"every": 1, "samples": 16},
                                       {"every": 3, "samples": 64}]))
    return job_from_dict({
        "name": "oracle", "algorithm": "grpo", "validation": validation,
        "models": {"policy": draw(st.sampled_from(["Qwen2.5-7B", "Llama-3-8B"])),
                   "reward": reward, "use_reference": use_ref},
        "batch": {"prompts": draw(st.sampled_from([8, 32, 64])), "samples_per_prompt": 4},
        "lengths": {"prompt": {"kind": "fixed", "value": draw(st.sampled_from([128, 512]))},
                    "response": draw(st.sampled_from([
                        {"kind": "fixed", "value": 64}, {"kind": "fixed", "value": 256},
                        {"kind": "lognormal", "median": 128, "sigma": 1.0, "cap": 1024}]))},
        "environment": {"kind": "tool" if env else "none", "turns": 2 if env else 1},
        "pipeline": {"mode": mode,
                     "max_staleness": draw(st.sampled_from([1, 2])) if mode == "async" else 0},
        "objective": draw(st.sampled_from(["time", "cost"])),
        "cluster": {"pools": pools},
    })


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=jobs(), data=st.data())
def test_ilp_matches_brute_force(job, data):
    res = resolve(job)
    try:
        full = build_problem(Pricer(res, Calibration()))
    except Infeasible:  # e.g. a 7B actor on 1 A100: the diagnosis has its own tests
        assume(False)
    # a random subset of at most 3 candidates per role keeps the brute force small
    # (single-pool ones: the planner's table always has those, and they keep every instance
    # feasible), plus a split rollout where the cluster has one
    singles = {r: [c for c in cs if not c.split] for r, cs in full.cands.items()}
    cands = {r: data.draw(st.lists(st.sampled_from(cs), min_size=1, max_size=3, unique_by=id),
                          label=r) for r, cs in singles.items()}
    splits = [c for c in full.cands.get("rollout", []) if c.split]
    if splits:
        cands["rollout"] = [*cands["rollout"][:2], data.draw(st.sampled_from(splits), "split")]
    problem = Problem(Pricer(res, full.calib), cands, full.objective)
    expect = brute_force(problem)
    sol = solve(problem, time_limit_s=20.0, workers=1)
    got = score(problem, sol.assignment)[0 if problem.objective == "time" else 1]
    assert sol.status == "OPTIMAL"
    assert got == pytest.approx(expect, rel=1e-5)
    assert sol.objective == pytest.approx(expect, rel=1e-4)


def test_ilp_prices_a_negative_tool_term_like_timing() -> None:
    """Over-provisioned with a pool a little short of cores, the tool-queue pair term is
    negative (`toolqueue.queue_delay`: the kept samples finish sooner); the ILP must give it to
    the rollout's slot only, as `timing` does, and still match the exhaustive search."""
    from simplans import small_job

    from placer.cost.timing import Placed

    job = job_from_dict(small_job(
        environment__turns=4, lengths__response={"kind": "fixed", "value": 256},
        tail_policy={"kind": "overprovision", "fraction": 0.25},
        pipeline={"mode": "async", "max_staleness": 1}))
    res = resolve(job)
    full = build_problem(Pricer(res, Calibration()))

    def tool(k, e) -> float:
        return Pricer(res, full.calib).tool_time(Placed("r", k.est), Placed("e", e.est))

    pairs = [(k, e) for k in full.cands["rollout"] if not k.split
             for e in full.cands["environment"] if tool(k, e) < 0]
    assert pairs  # the case under test exists
    k, e = pairs[0]
    cands = {r: cs[:2] for r, cs in full.cands.items()}
    cands["rollout"], cands["environment"] = [k], [e]  # the negative pair, every grouping
    problem = Problem(Pricer(res, full.calib), cands, "time")
    expect = brute_force(problem)
    sol = solve(problem, time_limit_s=20.0, workers=1)
    assert sol.status == "OPTIMAL"
    assert score(problem, sol.assignment)[0] == pytest.approx(expect, rel=1e-5)
    assert sol.objective == pytest.approx(expect, rel=1e-4)


@st.composite
def split_jobs(draw):
    """A small GRPO job on two GPU pools that can both generate (so the rollout may split) and
    a CPU pool for the rule reward."""
    gen = draw(st.sampled_from(["H20", "L40S", "A100-80G"]))
    pools = [{"name": "p0", "device": draw(st.sampled_from(["H100-SXM", "A100-80G"])),
              "devices_per_node": draw(st.sampled_from([4, 8])), "nodes": draw(st.integers(1, 2))},
             {"name": "p1", "device": gen, "devices_per_node": draw(st.sampled_from([2, 4, 8])),
              "nodes": draw(st.integers(1, 2))},
             {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}]
    mode = draw(st.sampled_from(["sync", "async"]))
    return job_from_dict({
        "name": "oracle-split", "algorithm": "grpo",
        "models": {"policy": draw(st.sampled_from(["Qwen2.5-7B", "Llama-3-8B"])),
                   "reward": "rule", "use_reference": False},
        "batch": {"prompts": draw(st.sampled_from([32, 64])), "samples_per_prompt": 4},
        "lengths": {"prompt": {"kind": "fixed", "value": 256},
                    "response": draw(st.sampled_from([
                        {"kind": "fixed", "value": 256},
                        {"kind": "lognormal", "median": 256, "sigma": 1.0, "cap": 2048}]))},
        "pipeline": {"mode": mode, "max_staleness": 1 if mode == "async" else 0},
        "objective": draw(st.sampled_from(["time", "cost"])),
        "cluster": {"pools": pools},
    })


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(job=split_jobs(), data=st.data())
def test_split_parts_at_every_count_match_brute_force(job, data):
    """Every split the pools allow: the unbounded table pairs every layout (so every device
    count) the rollout has alone on one pool with every one on the other (none pruned; only
    splits another split beats on devices and every stage are left out), and the ILP over all
    of those splits (with a few single-pool candidates per role) equals the exhaustive search.
    The planner's bounded table reaches the same optimum: its bound prunes no split a better
    plan needs."""
    res = resolve(job)
    try:
        full = build_problem(Pricer(res, Calibration()), bounded=False)
        bounded = build_problem(Pricer(res, Calibration()))
    except Infeasible:
        assume(False)
    rollout_singles = [c for c in full.cands["rollout"] if not c.split]
    per_pool = {p: len([c for c in rollout_singles if c.pool == p]) for p in ("p0", "p1")}
    space = full.space
    assert space is not None and space.pruned_by_bound == 0
    assert space.split_counts == per_pool["p0"] * per_pool["p1"]
    splits = [c for c in full.cands["rollout"] if c.split]
    assert len([c for c in splits if not c.colocated]) == space.split_counts - space.dominated
    assume(splits)
    singles = {r: [c for c in cs if not c.split] for r, cs in full.cands.items()}
    cands = {r: data.draw(st.lists(st.sampled_from(cs), min_size=1, max_size=2, unique_by=id),
                          label=r) for r, cs in singles.items()}
    cands["rollout"] = [*cands["rollout"], *splits]
    problem = Problem(Pricer(res, full.calib), cands, full.objective)
    key = 0 if problem.objective == "time" else 1
    expect = brute_force(problem)
    sol = solve(problem, time_limit_s=30.0, workers=1)
    assert sol.status == "OPTIMAL"
    assert score(problem, sol.assignment)[key] == pytest.approx(expect, rel=1e-5)
    # the whole tables: the bounded one loses nothing the unbounded one's optimum needs
    a, b = solve(bounded, 60.0, workers=1), solve(full, 60.0, workers=1)
    assert a.status == b.status == "OPTIMAL"
    assert score(bounded, a.assignment)[key] == pytest.approx(score(full, b.assignment)[key],
                                                              rel=1e-6)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ilp_prices_validation_like_timing(mode) -> None:
    """A job that validates every step with a large validation set: the ILP's objective is the
    priced step with its `validate` stage (the generation on the chosen rollout, the refit /
    every, the engines' wake where they share a slot), and equals the exhaustive search; the
    stage is no small term here (the step without it is far shorter)."""
    from simplans import small_job

    job = small_job(environment={"kind": "none", "turns": 1},
                    pipeline={"mode": mode, "max_staleness": int(mode == "async")},
                    validation={"every": 1, "samples": 512})
    job["cluster"]["pools"][0]["nodes"] = 2
    res = resolve(job_from_dict(job))
    full = build_problem(Pricer(res, Calibration()))
    problem = Problem(Pricer(res, full.calib), {r: cs[:3] for r, cs in full.cands.items()},
                      "time")
    expect = brute_force(problem)
    sol = solve(problem, time_limit_s=20.0, workers=1)
    assert sol.status == "OPTIMAL"
    bd = problem.px.iteration_time(sol.assignment.placed())
    assert bd.iteration_s == pytest.approx(expect, rel=1e-5)
    assert sol.objective == pytest.approx(expect, rel=1e-4)
    assert bd.stage_s["validate"] > 0.2 * bd.iteration_s
    plain = dict(job)
    del plain["validation"]
    res0 = resolve(job_from_dict(plain))
    p0 = Problem(Pricer(res0, full.calib), problem.cands, "time")
    assert solve(p0, time_limit_s=20.0, workers=1).objective < 0.8 * sol.objective
