"""NeMo-RL's measured MoE routing cost in its log-prob passes (`model.moe_route_time`,
`placer.spec.framework.NEMO_MOE_ROUTE_S`): the rate re-derived from its source, its scaling with
the tokens one GPU routes, and that only the NeMo-RL profile sets it."""
from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.estimate import _tokens
from placer.cost.model import moe_route_time
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.spec.catalog import resolve, shipped_models
from placer.spec.framework import NEMO_MOE_ROUTE_S, PROFILES
from placer.spec.load import job_from_dict
from workflows.published import EXAMPLES, _place
from workflows.published_rows import Use

# NVIDIA-NeMo/RL pull request 3295: Qwen3-30B-A3B on 2 x 8 B200, the log-prob stage (the
# policy's and the reference's passes) 87.5 s at 4,740 tokens/s/GPU
PR3295_LOGPROB_S = 87.5
PR3295_TOKENS_S_GPU = 4740.0
PR3295_GPUS = 16


def test_rate_reproduces_its_source() -> None:
    # An independent check of the constant against the measurement it came from, priced by the
    # cost model as it is now (a regression guard if the passes' other terms move): row r19's
    # job (the same 4n4g recipe family: EP 16, 8,192-token log-prob micro-batches) on the pull
    # request's 2 nodes x 8 B200.
    spec = yaml.safe_load((EXAMPLES / "r19-grpo30ba3b-16xgb200-nemorl-colocate.yaml").read_text())
    spec.pop("catalog")
    spec["cluster"]["pools"][0] = {"name": "b", "device": "B200", "devices_per_node": 8,
                                   "nodes": 2}
    res = resolve(job_from_dict(spec, "pr3295"), "pr3295")
    px = Pricer(res, Calibration())
    actor = _place(px, "actor", Use("b", dp=16, zero=1, ep=16, recompute=False))
    ref = _place(px, "reference", Use("b", dp=16, ep=16))
    per_token = (actor.stage_s["score"] + ref.stage_s["score"]) / _tokens(res)[0]
    measured = 1 / (PR3295_TOKENS_S_GPU * PR3295_GPUS)  # s per token, both passes
    assert per_token == pytest.approx(measured, rel=0.03)
    # the job's framework (nemo-rl) brings the rate; the routing is about half of the stage
    assert px.calib.default.moe_route_token_layer_s == NEMO_MOE_ROUTE_S
    route = 2 * moe_route_time(res.arch_of("actor"), Parallel(dp=16, ep=16),
                               _tokens(res)[0] / 16, px.calib.default)
    assert 0.4 < route / (per_token * _tokens(res)[0]) < 0.6
    assert PR3295_LOGPROB_S * PR3295_TOKENS_S_GPU == pytest.approx(414_750)  # tokens a GPU


def test_route_time_scales_with_the_tokens_a_gpu_routes() -> None:
    models = shipped_models()
    moe, dense = models["Qwen3-30B-A3B"], models["Qwen2.5-7B"]
    eff = replace(Efficiency(), moe_route_token_layer_s=1e-6)
    base = moe_route_time(moe, Parallel(dp=16, ep=16), 400_000, eff)
    assert base == pytest.approx(1e-6 * 400_000 * moe.moe_layers)
    assert moe_route_time(moe, Parallel(dp=16, ep=16), 200_000, eff) == pytest.approx(base / 2)
    # context and tensor parallelism split a rank's tokens, a pipeline its layers
    for par in (Parallel(tp=2, dp=8, ep=16), Parallel(cp=2, dp=8, ep=16),
                Parallel(pp=2, dp=8, ep=16)):
        assert moe_route_time(moe, par, 400_000, eff) == pytest.approx(base / 2), par
    # none for a dense model, and none where no profile measured it
    assert moe_route_time(dense, Parallel(dp=16), 400_000, eff) == 0.0
    assert moe_route_time(moe, Parallel(dp=16, ep=16), 400_000, Efficiency()) == 0.0


def test_only_the_nemo_rl_profile_prices_it() -> None:
    assert Efficiency().moe_route_token_layer_s == 0.0
    assert [n for n, p in PROFILES.items() if p.factors.get("moe_route_token_layer_s", 0) > 0] == [
        "nemo-rl"]
    assert "moe_route_token_layer_s" in PROFILES["nemo-rl"].sources
