"""A rollout pool shared by a fleet's jobs (`shared.rollout_pools`): a member's iteration priced by
hand from the cost model's functions (its plan with the rollout on the engines, plus the other
member's generation and one weight swap), sharing that loses where engines are plentiful, sharing
that alone lets the fleet fit, the brute-force oracle with the group charged to its second job,
and bad `shared.rollout_pools` input as one line each."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from fleet_oracle import oracle_checked, random_fleet

from placer.base.errors import Infeasible
from placer.cli import main
from placer.cost.calibration import load_calibration
from placer.cost.model import sync_call_cost, weight_sync_time
from placer.cost.pricer import Pricer
from placer.cost.timing import sync_calls, sync_links
from placer.fleet.planner import plan_fleet
from placer.fleet.result import FleetResult
from placer.fleet.spec import fleet_from_dict
from placer.solve.candidates import role_candidates
from placer.solve.planner import plan_job
from placer.spec.catalog import with_nodes
from placer.spec.job import Job
from placer.spec.pins import Pin, Pins

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# the tiny GRPO job with long responses, so that generation weighs in its iteration
JOB = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
JOB.pop("cluster")
JOB["lengths"]["response"]["value"] = 1024


def _fleet(share: bool = True, pin: bool = False, gpu: int = 2) -> dict:
    """Jobs x and y (the job above) of team a on `gpu` emulated-GPU nodes for their trainers and
    one H100 node for inference engines; `pin`: both pin their rollout to the H100 pool."""
    job = copy.deepcopy(JOB)
    if pin:
        job["pin"] = {"rollout": {"pool": "eng"}}
    doc: dict = {
        "name": "rollshare",
        "cluster": {"pools": [
            {"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": gpu},
            {"name": "eng", "device": "H100-SXM", "devices_per_node": 8, "nodes": 1},
            {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 2}]},
        "teams": {"a": {"quota": {"gpu": {"nominal": gpu}, "eng": {"nominal": 1},
                                  "cpu": {"nominal": 2}}}},
        "jobs": [{"name": n, "team": "a", "job": copy.deepcopy(job)} for n in ("x", "y")],
    }
    if share:
        doc["shared"] = {"rollout_pools": [{"pool": "eng", "jobs": ["x", "y"]}]}
    return doc


@pytest.fixture(scope="module")
def shared() -> FleetResult:
    return plan_fleet(fleet_from_dict(_fleet(), EXAMPLES, "t"), load_calibration(None),
                      workers=1)


def _by_hand(job: Job, nodes: dict[str, int]) -> float:
    """A member's sync iteration on one H100 engine node shared with one identical job, from
    the cost model's own functions: its plan with the rollout on the engines and its other roles
    off them, plus the other's generation (its rollout's fastest candidate on the node) and one
    swap of the model into the engines (the weight sync over the node's fabric)."""
    calib = load_calibration(None)
    pins = Pins(rollout=Pin(pool="eng"), actor=Pin(avoid=["eng"]),
                reference=Pin(avoid=["eng"]), reward=Pin(avoid=["eng"]),
                environment=Pin(avoid=["eng"]))
    own = plan_job(Pricer(with_nodes(job.model_copy(update={"pin": pins}), nodes), calib),
                   time_limit_s=5, workers=1)
    px = Pricer(with_nodes(job, {"eng": 1}), calib)
    eng = px.res.cluster.pool("eng")
    other = min(c.time_s for c in role_candidates(px, "rollout", eng) if c.est.feasible)
    eff = px.eff(eng)
    m = px.res.arch_of("rollout")
    links = sync_links(px.res, "eng", 8, 1, "eng", 8, 1, False, eff)
    swap = weight_sync_time(m, min(links.values()), px.res.device_of(eng), eff,
                            sync_calls(m, 1, eff), sync_call_cost(m, eff))
    return own.predicted_iteration_s + other + swap


def test_member_priced_by_hand(shared: FleetResult) -> None:
    """Each member's iteration is its own plan on its nodes plus the other's generation and one
    swap (sync pipeline: the queue adds to the chain); the engines count once."""
    fleet = fleet_from_dict(_fleet(), EXAMPLES, "t")
    for j in shared.jobs:
        assert j.rollout_pool == "eng" and j.nodes["eng"] == 1
        nodes = {"gpu": j.nodes.get("gpu", 0), "eng": 1, "cpu": j.nodes.get("cpu", 0)}
        assert j.iteration_s == pytest.approx(_by_hand(fleet.jobs[0].job, nodes), rel=1e-9)
        assert j.plan.roles["rollout"].pool == "eng"
        assert all(r.pool != "eng" for name, r in j.plan.roles.items() if name != "rollout")
    assert [u.used for u in shared.usage if u.pool == "eng"] == [1]
    engines = shared.engines[0]
    assert (engines.pool, engines.nodes, engines.team) == ("eng", 1, "a")
    for m in engines.members:
        assert m.iteration_s > m.alone_iteration_s
        assert m.queue_s == pytest.approx(m.generation_s + engines.swap_s)


def test_sharing_loses_where_engines_are_plentiful(shared: FleetResult) -> None:
    """With two trainer nodes each job can have a node of its own and the H100 node to one of
    them: unshared, no job queues behind the other's generation, and the fleet runs more
    iterations an hour than shared (sum of 3600 / the hand-priced times)."""
    alone = plan_fleet(fleet_from_dict(_fleet(share=False), EXAMPLES, "t"),
                       load_calibration(None), workers=1)
    assert alone.optimal and shared.optimal
    assert shared.value == pytest.approx(sum(3600 / j.iteration_s for j in shared.jobs))
    assert alone.value > shared.value
    doc = shared.to_dict()
    assert doc["shared_rollout"][0]["jobs"][0]["job"] == "x"
    assert "shared rollout engines eng x1" in shared.render()


def test_only_sharing_fits() -> None:
    """Both jobs generate on the H100 pool (pinned) and it has one node: each needs it, so
    unshared they do not fit (exit 3's diagnosis names the pool); shared they do, the node
    counted once against the team's quota."""
    calib = load_calibration(None)
    with pytest.raises(Infeasible, match="pool eng"):
        plan_fleet(fleet_from_dict(_fleet(share=False, pin=True), EXAMPLES, "t"), calib,
                   workers=1)
    res = plan_fleet(fleet_from_dict(_fleet(pin=True), EXAMPLES, "t"), calib, workers=1)
    assert {j.name: j.nodes["eng"] for j in res.jobs} == {"x": 1, "y": 1}
    assert [u.used for u in res.usage if u.pool == "eng"] == [1]


@pytest.mark.parametrize("charged", [0, 1])
def test_oracle_agrees_with_the_group_charged_to_either_member(charged: int) -> None:
    """Random small fleets whose first two jobs share pool p1, its count charged to job
    `charged` (a rollout pool's `charge` team's first member need not come first): the lazy
    CP-SAT loop finds the brute-force optimum and breaks no rule."""
    solved = 0
    for seed in range(16):
        pr, time_of = random_fleet(seed, "throughput", shared=True, charged=charged)
        a = oracle_checked(pr, time_of, seed)
        if a is None:
            continue
        solved += 1
    assert solved >= 8


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("change, field, named", [
    (lambda d: d["shared"]["rollout_pools"][0].update(pool="tpu"),
     "shared.rollout_pools.0.pool", "'tpu'"),
    (lambda d: d["shared"]["rollout_pools"][0].update(jobs=["x", "nobody"]),
     "shared.rollout_pools.0.jobs", "'nobody'"),
    (lambda d: d["jobs"][1]["job"]["models"].update(policy="tiny-llama-rm"),
     "shared.rollout_pools.0.jobs", "different models"),
    (lambda d: d["shared"].update(cpu_pools=[{"pool": "cpu", "jobs": ["x", "y"]}]),
     "shared.rollout_pools.0.jobs", "job 'x' already shares shared.cpu_pools.0"),
    (lambda d: d["jobs"][0]["job"].update(pin={"actor": {"pool": "eng"}}),
     "shared.rollout_pools.0.jobs", "pins its actor"),
    (lambda d: d["shared"]["rollout_pools"][0].update(charge="b"),
     "shared.rollout_pools.0.charge", "'b'"),
    (lambda d: d["jobs"][1].update(team="b"), "shared.rollout_pools.0.charge", "a, b"),
    (lambda d: d["shared"]["rollout_pools"][0].update(engines=2),
     "shared.rollout_pools.0.engines", "unknown key"),
])
def test_bad_rollout_pool_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      change, field: str, named: str) -> None:
    doc = _fleet()
    doc["teams"]["b"] = {"quota": {"gpu": {"nominal": 0}}}
    change(doc)
    assert main(["fleet", str(_write(tmp_path, doc))]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    if "already shares" in named:  # both jobs are in both sections: a line for each
        assert len(lines) == 2 and "job 'y' already shares" in lines[1], lines
    else:
        assert len(lines) == 1, lines
    assert field in lines[0] and named in lines[0], lines[0]


def test_two_teams_with_a_charge(shared: FleetResult) -> None:
    """Jobs of two teams share once a `charge` team is named: the engines count against its
    quota alone (the other team holds none of the pool)."""
    doc = _fleet()
    doc["teams"]["b"] = {"quota": {"gpu": {"nominal": 1}, "cpu": {"nominal": 1}}}
    doc["teams"]["a"]["quota"]["gpu"]["nominal"] = 1
    doc["teams"]["a"]["quota"]["cpu"]["nominal"] = 1
    doc["jobs"][0]["team"] = "b"
    doc["shared"]["rollout_pools"][0]["charge"] = "a"
    res = plan_fleet(fleet_from_dict(doc, EXAMPLES, "t"), load_calibration(None), workers=1)
    used = {(u.team, u.pool): u.used for u in res.usage}
    assert used[("a", "eng")] == 1 and ("b", "eng") not in used
    assert res.engines[0].team == "a"
    assert {j.name: j.nodes["eng"] for j in res.jobs} == {"x": 1, "y": 1}


def test_kueue_export_holds_the_engines_once(tmp_path: Path) -> None:
    """The export writes one RayCluster of the engines' node on the charged team's queue
    (passing KubeRay's RayCluster schema) and leaves the engines' group out of both members'
    RayJobs (passing the RayJob schema), with a warning that the members cannot reach it."""
    from frameworks import crd_errors

    from placer.interop.kueue import export_kueue

    fleet = fleet_from_dict(_fleet(pin=True), EXAMPLES, "t")
    res = plan_fleet(fleet, load_calibration(None), workers=1)
    out = export_kueue(fleet, res, namespace="rl")
    engines = yaml.safe_load(out.files["shared/eng-engines-raycluster.yaml"])
    assert crd_errors(engines, "rayclusters") == []
    assert engines["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "a"
    [group] = engines["spec"]["workerGroupSpecs"]
    assert (group["groupName"], group["replicas"]) == ("eng", 1)
    for name in ("x", "y"):
        job = yaml.safe_load(out.files[f"jobs/{name}-rayjob.yaml"])
        assert crd_errors(job, "rayjobs") == []
        groups = [g["groupName"] for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]]
        assert "eng" not in groups and "gpu" in groups
    assert any("cannot reach the shared engines" in w for w in out.warnings)


def test_the_simulation_time_shares_the_engines() -> None:
    """Simulated side by side (no variance), the members take the engines' one slot in turn:
    each runs slower than with the engines to itself, and no slower than priced (the pricing
    has every member's generation wait at once; in the simulation one trains while the other
    generates). The engines' node is held once."""
    from simulator.config import SimConfig
    from simulator.fleet import simulate_fleet

    calib = load_calibration(None)
    fleet = fleet_from_dict(_fleet(pin=True), EXAMPLES, "t")
    res = plan_fleet(fleet, calib, workers=1)
    sim = simulate_fleet(fleet, res, calib, iterations=4, config=SimConfig.no_variance())
    for j, jr in zip(sim.jobs, res.jobs):
        assert jr.alone_iteration_s is not None
        assert j.alone_s == pytest.approx(jr.alone_iteration_s, rel=1e-6)
        assert j.fleet_s is not None and j.alone_s * 1.2 < j.fleet_s <= jr.iteration_s * 1.001
    assert [u.used for u in sim.usage_after if u.pool == "eng"] == [1]


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
def test_oracle_agrees_on_the_sharing_choice(objective: str) -> None:
    """Random small fleets whose first two jobs may share pool p1 (their shared flavours slower
    but holding one count of it) or not: the model's choice and allocation reach the brute-force
    optimum over both options, and break no rule (one option, all or nothing)."""
    chose = set()
    for seed in range(20):
        pr, time_of = random_fleet(seed, objective, shared=True, choice=True)
        a = oracle_checked(pr, time_of, seed)
        if a is None:
            continue
        chose.add(any(a.vectors[-1]))
    assert chose == {True, False}  # both options won somewhere


def _choose(doc: dict) -> dict:
    doc["shared"]["rollout_pools"][0]["choose"] = True
    return doc


def test_the_allocator_declines_sharing_that_loses(shared: FleetResult) -> None:
    """Asked to choose on the plentiful fleet, the allocation does not share: its objective is
    the unshared fleet's, and the priced alternative is sharing's, each member at its hand-priced
    time (3600 / T summed)."""
    calib = load_calibration(None)
    alone = plan_fleet(fleet_from_dict(_fleet(share=False), EXAMPLES, "t"), calib, workers=1)
    res = plan_fleet(fleet_from_dict(_choose(_fleet()), EXAMPLES, "t"), calib, workers=1)
    [c] = res.choices
    assert (c.pool, c.jobs, c.shared) == ("eng", ["x", "y"], False)
    assert res.value == pytest.approx(alone.value, rel=1e-9) == c.value
    job = fleet_from_dict(_fleet(), EXAMPLES, "t").jobs[0].job
    by_hand = sum(3600 / _by_hand(job, {"gpu": j.nodes.get("gpu", 0), "eng": 1,
                                        "cpu": j.nodes.get("cpu", 0)}) for j in shared.jobs)
    assert c.alternative == pytest.approx(by_hand, rel=1e-9)
    assert res.engines == [] and all(j.rollout_pool is None for j in res.jobs)
    assert "x, y do not share rollout engines on eng" in res.render()
    assert res.to_dict()["sharing_choices"][0]["shared"] is False


def test_the_allocator_shares_where_only_sharing_fits() -> None:
    """With both rollouts pinned to the one H100 node, the allocation chooses to share; the
    other option is priced as not fitting, and the engines count once."""
    res = plan_fleet(fleet_from_dict(_choose(_fleet(pin=True)), EXAMPLES, "t"),
                     load_calibration(None), workers=1)
    [c] = res.choices
    assert c.shared and c.alternative is None
    assert [e.nodes for e in res.engines] == [1]
    assert [u.used for u in res.usage if u.pool == "eng"] == [1]
    assert {j.name: j.rollout_pool for j in res.jobs} == {"x": "eng", "y": "eng"}
    assert "x, y share rollout engines on eng" in res.render() and "does not fit" in res.render()


def test_a_member_is_not_priced_as_its_unshared_twin() -> None:
    """z runs the same job document as the members x and y but does not share: it is priced
    as written (its plan's own time), the members at their shared time, and no member is of a
    kind with z (an identical job's memo would hand one the other's time)."""
    doc = _fleet(gpu=3)
    doc["cluster"]["pools"][2]["nodes"] = 3
    doc["teams"]["a"]["quota"]["cpu"]["nominal"] = 3
    doc["jobs"].append({"name": "z", "team": "a", "job": copy.deepcopy(doc["jobs"][0]["job"])})
    res = plan_fleet(fleet_from_dict(doc, EXAMPLES, "t"), load_calibration(None), workers=1)
    by = {j.name: j for j in res.jobs}
    assert by["z"].rollout_pool is None
    assert by["z"].iteration_s == by["z"].plan.predicted_iteration_s
    for name in ("x", "y"):
        assert by[name].iteration_s > by[name].plan.predicted_iteration_s


def test_the_example_prices_both_options() -> None:
    """examples/fleets/shared-rollout.yaml: two Qwen2.5-7B GRPO jobs of two teams that may
    time-share the H20 node's engines; the allocation prices both options and keeps the better
    (on this cluster each job generating on its own H100s: sharing queues each behind the
    other's generation)."""
    from placer.fleet.spec import load_fleet

    res = plan_fleet(load_fleet(EXAMPLES / "fleets" / "shared-rollout.yaml"),
                     load_calibration(None), workers=1)
    [c] = res.choices
    assert c.alternative is not None and res.optimal
    assert res.value >= c.alternative
    assert c.shared == bool(res.engines)
