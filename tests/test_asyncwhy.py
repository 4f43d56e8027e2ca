"""`plan --explain` on a sync plan that leaves accelerators idle names what async would do with
them, with both times (the Qwen3-30B-A3B GRPO job on 2 x 8 H100 + 1 x 8 H20: sync colocates
everything on the H100s, async puts a rollout on the H20s). On 4 x 8 H100 + 1 x 8 H20, sync
uses the H20s too, with a mixed rollout (`placer.cost.split.colocated`): nothing is idle."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.asyncwhy import async_lines, async_why, idle_accelerators
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "grpo-qwen3-30b-a3b.yaml"


def _px(mode: str, h100_nodes: int = 2) -> Pricer:
    doc = yaml.safe_load(EXAMPLE.read_text())
    pools = {p["name"]: p for p in doc["cluster"]["pools"]}
    pools["h100"]["nodes"], pools["h20"]["nodes"] = h100_nodes, 1
    doc["pipeline"] = {"mode": mode} if mode == "sync" else {"mode": mode, "max_staleness": 1}
    return Pricer(resolve(job_from_dict(doc)), Calibration())


@pytest.fixture(scope="module")
def sync_case():
    px = _px("sync")
    return px, plan_job(px, time_limit_s=10, workers=1)


def test_sync_leaves_the_h20s_idle_and_async_uses_them(sync_case) -> None:
    px, plan = sync_case
    assert idle_accelerators(plan, px) == {"h20": 8}
    why = async_why(plan, px, time_limit_s=10)
    assert why is not None and why.idle_sync == {"h20": 8}
    assert why.idle_async.get("h20", 0) < 8  # async puts work on them
    assert why.async_iteration_s < why.sync_iteration_s
    # the same async plan, made directly, has the time it reports
    direct = plan_job(_px("async"), time_limit_s=10, workers=1)
    assert why.async_iteration_s == pytest.approx(direct.predicted_iteration_s, rel=1e-6)
    (line,) = async_lines(why)
    assert line.startswith("idle in sync: h20 8 accelerators") and "a step against" in line


def test_sync_with_a_mixed_rollout_leaves_nothing_idle() -> None:
    """4 x 8 H100 + 1 x 8 H20, sync: the rollout is split, its H100 part time-sharing the
    actor's slot and its H20 part alongside; no accelerator is idle, so there is nothing to say
    about async (without mixed rollouts this plan left the 8 H20s idle)."""
    px = _px("sync", h100_nodes=4)
    plan = plan_job(px, time_limit_s=10, workers=1)
    r = plan.roles["rollout"]
    assert [q.pool for q in r.parts] == ["h100", "h20"] and r.slot == plan.roles["actor"].slot
    assert idle_accelerators(plan, px) == {}
    assert async_why(plan, px, time_limit_s=10) is None


def test_an_async_plan_has_nothing_to_say() -> None:
    px = _px("async")
    assert async_why(plan_job(px, time_limit_s=10, workers=1), px) is None
