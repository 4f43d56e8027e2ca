"""Weights streamed from the host (`placer.cost.offload.stream_time`): FSDP's CPU parameter
offload, which verl and EasyR1 set on their reference, copies the device's shard to the GPU on
every forward micro-batch.

Every expected figure is worked by hand (shard bytes x micro-batches / the host link's rate),
not re-run through the code."""
from __future__ import annotations

from dataclasses import replace

import pytest

from placer.base.roles import Role
from placer.cost.calibration import load_calibration
from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import MICRO_TOKENS
from placer.cost.offload import STREAM_SCHEMES, stream_micro_batches, stream_time, streamed
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from workflows.published import EXAMPLES
from workflows.published_rows import ROWS

EFF = Efficiency(offload_gbs=25.0)


def test_micro_batches_are_the_ceiling_of_tokens_over_the_budget() -> None:
    assert stream_micro_batches(20_000, 8192) == 3  # 2.44 -> 3
    assert stream_micro_batches(16_384, 8192) == 2  # exact
    assert stream_micro_batches(100, 8192) == 1  # a short pass still runs one


def test_one_pass_copies_the_shard_once_per_micro_batch_at_the_host_dtype() -> None:
    # 2 GB of BF16 weights per device = 1 G parameters; EasyR1's BF16 host copy: 2 GB a
    # micro-batch; 20,000 tokens at 8,192 a micro-batch: 3; 3 x 2 GB / 25 GB/s = 0.24 s
    par = Parallel(dp=8, sharded_weights=True, micro_token_budget=8192, stream_params_bytes=2.0)
    assert stream_time(2.0, par, 20_000, 700, EFF) == pytest.approx(0.24)
    # verl's fp32 host copy (model_dtype fp32): 4 GB a micro-batch, 0.48 s
    fp32 = replace(par, stream_params_bytes=STREAM_SCHEMES["verl-fsdp-ref"].bytes_per_param)
    assert stream_time(2.0, fp32, 20_000, 700, EFF) == pytest.approx(0.48)


def test_the_budget_defaults_to_verls_token_budget_and_a_count_overrides_it() -> None:
    assert MICRO_TOKENS == 16384
    par = Parallel(dp=8, stream_params_bytes=2.0)
    # 20,000 tokens at 16,384: 2 micro-batches x 2 GB / 25 GB/s = 0.16 s
    assert stream_time(2.0, par, 20_000, 700, EFF) == pytest.approx(0.16)
    # 2 sequences of 1,000 tokens a micro-batch: 10 x 2 GB / 25 GB/s = 0.8 s
    assert stream_time(2.0, replace(par, micro_batch=2), 20_000, 1000, EFF) == pytest.approx(0.8)


def test_a_layout_that_streams_nothing_pays_nothing() -> None:
    assert stream_time(2.0, Parallel(dp=8, sharded_weights=True), 20_000, 700, EFF) == 0.0


def test_a_streaming_layout_keeps_no_weights_on_the_gpu() -> None:
    par = Parallel(dp=8, sharded_weights=True, micro_token_budget=8192, stream_params_bytes=2.0)
    assert streamed(2.0, par, 20_000, 700, EFF) == pytest.approx((0.24, 0.0))
    assert streamed(2.0, replace(par, stream_params_bytes=0.0), 20_000, 700, EFF) == (0.0, 2.0)


def test_r13s_reference_pays_29_copies_of_its_bf16_shard() -> None:
    """Row r13 (EasyR1, Qwen2.5-VL-7B, 8 H100): 2,560 samples of ~725 tokens (the job file's
    header: 1,600 tok/s/GPU x 8 x 145 s / 2,560) = 232,000 tokens a rank; at 8,192 a
    micro-batch, ceil(28.3) = 29 micro-batches (any mean context in (716.8, 742.4] gives 29).
    The shard: 8.29 G parameters x 2 B / 8 = 2.0725 GB. 29 x 2.0725 / offload_gbs."""
    row = next(r for r in ROWS if r.name.startswith("r13 "))
    use = row.layout[Role.REFERENCE]
    assert (use.sharded, use.micro_token_budget, use.stream_params_bytes) == (True, 0, 2.0)
    calib = load_calibration(None)
    px = Pricer(resolve(load_job(EXAMPLES / row.file), row.file), calib)
    # the budget is EasyR1's (the easyr1 profile: 2 sequences a forward micro-batch, 1 an update
    # one, x the padded length 4,096), as the job file sets none and the row's layout none
    assert px.res.job.micro_token_budget is None
    profile, padded = px.res.job.profile, px.res.job.max_context
    assert (profile.micro_token_budget("forward", padded),
            profile.micro_token_budget("update", padded)) == (8192, 4096)
    pool = px.res.cluster.pool(use.pool)
    streamed = px.estimate(Role.REFERENCE, pool, use.parallel())
    resident = px.estimate(Role.REFERENCE, pool, replace(use.parallel(), stream_params_bytes=0.0))
    added = streamed.stage_s["score"] - resident.stage_s["score"]
    offload_gbs = px.eff(pool).offload_gbs
    assert added == pytest.approx(29 * 2.0725 / offload_gbs, rel=1e-3)
    # the shard is on the host: none of it resident, where the unstreamed twin holds all of it
    assert streamed.memory.weights == 0.0
    assert resident.memory.weights == pytest.approx(2.0725, rel=1e-3)
