"""A colocated rollout engine's vLLM sleep level, as the job's framework sleeps it.

vLLM's level 1 copies the engine's weights to pinned host memory and back; level 2 discards them
and the refit writes them again (vllm/v1/worker/gpu_worker.py `Worker.sleep` @0012cf69). verl's
hybrid engine sleeps at level 2 with vLLM >= 0.8.5 (volcengine/verl @b178a3cd
vllm_async_server.py 563-575; verl/third_party/vllm VLLM_SLEEP_LEVEL since e31a88312), at level 1
in v0.5.0 and before (sharding_manager/fsdp_vllm.py:240), which a job run there sets with
`rollout_sleep_level`. Row r07 (verl's one_step_off.md, a v0.5-era run) is such a job.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.model import engine_swap_time
from placer.cost.pricer import Pricer
from placer.cost.timing import Placed
from placer.solve import hostmem
from placer.spec.catalog import Resolved, resolve
from placer.spec.framework import PROFILES, SLEEP_LEVELS
from placer.spec.load import job_from_dict
from workflows.published_rows import ROWS

ROOT = Path(__file__).resolve().parent.parent
R07 = next(r for r in ROWS if r.name.startswith("r07 "))


def test_verl_sleeps_its_engine_at_level_2_and_the_others_keep_level_1() -> None:
    levels = {name: p.rollout_sleep_level for name, p in PROFILES.items()}
    assert levels["verl"] == levels["verl-megatron"] == 2
    # EasyR1's sharding manager and `placer execute` call sleep(level=1)
    assert levels["easyr1"] == levels["native"] == 1
    assert set(levels.values()) <= set(SLEEP_LEVELS)


def test_level_2_copies_no_weights_over_the_host_link() -> None:
    eff = Calibration().for_device(resolve_r07(None).device_of("h20"))
    fixed = eff.engine_sleep_s + eff.engine_wake_s
    assert engine_swap_time(8.0, eff, 2) == pytest.approx(fixed)
    assert engine_swap_time(8.0, eff, 1) == pytest.approx(fixed + 2 * 8.0 / eff.offload_gbs)


def resolve_r07(level: int | None) -> Resolved:
    """Row r07's job with `rollout_sleep_level` set to `level` (None: the key dropped, so the
    verl profile's level applies)."""
    data = yaml.safe_load((ROOT / "examples" / "published" / R07.file).read_text())
    data.pop("rollout_sleep_level", None)
    if level is not None:
        data["rollout_sleep_level"] = level
    return resolve(job_from_dict(data), R07.file)


def _switch_and_engine(level: int | None) -> tuple[float, float, float]:
    """(r07's shared slot's switch per step, the rollout's per-device weights, its parked host
    GB) with its published layout."""
    res = resolve_r07(level)
    px = Pricer(res, Calibration())
    ests = {r: px.estimate(r, res.cluster.pool(u.pool), u.parallel())
            for r, u in R07.layout.items()}
    slot = {r: "+".join(g) for g in R07.groups for r in g}
    switch = px.slot_switch([Placed(slot[r], e) for r, e in ests.items()])
    rollout = ests[Role.ROLLOUT]
    parked = hostmem.parked_gb(rollout.memory, Role.ROLLOUT, res.job.profile.park_scheme,
                               res.job.sleep_level)
    return switch["actor+rollout"], rollout.memory.weights, parked


def test_a_verl_job_prices_its_engine_swap_at_its_sleep_level() -> None:
    """The published r07 (level 1) and the same job at the verl profile's level 2 differ by the
    engine's weights out and back, exactly; level 2 parks none of them in host memory."""
    assert resolve_r07(1).job.sleep_level == 1
    assert resolve_r07(None).job.sleep_level == 2
    one, weights, parked_one = _switch_and_engine(1)
    two, _, parked_two = _switch_and_engine(None)
    eff = Calibration().for_device(resolve_r07(None).device_of("h20"))
    assert weights > 1.0  # a 7B engine's TP2 shard
    assert one - two == pytest.approx(2 * weights / eff.offload_gbs)
    assert parked_one == pytest.approx(weights) and parked_two == 0.0
