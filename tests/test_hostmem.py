"""Host memory (offloaded optimizer state, parked colocated state, pinned buffers, Ray's object
store) checked per node, and checkpoint size and time from the model's state."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from placer.base.errors import Infeasible
from placer.cli import main
from placer.commands import goodput
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.solve import hostmem
from placer.solve.explain import explain
from placer.solve.planfile import load_plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve, shipped_models
from placer.spec.load import job_from_dict, load_job

ROOT = Path(__file__).resolve().parent.parent


def ppo70b(host_gb: float | None = None, nodes: int = 1) -> dict:
    pool = {"name": "a100", "device": "A100-80G", "devices_per_node": 8, "nodes": nodes}
    if host_gb is not None:
        pool["host_memory_gb"] = host_gb
    return {"name": "ppo-70b", "algorithm": "ppo",
            "models": {"policy": "Llama-3-70B", "reward": "rule"},
            "batch": {"prompts": 64, "samples_per_prompt": 1, "mini_batches": 1},
            "lengths": {"prompt": {"kind": "fixed", "value": 512},
                        "response": {"kind": "fixed", "value": 512}},
            "pipeline": {"mode": "sync"}, "objective": "time",
            "cluster": {"pools": [pool, {"name": "cpu", "device": "cpu-node",
                                         "devices_per_node": 1, "nodes": 1}]}}


def test_offloaded_optimizer_is_sixteen_bytes_per_param_sharded():
    """A host-stepped optimizer holds, per parameter of its shard, the fp32 parameter, Adam's two
    fp32 moments and the pinned fp32 gradient buffer its step copies into: 16 B (radixark/
    Megatron-LM @235952df607b3820716e5e67728a5ab470ca33ae megatron/core/optimizer/
    cpu_offloading/hybrid_optimizer.py `_set_sub_optimizer_grads`, 109-111, allocates the
    pinned `cpu_copy_map_grad` buffer once per parameter and keeps it). Was 12 B (the
    optimizer's state alone) before the buffer was read; the figures below moved by 16 / 12."""
    m = shipped_models()["Llama-3-70B"]
    per = hostmem.offloaded_gb_per_device(m, Parallel(tp=2, pp=1, dp=4, offload=True))
    assert per == pytest.approx(16 * m.params() / 2 / 4 / 1e9)
    assert hostmem.offloaded_gb_per_device(m, Parallel(tp=2, dp=4)) == 0.0
    # actor and critic of a 70B PPO, both offloaded on one node: ~2.26 TB (70.6 G x 16 B x 2)
    assert 2 * 8 * per == pytest.approx(2258, rel=0.01)


def test_offloaded_optimizer_is_sharded_over_dp_and_cp_not_tp_pp_replica():
    """ZeRO shards the optimizer over dp x cp ranks (`sharding.train_state_bytes`); tp and pp
    split the weights themselves; cp is part of `Parallel.replica` yet still shards the state."""
    m = shipped_models()["Llama-3-70B"]
    base = hostmem.offloaded_gb_per_device(m, Parallel(tp=2, dp=2, offload=True))
    with_cp = hostmem.offloaded_gb_per_device(m, Parallel(tp=2, dp=2, cp=2, offload=True))
    assert with_cp == pytest.approx(base / 2)
    assert with_cp == pytest.approx(16 * m.params() / (2 * 2 * 2) / 1e9)


def test_ppo_70b_on_one_a100_node_is_infeasible_below_its_offloaded_optimizers(tmp_path, capsys):
    """Actor and critic need their optimizer offloaded (16 B/param over 8 A100 is 141 GB a
    device), 2 x 1,129 GB on the node whatever the layout (16 B a parameter on the host: state
    and pinned gradient buffer); 2,200 GB of RAM cannot hold that."""
    job = tmp_path / "ppo70b.yaml"
    job.write_text(json.dumps(ppo70b(host_gb=2200)))
    assert main(["plan", str(job)]) == 3
    err = capsys.readouterr().err
    assert "host memory" in err and "actor (Llama-3-70B)" in err and "critic" in err
    assert "(optimizer 2,258, pinned 16, object store 200) of 2,200 GB" in err


def test_ppo_70b_on_one_a100_node_fits_host_memory_apart():
    """With 2,600 GB the node holds both offloaded optimizers, 2,474 GB in all, when actor and
    critic take 4 devices each and do not switch (colocated, their switching slot would park
    one's weights beside both optimizers: over the node's RAM). The catalog's 2,048 GB (DGX
    A100) held the 12 B count's 1,909 GB; the 16 B one (pinned gradient buffer) does not fit it."""
    res = resolve(job_from_dict(ppo70b(host_gb=2600)))
    px = Pricer(res, Calibration())
    plan = plan_job(px, time_limit_s=10)
    assert plan.roles["actor"].offload and plan.roles["critic"].offload
    assert plan.roles["actor"].slot != plan.roles["critic"].slot
    (node,) = [n for n in hostmem.plan_nodes(plan, px) if n.pool == "a100"]
    assert node.capacity_gb == 2600  # the pool's host RAM
    assert node.parts["optimizer"] == pytest.approx(2258, rel=0.01) and not node.parts["parked"]
    assert node.total_gb == pytest.approx(2474, rel=0.01)


def test_host_memory_from_the_pool_overrides_the_catalog():
    big = resolve(job_from_dict(ppo70b(host_gb=8000)))
    assert hostmem.host_capacity_gb(big, big.cluster.pool("a100")) == 8000
    assert hostmem.host_capacity_gb(big, big.cluster.pool("cpu")) is None  # CPU nodes: unchecked
    plan = plan_job(Pricer(big, Calibration()), time_limit_s=10)
    assert plan.roles["actor"].offload and plan.roles["critic"].offload  # 16 B/param > 80 GB
    nodes = hostmem.plan_nodes(plan, Pricer(big, Calibration()))
    assert nodes and not any(n.over for n in nodes)
    node = nodes[0]
    assert node.parts["optimizer"] == pytest.approx(2258, rel=0.01)
    assert node.parts["object_store"] == 200.0  # Ray: 30% of RAM, at most 200 GB
    ex = explain(plan, Pricer(big, Calibration()), time_limit_s=1)
    assert ex.host_memory["a100"].parts_gb["optimizer"] == pytest.approx(2258, rel=0.01)
    assert ex.roles["actor"].host_optimizer_gb > 100


def test_a_candidate_over_its_node_alone_is_refused():
    res = resolve(job_from_dict(ppo70b(host_gb=1200)))  # < 1,129 GB optimizer + 200 object store
    with pytest.raises(Infeasible, match="do not fit host memory: without optimizer offload"):
        plan_job(Pricer(res, Calibration()), time_limit_s=5)
    from placer.solve.candidates import all_candidates
    kept, refused = hostmem.refuse_candidates(res, all_candidates(Pricer(res, Calibration())))
    assert not kept["actor"] and refused["actor"].over
    assert refused["actor"].parts["optimizer"] > 1100


def test_examples_fit_host_memory():
    for name in ("grpo-qwen7b-h100", "ppo-llama8b-hetero"):
        res = resolve(load_job(ROOT / "examples" / f"{name}.yaml"))
        plan = plan_job(Pricer(res, Calibration()), time_limit_s=5)
        assert not hostmem.over_nodes(plan, Pricer(res, Calibration()))


def test_checkpoint_size_and_time_from_the_model_state():
    grpo = resolve(load_job(ROOT / "examples" / "grpo-qwen7b-h100.yaml"))
    m = grpo.model_of("actor")
    assert hostmem.checkpoint_gb(grpo) == pytest.approx(14 * m.params() / 1e9)
    assert hostmem.checkpoint_s(grpo) == pytest.approx(hostmem.checkpoint_gb(grpo) / 5.0)
    ppo = resolve(job_from_dict(ppo70b()))  # actor and critic: twice the state
    assert hostmem.checkpoint_gb(ppo) == pytest.approx(2 * 14 * 70.6, rel=0.01)
    fast = ppo70b()
    fast["cluster"]["storage_gbs"] = 50
    assert hostmem.checkpoint_s(resolve(job_from_dict(fast))) == pytest.approx(
        hostmem.checkpoint_s(ppo) / 10)


def test_goodput_uses_the_derived_checkpoint_cost(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", str(ROOT / "examples" / "tiny-cpu.yaml"), "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["goodput", str(plan), "--steps", "200", "--trials", "5", "--iterations", "2",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    res = resolve(load_job(ROOT / "examples" / "tiny-cpu.yaml"))
    # the plan's priced checkpoint: the write of its bytes (every rank writes its own shards, so
    # the dp-sharded actor gathers nothing) plus the calibration's fixed cost, 0 by default
    assert doc["checkpoint_s"] == pytest.approx(hostmem.plan_checkpoint_s(load_plan(plan)))
    assert doc["checkpoint_s"] == pytest.approx(hostmem.checkpoint_s(res))
    assert doc["checkpoint"]["source"] == goodput.PRICED
    assert main(["goodput", str(plan), "--steps", "200", "--trials", "5", "--iterations", "2",
                 "--checkpoint-cost", "30", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_s"] == 30


def test_a_plan_over_host_memory_is_re_solved_without_offload():
    from placer.solve.planner import _host_checked, build_problem

    big = resolve(job_from_dict(ppo70b(host_gb=8000)))
    plan = plan_job(Pricer(big, Calibration()), time_limit_s=10)
    assert _host_checked(build_problem(Pricer(big, Calibration())), plan) is None  # it fits: kept
    # the same plan against the catalog's 2,048 GB: its offloading roles lose offload, which
    # leaves them nothing (a 70B actor needs 16 B/param / 8 = 141 GB per A100 without it)
    small = resolve(job_from_dict(ppo70b()))
    problem = build_problem(Pricer(big, Calibration()))
    problem = dataclasses.replace(problem, px=problem.px.with_res(small))
    with pytest.raises(Infeasible, match="actor .* and critic .* do not fit host memory"):
        _host_checked(problem, plan)
    cands = hostmem.without_offload(problem.cands, {"actor"})
    assert cands["actor"] == [c for c in problem.cands["actor"] if not c.est.par.offload] == []
    assert cands["critic"] == problem.cands["critic"]  # other roles keep theirs
