"""A re-plan that changes only a trainer's micro-batch keeps its slot: the slot's actors keep
running and take the new micro-batch in place (`executors.elastic.slot_signature` leaves the
micro-batch out; `Worker.set_micro_batches`); a change of layout still rebuilds the slot.
Without Ray: the rule on run plans, and a trainer taking a new micro-batch. The whole path on a
multi-node local Ray is tests/test_exec_nodeloss.py (slow)."""
from __future__ import annotations

from pathlib import Path

import pytest
from exec_util import GRPO_LAYOUT, hand_plan

from executors.elastic import kept_slots, slot_signature
from executors.roles import RunConfig
from executors.runplan import RunPlan, resolve_plan
from executors.trainer import Trainer
from placer.cost.sharding import Parallel
from placer.solve.planfile import Plan


def _with(plan: Plan, role: str, **changes: object) -> Plan:
    roles = {**plan.roles, role: plan.roles[role].model_copy(update=changes)}
    return plan.model_copy(update={"roles": roles})


@pytest.fixture(scope="module")
def plan() -> Plan:
    return _with(hand_plan(GRPO_LAYOUT), "actor", micro_batch=2)


def _counts(run: RunPlan) -> dict[str, int]:
    return {name: p.nodes for name, p in run.pools.items()}


def test_a_micro_batch_only_change_keeps_every_slot(plan: Plan) -> None:
    old, new = resolve_plan(plan), resolve_plan(_with(plan, "actor", micro_batch=4))
    assert new.roles["actor"].micro_batch == 4 and old.roles["actor"].micro_batch == 2
    slot = old.roles["actor"].slot
    assert slot_signature(old, slot) == slot_signature(new, slot)
    assert kept_slots(old, new, _counts(old), set()) == {s: s for s in old.slots}


def test_a_layout_change_still_rebuilds_the_slot(plan: Plan) -> None:
    """The trainer's slot goes from dp 2 to dp 1 (as when a node is lost): rebuilt."""
    old = resolve_plan(plan)
    new = resolve_plan(_with(hand_plan({**GRPO_LAYOUT, "actor": ("gpu", Parallel(dp=1),
                                                                 "train")}),
                             "actor", micro_batch=2))
    slot = old.roles["actor"].slot
    assert slot not in kept_slots(old, new, _counts(old), set())


def test_a_running_trainer_takes_a_new_micro_batch_in_place(tmp_path: Path) -> None:
    from executors.model import build_policy, save_model_dir
    from placer.spec.catalog import shipped_models
    arch = shipped_models()["tiny-llama"]
    d = save_model_dir(build_policy(arch, 3), arch, tmp_path / "v0")
    tr = Trainer(RunConfig(algorithm="grpo", arch=arch.model_dump(), model_dir=str(d), seed=0,
                           max_new_tokens=8, lr=1e-3, accumulate=1))
    model, opt = tr.model, tr.opt
    assert tr.executed_layout(1)["micro_batches"] == 1
    assert tr.set_micro_batches(3) == 3
    assert tr.executed_layout(1)["micro_batches"] == 3
    assert tr.model is model and tr.opt is opt  # nothing rebuilt
