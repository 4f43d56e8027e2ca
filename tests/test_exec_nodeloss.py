"""Node loss and node join on a multi-node local Ray cluster (ray.cluster_utils): the executor
notices, re-plans on the alive nodes (warm-started from the running plan), rebuilds placement
groups and actors, restores the trainer from its last checkpoint and finishes every step with a
balanced ledger; a node that joins later is used from the next step boundary.

Cluster (`executors.localcluster`): a head with no resources, two 1-GPU nodes (the trainer's two
data-parallel ranks, one per node) and one 2-core CPU node (rollout, reward, environment), all on
loopback. Ray's health check runs every second here (default 3 s x 5 misses), so that a killed
node is declared dead in seconds.

  boundary before step 2   a GPU node is removed without warning (its raylet and workers are
                           killed): node 0, trainer rank 0's, in the default test, so that the
                           new plan's GPU node 0 is not an alive node's key (the rebuilt group is
                           placed by pool); node 1 in the slow test. Step 2's training fails, Ray
                           declares the node dead, the loop re-plans on 1 GPU node (trainer DP 1),
                           rebuilds the GPU slot, keeps the CPU slot's actors, and resumes at
                           step 2 from the step-1 checkpoint;
  boundary before step 4   (slow test only) a second CPU node joins; the loop re-plans on it,
                           rebuilds (the rollout/reward/environment slot now spans both CPU
                           nodes) and continues from a checkpoint of the step before, losing none.
The default test covers node loss (one cluster, one short run); the join run doubles the
rebuild cost, so it is `slow` (excluded by `make test-fast`).

A split rollout (tests/test_exec_split.py's plan: part 0 on an emulated 2-chip LPU node, part 1
on a second GPU pool) loses its LPU node before step 1: the re-plan joins the rollout on the
GPU pool left, the split slot's engines are rebuilt (none is reused by its old rank), the
trainer's unchanged slot keeps its actors, and every rebuilt engine gets the weights in its own
device's buckets and generates the step's samples. This run is `slow` too: each of its parts
runs by default elsewhere -- node loss, re-plan, rebuild and kept actors in the default test
above, the split plan on a multi-node Ray in tests/test_exec_split.py, and the rebuilt run
config (no stale parts) and per-device buckets in that file's tests without Ray.
"""
from __future__ import annotations

import math

import pytest
from exec_util import hand_plan, job_dict
from test_exec_split import split_plan

from executors.localcluster import Change, run_with_changes
from executors.roles import accumulation
from executors.runplan import resolve_plan
from executors.weights import bucket_bytes
from placer.cost.sharding import Parallel
from traces.schema import read_trace

pytestmark = pytest.mark.ray
STEPS = 5
LOSE_AT, JOIN_AT = 2, 4
POOLS = [{"name": "gpu", "device": "emu-gpu", "devices_per_node": 1, "nodes": 2},
         {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 2, "nodes": 1}]
LAYOUT = {"actor": ("gpu", Parallel(dp=2), "train"),
          "reference": ("gpu", Parallel(dp=1), "train"),
          "rollout": ("cpu", Parallel(dp=2), "cpu"),
          "reward": ("cpu", Parallel(), "cpu"),
          "environment": ("cpu", Parallel(dp=2), "cpu")}


def run_elastic(out, join: bool, lose: int):
    plan = hand_plan(LAYOUT, job_dict(cluster={"pools": POOLS}))
    changes = [Change(LOSE_AT, "lose", "gpu", lose)]
    if join:
        changes.append(Change(JOIN_AT, "join", "cpu", 1))
    run = run_with_changes(plan, STEPS if join else JOIN_AT, out, changes, note=print,
                           checkpoint_every=1)
    for row in run.recovery_rows():
        print(f"{row['change']}: noticed after {row['noticed_s']:.1f} s, recovered in "
              f"{row['recovery_s']:.1f} s (re-plan {row['replan_s']:.2f} s, placement groups "
              f"{row['groups_s']:.2f} s, actors {row['actors_s']:.1f} s); moves: "
              f"{row['moves']}; kept: {row['kept']}")
    return run.result, {"lost" if ch.kind == "lose" else "joined": t
                        for ch, t in run.changed_at.items()}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_elastic(tmp_path_factory.mktemp("nodeloss"), join=False, lose=0)


@pytest.fixture(scope="module")
def joined(tmp_path_factory):
    return run_elastic(tmp_path_factory.mktemp("nodejoin"), join=True, lose=1)


def test_run_finishes_with_balanced_ledger(result) -> None:
    r, _ = result
    assert [s.step for s in r.stats] == list(range(JOIN_AT))
    assert r.ledger_ok, r.ledger_problems
    assert [s.versions for s in r.stats] == [[s] for s in range(JOIN_AT)]


def test_node_loss_replans_and_resumes_from_checkpoint(result) -> None:
    r, events = result
    lost = r.recoveries[0]
    # Usually step 2's training fails on the lost rank; on a loaded machine the rank's process
    # can outlive its raylet long enough to finish step 2, and the loss is seen at step 3's
    # boundary instead (Ray has declared the node dead by then): both are recoveries.
    step = lost["step"]
    assert step in (LOSE_AT, LOSE_AT + 1) and lost["nodes"]["gpu"] == 1
    assert lost["resumed_from"] == step - 1 and lost["policy_version"] == step
    assert any(m.startswith("actor: gpu tp1 pp1 dp2 -> gpu tp1 pp1 dp1") for m in lost["moves"])
    assert lost["recovery_s"] > 0 and lost["detected_at"] >= events["lost"]
    assert r.ledger.rolled_back in ([step], [])  # a failed step ran again, once
    ev = [e for e in r.trace.of("restart") if e.name == "restart cluster"]
    assert [e.args["step"] for e in ev] == [step]
    # the policy version never goes back past the checkpoint: trainer updates continue from it
    train = sorted((e.ts_s, e.args["policy_version"]) for e in r.trace.of("train")
                   if e.name == "train actor" and e.tid == "actor0")
    versions = [v for _, v in train]
    assert versions == sorted(versions) and versions[-1] == JOIN_AT


def test_node_loss_keeps_the_actors_of_unchanged_slots(result) -> None:
    """Only the GPU slot changed (trainer DP 2 -> 1): the CPU slot's rollout, reward and
    environment actors keep running in their processes; the trainer's slot is rebuilt."""
    r, _ = result
    lost = r.recoveries[0]
    assert lost["kept"] == ["environment0", "reward0", "rollout0", "rollout1"]

    # split by the restart's time, not by step: a lost rank's process can outlive its raylet
    # long enough to train the step that then fails and runs again on the rebuilt slot
    restart = next(e for e in r.trace.of("restart") if e.name == "restart cluster")

    def pids(cat: str, tid: str, before: bool) -> set[int]:
        return {e.args["os_pid"] for e in r.trace.of(cat) if e.tid == tid
                and (e.end_s <= restart.ts_s if before else e.ts_s >= restart.end_s)}
    for tid in ("rollout0", "rollout1"):
        assert pids("generate", tid, True) == pids("generate", tid, False)  # the same process
        assert len(pids("generate", tid, True)) == 1
    assert pids("train", "actor0", True).isdisjoint(pids("train", "actor0", False))


def test_surviving_node_without_the_new_plans_key_is_used_unpinned(result) -> None:
    """GPU node 0 died, node 1 lives: the new plan's GPU node is number 0, whose key no alive
    node advertises, so the rebuilt groups are placed by pool only (and the run says so); the
    trainer now runs on the node that survived."""
    r, _ = result
    lost = r.recoveries[0]
    assert "node pinning off: surviving nodes do not carry the new plan's keys" in lost["moves"]
    gpu = [row for row in r.placement if row["pool"] == "gpu"]
    assert {row["role"] for row in gpu} == {"actor", "reference"}
    assert all(row["in_bundle"] for row in r.placement)
    assert len({row["ray_node"] for row in gpu}) == 1


def test_trace_round_trips(result, tmp_path) -> None:
    r, _ = result
    r.trace.write(tmp_path / "trace.json")
    ev = [e for e in read_trace(tmp_path / "trace.json").of("restart") if e.name == "restart cluster"]
    assert [e.args["nodes"] for e in ev] == [rec["nodes"] for rec in r.recoveries]


@pytest.mark.slow
def test_joined_node_is_used(joined) -> None:
    r, _ = joined
    assert [s.step for s in r.stats] == list(range(STEPS)) and r.ledger_ok, r.ledger_problems
    assert [s.versions for s in r.stats] == [[s] for s in range(STEPS)]
    joined = r.recoveries[1]
    assert joined["nodes"] == {"gpu": 1, "cpu": 2}
    assert joined["resumed_from"] == JOIN_AT - 1  # nothing rolled back on a join
    assert {row["node"] for row in r.placement if row["pool"] == "cpu"} == {0, 1}
    assert all(row["on_plan_node"] and row["in_bundle"] for row in r.placement)
    # the CPU slot grew and was rebuilt; the GPU slot did not change: its actors were kept
    assert joined["kept"] == ["actor0", "reference0"]


# ------------------------------------------------------------------ node loss with a split rollout
SPLIT_LOSE_AT = 1


@pytest.fixture(scope="module")
def lost(tmp_path_factory):
    """The split plan on its multi-node Ray; the LPU node (part 0's two engines) dies before
    step 1: the loop re-plans on the alive nodes (the planner joins the rollout on the GPU
    pool that is left) and rebuilds."""
    plan = split_plan()
    run = run_with_changes(plan, SPLIT_LOSE_AT + 1, tmp_path_factory.mktemp("split-loss"),
                           [Change(SPLIT_LOSE_AT, "lose", "lpu", 0)], checkpoint_every=1)
    return plan, run.result


def _pids(result, cat: str, tid: str, before: bool, step: int) -> set[int]:
    return {e.args["os_pid"] for e in result.trace.of(cat)
            if e.tid == tid and (e.args["step"] < step) == before}


@pytest.mark.slow  # its parts run by default: see the module docstring
def test_node_loss_under_a_split_rollout_replans_and_finishes(lost) -> None:
    plan, r = lost
    assert [s.step for s in r.stats] == [0, 1] and r.ledger_ok, r.ledger_problems
    (rec,) = r.recoveries
    assert rec["nodes"]["lpu"] == 0 and rec["resumed_from"] == rec["step"] - 1
    assert any(m.startswith("rollout: lpu tp1 pp1 dp2 + gpu2 tp1 pp1 dp1 -> ")
               for m in rec["moves"]), rec["moves"]
    # every actor of the rebuilt world is where the new plan puts it; none on the lost node
    assert all(row["in_bundle"] for row in r.placement) and r.placement
    assert "lpu" not in {row["pool"] for row in r.placement}
    gens = r.trace.of("generate")
    before = {e.pid.split(":")[0] for e in gens if e.args["step"] < rec["step"]}
    assert before == {"lpu", "gpu2"}  # both parts generated before the loss
    engines = {f"rollout{row['rank']}": row["pool"] for row in r.placement
               if row["role"] == "rollout"}
    (restart,) = [e for e in r.trace.of("restart") if e.name == "restart cluster"]
    rebuilt = [e for e in r.trace.events if e.ts_s >= restart.ts_s]  # the failed try's are older
    gens = [e for e in rebuilt if e.cat == "generate"]
    for step in range(rec["step"], SPLIT_LOSE_AT + 1):  # after it: the new plan's engines, all samples
        mine = [e for e in gens if e.args["step"] == step]
        assert {e.tid for e in mine} <= set(engines)
        assert all(e.pid.split(":")[0] == engines[e.tid] for e in mine)
        assert sum(len(e.args["sample_ids"]) for e in mine) == plan.spec.batch.samples
        syncs = [e for e in rebuilt if e.name == "weight sync" and e.args["step"] == step]
        assert {e.tid for e in syncs} == set(engines)  # every rebuilt engine got the weights
        assert all(e.args["calls"] == math.ceil(e.args["bytes"] / size) for e in syncs
                   if (size := bucket_bytes(resolve_plan(plan), engines[e.tid])) > 0)


@pytest.mark.slow  # as above; kept actors: test_node_loss_keeps_the_actors_of_unchanged_slots
def test_kept_actors_keep_their_processes_and_split_engines_are_rebuilt(lost) -> None:
    """Actors are reused by (role, rank) only from slots the new plan keeps: the split slot
    changed, so no rollout engine is reused (rank 2 on gpu2 is another engine now). The
    trainer's slot changed in its micro-batch only (the hand plan leaves it to the trainer;
    the re-plan chooses 8): its actor is kept, answers from the process it had, and runs the
    new micro-batch (the executed layout after the rebuild says so)."""
    plan, r = lost
    (rec,) = r.recoveries
    assert "actor: gpu tp1 pp1 dp1 -> gpu tp1 pp1 dp1 mbs8" in rec["moves"], rec["moves"]
    assert {"actor0", "environment0", "reward0"} <= set(rec["kept"]), rec["kept"]
    assert not any(k.startswith("rollout") for k in rec["kept"]), rec["kept"]
    assert _pids(r, "train", "actor0", True, rec["step"]) == \
        _pids(r, "train", "actor0", False, rec["step"])
    batch = plan.spec.batch
    assert r.trace.metadata["executed_layout"]["actor"]["micro_batches"] == \
        accumulation(batch.samples, batch.mini_batches, 1, 8)
    old = {p for k in range(3) for p in _pids(r, "generate", f"rollout{k}", True, rec["step"])}
    new = {p for k in range(3) for p in _pids(r, "generate", f"rollout{k}", False, rec["step"])}
    assert old and new and old.isdisjoint(new)
