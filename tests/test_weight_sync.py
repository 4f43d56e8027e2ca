"""Weight sync priced per call: tensors of a checkpoint, buckets per sender stream, unbucketed
(verl NCCL) vs bucketed (Miles, NeMo-RL, checkpoint-engine) transports, hand-computed; and the
simulator's sync transfer agreeing exactly with the planner's figure."""
from __future__ import annotations

import math

import pytest
from simplans import small_job, small_plan

from placer.base.roles import Role
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.pricer import Pricer
from placer.cost.roleestimate import Estimate
from placer.cost.roofline import Memory, engine_load_entries, weight_bytes, weight_tensors
from placer.cost.sharding import Parallel
from placer.cost.timing import Placed, sync_calls, sync_links, sync_senders
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.load import job_from_dict
from simulator.config import Network
from simulator.network import sync_plan

MODELS = shipped_models()
EFF = Efficiency()
FLAT = Efficiency(sync_bucket_gb=0.0)  # verl's NCCL sync without checkpoint-engine


@pytest.mark.parametrize(("name", "tensors"), [
    # 28 layers x (q k v o + 3 qkv biases + 2 norms + gate up down) + embed, final norm, lm_head
    ("Qwen2.5-7B", 28 * 12 + 3),
    # 48 layers x (q k v o + q/k norms + 2 norms + router + 128 experts x 3) + 3
    ("Qwen3-30B-A3B", 48 * (4 + 2 + 2 + 1 + 384) + 3),
    # MLA: q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o + 2 norms in all 61 layers; 3 dense MLPs;
    # 58 MoE layers of a router + (256 routed + 1 shared) x 3
    ("DeepSeek-V3", 61 * 9 + 3 * 3 + 58 * (1 + 257 * 3) + 3),
])
def test_weight_tensors_by_hand(name: str, tensors: int) -> None:
    assert weight_tensors(MODELS[name]) == tensors


def test_calls_are_buckets_per_sender_or_every_tensor() -> None:
    m = MODELS["Qwen3-30B-A3B"]
    gb = weight_bytes(m) / 1e9  # 61.1 GB
    assert sync_calls(m, 1, EFF) == math.ceil(gb) == 62
    assert sync_calls(m, 4, EFF) == math.ceil(gb / 4) == 16  # each stage streams its layers
    assert sync_calls(m, 4, FLAT) == weight_tensors(m)  # rank 0 sends every tensor
    assert sync_senders(4, EFF) == 4 and sync_senders(4, FLAT) == 1
    assert sync_calls(MODELS["tiny-llama"], 1, EFF) == 1  # under one bucket: one call


def test_calls_of_a_partial_push_as_a_trace_records_one() -> None:
    """A transfer event of `nbytes` (a fit or synthetic trace): its buckets, or that share of
    the tensors when unbucketed; the full size gives the whole-model count exactly."""
    m = MODELS["Qwen3-30B-A3B"]
    full = weight_bytes(m)
    assert sync_calls(m, 1, EFF, 10.5e9) == 11 and sync_calls(m, 2, EFF, 10.5e9) == 6
    assert sync_calls(m, 1, FLAT, full) == sync_calls(m, 1, FLAT) == weight_tensors(m)
    assert sync_calls(m, 1, FLAT, full / 2) == math.ceil(weight_tensors(m) / 2)
    assert sync_calls(m, 1, EFF, 1.0) == sync_calls(m, 1, FLAT, 1.0) == 1  # never below one


def _res(model: str, nodes: int):
    return resolve(job_from_dict({
        "algorithm": "grpo", "models": {"policy": model},
        "batch": {"prompts": 1, "samples_per_prompt": 2},
        "lengths": {"prompt": {"kind": "fixed", "value": 1},
                    "response": {"kind": "fixed", "value": 1}},
        "cluster": {"pools": [{"name": "g", "device": "H20", "devices_per_node": 8,
                               "nodes": nodes}]}}))


def _placed(slot: str, role: Role, par: Parallel) -> Placed:
    return Placed(slot, Estimate(role, "g", par, Memory(), {}))


def test_unbucketed_sync_is_one_sender_paying_every_tensor() -> None:
    res = _res("Qwen3-30B-A3B", 8)
    m = MODELS["Qwen3-30B-A3B"]
    h20 = shipped_devices()["H20"]
    actor = _placed("a", Role.ACTOR, Parallel(tp=4, pp=4, dp=2))  # 32 GPUs, 4 nodes
    rollout = _placed("r", Role.ROLLOUT, Parallel(tp=4, dp=8))
    t = Pricer(res, Calibration(FLAT)).sync_time(actor, rollout)
    # one sender whatever the pipeline stages, straight from its GPU at the NIC; each of the
    # 18,867 tensors after the first pays the engine's loader walk: 48 x 9 + 3 parameters and
    # the 3 x 128 expert mapping (vLLM's Qwen3-MoE load_weights, rebuilt every call)
    assert engine_load_entries(m) == 48 * 9 + 3 + 3 * 128
    per_tensor = engine_load_entries(m) * FLAT.sync_load_entry_s
    expect = (weight_bytes(m) / (h20.nic_gbs * 1e9 * FLAT.link_eff) + FLAT.sync_latency_s
              + (18867 - 1) * per_tensor)
    assert t == pytest.approx(expect)
    assert (18867 - 1) * per_tensor == pytest.approx(15.45, abs=0.01)  # of 15.76 s (verl)
    # bucketed, the 4 stages stream in parallel at the bucketed sender's rate, 16 calls each,
    # into a receiver's NIC (4 x 13.4 GB/s outruns its 50: the receive binds)
    sender = min(h20.nic_gbs, EFF.sync_sender_gbs)
    staged = Pricer(res, Calibration(EFF)).sync_time(actor, rollout)
    assert staged == pytest.approx(weight_bytes(m) / (min(4 * sender, h20.nic_gbs) * 1e9
                                                      * EFF.link_eff)
                                   + EFF.sync_latency_s + 15 * EFF.sync_call_s)


def test_a_dense_models_loader_walk_is_its_fused_parameters() -> None:
    # Qwen2.5-7B in vLLM: per layer qkv weight and bias, o, gate_up, down and 2 norms; plus
    # embedding, final norm and LM head; no expert mapping
    assert engine_load_entries(MODELS["Qwen2.5-7B"]) == 28 * 7 + 3


def test_one_node_unbucketed_sends_over_one_nvlink() -> None:
    res = _res("Qwen2.5-7B", 1)
    links = sync_links(res, "g", 4, 2, "g", 4, 4, False, FLAT)
    assert links["send"] == shipped_devices()["H20"].intra_link_gbs  # 1 sender, not pp = 2


@pytest.mark.parametrize("eff", [EFF, FLAT], ids=["bucketed", "unbucketed"])
def test_simulator_sync_transfer_is_the_planners(eff: Efficiency) -> None:
    plan = small_plan({"actor": ("h100", 4, "train"), "reference": ("h100", 4, "train"),
                       "rollout": ("h100", 4, "gen"), "reward": ("cpu", 1, "verify"),
                       "environment": ("cpu", 1, "env")})
    res, calib = resolve(job_from_dict(small_job())), Calibration(eff)
    sp = sync_plan(Pricer(res, calib), plan, Network())
    assert sp is not None
    a, r = plan.roles[Role.ACTOR], plan.roles[Role.ROLLOUT]
    actor = Placed(a.slot, Estimate(Role.ACTOR, a.pool, Parallel(tp=a.tp, pp=a.pp), Memory(), {}))
    rollout = Placed(r.slot, Estimate(Role.ROLLOUT, r.pool, Parallel(tp=r.tp, pp=r.pp,
                                                                    dp=r.devices // r.tp),
                                      Memory(), {}))
    assert sp.fixed_s + sp.alone_s == pytest.approx(Pricer(res, calib).sync_time(actor, rollout))
    if eff is FLAT:  # Qwen2.5-7B: 339 tensors, each after the first one loader walk (199)
        assert sp.fixed_s == pytest.approx(eff.sync_latency_s
                                           + 338 * 199 * eff.sync_load_entry_s)
