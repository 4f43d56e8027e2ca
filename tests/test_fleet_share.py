"""A CPU environment pool shared by a fleet's jobs (`shared.cpu_pools`): the allocation against the
brute-force oracle with a shared pool, sharing that frees CPU nodes for another job and wins, the
cost sharing puts on each member (its queueing at the combined demand), and bad `shared` input."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fleet_oracle import oracle_checked, random_fleet, violations

from placer.base.errors import Infeasible
from placer.cli import main
from placer.cost.calibration import load_calibration
from placer.fleet.inner import JobPlanner
from placer.fleet.planner import plan_fleet
from placer.fleet.result import FleetResult
from placer.fleet.sharing import shared_job, tool_demand
from placer.fleet.spec import fleet_from_dict
from simulator.config import SimConfig
from simulator.fleet import simulate_fleet

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
def test_shared_pool_agrees_with_brute_force(objective: str) -> None:
    """Random small fleets (seeded) whose first two jobs share pool p1: the lazy CP-SAT loop
    finds the oracle's optimum, where the oracle counts the shared nodes once and requires the
    members to hold one count of them, and its allocation breaks no rule."""
    solved = 0
    for seed in range(24):
        pr, time_of = random_fleet(seed, objective, shared=True)
        a = oracle_checked(pr, time_of, seed)
        if a is None:
            continue
        assert a.vectors[0][1] == a.vectors[1][1], seed
        solved += 1
    assert solved >= 12


def test_oracle_counts_a_shared_pool_once() -> None:
    """The oracle's own rules: members holding different counts break `shared`; the shared
    count is charged once against the pool's capacity."""
    pr, _ = random_fleet(0, "throughput", shared=True)
    n = pr.nodes[1]
    rest = [(0, 0)] * (len(pr.jobs) - 2)
    assert "shared p1" in violations(pr, [(1, n), (1, n - 1), *rest])
    assert not any(v.startswith("capacity p1") for v in violations(pr, [(1, n), (1, n), *rest]))


def test_share_of_the_cores() -> None:
    """A member is priced with its share of the cores: its cpu_per_call grows by the combined
    demand over its own (two equal jobs: doubled); a job without tool calls is unchanged."""
    agent = fleet_from_dict(_fleet(3), EXAMPLES, "t").jobs[0].job
    assert tool_demand(agent) == 32 * agent.environment.cpu_per_call
    assert shared_job(agent, [agent]).environment.cpu_per_call == 2 * agent.environment.cpu_per_call
    single = agent.model_copy(update={"environment": agent.environment.model_copy(
        update={"turns": 1})})
    assert shared_job(single, [agent]) is single


def _fleet(cpu: int, share: bool = True) -> dict:
    """Three agentic tiny jobs of one team on 3 GPU nodes and `cpu` CPU nodes; x and y may
    share one CPU pool."""
    doc: dict = {
        "name": "share",
        "cluster": {"pools": [
            {"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": 3},
            {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": cpu}]},
        "teams": {"a": {"quota": {"gpu": {"nominal": 3}, "cpu": {"nominal": cpu}}}},
        "jobs": [{"name": n, "team": "a", "job": "tiny-agent.yaml"} for n in ("x", "y", "z")],
    }
    if share:
        doc["shared"] = {"cpu_pools": [{"pool": "cpu", "jobs": ["x", "y"]}]}
    return doc


@pytest.fixture(scope="module")
def shared3() -> FleetResult:
    return plan_fleet(fleet_from_dict(_fleet(3), EXAMPLES, "t"), load_calibration(None),
                      workers=1)


def test_sharing_frees_cpu_nodes_and_wins(shared3: FleetResult) -> None:
    """On 2 CPU nodes three agentic jobs cannot each have one; x and y sharing one leaves the
    other for z. On 3 the pair shares 2 nodes and z takes the third: every call of the pair
    finds as many cores as alone on one node and the pooled waves round better, so the fleet's
    throughput beats each job on its own node."""
    calib = load_calibration(None)
    with pytest.raises(Infeasible):
        plan_fleet(fleet_from_dict(_fleet(2, share=False), EXAMPLES, "t"), calib, workers=1)
    tight = plan_fleet(fleet_from_dict(_fleet(2), EXAMPLES, "t"), calib, workers=1)
    assert {j.name: j.nodes["cpu"] for j in tight.jobs} == {"x": 1, "y": 1, "z": 1}
    assert sum(u.used for u in tight.usage if u.pool == "cpu") == 2
    alone = plan_fleet(fleet_from_dict(_fleet(3, share=False), EXAMPLES, "t"), calib, workers=1)
    assert shared3.optimal and alone.optimal
    assert shared3.value > alone.value
    assert [(s.pool, s.jobs) for s in shared3.shared] == [("cpu", ["x", "y"])]
    cpu_used = sum(u.used for u in shared3.usage if u.pool == "cpu")
    assert cpu_used == shared3.shared[0].nodes + shared3.jobs[2].nodes.get("cpu", 0) <= 3


def test_sharing_reports_its_cost(shared3: FleetResult) -> None:
    """The combined demand queues each member's calls: on the same nodes it is slower shared
    than with the pool to itself, and the result says by how much (JSON and table)."""
    s = shared3.shared[0]
    for name, t, alone in zip(s.jobs, s.iteration_s, s.alone_iteration_s):
        assert alone is not None and t > alone, name
    doc = shared3.to_dict()
    assert doc["shared"][0]["jobs"] == ["x", "y"]
    x = next(j for j in doc["jobs"] if j["name"] == "x")
    assert x["shared_pool"] == "cpu" and x["alone_iteration_s"] < x["iteration_s"]
    assert next(j for j in doc["jobs"] if j["name"] == "z")["shared_pool"] is None
    assert "shared cpu x" in shared3.render() and "(alone " in shared3.render()


def test_members_are_their_own_kind() -> None:
    """x and y (priced shared) are one kind; z, the same job file unshared, another."""
    planner = JobPlanner(fleet_from_dict(_fleet(3), EXAMPLES, "t"), load_calibration(None))
    assert planner.kind_of == [0, 0, 2]


def test_the_simulation_shares_what_the_allocation_shares(shared3: FleetResult) -> None:
    """With no contention section, the pool the allocation shares is shared in the simulation:
    its two CPU nodes serve x's and y's calls together (4 at once, 2 cores each), x and y run
    slower beside each other than alone on them, z as alone; the plans carry the jobs'
    own cpu_per_call (the sharing is the simulation's queue, not priced twice)."""
    fleet = fleet_from_dict(_fleet(3), EXAMPLES, "t")
    for j in shared3.jobs:
        assert j.plan.job["environment"]["cpu_per_call"] == 1
    sim = simulate_fleet(fleet, shared3, load_calibration(None), iterations=3,
                         config=SimConfig.no_variance())
    assert [(u.jobs, u.pool, u.slots) for u in sim.cpu_pools] == [(("x", "y"), "cpu", 4)]
    slow = {j.name: j.slowdown or 0 for j in sim.jobs}
    assert slow["x"] > 1.1 and slow["y"] > 1.1 and slow["z"] == pytest.approx(1.0), slow
    assert sum(u.used for u in sim.usage_after if u.pool == "cpu") == 3


@pytest.mark.parametrize("shared, field, named", [
    ({"cpu_pools": [{"pool": "cpu", "jobs": ["x", "nobody"]}]}, "shared.cpu_pools.0.jobs",
     "'nobody'"),
    ({"cpu_pools": [{"pool": "tpu", "jobs": ["x", "y"]}]}, "shared.cpu_pools.0.pool", "'tpu'"),
    ({"cpu_pools": [{"pool": "cpu", "jobs": ["x", "y"]}, {"pool": "cpu", "jobs": ["y", "z"]}]},
     "shared.cpu_pools.1.jobs", "'y'"),
    ({"pools": []}, "shared.pools", "unknown key"),
    ({"cpu_pools": [{"pool": "cpu", "jobs": ["x", "y"]}], "contention": True},
     "contention.cpu_pools.0.jobs", "'x'"),
])
def test_bad_shared_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                shared: dict, field: str, named: str) -> None:
    doc, shared = _fleet(3), dict(shared)
    if shared.pop("contention", False):  # the simulation asked to share what is shared
        doc["contention"] = {"cpu_pools": [{"jobs": ["x", "z"]}]}
    doc["shared"] = shared
    (tmp_path / "tiny-agent.yaml").write_text((EXAMPLES / "tiny-agent.yaml").read_text())
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["fleet", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert field in lines[0] and named in lines[0]


def test_members_of_two_teams_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _fleet(3)
    doc["teams"]["b"] = {"quota": {"gpu": {"nominal": 0}, "cpu": {"nominal": 0}}}
    doc["jobs"][1]["team"] = "b"
    (tmp_path / "tiny-agent.yaml").write_text((EXAMPLES / "tiny-agent.yaml").read_text())
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["fleet", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "shared.cpu_pools.0.jobs" in lines[0] and "a, b" in lines[0]


def test_infeasible_counts_a_shared_pool_once() -> None:
    """On 1 CPU node the pair's shared node and z's own do not fit: the diagnosis names the
    pool and counts the pair's node once."""
    with pytest.raises(Infeasible, match=r"pool cpu: the jobs need at least 2 nodes \(x 1, z 1\)"):
        plan_fleet(fleet_from_dict(_fleet(1), EXAMPLES, "t"), load_calibration(None), workers=1)


def test_the_allocator_chooses_the_cpu_pool(shared3: FleetResult) -> None:
    """With `choose: true` the allocation prices both options: on 3 CPU nodes sharing wins
    (the declared pool's objective; the alternative is the fleet of a node each), on 2 only
    sharing fits (the alternative does not)."""
    calib = load_calibration(None)
    alone = plan_fleet(fleet_from_dict(_fleet(3, share=False), EXAMPLES, "t"), calib, workers=1)
    for cpu, other in ((3, alone.value), (2, None)):
        doc = _fleet(cpu)
        doc["shared"]["cpu_pools"][0]["choose"] = True
        res = plan_fleet(fleet_from_dict(doc, EXAMPLES, "t"), calib, workers=1)
        [c] = res.choices
        assert (c.pool, c.jobs, c.shared, c.kind) == ("cpu", ["x", "y"], True, "CPU nodes")
        assert c.alternative == (None if other is None else pytest.approx(other, rel=1e-9))
        assert [s.jobs for s in res.shared] == [["x", "y"]]
        assert sum(u.used for u in res.usage if u.pool == "cpu") <= cpu
        if cpu == 3:
            assert res.value == pytest.approx(shared3.value, rel=1e-9)
            assert "choice: x, y share CPU nodes on cpu" in res.render()
