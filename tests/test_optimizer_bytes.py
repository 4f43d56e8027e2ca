"""A framework's optimizer state bytes (`FrameworkProfile.optimizer_bytes`): NeMo-RL's Megatron
recipes run Megatron-Core's precision-aware optimizer, whose state keeps the two fp32 Adam
moments and, with store_param_remainders (the default) and BF16 weights, only the low 16 bits
of the fp32 master weight: 10 B a parameter, not mixed-precision Adam's 12. The memory model
holds that much, and every move of it (the parked optimizer's copies, the slot's switch, the
host memory a parked state fills) follows `Memory.optimizer`."""
from __future__ import annotations

from dataclasses import replace

import pytest
from specdata import h100_job

from placer.base.roles import Role
from placer.cost import optpark
from placer.cost.efficiency import Calibration
from placer.cost.model import switched_gb
from placer.cost.offload import host_parked_gb
from placer.cost.pricer import Pricer
from placer.cost.sharding import OPTIMIZER_BYTES, Parallel
from placer.spec.catalog import resolve
from placer.spec.framework import PROFILES
from placer.spec.load import job_from_dict


def _estimate(framework: str, par: Parallel):
    px = Pricer(resolve(job_from_dict(h100_job("optbytes", framework, policy="Qwen3-8B",
                                                tokens=256))), Calibration())
    return px.estimate(Role.ACTOR, px.res.cluster.pool("h"), par)


def test_nemo_rl_keeps_ten_bytes_where_it_trains_with_megatron() -> None:
    nemo = PROFILES["nemo-rl"]
    assert nemo.optimizer_bytes(pp=2, ep=1) == nemo.optimizer_bytes(pp=1, ep=4) == 10.0
    assert nemo.optimizer_bytes(pp=1, ep=1) is None  # DTensor: torch's AdamW
    for name in ("native", "verl", "verl-megatron", "openrlhf", "miles", "easyr1"):
        assert PROFILES[name].optimizer_bytes(pp=2, ep=1) is None


def test_the_memory_and_its_moves_use_the_profiles_bytes() -> None:
    par = Parallel(pp=2, dp=4, park_optimizer=True)
    nemo, native = _estimate("nemo-rl", par), _estimate("native", par)
    assert native.memory.optimizer > 0
    assert nemo.memory.optimizer == pytest.approx(native.memory.optimizer * 10.0 / OPTIMIZER_BYTES)
    assert nemo.memory.weights == native.memory.weights
    # the switch copies the optimizer it holds; the parked optimizer's copies and host memory
    assert switched_gb(native.memory) - switched_gb(nemo.memory) == pytest.approx(
        native.memory.optimizer * 2.0 / OPTIMIZER_BYTES)
    ratio = 10.0 / OPTIMIZER_BYTES
    assert optpark.parked_gb(nemo.memory, nemo.par) == pytest.approx(
        ratio * optpark.parked_gb(native.memory, native.par))
    assert optpark.moved_gb(nemo, "") == pytest.approx(ratio * optpark.moved_gb(native, ""))
    assert host_parked_gb(nemo.memory, Role.ACTOR, "", ("optimizer",)) == pytest.approx(
        ratio * host_parked_gb(native.memory, Role.ACTOR, "", ("optimizer",)))
    # a DTensor layout (no pipeline or expert parallelism) keeps Adam's 12
    flat = Parallel(dp=8)
    assert _estimate("nemo-rl", flat).memory.optimizer == pytest.approx(
        _estimate("native", flat).memory.optimizer)


def test_a_host_stepped_optimizer_holds_none_on_the_device() -> None:
    par = replace(Parallel(pp=2, dp=4), offload=True)
    assert _estimate("nemo-rl", par).memory.optimizer == 0.0
