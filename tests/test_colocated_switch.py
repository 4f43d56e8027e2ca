"""A framework that switches its colocated policy and engine every step, fit or not
(`FrameworkProfile.switches_every_step`): NeMo-RL offloads the policy (optimizer before the refit,
parameters after it) and sleeps its vLLM engine (level 1) every step of a colocated run
(nemo_rl/algorithms/grpo.py `refit_policy_generation`, v0.6.0), where verl moves its actor only
when the job parks it but sleeps its hybrid engine's rollout every step (level 2). Priced by
`timing.slot_switch`, the ILP (`placer.solve.ilp_memory`), the simulator
(`simulator.training.onload_costs`) and the host-memory check alike."""
from __future__ import annotations

from dataclasses import replace

import pytest
from slot_oracle import brute_force
from specdata import h100_job

from placer.base.roles import Role
from placer.cost import optpark
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.model import engine_swap_time, switch_time
from placer.cost.pricer import Pricer
from placer.cost.roofline import Memory
from placer.cost.sharding import Parallel
from placer.cost.timing import Placed, onload_time
from placer.solve import hostmem
from placer.solve.assemble import placed_estimate
from placer.solve.candidates import Candidate
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import solve
from placer.solve.problem import Assignment, Problem, slot_names
from placer.spec.catalog import resolve
from placer.spec.framework import PROFILES
from placer.spec.load import job_from_dict
from simulator.handplans import place
from simulator.training import onload_costs

ACTOR_MEM = Memory(weights=4.0, grads=4.0, optimizer=6.0, activations=4.0)  # 18 GB
ENGINE_MEM = Memory(weights=15.0, overhead=2.0, kv_cache=40.0)  # 57 GB: 75 GB with the actor


def _job(framework: str, policy: str = "Qwen2.5-7B", reference: bool = False):
    return job_from_dict(h100_job("coloc", framework, policy=policy, use_reference=reference))


def _cand(px: Pricer, role: str, mem: Memory, devices: int = 8, park: bool = False) -> Candidate:
    """A candidate on `devices` H100s whose memory per device is set by hand."""
    par = Parallel(dp=devices) if role != Role.ROLLOUT else Parallel(tp=1, dp=devices)
    est = px.estimate(role, px.res.cluster.pool("h"), par)
    return Candidate(role, "h", replace(est, memory=mem,
                                        par=replace(est.par, park_optimizer=park)))


def test_profiles_say_which_roles_switch_every_step() -> None:
    nemo = PROFILES["nemo-rl"]
    assert nemo.switches_every_step([Role.ACTOR, Role.ROLLOUT, Role.REFERENCE]) == {
        Role.ACTOR, Role.ROLLOUT}
    # no generation beside the policy (r18's one-step-off form): no offload calls at all
    assert nemo.switches_every_step([Role.ACTOR, Role.REFERENCE]) == frozenset()
    # verl's and EasyR1's hybrid engines sleep the rollout every step (the actor moves only
    # where parked)
    for name in ("verl", "verl-megatron", "easyr1"):
        assert PROFILES[name].switches_every_step([Role.ACTOR, Role.ROLLOUT]) == {Role.ROLLOUT}
        assert PROFILES[name].switches_every_step([Role.ROLLOUT, Role.REFERENCE]) == frozenset()
    for name in ("miles", "openrlhf", "native"):
        assert PROFILES[name].switches_every_step([Role.ACTOR, Role.ROLLOUT]) == frozenset()


def test_a_nemo_rl_slot_that_fits_still_pays_the_policy_offload_and_engine_sleep() -> None:
    placed = {}
    for fw in ("nemo-rl", "verl"):
        px = Pricer(resolve(_job(fw)), Calibration())
        placed[fw] = (px, [Placed("s", _cand(px, Role.ACTOR, ACTOR_MEM).est),
                           Placed("s", _cand(px, Role.ROLLOUT, ENGINE_MEM).est)])
    px, members = placed["nemo-rl"]
    dev = px.res.device_of("h")
    rows = [(p.est.memory.total, 0.0) for p in members]
    assert optpark.slot_peak_gb(rows) == pytest.approx(75.0) and 75.0 < dev.memory_gb
    eff = px.calib.for_device(dev)
    # the policy's BF16 weights and optimizer state out and back (4 + 6 GB each way, grads
    # freed), the engine's 15 GB of weights out at its sleep and back at its wake plus the two
    # fixed calls: 2 x 10 / 25 + 2 x 15 / 25 + 11.2 + 3.7 = 0.8 + 1.2 + 14.9 = 16.9 s
    by_hand = 2 * 10.0 / eff.offload_gbs + 2 * 15.0 / eff.offload_gbs + eff.engine_sleep_s \
        + eff.engine_wake_s
    assert px.slot_switch(members) == {"s": pytest.approx(by_hand, rel=1e-12)}
    assert by_hand == pytest.approx(switch_time(ACTOR_MEM, eff) + engine_swap_time(15.0, eff, 1))
    # verl keeps an unparked actor on the GPU when the slot fits, but its hybrid engine sleeps
    # the rollout every step at level 2: the engine's two fixed calls, no weights copied
    vpx, vmembers = placed["verl"]
    assert vpx.res.job.sleep_level == 2
    assert vpx.slot_switch(vmembers) == {"s": pytest.approx(
        eff.engine_sleep_s + eff.engine_wake_s, rel=1e-12)}


def test_without_the_engine_beside_it_the_nemo_rl_policy_stays_put() -> None:
    px = Pricer(resolve(_job("nemo-rl", reference=True)), Calibration())
    ref = replace(px.estimate(Role.REFERENCE, px.res.cluster.pool("h"), Parallel(dp=8)),
                  memory=Memory(activations=2.0))
    members = [Placed("s", _cand(px, Role.ACTOR, ACTOR_MEM).est), Placed("s", ref)]
    assert px.slot_switch(members) == {}


def test_a_nemo_rl_slot_that_does_not_fit_pays_each_onload_once() -> None:
    px = Pricer(resolve(_job("nemo-rl")), Calibration())
    dev = px.res.device_of("h")
    eff = px.calib.for_device(dev)
    big = Memory(weights=15.0, overhead=2.0, kv_cache=60.0)  # 77 + 18 GB > 80 GB
    members = [Placed("s", _cand(px, Role.ACTOR, ACTOR_MEM).est),
               Placed("s", _cand(px, Role.ROLLOUT, big).est)]
    level = px.res.job.sleep_level  # NeMo-RL sleeps its engine at level 1
    expect = (onload_time(Role.ACTOR, ACTOR_MEM, dev, eff, level)
              + onload_time(Role.ROLLOUT, big, dev, eff, level))
    assert px.slot_switch(members) == {"s": pytest.approx(expect, rel=1e-12)}


def test_ilp_prices_the_every_step_switch_and_matches_brute_force() -> None:
    px = Pricer(resolve(_job("nemo-rl")), Calibration())
    cands: dict[str, list[Candidate]] = {Role.ACTOR: [_cand(px, Role.ACTOR, ACTOR_MEM),
                          _cand(px, Role.ACTOR, ACTOR_MEM, park=True),
                          _cand(px, Role.ACTOR, ACTOR_MEM, devices=4)],
             Role.ROLLOUT: [_cand(px, Role.ROLLOUT, ENGINE_MEM),
                            _cand(px, Role.ROLLOUT, ENGINE_MEM, devices=4)]}
    problem = Problem(px, cands)
    sol = solve(problem, time_limit_s=20.0, workers=1)
    expect = brute_force(problem)
    assert sol.status == "OPTIMAL"
    assert score(problem, sol.assignment)[0] == pytest.approx(expect, rel=1e-5)
    assert sol.objective == pytest.approx(expect, rel=1e-4)
    # the colocated choice pays the policy's and the engine's onloads in the ILP as in the
    # cost model: its objective, pinned to that choice, is its score
    shared: dict[str, list[Candidate]] = {Role.ACTOR: cands[Role.ACTOR][:1],
                                          Role.ROLLOUT: cands[Role.ROLLOUT][:1]}
    pinned = Problem(px, shared)
    both = solve(pinned, time_limit_s=20.0, workers=1)
    eight = Assignment({r: cs[0] for r, cs in shared.items()}, slot_names([list(shared)]))
    t, _ = score(pinned, eight)
    assert px.iteration_time(eight.placed()).switch_s  # the slot fits, and still switches
    assert both.objective == pytest.approx(t, rel=1e-4)
    # never the parked twin beside the engine: the onload moves the optimizer anyway
    a = sol.assignment
    if a.slot_of[Role.ACTOR] == a.slot_of[Role.ROLLOUT]:
        assert not a.choice[Role.ACTOR].est.par.park_optimizer


def _small_calib() -> Calibration:
    # engines that take 45% of a device: a 4B policy fits beside them on an H100
    return Calibration(Efficiency(kv_mem_fraction=0.45))


def test_simulator_charges_the_every_step_switch_where_the_plan_fits() -> None:
    placement: dict[str, tuple[str, int, str]] = {
        Role.ACTOR: ("h", 8, "s"), Role.ROLLOUT: ("h", 8, "s"), Role.REWARD: ("cpu", 1, "verify")}
    calib = _small_calib()
    costs = {}
    for fw in ("nemo-rl", "verl"):
        res = resolve(_job(fw, policy="Qwen3-4B"))
        plan = place(res, placement, calib)
        dev = res.device_of("h")
        rows = [(plan.roles[r].memory_gb, plan.roles[r].parked_gb)
                for r in (Role.ACTOR, Role.ROLLOUT)]
        assert optpark.slot_peak_gb(rows) <= dev.memory_gb  # the slot fits
        costs[fw] = (onload_costs(Pricer(res, calib), plan), plan)
    sim, plan = costs["nemo-rl"]
    assert set(sim) == {Role.ACTOR, Role.ROLLOUT} and all(v > 0 for v in sim.values())
    assert plan.breakdown.switch_s["s"] == pytest.approx(sum(sim.values()), rel=1e-9)
    vsim, vplan = costs["verl"]  # the engine's level-2 sleep and wake only
    eff = calib.for_device(dev)
    assert vsim == {Role.ROLLOUT: pytest.approx(eff.engine_sleep_s + eff.engine_wake_s)}
    assert vplan.breakdown.switch_s["s"] == pytest.approx(vsim[Role.ROLLOUT], rel=1e-9)
    # host memory: the policy's state while the engine generates, the engine's weights while
    # the policy trains, never both (nothing at all where the slot did not switch)
    px = Pricer(resolve(_job("nemo-rl", policy="Qwen3-4B")), calib)
    states = [hostmem.parked_gb(placed_estimate(px, r, plan.roles[r], True).memory, r, "",
                                px.res.job.sleep_level)
              for r in (Role.ACTOR, Role.ROLLOUT)]
    assert min(states) > 0
    assert hostmem._parked_per_device(plan, px) == {"s": pytest.approx(max(states))}
