"""NeMo-RL's reference pass (`placer.cost.refswap`): the reference's host state dict swapped into
the policy's model and back, with Megatron's forced parameter all-gather; and NeMo-RL's rule
reward on its eight verify workers.

Expected figures are worked by hand (three copies of the device's weights over a 25 GB/s host
link, a ring all-gather's (n - 1) / n of the bytes) or taken against the same job priced under
a framework that does not swap (the difference is the swap alone)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from placer.base.roles import Role
from placer.cost.collectives import all_gather
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.estimate import _tokens
from placer.cost.layercomm import shard_link
from placer.cost.model import moe_route_time
from placer.cost.pricer import Pricer
from placer.cost.refswap import SWAP_COPIES, param_sync_time, swap_host_gb, swap_time
from placer.cost.roleestimate import Estimate
from placer.cost.sharding import BYTES, Parallel
from placer.cost.timing import onload_time
from placer.solve import hostmem
from placer.spec.catalog import resolve
from placer.spec.framework import PROFILES
from placer.spec.load import load_job
from workflows.published import EXAMPLES, Use, _place
from workflows.published_rows import ROWS

EFF = Efficiency(offload_gbs=25.0)
R15 = next(r for r in ROWS if r.name.startswith("r15 "))


def _pricer(framework: str) -> Pricer:
    job = load_job(EXAMPLES / R15.file)
    return Pricer(resolve(job.model_copy(update={"framework": framework}), R15.file),
                  Calibration())


def _ref(px: Pricer) -> Estimate:
    return _place(px, Role.REFERENCE, R15.layout[Role.REFERENCE])


def test_nemo_rl_swaps_its_reference_and_no_other_profile_does() -> None:
    assert PROFILES["nemo-rl"].swap_frozen == (Role.REFERENCE,)
    assert all(not p.swap_frozen for n, p in PROFILES.items() if n != "nemo-rl")


def test_a_swap_copies_the_weights_three_times_over_the_host_link() -> None:
    # one rank (no all-gather): 2 GB out, 2 GB in, 2 GB back at 25 GB/s = 0.24 s
    px = _pricer("nemo-rl")
    m, dev = px.res.arch_of(Role.REFERENCE), px.res.device_of("h100")
    assert SWAP_COPIES == 3
    assert swap_time(m, dev, Parallel(), 2.0, EFF) == pytest.approx(0.24)


def test_the_forced_all_gather_is_the_distributed_optimizers_over_its_groups() -> None:
    # Qwen3-30B-A3B on 32 H100 with EP 8: the dense BF16 parameters over the 32 dp ranks, the
    # experts (each device's eighth) over their 4 expert-dp ranks, on the ZeRO group's link
    px = _pricer("nemo-rl")
    m, dev = px.res.arch_of(Role.REFERENCE), px.res.device_of("h100")
    par = Parallel(dp=32, ep=8, zero=1)
    experts = m.moe_layers * m.experts * m.expert_params()
    dense = m.params() - experts
    link = shard_link(dev, par, EFF)
    want = (all_gather(BYTES * dense, 32, link) + all_gather(BYTES * experts / 8, 4, link))
    assert param_sync_time(m, dev, par, EFF) == pytest.approx(want)
    assert want > 0
    # an FSDP-sharded reference (NeMo-RL's DTensor path) has no distributed optimizer to sync
    assert param_sync_time(m, dev, replace(par, sharded_weights=True), EFF) == 0.0


def test_nemo_rls_reference_pass_pays_the_swap_and_holds_no_weights_on_the_gpu() -> None:
    native, nemo = _ref(_pricer("native")), _ref(_pricer("nemo-rl"))
    px = _pricer("nemo-rl")
    m, dev = px.res.arch_of(Role.REFERENCE), px.res.device_of("h100")
    w = native.memory.weights
    assert w > 5.0  # the device's BF16 shard of a 30B model over EP 8
    eff = px.calib.for_device(dev)
    want = SWAP_COPIES * w / eff.offload_gbs + param_sync_time(m, dev, nemo.par, eff)
    # and the MoE routing cost NeMo-RL's log-prob passes were measured at (the nemo-rl
    # profile's moe_route_token_layer_s; the native profile has none)
    want += moe_route_time(m, nemo.par, _tokens(px.res)[0] / nemo.par.dp, eff)
    assert nemo.stage_s["score"] - native.stage_s["score"] == pytest.approx(want)
    assert nemo.memory.weights == 0.0
    # so a whole switch moves nothing of it: its swap is its switch
    assert onload_time(Role.REFERENCE, nemo.memory, dev, eff, 1) == 0.0
    assert onload_time(Role.REFERENCE, native.memory, dev, eff, 1) > 0.0


def test_the_swapped_reference_holds_two_copies_of_its_weights_in_host_memory() -> None:
    px = _pricer("nemo-rl")
    par = _ref(px).par
    w = _ref(_pricer("native")).memory.weights
    assert swap_host_gb(w) == pytest.approx(2 * w)
    assert hostmem.swapped_gb(px.res, Role.REFERENCE, par) == pytest.approx(2 * w)
    assert hostmem.swapped_gb(_pricer("native").res, Role.REFERENCE, par) == 0.0
    assert hostmem.swapped_gb(px.res, Role.ACTOR, par) == 0.0


def test_nemo_rls_rule_reward_runs_on_its_eight_verify_workers() -> None:
    # 2,048 answers: on 8 workers 256 rounds x 5 ms = 1.28 s; on a 64-core node's every core
    # 32 rounds = 0.16 s
    assert PROFILES["nemo-rl"].rule_workers == 8
    eff = Efficiency()
    cpu = Use("cpu")
    nemo = _place(_pricer("nemo-rl"), Role.REWARD, cpu).stage_s["score"]
    native = _place(_pricer("native"), Role.REWARD, cpu).stage_s["score"]
    assert nemo == pytest.approx(256 * eff.rule_reward_s)
    assert native == pytest.approx(32 * eff.rule_reward_s)
