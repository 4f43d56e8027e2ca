"""A frozen model's forward (reference, reward model) held FSDP-sharded over its dp ranks, as
verl's, OpenRLHF's and NeMo-RL's reference workers hold it, or as a whole copy on every tp x pp
group: sharded candidates exist for the frameworks that run them (not for `native`, whose
workers hold whole copies, and which `placer execute` refuses), and a pin picks the form. The
memory checks are against a closed form from the model's published shape (Qwen2.5-7B), not
against the cost model's own functions."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from exec_util import GRPO_LAYOUT, hand_plan, job_dict

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.estimate import frozen_sharded
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.solve.candidates import role_candidates
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "grpo-qwen7b-h100.yaml"
# Qwen2.5-7B (Qwen/Qwen2.5-7B config.json): 28 layers, hidden 3584, 28 heads of 128, 4 KV
# heads, SwiGLU MLP 18944, vocab 152064, untied embeddings, q/k/v biases
L, H, KV, F, V = 28, 3584, 4 * 128, 18944, 152064
PARAMS = L * (H * H + 2 * H * KV + H + 2 * KV + H * H + 3 * H * F + 2 * H) + 2 * V * H + H


def _doc(pin: dict | None = None, framework: str = "verl") -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["framework"] = framework
    if pin is not None:
        doc["pin"] = pin
    return doc


@pytest.fixture(scope="module")
def px() -> Pricer:
    return Pricer(resolve(job_from_dict(_doc())), Calibration())


def _reference_candidates(px: Pricer) -> list:
    return role_candidates(px, Role.REFERENCE, px.res.job.cluster.pool("h100"))


def test_the_closed_form_is_the_published_size() -> None:
    assert PARAMS == pytest.approx(7.62e9, rel=0.01)  # Qwen2.5-7B's published 7.61B


def test_sharded_weights_are_the_whole_over_dp_and_cost_their_gathers(px: Pricer) -> None:
    pool = px.res.job.cluster.pool("h100")
    whole = px.estimate(Role.REFERENCE, pool, Parallel(dp=8))
    sharded = px.estimate(Role.REFERENCE, pool, Parallel(dp=8, sharded_weights=True))
    assert not frozen_sharded(whole.par) and frozen_sharded(sharded.par)
    assert whole.memory.weights == pytest.approx(2 * PARAMS / 1e9, rel=0.01)
    assert sharded.memory.weights == pytest.approx(2 * PARAMS / 8 / 1e9, rel=0.01)
    # two FSDP units gathered while the pass runs: transient, not parked
    unit = 2 * PARAMS / (L + 1) / 1e9
    assert sharded.memory.activations - whole.memory.activations == pytest.approx(2 * unit,
                                                                                   rel=0.01)
    # mfu_score is fitted on FSDP-sharded forward passes: the same time for both forms
    assert sharded.stage_s["score"] == pytest.approx(whole.stage_s["score"], rel=1e-12)


def test_every_data_parallel_count_offers_a_smaller_shard(px: Pricer) -> None:
    cands = _reference_candidates(px)
    whole = {c.devices: c for c in cands if not c.est.par.sharded_weights}
    # resident shards (the streamed twins, `placer.solve.layouts.streamed_frozen`, are
    # tests/test_refstream_plan.py's)
    shard = {c.devices: c for c in cands
             if frozen_sharded(c.est.par) and not c.est.par.stream_params_bytes}
    assert set(shard) == {n for n, c in whole.items() if c.est.par.dp > 1} and shard
    for n, c in shard.items():
        assert c.time_s == pytest.approx(whole[n].time_s, rel=1e-12)
        assert c.est.memory.total < whole[n].est.memory.total


def test_native_keeps_whole_copies() -> None:
    px = Pricer(resolve(job_from_dict(_doc(framework="native"))), Calibration())
    cands = _reference_candidates(px)
    assert cands and not any(c.est.par.sharded_weights for c in cands)


@pytest.mark.parametrize("sharded", [True, False])
def test_a_pin_keeps_one_form(sharded: bool) -> None:
    px = Pricer(resolve(job_from_dict(_doc({"reference": {"sharded": sharded}}))),
                Calibration())
    cands = _reference_candidates(px)
    assert cands and all(frozen_sharded(c.est.par) == sharded for c in cands)


def test_a_trainer_cannot_pin_sharded() -> None:
    with pytest.raises(SpecError, match=r"actor\.sharded"):
        job_from_dict(_doc({"actor": {"sharded": True}}))


def test_execute_refuses_a_sharded_reference_and_runs_a_whole_one() -> None:
    from executors.runplan import resolve_plan
    job = job_dict()
    pool, _, slot = GRPO_LAYOUT["reference"]
    if job_from_dict(job).cluster.pool(pool).devices_per_node < 2:
        pytest.skip("the tiny example's GPU pool has one device")
    sharded = {**GRPO_LAYOUT, "reference": (pool, Parallel(dp=2, sharded_weights=True), slot)}
    with pytest.raises(SpecError, match=r"plan\.roles\.reference\.sharded_weights: true .*"
                                        r"sharded: false"):
        resolve_plan(hand_plan(sharded, job))
    whole = {**GRPO_LAYOUT, "reference": (pool, Parallel(dp=2), slot)}
    assert resolve_plan(hand_plan(whole, job)).roles
