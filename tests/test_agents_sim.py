"""Multi-agent plans planned and simulated: with every source of variance off, the simulated step
is the plan's placement re-priced at the job's means (`assemble.reprice` of `at_means`), the
contract single-policy plans keep too; the rollouts run one agent after another, roles of
different agents on one slot take turns, onloads are paid as the planner prices them."""
from __future__ import annotations

from pathlib import Path

import pytest

from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.tail_samples import at_means
from placer.solve.assemble import reprice
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from simulator.agents import agent_plan
from simulator.api import simulate_plan
from simulator.config import SimConfig

HERE = Path(__file__).resolve().parent
JOB = HERE.parent / "examples" / "multiagent-solver-verifier.yaml"


def _agrees(plan, iterations: int = 2) -> None:
    sim = simulate_plan(plan, iterations=iterations, config=SimConfig.no_variance())
    want = reprice(plan, at_means(plan.resolved().job), Calibration())
    assert sim.metrics.iteration_s.p50 == pytest.approx(want.iteration_s, rel=2e-3)
    if want.stage_s["switch"]:
        return  # onloads land in whichever stage a role first takes its slot: the total only
    for stage in ("sync", "rollout", "score", "train"):
        assert getattr(sim.metrics.stage_s, stage) == pytest.approx(want.stage_s[stage],
                                                                   rel=2e-3, abs=1e-6)


def test_the_solver_verifier_plan_simulates_as_priced(planned_example) -> None:
    plan = planned_example(JOB)
    assert set(plan.roles) == set(plan.resolved().job.role_names())
    assert len(plan.sync_routes) >= 2  # each trained agent's actor -> its engines
    _agrees(plan)
    from executors.runplan import resolve_plan  # lazy: the executor's side
    from placer.base.errors import SpecError
    with pytest.raises(SpecError, match=r"job.agents: \[solver, verifier\]: placer execute"):
        resolve_plan(plan)  # the executor runs one policy: refused, not run as the first agent


def test_full_weights_swapped_on_shared_engines_simulate_as_priced() -> None:
    """Two 4B agents on one 2-GPU node share their engines without adapters and cannot all
    fit with the actor: every member onloads, the engines once per run of their turns."""
    raw = {"name": "shared", "algorithm": "grpo",
           "agents": {"members": {
               "solver": {"policy": "Qwen3-4B", "use_reference": False},
               "verifier": {"policy": "Qwen3-4B", "use_reference": False, "reward": "none",
                            "response": {"kind": "fixed", "value": 64}}},
               "turns": ["solver", "verifier", "solver", "verifier"],
               "shared_engines": [{"agents": ["solver", "verifier"], "adapters": "none"}]},
           "batch": {"prompts": 8, "samples_per_prompt": 4},
           "lengths": {"prompt": {"kind": "fixed", "value": 128},
                       "response": {"kind": "lognormal", "median": 96, "sigma": 0.5,
                                    "cap": 512}},
           "cluster": {"pools": [
               {"name": "gpu", "device": "A100-80G", "devices_per_node": 2, "nodes": 1},
               {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}]}}
    plan = plan_job(Pricer(resolve(job_from_dict(raw))))
    slot = plan.roles["solver.rollout"].slot
    assert plan.roles["verifier.rollout"].slot == slot  # shared engines: one slot
    assert plan.breakdown.switch_s.get(slot, 0.0) > 0
    _agrees(plan)


def test_an_agents_view_of_the_plan_keeps_its_roles_and_slots(planned_example) -> None:
    plan = planned_example(JOB)
    view = agent_plan(plan, "verifier")
    assert set(view.roles) == {"actor", "rollout", "reward"}
    assert view.roles["rollout"] == plan.roles["verifier.rollout"]
    assert {s.name for s in view.slots} <= {s.name for s in plan.slots}
    assert view.resolved().job.models.policy == "Qwen3-4B"


def test_an_agents_trainer_may_shard_its_state_in_a_plan(planned_example) -> None:
    """An HSDP shard group on `solver.actor` is a training role's (the colocated baseline of
    `placer compare --simulate` places one)."""
    from placer.solve.planfile import check_plan
    plan = planned_example(JOB)
    actor = plan.roles["solver.actor"]
    sharded = plan.model_copy(update={"roles": {**plan.roles, "solver.actor": actor.model_copy(
        update={"shard": 1})}})
    check_plan(sharded, sharded.resolved())
