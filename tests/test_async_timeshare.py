"""An async plan whose rollout shares its slot with the reference: the slot time-shares.

The reference pass of step i runs on the rollout's devices between rollouts i and i+1, so the
slot is busy sync + onloads + rollout + reference score per step, and with that slot the busiest
the async period is exactly that sum (`placer.cost.timing`: T >= the busiest slot's work). The
simulator must run the slot that way (oldest step first, `simulator.iteration`) and reach the
same period with variance off. Were rollout i+1 to take the slot at the instant rollout i ended,
ahead of step i's reference pass, the commits would alternate long and short and a short run
would disagree with the planner by several percent (examples/agentic-code.yaml with
over-provisioning: 56.8 s simulated against 60.7 s predicted)."""
from __future__ import annotations

import pytest
from simplans import small_plan

from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.model import engine_swap_time, switch_time
from placer.cost.pricer import Pricer
from placer.cost.tail_samples import at_means
from placer.cost.timing import Placed, onload_time
from placer.solve.assemble import placed_estimate, reprice
from placer.spec.catalog import resolve
from placer.spec.pipeline import Async
from simulator.api import simulate_plan
from simulator.config import SimConfig
from simulator.metrics import iteration_durations
from simulator.training import onload_costs

# actor alone; rollout and reference time-share the other four GPUs; no tools
PLACEMENT = {"actor": ("h100", 4, "train"), "rollout": ("h100", 4, "gen"),
             "reference": ("h100", 4, "gen"), "reward": ("cpu", 1, "verify")}
ITERATIONS = 8


def _plan():
    return small_plan(PLACEMENT, pipeline={"mode": "async", "max_staleness": 1},
                      environment={"kind": "none"},
                      lengths__response={"kind": "fixed", "value": 256})


def _by_hand(plan) -> tuple[float, float, float]:
    """(the shared slot's work per step, the actor slot's, the staleness chain bound) from the
    role estimates, summed by hand."""
    calib = Calibration()
    res = resolve(at_means(plan.spec))
    est = {role: placed_estimate(Pricer(res, calib), role, r) for role, r in plan.roles.items()}
    sync = Pricer(res, calib).sync_time(Placed("train", est[Role.ACTOR]), Placed("gen", est[Role.ROLLOUT]))
    rollout, ref = est[Role.ROLLOUT], est[Role.REFERENCE]
    dev = res.device_of(rollout.pool)
    assert rollout.memory.total + ref.memory.total > dev.memory_gb  # they swap: both onload
    eff = calib.for_device(dev)
    # the engine sleeps and wakes (weights over the host link, KV discarded); the reference
    # copies its weights out and back
    onload = (engine_swap_time(rollout.memory.weights, eff, res.job.sleep_level)
              + switch_time(ref.memory, eff))
    shared = sync + onload + rollout.stage_s["rollout"] + ref.stage_s["score"]
    actor = sum(est[Role.ACTOR].stage_s.values())
    score = max(ref.stage_s["score"], est[Role.ACTOR].stage_s["score"],
                est[Role.REWARD].stage_s["score"])
    chain = sync + rollout.stage_s["rollout"] + score + est[Role.ACTOR].stage_s["train"] + onload
    return shared, actor, res.job.pipeline.mechanism.chain_bound_s(chain)


def test_planner_prices_the_shared_slot_as_its_summed_work() -> None:
    plan = _plan()
    assert plan.mode == "async"
    slots = {s.name: set(s.roles) for s in plan.slots}
    assert slots["gen"] == {Role.ROLLOUT, Role.REFERENCE}
    shared, actor, chain = _by_hand(plan)
    assert shared > max(actor, chain)  # the shared slot sets the pace
    pred = reprice(plan, at_means(plan.spec), Calibration()).iteration_s
    assert pred == pytest.approx(shared, rel=1e-9)


def test_simulator_time_shares_the_slot_at_the_planned_period() -> None:
    plan = _plan()
    run = simulate_plan(plan, iterations=ITERATIONS, seed=0,
                        config=SimConfig.no_variance()).run
    shared, _, _ = _by_hand(plan)
    s = plan.spec.pipeline.max_staleness
    # after the fill (s + 1 commits) and before the drain (the last s), every commit is one
    # period of the shared slot apart
    steady = iteration_durations(run, Async(1))[s + 1:ITERATIONS - s]
    assert steady
    for d in steady:
        assert d == pytest.approx(shared, rel=1e-6)


def test_reference_pass_runs_between_consecutive_rollouts() -> None:
    """Step i's reference forward ends before step i+1's sync, onload or generation starts on
    the shared devices: the slot serves its oldest step first."""
    events = simulate_plan(_plan(), iterations=ITERATIONS, seed=0,
                           config=SimConfig.no_variance()).trace.events

    def span(role: str, step: int) -> tuple[float, float]:
        mine = [e for e in events if e.args.get("role") == role and e.args.get("step") == step]
        assert mine, (role, step)
        return min(e.ts_s for e in mine), max(e.ts_s + e.dur_s for e in mine)

    for i in range(ITERATIONS - 1):
        ref_end = span(Role.REFERENCE, i)[1]
        assert span(Role.ROLLOUT, i)[1] <= span(Role.REFERENCE, i)[0]
        assert ref_end <= span(Role.ROLLOUT, i + 1)[0] + 1e-9, f"step {i}"


def test_engine_sleeps_and_wakes_where_the_slot_swaps_in_planner_and_simulator() -> None:
    """The rollout engine's onload is its sleep and wake (its per-device weights both ways over
    the host link plus the two fixed calls, its KV pool discarded), not its KV-filled memory
    moved; the simulator charges each role what the planner's slot switch sums."""
    plan = _plan()
    calib = Calibration()
    res = resolve(at_means(plan.spec))
    est = {role: placed_estimate(Pricer(res, calib), role, r) for role, r in plan.roles.items()}
    rollout, ref = est[Role.ROLLOUT], est[Role.REFERENCE]
    eff = calib.for_device(res.device_of(rollout.pool))
    assert res.job.sleep_level == 1  # placer execute sleeps its vLLM engines at level 1
    engine = onload_time(Role.ROLLOUT, rollout.memory, res.device_of(rollout.pool), eff,
                         res.job.sleep_level)
    by_hand = (2 * rollout.memory.weights / eff.offload_gbs + eff.engine_sleep_s
               + eff.engine_wake_s)
    assert engine == pytest.approx(by_hand, rel=1e-12)
    assert rollout.memory.kv_cache > 0 and engine != pytest.approx(
        switch_time(rollout.memory, eff))
    sim = onload_costs(Pricer(res, calib), plan)
    assert sim[Role.ROLLOUT] == pytest.approx(engine, rel=1e-12)
    assert sim[Role.REFERENCE] == pytest.approx(switch_time(ref.memory, eff), rel=1e-12)
    switch = Pricer(res, calib).slot_switch([Placed(plan.roles[r].slot, e) for r, e in est.items()])
    assert switch["gen"] == pytest.approx(sim[Role.ROLLOUT] + sim[Role.REFERENCE], rel=1e-12)
