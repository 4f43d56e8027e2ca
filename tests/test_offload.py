"""Offload as each framework moves it (`placer.cost.offload`): the per-phase copies of parked
state, a host-stepped optimizer's per-step copies, and how a colocated slot pays them.

Every expected figure is worked out by hand from the sources the module cites (bytes a
parameter x parameters a device holds x loads), not re-run through the code."""
from __future__ import annotations

import pytest

from placer.base.roles import Role
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.model import train_time
from placer.cost.offload import (
    GENERIC,
    PARK_SCHEMES,
    Phase,
    host_step_gb,
    parked_moves_gb,
    parked_states,
    phases_of,
    scheme_of,
    unparked_gb,
)
from placer.cost.optpark import parked_gb
from placer.cost.roleestimate import Estimate
from placer.cost.roofline import GB, Memory
from placer.cost.sharding import Parallel, train_state_bytes
from placer.cost.timing import member_switch
from placer.spec.catalog import shipped_devices, shipped_models
from placer.spec.framework import PROFILES

# 7 G parameters per device in the model's accounting: 14 GB of BF16 weights, 84 GB of optimizer
MEM = Memory(weights=14.0, grads=14.0, optimizer=84.0)
EVERY: frozenset[Phase] = frozenset({"refit", "forward", "update"})


def test_verl_fsdp_moves_fp32_params_three_times_and_adam_moments_once() -> None:
    par = Parallel(park_params=True, park_optimizer=True)
    # params: 4 B x 7 G x 3 loads (rollout_mode, compute_log_prob, update_actor) = 84 GB;
    # optimizer: 8 B (exp_avg, exp_avg_sq) x 7 G x 1 load (update_actor) = 56 GB
    assert parked_moves_gb(MEM, par, "verl", EVERY) == pytest.approx(84.0 + 56.0)


def test_verl_megatron_moves_bf16_params_three_times_and_master_plus_moments_once() -> None:
    par = Parallel(tp=2, zero=1, park_params=True, park_optimizer=True)
    # params: 2 B x 7 G x 3 = 42 GB; optimizer: 12 B (fp32 master, exp_avg, exp_avg_sq) x 7 G
    assert parked_moves_gb(MEM, par, "verl-megatron", EVERY) == pytest.approx(42.0 + 84.0)


def test_a_role_without_a_log_prob_pass_loads_its_params_twice() -> None:
    # a fully async trainer takes old log-probs from the engine: refit and update only
    phases = phases_of(Role.ACTOR, ["train"])
    assert phases == {"refit", "update"}
    par = Parallel(park_params=True)
    assert parked_moves_gb(MEM, par, "verl", phases) == pytest.approx(4 * 7 * 2)


def test_a_frozen_reference_loads_its_params_for_its_forward_only() -> None:
    assert phases_of(Role.REFERENCE, ["score"]) == {"forward"}
    par = Parallel(tp=2, zero=1, park_params=True)
    mem = Memory(weights=14.0)
    assert parked_moves_gb(mem, par, "verl-megatron", phases_of(Role.REFERENCE, ["score"])) == (
        pytest.approx(14.0))


def test_frameworks_without_a_scheme_move_the_models_own_bytes() -> None:
    for name in set(PROFILES) - set(PARK_SCHEMES):
        assert scheme_of(name) is GENERIC
    par = Parallel(park_optimizer=True)
    # the optimizer once, at the model's 12 B: exactly its on-device state (optpark's rule)
    assert parked_moves_gb(MEM, par, "nemo-rl", EVERY) == pytest.approx(MEM.optimizer)


def test_a_host_stepped_optimizer_parks_nothing_of_its_state() -> None:
    par = Parallel(offload=True, park_optimizer=True, park_params=True)
    assert parked_states(par) == ("params",)
    assert parked_gb(MEM, par) == pytest.approx(MEM.weights)
    assert unparked_gb(MEM, par) == pytest.approx(MEM.optimizer)


def test_host_step_copies_an_fp32_gradient_out_and_parameter_in() -> None:
    # 84 GB of optimizer state is 7 G parameters; 4 + 4 B each per optimizer step
    assert host_step_gb(84.0) == pytest.approx(56.0)


def test_train_time_prices_the_host_step_per_optimizer_step() -> None:
    m = shipped_models()["Qwen2.5-7B"]
    dev = shipped_devices()["H100-SXM"]
    eff = Efficiency()
    on, off = Parallel(dp=8, offload=True), Parallel(dp=8)
    steps = 4
    extra = (train_time(m, dev, on, 1e6, 1024, steps, eff)
             - train_time(m, dev, off, 1e6, 1024, steps, eff))
    params = train_state_bytes(m, on)[2] / 12 / GB  # G parameters of the optimizer's shard
    assert extra == pytest.approx(steps * 8 * params / eff.offload_gbs)


def _est(role: str, mem: Memory, par: Parallel, stages: dict[str, float]) -> Estimate:
    return Estimate(role, "h", par, mem, stages)


def test_a_parking_member_pays_its_copies_whether_or_not_the_slot_fits() -> None:
    dev = shipped_devices()["H100-SXM"]
    eff = Calibration().for_device(dev)
    par = Parallel(park_params=True, park_optimizer=True)
    est = _est(Role.ACTOR, MEM, par, {"score": 1.0, "train": 1.0})
    copies = 2 * (84.0 + 56.0) / eff.offload_gbs  # verl's FSDP copies, out and back
    assert member_switch(est, dev, eff, "verl", whole=False, sleep_level=2) == pytest.approx(copies)
    # switching whole it parks everything it holds: nothing else moves, and its copies exceed
    # the one round trip of weights and optimizer an onload would be (2 x 98 GB)
    assert member_switch(est, dev, eff, "verl", whole=True, sleep_level=2) == pytest.approx(copies)


def test_a_parked_member_of_a_switching_slot_pays_at_least_its_onload() -> None:
    dev = shipped_devices()["H100-SXM"]
    eff = Calibration().for_device(dev)
    est = _est(Role.ACTOR, MEM, Parallel(park_optimizer=True), {"train": 1.0})
    onload = 2 * (14.0 + 84.0) / eff.offload_gbs
    # verl's 8 B moments (56 GB) plus the unparked weights (14 GB) would be less than the
    # onload: the whole switch moves the state out once anyway
    assert member_switch(est, dev, eff, "verl", whole=True, sleep_level=2) == pytest.approx(onload)
    assert member_switch(est, dev, eff, "verl", whole=False, sleep_level=2) == pytest.approx(
        2 * 56.0 / eff.offload_gbs)
