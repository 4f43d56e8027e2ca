"""The precision a trainer reduces its gradients at (`FrameworkProfile.grad_reduce_bytes`,
`Parallel.grad_reduce_bytes`): FSDP's `reduce_dtype` and Megatron's `grad_reduce_in_fp32` cast
the gradients to fp32 before the reduce-scatter / all-reduce (verl, EasyR1, NeMo-RL's DTensor
path, Miles' recipes and this repository's own FSDP2 loop), so those calls move twice the BF16
bytes, while the weights' gathers stay BF16. NeMo-RL's Megatron recipes and DeepSpeed under bf16
(OpenRLHF) reduce in BF16.

The closed forms below restate what each call moves (ring collectives: a call's time goes with
its bytes); `test_native_profile_reduces_as_the_executor_does` checks the profile against the
executor's own FSDP2 policy, an independent reference."""
from __future__ import annotations

from dataclasses import replace

import pytest
from specdata import h100_job

import placer.spec.job as jobmod
from placer.base.roles import Role
from placer.cost.collectives import all_gather, all_reduce
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.layercomm import (
    call_cost,
    fsdp_calls,
    fsdp_units,
    grad_sync_time,
    shard_link,
    zero3_gathers,
)
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel, grad_bytes
from placer.spec.catalog import resolve
from placer.spec.framework import PROFILES
from placer.spec.load import job_from_dict


def _resolved(framework: str):
    return resolve(job_from_dict(h100_job("gradreduce", framework, policy="Qwen3-8B",
                                          tokens=256)))


def test_each_framework_reduces_at_its_sources_precision() -> None:
    fp32 = {"native", "verl", "verl-megatron", "easyr1", "miles"}
    for name in fp32:
        p = PROFILES[name]
        assert p.grad_reduce_bytes(pp=1, ep=1) == p.grad_reduce_bytes(pp=2, ep=1) == 4, name
    nemo = PROFILES["nemo-rl"]
    assert nemo.grad_reduce_bytes(pp=1, ep=1) == 4  # DTensor: FSDP2 in fp32
    assert nemo.grad_reduce_bytes(pp=2, ep=1) == nemo.grad_reduce_bytes(pp=1, ep=8) == 2
    assert PROFILES["openrlhf"].grad_reduce_bytes(pp=1, ep=1) == 2  # DeepSpeed bf16
    for name, p in PROFILES.items():
        if name != "native":
            assert "grad_reduce_bytes" in p.sources, name


def test_native_profile_reduces_as_the_executor_does() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.fsdp")
    from executors.precision import fsdp_policy
    policy = fsdp_policy("bf16")
    bytes_per = torch.empty((), dtype=policy.reduce_dtype).element_size()
    assert PROFILES["native"].grad_reduce_bytes(pp=1, ep=1) == bytes_per


def test_zero3_reduce_scatters_move_the_reduce_precision_gathers_stay_bf16() -> None:
    res = _resolved("native")
    m, dev, eff = res.arch_of(Role.ACTOR), res.device_of("h"), Efficiency()
    bf16, fp32 = Parallel(dp=8), Parallel(dp=8, grad_reduce_bytes=4)
    link = call_cost(shard_link(dev, bf16, eff), eff.fsdp_call_s)
    dense = grad_bytes(m, bf16)[0] / fsdp_units(m)
    tokens = 4096.0
    per_micro = (fsdp_calls(m, 3) - fsdp_units(m)) * all_gather(dense, 8, link) \
        + fsdp_units(m) * all_gather(2 * dense, 8, link)
    assert zero3_gathers(m, dev, fp32, tokens, 3, eff, tokens) == pytest.approx(per_micro)
    assert zero3_gathers(m, dev, fp32, tokens, 3, eff, tokens) > zero3_gathers(
        m, dev, bf16, tokens, 3, eff, tokens)
    # a forward pass only gathers: no gradient, no change
    assert zero3_gathers(m, dev, fp32, tokens, 1, eff, tokens) == pytest.approx(
        zero3_gathers(m, dev, bf16, tokens, 1, eff, tokens))


def test_the_step_reduction_scales_the_gradients_half_with_zero_all_without() -> None:
    res = _resolved("native")
    m, dev, eff = res.arch_of(Role.ACTOR), res.device_of("h"), Efficiency()
    dense = grad_bytes(m, Parallel(dp=8))[0]
    for zero, scale in ((1, 1.5), (0, 2.0)):
        par = Parallel(dp=8, zero=zero, grad_reduce_bytes=4)
        link = shard_link(dev, par, eff)
        assert grad_sync_time(m, dev, par, eff) == pytest.approx(
            all_reduce(dense * scale, par.zero_group, link)), zero
        assert grad_sync_time(m, dev, replace(par, grad_reduce_bytes=2), eff) == pytest.approx(
            all_reduce(dense, par.zero_group, link)), zero


def test_the_update_is_priced_at_its_frameworks_precision_and_the_layout_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    par, calib = Parallel(dp=8), Calibration()

    def estimate():
        res = _resolved("native")
        return Pricer(res, calib).estimate(Role.ACTOR, res.cluster.pool("h"), par)

    fp32 = estimate()
    bf16_native = replace(PROFILES["native"], fsdp_grad_reduce_bytes=2)
    monkeypatch.setattr(jobmod, "profile_of", lambda name: bf16_native)
    bf16 = estimate()
    assert fp32.stage_s["train"] > bf16.stage_s["train"]
    assert fp32.stage_s["score"] == pytest.approx(bf16.stage_s["score"])
    assert fp32.par == bf16.par == par  # the plan's layout is unchanged
