"""The placement ILP on multi-agent jobs: optimal against an exhaustive search, and exact for the
cost model's rule (`placer.cost.agents`: the agents' rollouts and weight syncs add, the other
stages follow the slot rule, shared engines share a slot).

Instances: two agents (a trained solver; a trained or frozen verifier, on engines of its own or
sharing the solver's, with LoRA adapters or swapped full weights), sync or async, on one or two
GPU pools and a CPU pool of up to 24 devices. The brute force (tests/slot_oracle.py)
enumerates, over the same cost table, every choice of one candidate per role and every grouping
into slots (one pool per slot, capacities respected, shared engines in one slot) and prices each
with `ilp_bound.score`,
which is `AgentPricer.iteration_time`.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from slot_oracle import brute_force

from placer.base.errors import Infeasible
from placer.cost.agents import swap_runs
from placer.cost.pricer import AgentPricer, Pricer
from placer.solve.agentplan import build_agent_problem
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import solve
from placer.solve.problem import Assignment, Problem
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict, load_job


def agent_job(verifier: dict, shared: str | None, mode: str, pools: list[dict],
              turns: list[str]) -> dict:
    agents: dict = {"members": {
        "solver": {"policy": "Qwen3-4B", "use_reference": False, "reward": "rule",
                   "response": {"kind": "fixed", "value": 256}},
        "verifier": verifier}, "turns": turns}
    if shared is not None:
        agents["shared_engines"] = [{"agents": ["solver", "verifier"], "adapters": shared}]
    return {"name": "agents", "algorithm": "grpo", "agents": agents,
            "batch": {"prompts": 16, "samples_per_prompt": 4},
            "lengths": {"prompt": {"kind": "fixed", "value": 256},
                        "response": {"kind": "fixed", "value": 128}},
            "pipeline": {"mode": mode, "max_staleness": 1 if mode == "async" else 0},
            "cluster": {"pools": pools}}


@st.composite
def jobs(draw):
    shared = draw(st.sampled_from([None, "lora", "none"]))
    verifier = {"policy": "Qwen3-4B" if shared else draw(st.sampled_from(["Qwen3-4B",
                                                                          "Qwen2.5-7B"])),
                "trained": draw(st.booleans()), "use_reference": False, "reward": "none",
                "response": {"kind": "fixed", "value": draw(st.sampled_from([64, 256]))}}
    pools = [{"name": "g0", "device": draw(st.sampled_from(["H100-SXM", "A100-80G"])),
              "devices_per_node": draw(st.sampled_from([2, 4, 8])), "nodes": 1}]
    if draw(st.booleans()):
        pools.append({"name": "g1", "device": draw(st.sampled_from(["L40S", "H100-SXM"])),
                      "devices_per_node": draw(st.sampled_from([2, 4])), "nodes": 1})
    pools.append({"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1})
    turns = draw(st.sampled_from([["solver", "verifier"], ["solver", "verifier", "solver"]]))
    return job_from_dict(agent_job(verifier, shared, draw(st.sampled_from(["sync", "async"])),
                                   pools, turns))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=jobs(), data=st.data())
def test_ilp_matches_brute_force_on_two_agents(job, data):
    px = AgentPricer(resolve(job))
    try:
        full = build_agent_problem(px)
    except Infeasible:
        assume(False)
    cands = {r: data.draw(st.lists(st.sampled_from(cs), min_size=1, max_size=2, unique_by=id),
                          label=r) for r, cs in full.cands.items()}
    problem = Problem(px, cands, "time")
    expect = brute_force(problem)
    assume(expect < float("inf"))
    sol = solve(problem, time_limit_s=20.0, workers=1)
    assert sol.status == "OPTIMAL"
    assert score(problem, sol.assignment)[0] == pytest.approx(expect, rel=1e-5)
    assert sol.objective == pytest.approx(expect, rel=1e-4)
    for g in px.colocated_roles():
        assert len({sol.assignment.slot_of[r] for r in g}) == 1


def _two_h100_job(**verifier) -> AgentPricer:
    pools = [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8, "nodes": 1},
             {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}]
    v = {"policy": "Qwen3-4B", "reward": "none", "use_reference": False,
         "response": {"kind": "fixed", "value": 128}, **verifier}
    return AgentPricer(resolve(job_from_dict(agent_job(v, None, "sync", pools,
                                                       ["solver", "verifier", "solver"]))))


def test_a_pricer_of_an_agent_job_is_an_agent_pricer() -> None:
    res = _two_h100_job().res
    assert type(Pricer(res)) is AgentPricer
    single = resolve(load_job(Path(__file__).resolve().parent.parent / "examples" / "tiny-cpu.yaml"))
    assert type(Pricer(single)) is Pricer


def test_each_agent_is_priced_with_its_own_model_and_turns() -> None:
    """The verifier's engines run its model on its own (shorter) turns; the solver's hold its
    two turns: on one layout, the solver's rollout takes longer."""
    px = _two_h100_job()
    pool = px.res.cluster.pool("h100")
    problem = build_agent_problem(px)
    par = problem.cands["verifier.rollout"][0].est.par
    s, v = px.estimate("solver.rollout", pool, par), px.estimate("verifier.rollout", pool, par)
    assert (s.role, v.role) == ("solver.rollout", "verifier.rollout")
    assert s.stage_s["rollout"] > v.stage_s["rollout"] > 0
    assert px.subs["solver"].res.job.environment.turns == 2


def test_the_agents_rollouts_add_wherever_they_sit() -> None:
    """Apart, the rollout stage is the sum of the two rollouts (turns run in schedule order),
    not their max as for roles that overlap."""
    px = _two_h100_job()
    problem = build_agent_problem(px)
    choice = {r: cs[0] for r, cs in problem.cands.items()}
    apart = Assignment(choice, {r: r for r in choice})
    bd = px.iteration_time(apart.placed())
    want = sum(choice[r].est.stage_s["rollout"] for r in ("solver.rollout", "verifier.rollout"))
    assert bd.stage_s["rollout"] == pytest.approx(want)


def test_full_weights_swapped_pay_once_per_run_of_turns() -> None:
    from placer.spec.agents import Agents
    def runs(turns: list[str]) -> tuple[int, int]:
        a = Agents.model_validate({"members": {"s": {"policy": "x"}, "v": {"policy": "x"}},
                                   "turns": turns,
                                   "shared_engines": [{"agents": ["s", "v"], "adapters": "none"}]})
        return swap_runs(a, 0, "s"), swap_runs(a, 0, "v")

    # the next step starts where this one ended: s's last turn and its first are one run
    assert runs(["s", "v", "s"]) == (1, 1)
    assert runs(["s", "v"]) == (1, 1)
    assert runs(["s", "v", "s", "v"]) == (2, 2)
    assert runs(["s", "s", "v", "s", "v", "v"]) == (2, 2)


def test_a_lora_agent_holds_its_adapter_not_a_second_base() -> None:
    pools = [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8, "nodes": 1},
             {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}]
    v = {"policy": "Qwen3-4B", "reward": "none", "use_reference": False}
    px = AgentPricer(resolve(job_from_dict(agent_job(v, "lora", "sync", pools,
                                                     ["solver", "verifier"]))))
    pool = px.res.cluster.pool("h100")
    par = build_agent_problem(px).cands["solver.rollout"][0].est.par
    s, v_ = px.estimate("solver.rollout", pool, par), px.estimate("verifier.rollout", pool, par)
    assert 0 < v_.memory.weights < s.memory.weights / 10
