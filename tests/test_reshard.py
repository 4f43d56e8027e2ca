"""NeMo-RL's nccl_reshard refit (`nccl-reshard`, `placer.cost.refit`): the bytes an engine rank
receives against the doc's published "XferDTensor fraction" (an independent check: the model's
shape alone gives it), the closed form of one refit, the colocated fallback to CUDA IPC, the
simulator agreeing with the planner, and the executor refusing what it does not run."""
from __future__ import annotations

import math

import pytest
from simplans import small_plan

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.pricer import Pricer
from placer.cost.refit import (
    RESHARD_STREAMS,
    reshard_bulk_bytes,
    reshard_bytes,
    reshard_grouped_calls,
    reshard_misc_tensors,
)
from placer.cost.roleestimate import Estimate
from placer.cost.roofline import GB, Memory, weight_bytes
from placer.cost.sharding import Parallel
from placer.cost.timing import Placed
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.load import job_from_dict
from placer.spec.weightsync import TransportKind

MODELS = shipped_models()
H100 = shipped_devices()["H100-SXM"]
EFF = Efficiency()


def _res(model: str, nodes: int, transport: TransportKind = "nccl-reshard"):
    return resolve(job_from_dict({
        "name": "reshard", "algorithm": "grpo", "models": {"policy": model},
        "batch": {"prompts": 1, "samples_per_prompt": 2},
        "lengths": {"prompt": {"kind": "fixed", "value": 1},
                    "response": {"kind": "fixed", "value": 1}},
        "cluster": {"pools": [{"name": "g", "device": "H100-SXM", "devices_per_node": 8,
                               "nodes": nodes}]},
        "weight_sync": {"transport": transport}}))


def _sync_s(res, a_par: Parallel, r_par: Parallel, colocated: bool) -> float:
    a = Placed("a+r" if colocated else "a", Estimate(Role.ACTOR, "g", a_par, Memory(), {}))
    r = Placed("a+r" if colocated else "r", Estimate(Role.ROLLOUT, "g", r_par, Memory(), {}))
    return Pricer(res, Calibration(EFF)).sync_time(a, r)


@pytest.mark.parametrize("model, fraction", [
    ("Qwen3-4B", 0.669), ("Qwen3-30B-A3B", 0.950), ("DeepSeek-V3", 0.976)])
def test_bulk_share_is_the_docs_xferdtensor_fraction(model: str, fraction: float) -> None:
    """NVIDIA-NeMo/RL docs/design-docs/nccl-reshard-refit.md @7ea279ab, Expected Performance:
    the share of the refit that rides the shard-to-shard path, as the doc prints it (0.1%)."""
    m = MODELS[model]
    assert reshard_bulk_bytes(m) / weight_bytes(m) == pytest.approx(fraction, abs=5e-4)


def test_engine_rank_receives_its_ffn_slice_and_the_misc_whole() -> None:
    m = MODELS["Qwen3-4B"]  # dense: the FFN over TP
    bulk, misc = reshard_bytes(m, Parallel(tp=8))
    assert bulk == pytest.approx(reshard_bulk_bytes(m) / 8)
    assert misc == pytest.approx(weight_bytes(m) - reshard_bulk_bytes(m))
    d = MODELS["DeepSeek-V3"]  # MoE: the experts over the engine's expert shards
    routed = d.moe_layers * d.experts * d.expert_params() * 2
    bulk, _ = reshard_bytes(d, Parallel(tp=32))
    assert bulk == pytest.approx(routed / 32 + (reshard_bulk_bytes(d) - routed) / 32)


def test_refit_is_the_closed_form_over_two_nodes() -> None:
    """DP8 trainer on one node, TP8 engine on the other: export of the misc, then bulk slice and
    misc over one NIC, the latency, one call per FFN projection and per misc bucket, and each
    misc tensor's export and load (a dense model: no grouped-expert call)."""
    m = MODELS["Qwen3-4B"]
    bulk, misc = reshard_bytes(m, Parallel(tp=8))
    calls = 3 * m.layers + math.ceil(misc / GB / EFF.sync_bucket_gb)
    want = (misc / (EFF.sync_export_gbs * GB) + (bulk + misc) / (H100.nic_gbs * GB * EFF.link_eff)
            + EFF.sync_latency_s + (calls - 1) * EFF.sync_call_s
            + 290 * EFF.reshard_misc_tensor_s)
    got = _sync_s(_res("Qwen3-4B", 2), Parallel(dp=8), Parallel(tp=8), colocated=False)
    assert got == pytest.approx(want)
    broadcast = _sync_s(_res("Qwen3-4B", 2, "broadcast"), Parallel(dp=8), Parallel(tp=8), False)
    assert got < broadcast  # a third of the bytes and no sender cap


@pytest.mark.parametrize("model, tensors, misc", [
    ("Qwen3-4B", 398, 290), ("Qwen3-30B-A3B", 18867, 435), ("DeepSeek-V3", 45337, 784)])
def test_misc_tensors_are_the_checkpoint_less_the_ffn_projections(
        model: str, tensors: int, misc: int) -> None:
    """The misc path carries every HF tensor but the dense MLPs' and routed experts' gate, up
    and down: Qwen3-4B's 398 (36 layers x 11 + embedding + norm, tied head) less 108."""
    m = MODELS[model]
    bulk = 3 * (m.layers - m.moe_layers) + 3 * m.moe_layers * m.experts
    assert bulk + reshard_misc_tensors(m) == tensors
    assert reshard_misc_tensors(m) == misc


def test_grouped_calls_spread_over_the_engines_two_streams() -> None:
    """3 grouped-expert calls per MoE layer, the trainer's stages over NRL_REFIT_NUM_STREAMS
    (2) streams: PP2 halves the calls in line, PP4 no further; a dense model has none."""
    m = MODELS["Qwen3-30B-A3B"]
    assert RESHARD_STREAMS == 2
    assert reshard_grouped_calls(m, 1) == 3 * 48
    assert reshard_grouped_calls(m, 2) == reshard_grouped_calls(m, 4) == 3 * 48 / 2
    assert reshard_grouped_calls(MODELS["Qwen3-4B"], 1) == 0
    res, r_par = _res("Qwen3-30B-A3B", 4), Parallel(tp=8, dp=2)
    one = _sync_s(res, Parallel(dp=16, ep=8), r_par, colocated=False)
    two = _sync_s(res, Parallel(pp=2, dp=8, ep=8), r_par, colocated=False)
    assert one - two == pytest.approx(72 * EFF.reshard_grouped_call_s)


def test_colocated_falls_back_to_cuda_ipc_of_the_full_weights() -> None:
    """The doc: "the colocated path uses IPC and is unaffected": the broadcast's local refresh."""
    args = (Parallel(dp=8), Parallel(tp=8), True)
    assert _sync_s(_res("Qwen3-4B", 1), *args) == pytest.approx(
        _sync_s(_res("Qwen3-4B", 1, "broadcast"), *args))


def test_execute_refuses_the_reshard_it_does_not_run() -> None:
    from executors.runplan import resolve_plan

    with pytest.raises(SpecError, match=r"weight_sync\.transport: 'nccl-reshard'"):
        resolve_plan(small_plan(weight_sync={"transport": "nccl-reshard"}))
