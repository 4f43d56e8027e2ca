"""The fleet's job plans at scale: one pricing memo shared by every job and allocation
(`placer.fleet.workers`) gives the plans a fresh pricer gives, in this process or in the
kind-affine worker processes, and each (kind, vector) is computed once."""
from __future__ import annotations

from pathlib import Path

from placer.cost.calibration import load_calibration
from placer.fleet.inner import JobPlanner, plan_on
from placer.fleet.spec import fleet_from_dict
from placer.fleet.workers import KindWorkers, Pricers
from placer.solve.planfile import Plan

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def two_kind_fleet() -> dict:
    """Two tiny job kinds on 4 emulated GPU nodes and 4 CPU nodes, one team, the first kind
    twice (tests/test_fleet_reuse.py uses it too)."""
    return {
        "name": "memo-fleet",
        "cluster": {"pools": [
            {"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": 4},
            {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 4}]},
        "teams": {"a": {"quota": {"gpu": {"nominal": 4}, "cpu": {"nominal": 4}}}},
        "jobs": [{"name": "c1", "team": "a", "job": "tiny-cpu.yaml"},
                 {"name": "c2", "team": "a", "job": "tiny-cpu.yaml"},
                 {"name": "g1", "team": "a", "job": "tiny-agent.yaml"}]}


VECTORS = [(4, 4), (2, 1), (1, 2), (4, 0), (0, 4), (1, 1)]


def _same(a: object, b: object) -> bool:
    if not isinstance(a, Plan) or not isinstance(b, Plan):
        return a == b
    return (a.predicted_iteration_s == b.predicted_iteration_s
            and a.model_dump(include={"roles"}) == b.model_dump(include={"roles"}))


def test_one_memo_gives_the_fresh_plans() -> None:
    """One memo reused by two jobs on allocation after allocation (growing) plans each as a
    fresh pricer does: it is keyed by value, never by the cluster or the job."""
    fleet = fleet_from_dict(two_kind_fleet(), EXAMPLES, "memo")
    calib = load_calibration(None)
    memo = Pricers(calib)
    for j in (0, 2):
        job = fleet.jobs[j].job
        for a in VECTORS:
            nodes = dict(zip(("gpu", "cpu"), a))
            assert _same(plan_on(job, nodes, calib, 5.0, 0, memo),
                         plan_on(job, nodes, calib, 5.0, 0)), (j, a)
    assert memo.terms  # the memo was used


def test_kind_workers_plan_as_here() -> None:
    """A batch dealt to two workers (each kind to the one that priced it first, idle ones
    taking queued tasks) returns, in order, what planning here returns; each (kind, vector) of
    the planner is computed once however often it is asked for."""
    fleet = fleet_from_dict(two_kind_fleet(), EXAMPLES, "memo")
    calib = load_calibration(None)
    here = JobPlanner(fleet, calib)
    tasks = [("plan", k, dict(zip(("gpu", "cpu"), a))) for a in VECTORS for k in (0, 2)]
    tasks.append(("least", 2, {"gpu": 4, "cpu": 4}))
    pool = KindWorkers(here.priced, calib, 5.0, 0, 2)
    try:
        got = pool.run(tasks) + pool.run(tasks[:3])  # a second batch: the same workers
    finally:
        pool.close()
    assert pool.home == {0: 0, 2: 1}
    assert here._run(tasks[-1:]) == [got[len(tasks) - 1]]
    for t, g in zip(tasks[:-1] + tasks[:3], got[:len(tasks) - 1] + got[len(tasks):]):
        assert _same(g, here._run([t])[0]), t
    par = JobPlanner(fleet, calib, workers=2)
    try:
        par.prefetch([(j, a) for a in VECTORS for j in range(3)])
        computed = par.computed
        times = [par.time(j, a) for a in VECTORS for j in range(3)]
    finally:
        par.close()
    assert computed == par.computed == 2 * len(VECTORS)  # c1 and c2: one kind
    assert times == [here.time(j, a) for a in VECTORS for j in range(3)]


def test_split_parts_shared_across_allocations_give_the_fresh_plans() -> None:
    """The split rollout's part estimates kept on the shared memo (`StepTerms.part`, keyed by
    the job's value, pool, layout and samples) are found again by the plans of the job on other
    allocations and by a renamed copy of the job, and every plan is the one a fresh pricer gives."""
    cluster = {"pools": [
        {"name": "h100", "device": "H100-SXM", "devices_per_node": 8, "nodes": 2},
        {"name": "h20", "device": "H20", "devices_per_node": 8, "nodes": 1},
        {"name": "l40s", "device": "L40S", "devices_per_node": 8, "nodes": 2},
        {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}]}
    doc = {"name": "split-fleet", "cluster": cluster,  # hetero-split.yaml's own
           "teams": {"a": {"quota": {"h100": {"nominal": 2}, "h20": {"nominal": 1},
                                     "l40s": {"nominal": 2}, "cpu": {"nominal": 1}}}},
           "jobs": [{"name": "s1", "team": "a", "job": "hetero-split.yaml"},
                    {"name": "s2", "team": "a", "job": "hetero-split.yaml"}]}
    fleet = fleet_from_dict(doc, EXAMPLES, "split")
    calib = load_calibration(None)
    memo = Pricers(calib)
    pools = ("h100", "h20", "l40s", "cpu")
    splits = 0
    for j, a in [(0, (2, 1, 2, 1)), (0, (1, 1, 2, 1)), (1, (2, 1, 1, 1))]:
        nodes = dict(zip(pools, a))
        before = sum(len(st.parts) for st in memo.terms.values())
        shared = plan_on(fleet.jobs[j].job, nodes, calib, 5.0, 0, memo)
        assert _same(shared, plan_on(fleet.jobs[j].job, nodes, calib, 5.0, 0)), (j, a)
        assert isinstance(shared, Plan)
        splits += any(r.parts for r in shared.roles.values())
        if before:  # a later allocation, or the renamed copy: the earlier parts were reused
            assert sum(len(st.parts) for st in memo.terms.values()) - before < before
    assert splits  # some plan split its rollout, so the memo's parts were in play
