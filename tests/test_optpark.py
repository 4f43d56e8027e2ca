"""Optimizer parking (`placer.cost.optpark`): the slot rule, its price, the ILP and the exports."""
from __future__ import annotations

from dataclasses import replace

import pytest
from slot_oracle import brute_force
from specdata import h100_job

from placer.base.errors import SpecError
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.optpark import park_time
from placer.cost.pricer import Pricer
from placer.cost.roofline import Memory
from placer.cost.sharding import Parallel
from placer.cost.timing import Placed
from placer.solve.candidates import Candidate
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import hint_assignment, solve
from placer.solve.parktwins import PARK_TWINS, park_twins
from placer.solve.problem import (
    Hint,
    Problem,
    candidate_key,
    layout_key,
)
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict

H100_GB = 80.0


def _job(framework: str = "verl"):
    return job_from_dict(h100_job("park", framework, algorithm="ppo", use_reference=False))


def _trainer(px: Pricer, role: str, park: bool, optimizer: float = 12.0) -> Candidate:
    """A trained candidate on all 8 H100s whose memory is set by hand: 45 GB per device of
    which `optimizer` GB is optimizer state, so two of them (90 GB) overflow an 80 GB H100
    together unless one optimizer is parked (90 - 12 = 78 GB)."""
    est = px.estimate(role, px.res.cluster.pool("h"), Parallel(dp=8))
    mem = Memory(weights=4.0, grads=4.0, optimizer=optimizer, activations=45.0 - 8.0 - optimizer)
    return Candidate(role, "h", replace(est, memory=mem, par=replace(est.par, park_optimizer=park)))


def test_park_time_is_both_copies_over_the_host_link() -> None:
    # 12 GB out and 12 GB back at 25 GB/s: 24e9 B / 25e9 B/s = 0.96 s (written out, not re-run)
    assert park_time(12.0, Efficiency(offload_gbs=25.0)) == pytest.approx(0.96)
    assert park_time(12.0, Efficiency(offload_gbs=50.0)) == pytest.approx(0.48)


def test_parking_makes_a_colocated_slot_fit_and_prices_the_copies() -> None:
    px = Pricer(resolve(_job()), Calibration())
    eff = px.calib.for_device(px.res.device_of("h"))
    whole = [Placed("s", _trainer(px, r, False).est) for r in ("actor", "critic")]
    # 90 GB > 80 GB: the slot switches whole, each member copying its 4 GB of weights and 12 GB
    # of optimizer out and back: 4 x 16 GB of copies
    assert px.slot_switch(whole) == {"s": pytest.approx(64.0 / eff.offload_gbs)}
    parked = [Placed("s", _trainer(px, r, True).est) for r in ("actor", "critic")]
    # resident 33 + 33, plus one 12 GB optimizer brought back at a time: 78 GB <= 80 GB. Each
    # parked optimizer goes out and back as verl's FSDP worker moves it: Adam's two fp32 moments,
    # 8 of the model's 12 B a parameter (its fp32 module parameters are the master copy and stay;
    # placer.cost.offload.PARK_SCHEMES): 4 copies of 8 GB (12 GB before the schemes were read)
    assert px.slot_switch(parked) == {"s": pytest.approx(4 * 8.0 / eff.offload_gbs)}
    # a 20 GB optimizer each: 25 + 25 + 20 = 70 GB fits too, 4 copies of 20 x 8 / 12 GB
    big = [Placed("s", _trainer(px, r, True, optimizer=20.0).est) for r in ("actor", "critic")]
    assert px.slot_switch(big) == {"s": pytest.approx(4 * 20.0 * 8 / 12 / eff.offload_gbs)}
    # one member parked: 45 - 12 + 45 + 12 = 90 GB, no better than none; it switches whole and
    # its onload (weights and optimizer out and back) is at least what it parks
    one = [Placed("s", _trainer(px, "actor", True).est), whole[1]]
    assert px.slot_switch(one) == {"s": pytest.approx(64.0 / eff.offload_gbs)}


def test_ilp_chooses_parking_where_it_wins_and_matches_brute_force() -> None:
    px = Pricer(resolve(_job()), Calibration())
    cands = {r: [_trainer(px, r, False, optimizer=20.0), _trainer(px, r, True, optimizer=20.0)]
             for r in ("actor", "critic")}
    problem = Problem(px, cands)
    sol = solve(problem, time_limit_s=20.0, workers=1)
    expect = brute_force(problem)
    assert sol.status == "OPTIMAL"
    assert score(problem, sol.assignment)[0] == pytest.approx(expect, rel=1e-5)
    assert sol.objective == pytest.approx(expect, rel=1e-4)
    # both on all 8 H100s: sharing them is the only way, and parking (53 GB of copies: verl's
    # 8 B of the optimizer's 12 B a parameter) beats the whole switch (2 x (4 + 20) GB out and
    # back each: 96 GB)
    a = sol.assignment
    assert a.slot_of["actor"] == a.slot_of["critic"]
    assert all(c.est.par.park_optimizer for c in a.choice.values())
    # without the twins the same slot pays the whole switch: slower
    plain = Problem(px, {r: cs[:1] for r, cs in cands.items()})
    assert solve(plain, time_limit_s=20.0, workers=1).objective > sol.objective


def test_twins_are_bounded_and_follow_the_framework() -> None:
    res = resolve(_job("verl"))
    px = Pricer(res, Calibration())
    cands = [Candidate("actor", "h", px.estimate("actor", res.cluster.pool("h"), Parallel(dp=d)))
             for d in (1, 2, 4, 8, 8, 8)]
    twins = park_twins(res, cands)
    assert 0 < len(twins) <= PARK_TWINS
    assert all(est.par.park_optimizer and est.time_s == c.est.time_s for c, est in twins)
    assert park_twins(resolve(_job("miles")), cands) == []
    assert park_twins(resolve(_job("native")), cands) == []


def _plan_with_parked_actor():
    from placer.solve.planner import plan_job
    plan = plan_job(Pricer(resolve(_job()), Calibration()), workers=1)
    actor = plan.roles["actor"].model_copy(update={"park_optimizer": True, "parked_gb": 1.0})
    return plan.model_copy(update={"roles": {**plan.roles, "actor": actor}})


def test_exports_carry_or_refuse_parking() -> None:
    from placer.interop import kuberay, miles, nemorl, openrlhf, verl
    plan = _plan_with_parked_actor()
    flat, _ = verl.overrides(plan)
    assert flat["actor_rollout_ref.actor.fsdp_config.optimizer_offload"] is True
    recipe, _ = nemorl.recipe(plan)
    assert recipe["policy.offload_optimizer_for_logprob"] is True
    for export in (miles.command_args, openrlhf.export_openrlhf, kuberay.export_kuberay):
        with pytest.raises(SpecError, match=r"roles\.actor\.park_optimizer: true"):
            export(plan)


def test_plan_file_and_text_show_parking() -> None:
    from placer.solve.planfile import Plan
    from placer.solve.render import render_plan
    plan = _plan_with_parked_actor()
    assert "actor: optimizer state parked in host memory between phases (1.0 GB per device)" \
        in render_plan(plan)
    back = Plan.model_validate_json(plan.to_json())
    assert back.roles["actor"].park_optimizer and back.roles["actor"].parked_gb == 1.0
    # a role that does not park writes neither field (plan files stay as they were)
    assert "park_optimizer" not in plan.roles["critic"].model_dump()


def test_explain_note_names_the_parked_state_and_its_cost() -> None:
    from placer.solve.parktwins import park_note
    plan = _plan_with_parked_actor()
    note = park_note(plan, plan.resolved(), plan.roles["actor"].slot, 0.5)
    assert note is not None and "actor 1.0 GB per device" in note and "0.50 s per iteration" in note
    assert park_note(plan, plan.resolved(), plan.roles["critic"].slot, 0.5) is None  # parks nothing


# A candidate and its parked twin differ only in `park_optimizer`, and two trained layouts may
# differ only in their micro-batch: `problem.layout_key` tells both apart, so a re-plan's hint
# finds the very candidate the old plan ran and its move cost counts a change of either.

def test_micro_batch_and_parking_are_part_of_the_key() -> None:
    base = Parallel(tp=2, dp=4, micro_batch=4)
    assert layout_key("h", base) == layout_key("h", replace(base))
    assert layout_key("h", base) != layout_key("h", replace(base, micro_batch=2))
    assert layout_key("h", base) != layout_key("h", replace(base, park_optimizer=True))


def test_the_hint_finds_the_parked_twin_the_old_plan_ran() -> None:
    """A candidate and its parked twin share every other field; the old plan ran the twin, so
    the hint must name the twin, not the unparked candidate listed first."""
    px = Pricer(resolve(_job()), Calibration())
    cands = {r: [_trainer(px, r, False), _trainer(px, r, True)] for r in ("actor", "critic")}
    problem = Problem(px, cands)
    assert candidate_key(cands["actor"][0]) != candidate_key(cands["actor"][1])
    hint = Hint({r: candidate_key(cs[1]) for r, cs in cands.items()}, [["actor", "critic"]])
    a = hint_assignment(problem, hint)
    assert a is not None
    assert all(a.choice[r] is cs[1] for r, cs in cands.items())


def test_the_hint_misses_a_micro_batch_the_new_table_lacks() -> None:
    """An old plan's micro-batch that the new table does not hold is no warm start (the role
    moves), rather than a candidate of another micro-batch taken for it."""
    px = Pricer(resolve(_job()), Calibration())
    c = _trainer(px, "actor", False)
    other = Candidate(c.role, c.pool, replace(c.est, par=replace(c.est.par, micro_batch=2)))
    c4 = Candidate(c.role, c.pool, replace(c.est, par=replace(c.est.par, micro_batch=4)))
    problem = Problem(px, {"actor": [c4]})
    assert hint_assignment(problem, Hint({"actor": candidate_key(other)}, [["actor"]])) is None
    assert hint_assignment(problem, Hint({"actor": candidate_key(c4)}, [["actor"]])) is not None

