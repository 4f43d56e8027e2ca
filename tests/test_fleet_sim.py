"""`placer fleet --simulate`: jobs side by side in one simulation. A shared CPU pool slows two
agentic jobs (separate pools do not), a preemption re-plans the borrower on what it keeps (at
the job-level plan's pace there, its lost work and restart counted in its finish and goodput),
a borrower left with nothing its job fits on is suspended and says why, and with nothing shared
each job runs exactly as the single-job simulator runs it alone. The figures are written with
the artists they should have."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from statistics import median
from typing import Any

import pytest
import simpy
import yaml
from figcheck import check_figure
from matplotlib.collections import PolyCollection

from placer.cli import main
from placer.cost.calibration import load_calibration
from placer.fleet.contention import Contention
from placer.fleet.inner import JobPlanner
from placer.fleet.planner import plan_fleet
from placer.fleet.result import FleetResult
from placer.fleet.spec import Fleet, fleet_from_dict, load_fleet
from simulator.api import simulate_plan
from simulator.config import SimConfig
from simulator.fabric import Fabric
from simulator.fleet import simulate_fleet
from simulator.fleetplots import gantt, usage, write_fleet_plots
from simulator.metrics import iteration_durations, steady

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
QUIET = SimConfig.no_variance()


def _agents(jobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Two teams, each with one tiny agentic job (two turns, a tool call between them)."""
    return {
        "name": "agents",
        "cluster": {"pools": [
            {"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": 4},
            {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 2}]},
        "teams": {"a": {"cohort": "lab", "quota": {"gpu": {"nominal": 2}, "cpu": {"nominal": 1}}},
                  "b": {"cohort": "lab", "quota": {"gpu": {"nominal": 2}, "cpu": {"nominal": 1}}}},
        "jobs": jobs or [{"name": "a1", "team": "a", "job": "tiny-agent.yaml"},
                         {"name": "b1", "team": "b", "job": "tiny-agent.yaml"}],
    }


@pytest.fixture(scope="module")
def agents() -> tuple[Fleet, FleetResult]:
    fleet = fleet_from_dict(_agents(), EXAMPLES, "agents")
    return fleet, plan_fleet(fleet, load_calibration(None), workers=1)


def _with(fleet: Fleet, **contention: Any) -> Fleet:
    return dataclasses.replace(fleet, contention=Contention.model_validate(contention))


def test_a_shared_cpu_pool_slows_two_agentic_jobs(agents: tuple[Fleet, FleetResult]) -> None:
    fleet, res = agents
    calib = load_calibration(None)
    apart = simulate_fleet(fleet, res, calib, iterations=3, config=QUIET)
    assert [j.slowdown for j in apart.jobs] == [1.0, 1.0]
    shared = simulate_fleet(_with(fleet, cpu_pools=[{"jobs": ["a1", "b1"]}]), res, calib,
                            iterations=3, config=QUIET)
    assert all((j.slowdown or 0) > 1.1 for j in shared.jobs), [j.slowdown for j in shared.jobs]
    assert [j.alone_s for j in shared.jobs] == [j.alone_s for j in apart.jobs]
    (pool,) = shared.cpu_pools
    assert pool.jobs == ("a1", "b1") and pool.calls > 0 and pool.mean_wait_s > 0
    assert shared.goodput < apart.goodput


def test_same_seed_same_fleet_simulation(agents: tuple[Fleet, FleetResult]) -> None:
    """With the default variance on, a seed fixes every draw of every job's runs."""
    fleet, res = agents
    shared = _with(fleet, cpu_pools=[{"jobs": ["a1", "b1"]}], checkpoint_every=1)
    calib = load_calibration(None)
    runs = [simulate_fleet(shared, res, calib, iterations=2, seed=3).to_dict() for _ in range(2)]
    assert runs[0] == runs[1]


def test_with_nothing_shared_each_job_runs_as_alone() -> None:
    """Three jobs, one of them async, no contention section and no variance: each job's
    iterations in the fleet are the single-job simulator's, to rounding."""
    async_job = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    async_job.update(name="tiny-async", pipeline={"mode": "async", "max_staleness": 1})
    doc = _agents([{"name": "a1", "team": "a", "job": "tiny-agent.yaml"},
                   {"name": "b1", "team": "b", "job": "tiny-cpu.yaml"},
                   {"name": "b2", "team": "b", "job": async_job}])
    doc["cluster"]["pools"][0]["nodes"] = 6
    doc["cluster"]["pools"][1]["nodes"] = 3
    doc["teams"]["b"]["quota"] = {"gpu": {"nominal": 4}, "cpu": {"nominal": 2}}
    fleet = fleet_from_dict(doc, EXAMPLES, "three")
    calib = load_calibration(None)
    res = plan_fleet(fleet, calib, workers=1)
    sim = simulate_fleet(fleet, res, calib, iterations=4, config=QUIET)
    for j, jr in zip(sim.jobs, res.jobs):
        one = simulate_plan(jr.plan, iterations=4, seed=0, config=QUIET)
        alone = median(steady(iteration_durations(one.run, jr.plan.pipeline),
                              jr.plan.pipeline))
        assert j.fleet_s == pytest.approx(alone, rel=1e-9), j.name
        assert j.alone_s == pytest.approx(alone, rel=1e-9), j.name
        assert j.slowdown == pytest.approx(1.0, rel=1e-9) and j.lost_s == 0.0


def test_weight_syncs_share_the_spine_between_pools() -> None:
    """Two jobs whose rollout is pinned to the LPU pool sync their weights from the GPU pool over
    one spine link: slower beside each other than alone (where the spine is theirs alone)."""
    job = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    job["pin"] = {"rollout": {"pool": "lpu"}}
    quota = {"gpu": {"nominal": 1}, "lpu": {"nominal": 1}, "cpu": {"nominal": 1}}
    doc = {"name": "spine", "cluster": {"pools": [
        {"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": 2},
        {"name": "lpu", "device": "emu-lpu", "devices_per_node": 4, "nodes": 2},
        {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 2}]},
        "teams": {"a": {"quota": quota}, "b": {"quota": quota}},
        "jobs": [{"name": "a1", "team": "a", "job": job}, {"name": "b1", "team": "b", "job": job}]}
    fleet = fleet_from_dict(doc, EXAMPLES, "spine")
    calib = load_calibration(None)
    res = plan_fleet(fleet, calib, workers=1)
    assert all(j.plan.roles["rollout"].pool == "lpu" and j.plan.roles["actor"].pool == "gpu"
               for j in res.jobs)
    free = simulate_fleet(fleet, res, calib, iterations=2, config=QUIET)
    narrow = simulate_fleet(_with(fleet, spine_gbs=1e-4), res, calib, iterations=2, config=QUIET)
    assert [j.slowdown for j in free.jobs] == [1.0, 1.0]
    assert all((j.slowdown or 0) > 1.1 for j in narrow.jobs), [j.slowdown for j in narrow.jobs]
    assert all(n.alone_s > f.alone_s for n, f in zip(narrow.jobs, free.jobs))
    assert list(narrow.spine_gb) == ["spine:gpu-lpu"] and narrow.spine_gb["spine:gpu-lpu"] > 0


def _borrower() -> dict[str, Any]:
    """Team b's job borrows three of team a's GPU nodes; team a has no job yet."""
    return {
        "name": "borrow",
        "cluster": {"pools": [
            {"name": "gpu", "device": "emu-gpu", "devices_per_node": 1, "nodes": 4},
            {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 2}]},
        "teams": {"a": {"cohort": "lab", "quota": {"gpu": {"nominal": 3}}},
                  "b": {"cohort": "lab", "quota": {"gpu": {"nominal": 1, "borrowing_limit": 3},
                                                   "cpu": {"nominal": 2}}}},
        "jobs": [{"name": "b1", "team": "b", "job": "tiny-cpu.yaml"}],
        "contention": {"checkpoint_every": 2,
                       "preemptions": [{"at_s": 0.65, "team": "a", "pool": "gpu", "nodes": 2}]},
    }


RESTART = QUIET.model_copy(update={"failures": QUIET.failures.model_copy(
    update={"restart_s": 1.0})})


def test_a_preemption_replans_the_borrower(tmp_path: Path) -> None:
    fleet = fleet_from_dict(_borrower(), EXAMPLES, "borrow")
    calib = load_calibration(None)
    res = plan_fleet(fleet, calib, workers=1)
    assert res.jobs[0].nodes["gpu"] == 4  # it borrows
    n = 6
    sim = simulate_fleet(fleet, res, calib, iterations=n, config=RESTART)
    (job,) = sim.jobs
    assert job.preempted_at_s == 0.65 and job.nodes_after == {"gpu": 2, "cpu": 2}
    assert job.preemptions == 1 and job.suspended is None and job.restart_s == 1.0
    # the re-plan is the job-level planner's on the nodes it kept, and it runs at that plan's pace
    planner = JobPlanner(fleet, calib, 5.0, 0)
    assert planner.time(0, (2, 2)) == pytest.approx(job.replanned_predicted_s, rel=1e-9)
    assert job.replanned_plan is not None
    assert job.replanned_plan.predicted_iteration_s == job.replanned_predicted_s
    assert {r.pool for r in job.replanned_plan.roles.values()} == {"gpu", "cpu"}
    assert sum(sl.devices for sl in job.replanned_plan.slots if sl.pool == "gpu") <= 2
    one = simulate_plan(job.replanned_plan, iterations=2, seed=0, config=RESTART)
    assert job.replanned_s == pytest.approx(
        median(iteration_durations(one.run, job.replanned_plan.pipeline)), rel=1e-9)
    assert job.replanned_s != pytest.approx(job.fleet_s, rel=1e-6)
    # lost work: the first checkpoint (2 iterations) was written at 0.395 s; the third
    # iteration, done by 0.65 s, is thrown away and run again on the re-plan
    assert job.checkpoints == 2 and job.lost_iterations == 1
    assert 0.2 < job.lost_s < 0.65 - 2 * job.fleet_s
    # its finish (and so its goodput) pays exactly for the preemption: against the same fleet
    # with no preemption, the lost work, the restart, and the re-plan's pace over the four
    # iterations run after it
    calm = simulate_fleet(_with(fleet, checkpoint_every=2), res, calib, iterations=n,
                          config=RESTART).jobs[0]
    assert calm.checkpoints == job.checkpoints and calm.preemptions == 0
    assert job.finish_s == pytest.approx(calm.finish_s + job.lost_s + job.restart_s
                                         + (n - 2) * (job.replanned_s - calm.fleet_s), rel=1e-9)
    assert job.goodput == pytest.approx(n * job.alone_s / job.finish_s, rel=1e-12)
    assert job.goodput < calm.goodput and sim.goodput == pytest.approx(job.goodput)
    assert "re-planned on gpu 2, cpu 2" in sim.render() and "1 iteration(s) lost" in sim.render()
    (ev,) = sim.preemptions
    assert ev.taken == {"b1": 2} and ev.free == 0
    after = {(u.team, u.pool): u.used for u in sim.usage_after}
    assert after[("a", "gpu")] == 2 and after[("b", "gpu")] == 2
    paths = write_fleet_plots(sim, tmp_path)
    assert [p.name for p in paths] == ["fleet_gantt.png", "fleet_usage.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    _check_gantt(sim)
    _check_usage(sim)


def _check_gantt(sim: Any) -> None:
    fig = gantt(sim)
    (ax,) = fig.axes
    bars = [c for c in ax.collections if isinstance(c, PolyCollection)]
    labels = {c.get_label() for c in bars}
    assert "b1" in labels and len(bars) == len(sim.spans)  # one bar per node span
    marks = [ln for ln in ax.lines if ln.get_label() == "preemption"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [0.65, 0.65]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu (4 nodes)", "cpu (2 nodes)"]
    # the job's bar: on all 6 nodes, then restarting on the 4 it kept, then running on them
    mine = [s for s in sim.spans if s.holder == "b1"]
    assert sorted((s.start_s, s.restarting) for s in mine) == (
        [(0, False)] * 6 + [(0.65, True)] * 4 + [(1.65, False)] * 4)
    legend = check_figure(fig)
    assert sorted(legend.values()) == ["b1", "preempted job re-planning and restarting on the "
                                       "nodes it kept", "preemption",
                                       "taken back by the lending team"]


def test_a_preempted_job_of_another_jobs_kind_is_replanned() -> None:
    """Two jobs of one document (one kind, planned once per vector): the second, of lower
    weight, loses one of its two GPU nodes and is re-planned as itself on the node it keeps."""
    doc = _borrower()
    doc["cluster"]["pools"][0]["nodes"] = 6
    doc["teams"]["b"]["quota"]["gpu"] = {"nominal": 3, "borrowing_limit": 3}
    doc["jobs"] = [{"name": "b0", "team": "b", "job": "tiny-cpu.yaml", "weight": 2},
                   {"name": "b1", "team": "b", "job": "tiny-cpu.yaml", "weight": 1}]
    doc["contention"]["preemptions"][0]["nodes"] = 1
    fleet = fleet_from_dict(doc, EXAMPLES, "twins")
    calib = load_calibration(None)
    res = plan_fleet(fleet, calib, workers=1)
    assert [j.nodes for j in res.jobs] == [{"gpu": 4, "cpu": 1}, {"gpu": 2, "cpu": 1}]
    sim = simulate_fleet(fleet, res, calib, iterations=6, config=RESTART)
    b0, b1 = sim.jobs
    assert b0.preemptions == 0 and b1.nodes_after == {"gpu": 1, "cpu": 1}
    assert b1.suspended is None and b1.finish_s is not None
    planner = JobPlanner(fleet, calib, 5.0, 0)
    assert planner.kind_of == [0, 0]
    assert b1.replanned_predicted_s == pytest.approx(planner.time(1, (1, 1)), rel=1e-9)


def test_a_borrower_left_with_no_gpu_is_suspended() -> None:
    """Team b borrows every GPU node; team a takes them all back: its job cannot train on the
    CPU nodes it keeps, so it is suspended (and says why), its nodes freed at once; only the
    iterations of its last checkpoint count as useful."""
    doc = _borrower()
    doc["teams"]["a"]["quota"]["gpu"]["nominal"] = 4
    doc["teams"]["b"]["quota"]["gpu"] = {"nominal": 0, "borrowing_limit": 4}
    doc["contention"]["preemptions"][0]["nodes"] = 4
    fleet = fleet_from_dict(doc, EXAMPLES, "borrow-all")
    calib = load_calibration(None)
    res = plan_fleet(fleet, calib, workers=1)
    sim = simulate_fleet(fleet, res, calib, iterations=6, config=RESTART)
    (job,) = sim.jobs
    assert job.nodes_after == {"cpu": 2} and job.finish_s is None and job.goodput == 0.0
    assert job.suspended is not None and job.suspended.startswith(
        "no plan fits the nodes it kept (cpu 2): actor (tiny-llama) cannot run on any pool")
    assert job.suspended_at_s == 0.65 and job.restart_s == 0.0 and job.replanned_plan is None
    assert job.lost_iterations == 1 and job.useful_s == pytest.approx(2 * job.alone_s)
    assert all(s.end_s == 0.65 for s in sim.spans if s.holder == "b1")
    assert "suspended: no plan fits the nodes it kept" in sim.render()
    assert sim.to_dict()["jobs"][0]["suspended"] == job.suspended
    fig = gantt(sim)
    (stop,) = [ln for ln in fig.axes[0].lines if ln.get_label().startswith("suspended")]
    assert list(stop.get_xdata()) == [0.65, 0.65]  # on the two CPU nodes it held
    check_figure(fig)


def _check_usage(sim: Any) -> None:
    fig = usage(sim)
    (ax,) = fig.axes
    assert len(ax.patches) == 2 * len(sim.usage)  # as allocated, and after the preemption
    heights = [round(p.get_height()) for p in ax.patches]
    assert heights[:3] == [0, 4, 2] and heights[3:] == [2, 2, 2]
    assert {ln.get_label() for ln in ax.lines} == {"nominal quota",
                                                   "cap (nominal + borrowing limit)"}
    check_figure(fig)


def test_fabric_shares_a_link_max_min_fairly() -> None:
    env = simpy.Environment()
    fab = Fabric(env, {"spine": 10.0, "own": 4.0})
    ends: dict[str, float] = {}

    def send(name: str, gb: float, path: tuple[str, ...], at: float):  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        yield fab.send(gb, path)
        ends[name] = env.now

    env.process(send("alone", 20.0, ("spine",), 0.0))
    env.process(send("capped", 8.0, ("spine", "own"), 1.0))
    env.run()
    # 0-1 s: alone at 10 GB/s (10 GB left); then capped gets 4 (its own link), alone 6; capped
    # ends at 3 s (8 GB), alone has 10 - 12 < 0: it ended at 1 + 10/6 s
    assert ends["alone"] == pytest.approx(1 + 10 / 6)
    assert ends["capped"] == pytest.approx(1 + 10 / 6 * 4 / 4 + (8 - 4 * 10 / 6) / 4)


def test_cli_simulate_json_and_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _agents()
    doc["contention"] = {"cpu_pools": [{"jobs": ["a1", "b1"]}]}
    path = tmp_path / "agents.yaml"
    for job in doc["jobs"]:
        job["job"] = str(EXAMPLES / job["job"])
    path.write_text(yaml.safe_dump(doc))
    plots = tmp_path / "plots"
    assert main(["fleet", str(path), "--simulate", "--iterations", "2", "--no-variance",
                 "--json", "--plots", str(plots)]) == 0
    out = json.loads(capsys.readouterr().out)
    jobs = out["simulation"]["jobs"]
    assert [j["name"] for j in jobs] == ["a1", "b1"] and all(j["slowdown"] > 1 for j in jobs)
    assert sorted(p.name for p in plots.iterdir()) == ["fleet_gantt.png", "fleet_usage.png"]
    assert main(["fleet", str(path), "--plots", str(plots)]) == 2
    assert "--plots: applies to --simulate only" in capsys.readouterr().err
    assert main(["fleet", str(path), "--simulate", "--iterations", "0"]) == 2
    assert "--iterations: must be 1 to 10000 (got 0)" in capsys.readouterr().err
    doc["contention"] = {"cpu_pools": [{"jobs": ["a1", "zz"]}]}
    path.write_text(yaml.safe_dump(doc))
    assert main(["fleet", str(path), "--simulate"]) == 2
    err = capsys.readouterr().err
    assert "contention.cpu_pools.0.jobs: no job 'zz' in the fleet" in err


@pytest.mark.slow
def test_the_example_fleet_replans_its_preempted_job() -> None:
    """examples/fleets/mixed.yaml: the evaluation team takes back the H100 node of hetero-split,
    which is re-planned on the H20 and CPU nodes it keeps (not suspended) and finishes there."""
    fleet = load_fleet(EXAMPLES / "fleets" / "mixed.yaml")
    calib = load_calibration(None)
    res = plan_fleet(fleet, calib)
    sim = simulate_fleet(fleet, res, calib, iterations=4)
    (ev,) = sim.preemptions
    assert ev.taken == {"hetero-split": 1} and ev.free == 0
    job = next(j for j in sim.jobs if j.name == "hetero-split")
    assert job.suspended is None and job.finish_s is not None
    assert job.nodes_after == {"h20": 1, "cpu": 1} and job.lost_iterations >= 1
    assert job.fleet_s is not None and job.replanned_s is not None
    assert job.replanned_s > job.fleet_s  # fewer, slower nodes
    # its slowdown compares the one iteration it ran on its allocation with the same iteration
    # alone (the same draws), not with the median of all four alone (0.97x, as if faster)
    assert job.alone_matched_s is not None
    assert job.fleet_s / job.alone_s < 0.98 and job.slowdown == pytest.approx(1.0, abs=0.02)
