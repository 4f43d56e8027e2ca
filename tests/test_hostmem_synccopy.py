"""The weight-sync senders' kept copy in the plan's host memory (`placer.solve.hostmem`): kept
where every node holds it beside its other host memory, and then counted there; else not kept,
and the executor's run plan says so (`RunPlan.keep_sync_copy`)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.roofline import GB, weight_bytes
from placer.solve import hostmem
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict

ROOT = Path(__file__).resolve().parents[1]


def _plan(host_gb: float | None = None) -> tuple[Plan, Pricer]:
    data = yaml.safe_load((ROOT / "examples" / "grpo-qwen7b-h100.yaml").read_text())
    if host_gb is not None:
        data["cluster"]["pools"][0]["host_memory_gb"] = host_gb
    res = resolve(job_from_dict(data))
    px = Pricer(res, Calibration())
    return plan_job(px, time_limit_s=5), px


def test_a_copy_that_fits_is_kept_and_counted_on_the_senders_nodes() -> None:
    plan, px = _plan()
    copy = hostmem.sync_copy_gb(plan)
    arch = px.res.model_of("actor")
    assert arch is not None
    full = hostmem.sync_copy_bytes(arch) / GB
    # the executor keeps its FP32 master weights (what it holds: tests/test_exec_keptcopy.py)
    assert full == pytest.approx(2 * weight_bytes(arch) / GB)
    assert copy and sum(copy.values()) >= full * 0.999  # one copy at least (a rank's each)
    assert hostmem.keeps_sync_copy(plan, px)
    nodes = hostmem.plan_nodes(plan, px)
    for n in nodes:
        assert n.parts["sync_copy"] == pytest.approx(copy.get((n.pool, n.node), 0.0))
        assert not n.over


def test_a_copy_that_does_not_fit_is_not_kept_nor_counted() -> None:
    plan, px = _plan()
    nodes = hostmem.plan_nodes(plan, px)
    # room for everything but the copy on the fullest sending node
    copy = hostmem.sync_copy_gb(plan)
    tight = max(n.total_gb - n.parts["sync_copy"] for n in nodes) + min(copy.values()) / 2
    plan2, px2 = _plan(host_gb=tight)
    if hostmem.over_nodes(plan2, px2):
        pytest.skip("the tighter node re-planned into another shape")
    assert not hostmem.keeps_sync_copy(plan2, px2)
    assert all(n.parts["sync_copy"] == 0 for n in hostmem.plan_nodes(plan2, px2))
    from executors.runplan import resolve_plan
    assert resolve_plan(plan).keep_sync_copy and not resolve_plan(plan2).keep_sync_copy


def test_no_copy_without_a_rollout_to_refresh_or_with_pipeline_stages() -> None:
    plan, _ = _plan()
    staged = plan.model_copy(update={"roles": {
        **plan.roles, "actor": plan.roles["actor"].model_copy(update={"pp": 2})}})
    assert hostmem.sync_copy_gb(staged) == {}
