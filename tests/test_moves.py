"""What moved between two plans (`placer.solve.moves`): the one definition `placer replan`, the
executor's elastic rebuild and the benchmarks share, pinned on a hand plan whose slots and bundles
are known (agentic-code: actor + reference share `train`, eight one-core environment bundles)."""
from __future__ import annotations

from typing import Any

import pytest
from simplans import hand_plan

from placer.base.roles import Role
from placer.solve.moves import Move, dims, layout, moves, role_counts
from placer.solve.planfile import Plan


@pytest.fixture(scope="module")
def plan() -> Plan:
    return hand_plan("agentic-code")


def _with_role(plan: Plan, role: str, **update: Any) -> Plan:
    roles = dict(plan.roles)
    roles[role] = roles[role].model_copy(update=update)
    return plan.model_copy(update={"roles": roles})


def test_layout_is_the_actors_the_executor_builds(plan: Plan) -> None:
    counts = role_counts(plan)
    assert counts[Role.ACTOR] == plan.roles[Role.ACTOR].dp == 8
    assert counts[Role.REWARD] == 1
    # an environment is one worker per bundle of its slot, whatever dp the plan records
    assert counts[Role.ENVIRONMENT] == sum(1 for b in plan.bundles if b.slot == "env") == 8
    assert layout(plan, Role.ROLLOUT) == "h100 tp4 pp1 dp2"
    assert layout(plan, Role.CRITIC) == "absent"


def test_identical_plans_move_nothing(plan: Plan) -> None:
    assert moves(plan, plan) == {}
    assert moves(plan, plan, colocation=False) == {}


def test_a_colocation_change_moves_the_partners_only_when_colocation_counts(plan: Plan) -> None:
    alone = _with_role(plan, Role.REFERENCE, slot="ref")  # same config, its own slot
    moved = moves(plan, alone)
    assert set(moved) == {Role.ACTOR, Role.REFERENCE}
    assert all(m.why == "colocation" for m in moved.values())
    assert moved[Role.REFERENCE].to_dict() == {"from": "h100 tp1 pp1 dp8 [train]",
                                               "to": "h100 tp1 pp1 dp8 [ref]",
                                               "why": "colocation"}
    # the executor's question: whose actors change? a new partner alone changes none
    assert moves(plan, alone, colocation=False) == {}


def test_a_config_change_is_a_move_either_way(plan: Plan) -> None:
    smaller = _with_role(plan, Role.ACTOR, dp=4, devices=4)
    for colocation in (True, False):
        moved = moves(plan, smaller, colocation=colocation)
        assert list(moved) == [Role.ACTOR] and moved[Role.ACTOR].why == "config"
    assert str(moves(plan, smaller, colocation=False)[Role.ACTOR]) == \
        "actor: h100 tp1 pp1 dp8 mbs8 -> h100 tp1 pp1 dp4 mbs8"
    assert moves(plan, _with_role(plan, Role.ACTOR, offload=True))[Role.ACTOR].after == \
        "h100 tp1 pp1 dp8 mbs8 offload [train]"


def test_a_parking_or_micro_batch_change_is_a_config_move(plan: Plan) -> None:
    """A trainer that parks its optimizer, or runs another micro-batch, has moved
    (`problem.layout_key` holds both, so the re-plan's move cost counts them too)."""
    role = "actor"
    for update, shown in (({"park_optimizer": True}, " park-optimizer"),
                          ({"micro_batch": plan.roles[role].micro_batch + 1}, " mbs")):
        got = moves(plan, _with_role(plan, role, **update))
        assert set(got) == {role} and got[role].why == "config"
        assert shown in got[role].after and got[role].before != got[role].after


def test_context_and_expert_parallelism_show_and_move(plan: Plan) -> None:
    """cp and ep (and etp) appear where above 1, in Megatron-Core's order; changing them moves
    the role (its actors are built differently), while layouts without them read as before."""
    cp = _with_role(plan, Role.ACTOR, cp=2, dp=4)
    assert layout(cp, Role.ACTOR) == "h100 tp1 cp2 pp1 dp4 mbs8"
    moe = _with_role(plan, Role.ACTOR, tp=2, dp=4, ep=4, etp=2)
    assert layout(moe, Role.ACTOR) == "h100 tp2 pp1 dp4 ep4 etp2 mbs8"
    assert dims(moe.roles[Role.ACTOR]) == "tp2 pp1 dp4 ep4 etp2 mbs8"
    only_cp = _with_role(cp, Role.ACTOR, cp=1)  # same tp, pp, dp: only cp differs
    moved = moves(cp, only_cp, colocation=False)
    assert str(moved[Role.ACTOR]) == "actor: h100 tp1 cp2 pp1 dp4 mbs8 -> h100 tp1 pp1 dp4 mbs8"


def test_an_environment_moves_with_its_bundles_not_its_dp(plan: Plan) -> None:
    assert moves(plan, _with_role(plan, Role.ENVIRONMENT, dp=3)) == {}
    dropped = next(b for b in plan.bundles if b.slot == "env")
    fewer = plan.model_copy(update={"bundles": [b for b in plan.bundles if b is not dropped]})
    assert moves(plan, fewer, colocation=False) == {
        Role.ENVIRONMENT: Move(Role.ENVIRONMENT, "cpu tp1 pp1 dp8", "cpu tp1 pp1 dp7", "config")}


def test_a_role_only_one_plan_runs_moved_from_or_to_absent(plan: Plan) -> None:
    roles = {r: x for r, x in plan.roles.items() if r != Role.REWARD}
    without = plan.model_copy(update={"roles": roles})
    assert moves(plan, without, colocation=False)[Role.REWARD].after == "absent"
    assert moves(without, plan)[Role.REWARD].before == "absent"


def test_explain_describes_layouts_the_same_way(plan: Plan) -> None:
    """`placer plan --explain`'s per-role layout uses the same `dims` (cp shown where above 1)."""
    from placer.cost.efficiency import Calibration
    from placer.cost.pricer import Pricer
    from placer.solve.breakdown import breakdown

    cp = _with_role(plan, Role.ACTOR, cp=2, dp=4)
    rows = breakdown(cp, Pricer(cp.resolved(), Calibration()))
    assert rows[Role.ACTOR].layout == "tp1 cp2 pp1 dp4 mbs8"
    assert rows[Role.ROLLOUT].layout == "tp4 pp1 dp2"
