"""`plan --explain` on a sync plan that leaves accelerators idle names what async would do with
them, with both times (PPO on H100 + L40S + LPU + CPU). The Qwen3-30B-A3B GRPO job on H100 +
1 x 8 H20 uses the H20s in sync too, with a mixed rollout (`placer.cost.split.colocated`):
nothing is idle, so there is nothing to say."""
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


HETERO = EXAMPLE.parent / "ppo-llama8b-hetero.yaml"


def _hetero(mode: str) -> Pricer:
    doc = yaml.safe_load(HETERO.read_text())
    doc["pipeline"] = {"mode": mode} if mode == "sync" else {"mode": mode, "max_staleness": 1}
    return Pricer(resolve(job_from_dict(doc)), Calibration())


@pytest.fixture(scope="module")
def sync_case():
    px = _hetero("sync")
    return px, plan_job(px, time_limit_s=10, workers=1)


def test_a_sync_plan_with_idle_accelerators_names_the_async_alternative(sync_case) -> None:
    """PPO on H100 + L40S + LPU + CPU in sync leaves the L40S ("gen") and LPU pools idle:
    `--explain` gives both times, and the async time is that of the same job planned async."""
    px, plan = sync_case
    idle = idle_accelerators(plan, px)
    assert idle and set(idle) <= {"gen", "lpu"}
    why = async_why(plan, px, time_limit_s=10)
    assert why is not None and why.idle_sync == idle
    assert why.sync_iteration_s == pytest.approx(plan.predicted_iteration_s, rel=1e-6)
    direct = plan_job(_hetero("async"), time_limit_s=10, workers=1)
    assert why.async_iteration_s == pytest.approx(direct.predicted_iteration_s, rel=1e-6)
    (line,) = async_lines(why)
    assert line.startswith("idle in sync: ") and "a step against" in line


def test_sync_with_a_mixed_rollout_leaves_nothing_idle() -> None:
    """2 x 8 H100 + 1 x 8 H20, sync: the rollout is split, its H100 part time-sharing the
    actor's slot and its H20 part alongside; no accelerator is idle, so there is nothing to say
    about async (without mixed rollouts this plan left the 8 H20s idle)."""
    px = _px("sync", h100_nodes=2)
    plan = plan_job(px, time_limit_s=10, workers=1)
    r = plan.roles["rollout"]
    assert [q.pool for q in r.parts] == ["h100", "h20"] and r.slot == plan.roles["actor"].slot
    assert idle_accelerators(plan, px) == {}
    assert async_why(plan, px, time_limit_s=10) is None


def test_an_async_plan_has_nothing_to_say() -> None:
    px = _px("async")
    assert async_why(plan_job(px, time_limit_s=10, workers=1), px) is None
