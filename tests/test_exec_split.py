"""A rollout split over two pools, executed: each part's engines on its own pool, each part
generating its share of every step's samples (the plan contract's dispatch rule).

The tiny GRPO job runs on a multi-node Ray (`ray.cluster_utils`: one Ray node per plan node, each
advertising only its pool's resources and its node key, as a real heterogeneous cluster does):
trainer and reference on an emulated GPU, the reward and the sandbox on the CPU node, and the
rollout split over an emulated 2-chip LPU node (part 0: 2 engines, 20 of the 32 samples) and a
second emulated-GPU pool (part 1: 1 engine, 12 samples), as `placer.cost.split.join` builds a split
estimate. Two steps. Cheap checks of the dealing rule, the rank layout and the refusals (exit 2)
run without Ray.
"""
from __future__ import annotations

import math

import pytest
import yaml
from exec_util import GRPO_LAYOUT, ROOT, VirtualRuntime, hand_plan, job_dict, spread_lengths

from executors import cluster
from executors import placement as pl
from executors.backends import backend_of
from executors.context import LoopConfig
from executors.loop import Loop
from executors.roles import run_config
from executors.run import check_layouts, execute
from executors.runplan import EngineGroup, resolve_plan
from executors.runtime import worker_spec
from executors.vllm_rollout import engine_args
from executors.weights import bucket_bytes
from placer.base.errors import SpecError
from placer.cost.calibration import calibration_from_dict
from placer.cost.sharding import Parallel
from placer.cost.split import deal
from placer.solve.planfile import save_plan
from traces.schema import Trace

POOLS = [{"name": "gpu", "device": "emu-gpu", "devices_per_node": 1, "nodes": 1},
         {"name": "lpu", "device": "emu-lpu", "devices_per_node": 2, "nodes": 1},
         {"name": "gpu2", "device": "emu-gpu", "devices_per_node": 2, "nodes": 1},
         {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 1}]
LAYOUT = {**GRPO_LAYOUT, "actor": ("gpu", Parallel(dp=1), "train")}
PARTS = [("lpu", Parallel(dp=2), 20), ("gpu2", Parallel(dp=1), 12)]  # 32 = 8 prompts x 4
STEPS = 2


def split_plan(parts=PARTS):
    return hand_plan(LAYOUT, job_dict(cluster={"pools": POOLS}), split=("gen", parts))


# ------------------------------------------------------------------ without Ray
def test_deal_follows_the_plan_contract() -> None:
    assert deal(32, [20, 12]) == [20, 12]  # the planned batch: the plan's own counts
    assert deal(36, [20, 12]) == [23, 13]  # 4 extra: 2.5 / 1.5, the tie to the first part
    assert deal(8, [20, 12]) == [5, 3]  # fewer (a carried remainder): all by the shares
    assert deal(7, [32]) == [7]


def test_engines_take_ranks_part_by_part() -> None:
    run = resolve_plan(split_plan())
    rows = [m for m in pl.assign(run.seats) if m.role == "rollout"]
    assert [(m.rank, m.part, m.bundle.pool) for m in rows] == [
        (0, 0, "lpu"), (1, 0, "lpu"), (2, 1, "gpu2")]
    assert [m.sharers for m in rows] == [2, 2, 1]  # two engines share the 2-chip LPU bundle
    assert all(f"pool_{m.bundle.pool}" in m.bundle.resources for m in rows)
    # node 0 of two pools is two machines: the split slot's group must not be STRICT_PACK
    assert run.slots["gen"].strategy == "PACK"


def test_a_part_layout_the_backend_cannot_run_exits_2(tmp_path) -> None:
    from placer.cli import main  # lazy: the CLI's imports, for this test only
    plan = split_plan([("lpu", Parallel(dp=2), 20), ("gpu2", Parallel(tp=2), 12)])
    run = resolve_plan(plan)
    check_layouts(run, backend_of("torch"))  # the torch engine holds its 2 TP shards
    check_layouts(run, backend_of("vllm"))  # vLLM splits tiny-llama's heads over 2
    # ... and each engine gets its own part's tensor parallelism and memory share
    cfg = run_config(run, model_dir="/m")
    members = pl.assign(run.seats)
    specs = [worker_spec(m, cfg, run.roles["rollout"], backend_of("vllm"), members)
             for m in members if m.role == "rollout"]
    assert [cls.__name__ for cls, _ in specs] == ["VllmRollout"] * 3
    tps = [engine_args(args[0], args[1])["tensor_parallel_size"] for _, args in specs]
    assert tps == [1, 1, 2]
    fractions = [specs[k][1][0].engines.mem_fraction for k in (0, 2)]
    assert fractions == [p.memory_gb / d for p, d in zip(plan.roles["rollout"].parts, (0.23, 16))]
    staged = split_plan([("lpu", Parallel(dp=2), 20), ("gpu2", Parallel(pp=2), 12)])
    with pytest.raises(SpecError, match=r"plan\.roles\.rollout\.parts\.1 \(pool gpu2\): "
                                        r"layout dp1 tp1 pp2: the torch rollout backend"):
        check_layouts(resolve_plan(staged), backend_of("torch"))
    save_plan(staged, tmp_path / "plan.json")
    assert main(["execute", str(tmp_path / "plan.json"), "--steps", "1",
                 "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run" / "model-v0").exists()  # refused before anything started


def test_parts_that_do_not_match_the_bundles_exit_2() -> None:
    plan = split_plan()
    r = plan.roles["rollout"]
    moved = [r.parts[0], r.parts[1].model_copy(update={"pool": "lpu"})]
    bad = plan.model_copy(update={"roles": {**plan.roles,
                                            "rollout": r.model_copy(update={"parts": moved})}})
    with pytest.raises(SpecError, match=r"roles\.rollout\.parts\.1: 1 device\(s\) of pool lpu"):
        execute(bad, 1, "/nonexistent/never-written")


def test_a_trajectory_stays_on_its_part_over_turns(tmp_path) -> None:
    """Two turns and over-provisioning (36 trajectories for 32 samples), every rank an
    in-process worker: round 0 deals the 4 extra by the parts' shares (23 / 13), and each
    trajectory's later turns run on the part that started it."""
    env = yaml.safe_load((ROOT / "examples" / "tiny-agent.yaml").read_text())["environment"]
    plan = hand_plan(LAYOUT, job_dict(cluster={"pools": POOLS}, environment=env,
                                      tail_policy={"kind": "overprovision", "fraction": 0.125}),
                     split=("gen", PARTS))
    spread_lengths(plan, tmp_path)
    run = resolve_plan(plan)
    cfg = run_config(run, model_dir=str(tmp_path / "model-v0"))
    loop = Loop(run, VirtualRuntime(run, cfg, {}), cfg, LoopConfig(steps=1, out_dir=tmp_path),
                Trace())
    loop.sync_weights(0)
    loop.collect_rollout(loop.launch_rollout(0))
    gens = loop.trace.of("generate")
    first = {p: sum(len(e.args["sample_ids"]) for e in gens
                    if e.args["round"] == 0 and e.args["part"] == p) for p in (0, 1)}
    assert first == {0: 23, 1: 13} == dict(enumerate(deal(36, [20, 12])))
    parts: dict[str, set[int]] = {}
    for e in gens:
        for sid in e.args["sample_ids"]:
            parts.setdefault(sid, set()).add(e.args["part"])
    assert max(e.args["round"] for e in gens) >= 1 and all(len(p) == 1 for p in parts.values())


def test_each_part_syncs_in_its_own_devices_buckets(tmp_path) -> None:
    """The parts' device types take different bucket sizes here (emu-lpu 10 kB, emu-gpu 40 kB):
    each engine's refresh is cut in its own device's buckets, as `timing.sync_time` prices each
    part, and every engine still receives the whole model."""
    plan = split_plan()
    plan = plan.model_copy(update={"calibration": calibration_from_dict({
        "default": {"sync_bucket_gb": 1e-5}, "devices": {"emu-gpu": {"sync_bucket_gb": 4e-5}}})})
    run = resolve_plan(plan)
    sizes = {q.pool: bucket_bytes(run, q.pool) for q in plan.roles["rollout"].parts}
    assert sizes == {"lpu": 10_000, "gpu2": 40_000}
    spread_lengths(plan, tmp_path)
    cfg = run_config(run, model_dir=str(tmp_path / "model-v0"))
    loop = Loop(run, VirtualRuntime(run, cfg, {}), cfg, LoopConfig(steps=1, out_dir=tmp_path),
                Trace())
    loop.sync_weights(0)
    syncs = [e for e in loop.trace.events if e.name == "weight sync"]
    assert sorted(e.tid for e in syncs) == ["rollout0", "rollout1", "rollout2"]
    nbytes = syncs[0].args["bytes"]
    for e in syncs:
        pool = e.args["dst"].split(":")[0]
        assert e.args["bytes"] == nbytes and e.args["calls"] == math.ceil(nbytes / sizes[pool])
    assert len({e.args["calls"] for e in syncs}) == 2


def test_a_rebuilt_run_config_takes_the_new_plans_engines() -> None:
    """A re-plan may join a split rollout (or split a joined one): the rebuilt actors' config is
    the new plan's -- no stale parts, each engine's TP and memory share from the new plan."""
    split = split_plan()
    joined = hand_plan({**LAYOUT, "rollout": ("gpu2", Parallel(dp=2), "gen")},
                       job_dict(cluster={"pools": POOLS}))
    for old, new in ((resolve_plan(split), resolve_plan(joined)),
                     (resolve_plan(joined), resolve_plan(split))):
        cfg = run_config(old, model_dir="/m").for_run(new)
        assert cfg == run_config(new, model_dir="/m")
        assert cfg.engines == new.roles["rollout"].engines[0]
    # the joined rollout is one engine group of both replicas, each engine tp 1 on gpu2
    assert resolve_plan(joined).roles["rollout"].engines == (
        EngineGroup("gpu2", 0, 2, 1, joined.roles["rollout"].memory_gb / 16),)


# ------------------------------------------------------------------ on a multi-node Ray
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import ray  # lazy: Ray (~1 s) loads when a Ray test runs, not at collection
    from ray.cluster_utils import Cluster  # lazy: as above

    plan = split_plan()
    if ray.is_initialized():
        ray.shutdown()
    cluster.ensure_token_auth()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for (_pool, _node), res in sorted(cluster.node_resources(resolve_plan(plan)).items()):
            res = dict(res)
            c.add_node(num_cpus=int(res.pop("CPU", 0)), num_gpus=int(res.pop("GPU", 0)),
                       resources=res)
        ray.init(address=c.address)
        c.wait_for_nodes()
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n.get("Alive")}
        result = execute(plan, STEPS, tmp_path_factory.mktemp("split"))
        yield plan, result, nodes
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.mark.ray
def test_every_engine_runs_on_its_parts_pool(run) -> None:
    plan, result, nodes = run
    rows = [r for r in result.placement if r["role"] == "rollout"]
    assert [(r["rank"], r["part"], r["pool"]) for r in rows] == [
        (0, 0, "lpu"), (1, 0, "lpu"), (2, 1, "gpu2")]
    assert all(r["on_plan_node"] and r["in_bundle"] for r in rows), rows
    for r in rows:  # the Ray node it runs on is its pool's machine, and no other pool's
        have = nodes[r["ray_node"]]
        assert have.get(cluster.node_key(r["pool"], r["node"])) and f"pool_{r['pool']}" in have
        assert not any(k.startswith("pool_") and k != f"pool_{r['pool']}" for k in have)
    assert len({r["ray_node"] for r in rows}) == 2


@pytest.mark.ray
def test_each_part_generates_its_share(run) -> None:
    plan, result, _ = run
    assert result.ledger_ok, result.ledger_problems
    trace: Trace = result.trace
    gens = [e for e in trace.events if e.cat == "generate"]
    want = {p.pool: p.samples for p in plan.roles["rollout"].parts}
    for step in range(STEPS):
        got: dict[str, int] = {}
        for e in (e for e in gens if e.args["step"] == step):
            assert e.args["pool"] == e.pid.split(":")[0] == e.args["devices"][0].split(":")[0]
            assert e.args["part"] == (0 if e.args["pool"] == "lpu" else 1)
            got[e.args["pool"]] = got.get(e.args["pool"], 0) + len(e.args["sample_ids"])
        assert got == want == {"lpu": 20, "gpu2": 12}
    # both engines of part 0 worked (round-robin inside a part, contiguous chunks)
    assert {e.tid for e in gens if e.args["part"] == 0} == {"rollout0", "rollout1"}


@pytest.mark.ray
def test_weights_reach_every_engine_of_every_part(run) -> None:
    _, result, _ = run
    syncs = [e for e in result.trace.events if e.name == "weight sync"]
    for step in range(STEPS):
        assert {(e.tid, e.args["part"]) for e in syncs if e.args["step"] == step} == {
            ("rollout0", 0), ("rollout1", 0), ("rollout2", 1)}


@pytest.mark.ray
def test_executed_layout_lists_the_parts(run) -> None:
    _, result, _ = run
    assert result.trace.metadata["executed_layout"]["rollout"] == {"parts": [
        {"pool": "lpu", "dp": 2, "tp": 1, "pp": 1}, {"pool": "gpu2", "dp": 1, "tp": 1, "pp": 1}]}
    assert len(result.stats) == STEPS

