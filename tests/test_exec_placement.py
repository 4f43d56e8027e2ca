"""Plan to Ray on a multi-node cluster (ray.cluster_utils) whose nodes advertise GPU, LPU and
CPU pool resources: every role actor lands on the node and in the bundle the plan says.

The job has two 1-GPU nodes (the trainer's two data-parallel ranks must go one per node), one
4-chip LPU node (two rollout replicas packed in one bundle) and two CPU nodes (environment
workers spread one per node).

The Ray run here is `slow` (its own five-node cluster and nine actors, no step): its paths run by
default in tests/test_exec_split.py (the same `ray.cluster_utils` cluster joined by
`cluster.start`, node-keyed placement groups, `RayRuntime`, `placement.verify` and `check`: every
rollout engine on its plan node and bundle, one Ray node per pool) and tests/test_exec_nodeloss.py
(the trainer's two data-parallel ranks on two 1-GPU nodes, every actor in its bundle). The
slots' strategies and the misplacement report are checked here without Ray, by default.
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


def _run():
    return resolve_plan(hand_plan(LAYOUT, job_dict(cluster={"pools": POOLS})))


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    import ray  # lazy: Ray (~1 s) loads when a Ray test runs, not at collection
    from ray.cluster_utils import Cluster  # lazy: as above

    run = _run()
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


@pytest.mark.slow  # see the module docstring: tests/test_exec_split.py runs these paths
def test_every_actor_on_its_plan_node_and_bundle(placed) -> None:
    plan, info, _, rows = placed
    assert info.pinned
    assert len(rows) == 2 + 1 + 2 + 1 + 2  # actor x2, reference, rollout x2, reward, env x2
    assert all(r["on_plan_node"] and r["in_bundle"] for r in rows), rows
    pl.check(rows, info.pinned)


@pytest.mark.slow  # as above; two trainer ranks on two nodes: tests/test_exec_nodeloss.py
def test_dp_ranks_and_environments_on_distinct_nodes(placed) -> None:
    _, _, _, rows = placed

    def by(role: str) -> list[dict]:
        return [r for r in rows if r["role"] == role]

    assert {r["node"] for r in by("actor")} == {0, 1}
    assert len({r["ray_node"] for r in by("actor")}) == 2
    assert len({r["ray_node"] for r in by("environment")}) == 2
    assert len({(r["ray_node"], r["bundle"]) for r in by("rollout")}) == 1  # one LPU bundle


STRATEGIES = {"gen": "STRICT_PACK", "env": "SPREAD", "train": "PACK"}


def test_slot_strategies_follow_the_plan() -> None:
    assert {name: s.strategy for name, s in _run().slots.items()} == STRATEGIES


@pytest.mark.slow  # as above: every Ray run makes its groups with these strategies
def test_strategies_follow_the_plan(placed) -> None:
    run, _, groups, _ = placed
    assert {name: s.strategy for name, s in run.slots.items()} == STRATEGIES
    import ray  # lazy: as in `placed`
    made = {name: ray.util.placement_group_table(pg)["strategy"] for name, pg in groups.items()}
    assert made == STRATEGIES  # the groups Ray made are the run plan's


@pytest.mark.slow  # as above; emulated pools named: tests/test_exec_grpo.py, test_execute_cli.py
def test_emulated_pools_are_named(placed) -> None:
    _, info, _, _ = placed
    assert set(info.emulated) == {"gpu", "lpu"}
    assert "emulated" in info.describe()


def test_misplacement_is_reported() -> None:
    row = {"role": "actor", "rank": 1, "pool": "gpu", "node": 1, "bundle": 3,
           "on_plan_node": False, "in_bundle": True}
    with pytest.raises(pl.PlacementError, match="actor\\[1\\] is not on gpu:1"):
        pl.check([row], pinned=True)
