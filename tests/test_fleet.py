"""`placer fleet`: the allocation model against a brute-force oracle, quotas on a real fleet of
tiny jobs, bad fleet files (exit 2, one line per mistake) and fleets that cannot fit (exit 3)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fleet_oracle import oracle_checked, random_fleet, violations

from placer.base.errors import Infeasible
from placer.cli import main
from placer.cost.calibration import load_calibration
from placer.fleet.alloc import (
    AllocJob,
    AllocProblem,
    TeamQuota,
    allocate,
    fair_shares,
    twins,
)
from placer.fleet.inner import JobPlanner, ladder, levels, thinned
from placer.fleet.planner import plan_fleet
from placer.fleet.spec import fleet_from_dict, load_fleet
from placer.solve.planfile import Plan

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
def test_allocation_agrees_with_brute_force(objective: str) -> None:
    """Random small fleets (seeded): the lazy CP-SAT loop finds the brute-force optimum over the
    same grids, its allocation breaks no quota rule, and it plans fewer vectors than exist."""
    planned = total = 0
    for seed in range(30):
        pr, time_of = random_fleet(seed, objective)
        a = oracle_checked(pr, time_of, seed)
        if a is None:
            continue
        assert a.gap == 0.0 and a.not_monotone == 0, seed
        planned += a.evaluated
        total += sum(len(job.grid) for job in pr.jobs)
    assert 0 < planned < total  # the grids are visited lazily, not swept


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
def test_identical_jobs_agree_with_brute_force(objective: str) -> None:
    """Jobs of one kind share one memo of times and are ordered by symmetry breaking: the
    optimum over every combination is still found, and each kind is planned once per vector."""
    for seed in range(12):
        pr, time_of = random_fleet(seed, objective, twins=True)
        assert twins(pr)
        a = oracle_checked(pr, time_of, seed)
        if a is None:
            continue
        assert pr.known[0] is pr.known[1]  # one kind, one memo
        assert a.evaluated == len(pr.known[0]) + len(pr.known[-1])


def test_fair_shares_keep_the_quotas() -> None:
    """The first incumbent (each job within an equal split of its team's nominal quota) breaks
    no rule the oracle checks, and is found on most random fleets."""
    found = 0
    for seed in range(40):
        pr, _ = random_fleet(seed, "throughput")
        shares = fair_shares(pr)
        if shares is not None:
            found += 1
            assert violations(pr, shares) == [], seed
            assert all(a in job.grid for a, job in zip(shares, pr.jobs))
    assert found >= 10


def test_thinned_grid() -> None:
    assert ladder(640, 4) == [0, 1, 9, 74, 640]
    assert ladder(1, 5) == [0, 1]
    axes = [levels(640), levels(512), [0], levels(3)]
    cut = thinned(axes, 256)
    assert all(max(c) == max(a) and 0 in c and 1 in c for c, a in zip(cut, axes) if len(a) > 1)
    assert len(cut[0]) * len(cut[1]) * len(cut[3]) <= 256 < len(axes[0]) * len(axes[1]) * 3
    assert thinned(axes[2:], 256) == axes[2:]  # small grids are kept whole
    kept = thinned(axes, 256, [80, 64, 0, 3])  # a fair share stays a rung of a thinned axis
    assert 80 in kept[0] and 64 in kept[1] and kept[2] == [0] and kept[3] == axes[3]


def test_levels() -> None:
    assert levels(0) == [0]
    assert levels(6) == [0, 1, 2, 4, 6]
    assert levels(4) == [0, 1, 2, 4]


def _tiny_fleet(**over: object) -> dict:
    """Three tiny jobs of two teams on 4 emulated GPU nodes and 4 CPU nodes."""
    doc = {
        "name": "tiny-fleet",
        "cluster": {"pools": [
            {"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": 4},
            {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 4}]},
        "teams": {
            "a": {"cohort": "lab", "quota": {"gpu": {"nominal": 2}, "cpu": {"nominal": 2}}},
            "b": {"cohort": "lab", "quota": {"gpu": {"nominal": 2, "borrowing_limit": 1},
                                             "cpu": {"nominal": 2}}}},
        "jobs": [
            {"name": "a1", "team": "a", "job": "tiny-cpu.yaml", "weight": 2},
            {"name": "b1", "team": "b", "job": "tiny-cpu.yaml"},
            {"name": "b2", "team": "b", "job": "tiny-agent.yaml"}],
    }
    doc.update(over)
    return doc


def test_quotas_hold_on_a_real_fleet() -> None:
    fleet = fleet_from_dict(_tiny_fleet(), EXAMPLES, "tiny")
    res = plan_fleet(fleet, load_calibration(None), workers=1)
    assert res.optimal
    for u in res.usage:  # every team within its cap; borrowing only past nominal
        assert u.used <= u.cap
    for pool in ("gpu", "cpu"):
        rows = [u for u in res.usage if u.pool == pool]
        assert sum(u.used for u in rows) <= sum(u.nominal for u in rows)
        if any(u.borrowed for u in rows):
            assert all(u.used >= u.nominal for u in rows)
    for j in res.jobs:  # each job's plan uses only the nodes it was given
        used: dict[str, int] = {}
        for r in j.plan.roles.values():
            for part in (r.parts or [r]):
                used[part.pool] = used.get(part.pool, 0) + part.devices
        assert set(used) <= set(j.nodes)
        doc = j.plan.job["cluster"]["pools"]
        assert {p["name"]: p["nodes"] for p in doc} == j.nodes


def test_kinds_planned_once_in_parallel() -> None:
    """Two jobs of one job file are one kind (planned once per vector); a batch of vectors
    planned in worker processes gives the plans a sequential planner gives."""
    fleet = fleet_from_dict(_tiny_fleet(), EXAMPLES, "tiny")
    calib = load_calibration(None)
    par = JobPlanner(fleet, calib, workers=2)
    assert par.kind_of == [0, 0, 2]
    pairs = [(0, (1, 1)), (1, (1, 1)), (2, (2, 1)), (2, (1, 0))]
    try:
        par.prefetch(pairs)
    finally:
        par.close()
    assert len(par.plans) + len(par.why) == 3  # (0, (1, 1)) and (1, (1, 1)): one plan
    seq = JobPlanner(fleet, calib)
    for j, a in pairs:
        assert par.time(j, a) == seq.time(j, a)


def _write(tmp_path: Path, doc: dict) -> str:
    for name in ("tiny-cpu.yaml", "tiny-agent.yaml"):
        (tmp_path / name).write_text((EXAMPLES / name).read_text())
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_bad_fleet_file_one_line_per_mistake(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    doc = _tiny_fleet()
    doc["jobs"][0]["weight"] = -1
    doc["jobs"][1]["colour"] = "red"
    assert main(["fleet", _write(tmp_path, doc)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert "jobs.0.weight" in lines[0] and "-1" in lines[0]
    assert "jobs.1.colour" in lines[1] and "unknown key" in lines[1]


def test_bad_jobs_and_teams_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _tiny_fleet()
    doc["jobs"][0]["team"] = "nobody"
    bad = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    bad["batch"]["prompts"] = 0
    doc["jobs"][1]["job"] = bad
    doc["teams"]["a"]["quota"]["tpu"] = {"nominal": 1}
    doc["teams"]["b"]["quota"]["gpu"]["nominal"] = 3  # 2 + 3 nominal > 4 nodes
    assert main(["fleet", _write(tmp_path, doc)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4, lines
    text = "\n".join(lines)
    assert "jobs.0 (a1): team: no team 'nobody'" in text
    assert "jobs.1 (b1): job: batch.prompts" in text
    assert "teams.a.quota.tpu: no pool 'tpu'" in text
    assert "nominal quotas of pool gpu add to 5" in text


def test_makespan_needs_iterations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", _write(tmp_path, _tiny_fleet(objective="makespan"))]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all("iterations: the makespan objective" in x for x in lines)


def test_infeasible_names_job_and_resource(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    doc = _tiny_fleet()
    doc["teams"]["b"]["quota"]["cpu"]["nominal"] = 1  # b's two jobs need 2 CPU nodes
    assert main(["fleet", _write(tmp_path, doc)]) == 3
    err = capsys.readouterr().err
    assert "pool cpu: team b's jobs need at least 2 nodes (b1 1, b2 1)" in err

    doc = _tiny_fleet()
    doc["teams"]["a"]["quota"] = {"cpu": {"nominal": 2}}  # a1 has no GPU to train on
    with pytest.raises(Infeasible, match="job a1: cannot be placed even on all its team a"):
        plan_fleet(fleet_from_dict(doc, EXAMPLES, "tiny"), load_calibration(None), workers=1)


def test_deadline_missed_names_the_job() -> None:
    doc = _tiny_fleet()
    doc["jobs"][2]["deadline"] = {"iterations": 10**6, "hours": 1}
    with pytest.raises(Infeasible, match="job b2: misses its deadline"):
        plan_fleet(fleet_from_dict(doc, EXAMPLES, "tiny"), load_calibration(None), workers=1)


def test_json_is_one_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet.json"
    assert main(["fleet", _write(tmp_path, _tiny_fleet()), "--json", "-o", str(out),
                 "--workers", "1"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc == json.loads(out.read_text())
    assert doc["optimal"] and doc["gap"] == 0.0 and len(doc["jobs"]) == 3
    assert "fleet: round 1:" in captured.err  # progress on stderr, not stdout
    Plan.model_validate(doc["jobs"][0]["plan"])  # each job's plan as `placer simulate` reads it


def test_the_example_fleet_loads() -> None:
    fleet = load_fleet(EXAMPLES / "fleets" / "mixed.yaml")
    assert len(fleet.jobs) == 6 and len(fleet.teams) == 4
    assert {p.name for p in fleet.cluster.pools} == {"h100", "h20", "l40s", "cpu"}
    assert all(j.job.cluster == fleet.cluster for j in fleet.jobs)


@pytest.mark.slow
def test_the_example_fleet_plans() -> None:
    # each job plan proves its optimum in well under a second alone; the generous job limit
    # keeps a busy machine from stopping one early, which the fleet's gap would then (rightly)
    # carry and `optimal` refuse
    res = plan_fleet(load_fleet(EXAMPLES / "fleets" / "mixed.yaml"), load_calibration(None),
                     job_time_limit_s=60.0)
    assert res.optimal and res.plans_priced < res.grid_size
    for u in res.usage:
        assert u.used <= u.cap


def test_a_cluster_mistake_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    """Every job is validated on the fleet's cluster; a bad device there is said once."""
    doc = _tiny_fleet()
    doc["cluster"]["pools"][0]["device"] = "emu-gpx"
    doc["jobs"][2]["job"] = "missing.yaml"
    assert main(["fleet", _write(tmp_path, doc)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert "cluster.pools.0.device: unknown device type 'emu-gpx'" in lines[0]
    assert "jobs.2 (b2): job: " in lines[1] and "missing.yaml" in lines[1]


def test_a_broken_bound_is_reported() -> None:
    """A job faster on fewer nodes breaks the bound the lazy search relies on: counted, and the
    allocation is then not called optimal."""
    times = {(1,): 10.0, (2,): 20.0}
    pr = AllocProblem(("p",), (2,), {"t": TeamQuota("t", None, (2,), (2,))},
                      [AllocJob("j", "t", 1.0, 1, ((1,), (2,)))], "throughput",
                      lambda j, a: times[a])
    pr.evaluate(0, (2,))
    pr.evaluate(0, (1,))
    assert pr.not_monotone == 1
    a = allocate(pr, workers=1)
    assert a.vectors == [(1,)] and not a.optimal


def test_makespan_is_the_last_job_to_finish() -> None:
    doc = _tiny_fleet(objective="makespan")
    for job, n in zip(doc["jobs"], (1000, 500, 200)):
        job["iterations"] = n
    res = plan_fleet(fleet_from_dict(doc, EXAMPLES, "tiny"), load_calibration(None), workers=1)
    finish = [j.iterations * j.iteration_s for j in res.jobs if j.iterations is not None]
    assert res.optimal and res.value == pytest.approx(max(finish))
