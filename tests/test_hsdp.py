"""Hybrid sharded data parallelism (HSDP, `Parallel.shard`; verl's `fsdp_size`, FSDP2's 2-D
(replicate, shard) mesh): state sharded over the shard group, the gathers on its links and the
shards' all-reduce across the groups, checked against hand-computed values; candidates, pins, the
plan file and its checks."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from placer.base.errors import SpecError
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.layercomm import fsdp_calls, fsdp_units, grad_sync_time, hsdp_all_reduce, zero3_gathers
from placer.cost.model import train_memory, train_time
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel, train_state_bytes
from placer.solve.candidates import role_candidates
from placer.solve.layouts import hsdp_layouts
from placer.solve.moves import dims
from placer.solve.planfile import Plan, load_plan, save_plan
from placer.solve.planner import plan_job
from placer.solve.render import render_plan
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.hardware import Pool
from placer.spec.load import job_from_dict, load_job

ROOT = Path(__file__).resolve().parent.parent
M, D = shipped_models(), shipped_devices()
Q7, H20 = M["Qwen2.5-7B"], D["H20"]
EFF = Efficiency()
NV_BW = H20.intra_link_gbs * 1e9 * EFF.link_eff  # achieved bytes/s on NVLink
NIC_BW = H20.nic_gbs * 1e9 * EFF.link_eff  # and on the node's NIC


def test_shard_group_holds_the_state_not_all_of_dp() -> None:
    p = Q7.params()
    assert train_state_bytes(Q7, Parallel(dp=16)) == pytest.approx((2 * p / 16, 2 * p / 16,
                                                                     12 * p / 16))
    assert train_state_bytes(Q7, Parallel(dp=16, shard=8)) == pytest.approx((2 * p / 8, 2 * p / 8,
                                                                             12 * p / 8))
    # ZeRO-1 inside the group: only the optimizer state is split, over the group's 8 ranks
    assert train_state_bytes(Q7, Parallel(dp=16, zero=1, shard=8)) == pytest.approx(
        (2 * p, 2 * p, 12 * p / 8))
    hsdp = train_memory(Q7, Parallel(dp=16, shard=8), 16384)
    zero3 = train_memory(Q7, Parallel(dp=16), 16384)
    assert hsdp.total - zero3.total == pytest.approx(16 * p * (1 / 8 - 1 / 16) / 1e9)


def test_one_node_shard_group_gathers_on_nvlink_and_all_reduces_over_the_nic() -> None:
    b = 2 * Q7.params()  # BF16 bytes of the weights one device gathers
    base, nv, net = EFF.coll_base_s, EFF.nvlink_hop_s, EFF.net_hop_s
    units = fsdp_units(Q7)  # one call per FSDP unit, each its share of the bytes
    fwd_bwd, fwd = fsdp_calls(Q7, 3), fsdp_calls(Q7, 1)
    # ZeRO-3 over 16 ranks on two nodes: gather, gather, reduce-scatter over the NIC (ring)
    zero3 = fwd_bwd * (base + 15 * net + 15 / 16 * b / units / NIC_BW)
    assert zero3_gathers(Q7, H20, Parallel(dp=16), 16384, 3, EFF) == pytest.approx(zero3)
    # HSDP, shard 8: the calls inside one node on NVLink, then each rank's 1/8 gradient shard
    # all-reduced with its twin on the other node (ring over 2: base + 2 hops + B/bw)
    call = base + 7 * nv + 7 / 8 * b / units / NV_BW
    cross = base + 2 * net + (b / 8) / NIC_BW
    par = Parallel(dp=16, shard=8)
    assert hsdp_all_reduce(Q7, H20, par, EFF) == pytest.approx(cross)
    assert zero3_gathers(Q7, H20, par, 16384, 3, EFF) == pytest.approx(fwd_bwd * call + cross)
    # a forward pass reduces no gradients
    assert zero3_gathers(Q7, H20, par, 16384, 1, EFF) == pytest.approx(fwd * call)
    # two micro-batches pay it twice
    assert zero3_gathers(Q7, H20, par, 2 * 16384, 3, EFF) == pytest.approx(
        2 * (fwd_bwd * call + cross))
    assert fwd_bwd * call + cross < zero3 / 5  # the point of HSDP on a 7B model across nodes


def test_step_gradient_sync_runs_inside_the_group_and_crosses_once_below_zero3() -> None:
    b = 2 * Q7.params()
    base, nv, net = EFF.coll_base_s, EFF.nvlink_hop_s, EFF.net_hop_s
    in_group = base + 2 * 7 * nv + 2 * 7 / 8 * b / NV_BW  # ring all-reduce over 8 on NVLink
    assert grad_sync_time(Q7, H20, Parallel(dp=16, shard=8), EFF) == pytest.approx(in_group)
    # ZeRO-1 accumulates locally and crosses the groups once a step
    cross = base + 2 * net + (b / 8) / NIC_BW
    assert grad_sync_time(Q7, H20, Parallel(dp=16, zero=1, shard=8), EFF) == pytest.approx(
        in_group + cross)
    over_nic = base + 2 * 15 * net + 2 * 15 / 16 * b / NIC_BW
    assert grad_sync_time(Q7, H20, Parallel(dp=16), EFF) == pytest.approx(over_nic)


@pytest.mark.parametrize("shard", [0, 16, 32])
def test_a_shard_group_of_all_of_dp_is_plain_zero(shard: int) -> None:
    par = Parallel(dp=16, shard=shard)
    assert not par.hsdp and par.shard_dp == 16 and par.zero_group == 16
    assert train_time(Q7, H20, par, 1e6, 2048, 4, EFF) == train_time(Q7, H20, Parallel(dp=16),
                                                                     1e6, 2048, 4, EFF)
    assert train_memory(Q7, par, 16384) == train_memory(Q7, Parallel(dp=16), 16384)


def test_hsdp_trains_faster_across_nodes_than_zero3_over_the_nic() -> None:
    hsdp = train_time(Q7, H20, Parallel(dp=16, shard=8), 4e6, 2048, 4, EFF)
    assert hsdp < train_time(Q7, H20, Parallel(dp=16), 4e6, 2048, 4, EFF)


def _pool(nodes: int = 2) -> Pool:
    return Pool(name="g", device="H20", devices_per_node=8, nodes=nodes)


def test_candidates_add_only_the_one_node_shard_group_where_dp_spans_nodes() -> None:
    pars = [Parallel(dp=16), Parallel(tp=2, dp=8), Parallel(dp=8), Parallel(dp=12),
            Parallel(tp=8, dp=2), Parallel(dp=16, zero=1)]
    out = hsdp_layouts(pars, _pool())
    assert out == [Parallel(dp=16, shard=8), Parallel(tp=2, dp=8, shard=4),
                   Parallel(tp=8, dp=2, shard=1)]
    # a pinned size is tried besides it, wherever it divides dp
    assert hsdp_layouts([Parallel(dp=8), Parallel(dp=16)], _pool(), pinned=2) == [
        Parallel(dp=8, shard=2), Parallel(dp=16, shard=2), Parallel(dp=16, shard=8)]


def _job(pin: dict | None = None) -> dict:
    doc = load_job(ROOT / "examples" / "grpo-qwen7b-h100.yaml").model_dump(mode="json",
                                                                           exclude_none=True)
    if pin is not None:
        doc["pin"] = pin
    return doc


def test_a_pinned_shard_keeps_every_actor_candidate_to_it() -> None:
    res = resolve(job_from_dict(_job({"actor": {"shard": 2}})))
    pool = res.cluster.pools[0]
    cands = role_candidates(Pricer(res, Calibration()), "actor", pool)
    assert cands and all(c.est.par.shard_dp == 2 for c in cands)


def test_a_pinned_shard_that_does_not_divide_the_pinned_dp_is_refused() -> None:
    with pytest.raises(SpecError, match=r"pin\.actor.*shard 3 does not divide dp 8"):
        job_from_dict(_job({"actor": {"dp": 8, "shard": 3}}))


@pytest.fixture(scope="module")
def plan() -> Plan:
    res = resolve(load_job(ROOT / "examples" / "grpo-qwen7b-h100.yaml"))
    p = plan_job(Pricer(res, Calibration()), time_limit_s=10)
    assert p.roles["actor"].shard == 8, "the example's actor is expected to take HSDP"
    return p


def test_plan_file_round_trip_carries_the_shard(plan: Plan, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    doc = json.loads(path.read_text())
    assert doc["roles"]["actor"]["shard"] == 8
    assert "shard" not in doc["roles"]["rollout"]  # omitted where unset: old files unchanged
    back = load_plan(path)
    assert back.roles["actor"].shard == 8 and back.roles["actor"].par == plan.roles["actor"].par
    assert back.roles["actor"].par.hsdp
    assert "dp 16 (shard 8)" in render_plan(back)
    assert "dp16 shard8" in dims(back.roles["actor"])  # before the micro-batch, if chosen


def test_old_plans_load_without_shard() -> None:
    old = load_plan(ROOT / "traces" / "golden" / "tiny-cpu.plan.json")
    assert all(r.shard == 0 and not r.par.hsdp for r in old.roles.values())
    assert '"shard"' not in old.model_dump_json()


@pytest.mark.parametrize(("role", "shard", "message"), [
    ("actor", 3, "roles.actor.shard: 3 does not divide dp 16"),
    ("rollout", 2, "roles.rollout.shard: 2, but only a training role"),
])
def test_bad_shard_in_a_plan_file_is_one_spec_error(plan: Plan, tmp_path: Path, role: str,
                                                    shard: int, message: str) -> None:
    doc = json.loads(plan.model_dump_json())
    doc["roles"][role]["shard"] = shard
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        load_plan(path)


def test_cli_exits_2_on_a_bad_shard(plan: Plan, tmp_path: Path, placer_cmd: list[str]) -> None:
    doc = json.loads(plan.model_dump_json())
    doc["roles"]["actor"]["shard"] = 5
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    out = subprocess.run([*placer_cmd, "simulate", str(path)], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "roles.actor.shard: 5" in out.stderr and "Traceback" not in out.stderr


def test_verl_export_sets_fsdp_size_to_the_shard_group(plan: Plan) -> None:
    from placer.interop.verl import export_verl  # lazy: the exporters load on use
    launch = export_verl(plan).files["launch.sh"]
    assert "actor_rollout_ref.actor.fsdp_config.fsdp_size=8" in launch
