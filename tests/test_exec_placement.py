"""Plan to Ray on a multi-node cluster (ray.cluster_utils) whose nodes advertise GPU, LPU and
CPU pool resources: every role actor lands on the node and in the bundle the plan says.

The job has two 1-GPU nodes (the trainer's two data-parallel ranks must go one per node), one
4-chip LPU node (two rollout replicas packed in one bundle) and two CPU nodes (environment
workers spread one per node).
"""
from __future__ import annotations

import pytest
from exec_util import hand_plan, job_dict

from executors import cluster
from executors import placement as pl
from executors.roles import run_config
from executors.run import prepare_model
from executors.runplan import resolve_plan
from executors.runtime import RayRuntime
from placer.cost.sharding import Parallel

pytestmark = pytest.mark.ray

LAYOUT = {"actor": ("gpu", Parallel(dp=2), "train"),
          "reference": ("gpu", Parallel(dp=1), "train"),
          "rollout": ("lpu", Parallel(dp=2), "gen"),
          "reward": ("cpu", Parallel(dp=2), "env"),
          "environment": ("cpu", Parallel(dp=2), "env")}
POOLS = [{"name": "gpu", "device": "emu-gpu", "devices_per_node": 1, "nodes": 2},
         {"name": "lpu", "device": "emu-lpu", "devices_per_node": 4, "nodes": 1},
         {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 2}]


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    import ray  # lazy: Ray (~1 s) loads when a Ray test runs, not at collection
    from ray.cluster_utils import Cluster  # lazy: as above

    run = resolve_plan(hand_plan(LAYOUT, job_dict(cluster={"pools": POOLS})))
    if ray.is_initialized():
        ray.shutdown()
    cluster.ensure_token_auth()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for (_pool, _node), res in sorted(cluster.node_resources(run).items()):
        res = dict(res)
        c.add_node(num_cpus=int(res.pop("CPU", 0)), num_gpus=int(res.pop("GPU", 0)), resources=res)
    ray.init(address=c.address)
    c.wait_for_nodes()
    info = cluster.start(run)  # joins the running cluster
    groups = pl.create_groups(run, info.pinned)
    cfg = run_config(run, model_dir=prepare_model(run.job, tmp_path_factory.mktemp("placement")))
    rt = RayRuntime(run, cfg, groups, info.pinned)
    rows = pl.verify(rt.members, groups)
    yield run, info, groups, rows
    rt.close()
    ray.shutdown()
    c.shutdown()


def test_every_actor_on_its_plan_node_and_bundle(placed) -> None:
    plan, info, _, rows = placed
    assert info.pinned
    assert len(rows) == 2 + 1 + 2 + 1 + 2  # actor x2, reference, rollout x2, reward, env x2
    assert all(r["on_plan_node"] and r["in_bundle"] for r in rows), rows
    pl.check(rows, info.pinned)


def test_dp_ranks_and_environments_on_distinct_nodes(placed) -> None:
    _, _, _, rows = placed

    def by(role: str) -> list[dict]:
        return [r for r in rows if r["role"] == role]

    assert {r["node"] for r in by("actor")} == {0, 1}
    assert len({r["ray_node"] for r in by("actor")}) == 2
    assert len({r["ray_node"] for r in by("environment")}) == 2
    assert len({(r["ray_node"], r["bundle"]) for r in by("rollout")}) == 1  # one LPU bundle


def test_strategies_follow_the_plan(placed) -> None:
    run, _, groups, _ = placed
    want = {"gen": "STRICT_PACK", "env": "SPREAD", "train": "PACK"}
    assert {name: s.strategy for name, s in run.slots.items()} == want
    import ray  # lazy: as in `placed`
    made = {name: ray.util.placement_group_table(pg)["strategy"] for name, pg in groups.items()}
    assert made == want  # the groups Ray made are the run plan's


def test_emulated_pools_are_named(placed) -> None:
    _, info, _, _ = placed
    assert set(info.emulated) == {"gpu", "lpu"}
    assert "emulated" in info.describe()


def test_misplacement_is_reported() -> None:
    row = {"role": "actor", "rank": 1, "pool": "gpu", "node": 1, "bundle": 3,
           "on_plan_node": False, "in_bundle": True}
    with pytest.raises(pl.PlacementError, match="actor\\[1\\] is not on gpu:1"):
        pl.check([row], pinned=True)
