"""`placer fleet --execute` with a CPU environment pool shared by two jobs, and `--address`.

The Ray run (2 agentic jobs x 2 steps, `examples/fleets/shared-cpu-tiny.yaml`) checks that both
jobs finish with balanced ledgers; that the pool's environment workers are the first member's
(as many as its plan puts on the shared nodes) and the other member starts none; that every
sandbox call of each job ran in one of those workers' processes (the pid the worker reports with
each call's timing, against the pids its runtime read when it started); that the pool has the
plan's slots and cuts each request into one call per slot; that the shared nodes hold the
bundles of the first member's plan there and no other job's (the other's rule reward runs in one
of them); that a call its worker stalls on (a test delay) is issued again to the other worker,
whose answer is taken; and that each job's measured queueing wait on the pool is in the executed
summary beside the priced slowdown. Without Ray: each member's slots against the simulator's and
the cost model's count (one `cpu_per_call`, and two different), the shared nodes' bundles
against the plan (the first member's only), and the address checks (a malformed or unreachable
`--address` exits 2 with one line, before any planning). The pool's own policy, slots and re-
issues without Ray are in tests/test_fleet_cpu_pool.py.
"""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from executors.cluster import parse_address
from placer.base.errors import SpecError
from placer.cost.calibration import load_calibration
from placer.fleet.planner import plan_fleet
from placer.fleet.spec import load_fleet

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fleets" / "shared-cpu-tiny.yaml"


@pytest.mark.ray
@pytest.mark.slow  # Ray, two jobs' actors, 4 steps of two-turn agentic rollouts
def test_two_jobs_share_one_cpu_pools_workers(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import ray  # lazy: Ray (~1 s) loads when a Ray test runs, not at collection

    from executors import fleetrun
    from executors.fleetrun import execute_fleet
    from executors.roles import Delay

    made = fleetrun.run_config

    def slow_worker(run: Any, lr: Any = None, model_dir: str = "", delays: Any = ()) -> Any:
        # the pool's first worker stalls on its third call (only agent-a starts the pool's
        # workers: agent-b's config never reaches one)
        return made(run, lr, model_dir, (Delay("environment", 0, 2, 20.0),))
    monkeypatch.setattr(fleetrun, "run_config", slow_worker)

    if ray.is_initialized():  # so that the run starts its own embedded Ray (and stops it)
        ray.shutdown()
    fleet = load_fleet(str(EXAMPLE))
    result = plan_fleet(fleet, load_calibration(None), time_limit_s=10, job_time_limit_s=5,
                        workers=1, seed=0)
    [use] = result.shared
    assert (use.pool, use.jobs) == ("cpu", ["agent-a", "agent-b"])
    ran = execute_fleet(fleet, result, 2, tmp_path)
    assert not ray.is_initialized()
    assert {n: len(s) for n, s in ran.jobs.items()} == {"agent-a": 2, "agent-b": 2}
    assert ran.ledger_ok, ran.ledger_problems
    [pool] = ran.summary()["shared_cpu"]
    lead = next(j for j in result.jobs if j.name == "agent-a")
    env = lead.plan.roles["environment"]
    assert env.pool == "cpu"
    seats = sum(1 for r in ran.placement["agent-a"] if r["role"] == "environment")
    assert seats == pool["workers"] == len(pool["worker_pids"]) >= 1
    assert all(r["pool"] == "cpu" for r in ran.placement["agent-a"]
               if r["role"] == "environment")
    assert not any(r["role"] == "environment" for r in ran.placement["agent-b"])
    # the shared nodes hold the bundles of agent-a's plan there and no others (the plan
    # charges them once, to agent-a); agent-b's reward runs in one of them, on its plan node
    from executors.runplan import resolve_plan
    planned = sorted((b.pool, b.node, b.index) for s in resolve_plan(lead.plan).slots.values()
                     for b in s.bundles if b.pool == "cpu")
    made = ran.summary()["jobs"]
    assert sorted((x["pool"], x["node"], x["bundle"]) for x in made["agent-a"]["bundles"]
                  if x["pool"] == "cpu") == planned and planned
    assert not [x for x in made["agent-b"]["bundles"] if x["pool"] == "cpu"]
    b_cpu = [r for r in ran.placement["agent-b"] if r["pool"] == "cpu"]
    assert [r["role"] for r in b_cpu] == ["reward"]
    assert all(r["in_bundle"] and r["on_plan_node"] and r["slot"] == env.slot for r in b_cpu)
    # two-turn jobs: a tool call round and a verify round each step, on every worker
    for name in ("agent-a", "agent-b"):
        got = pool["jobs"][name]
        calls = [c for c in pool["calls"] if c["job"] == name]
        assert got["calls"] == len(calls) >= 2 * 2, (name, calls)
        assert {c["what"] for c in calls} == {"tool call", "verify"}
        assert got["worker_pids"] and set(got["worker_pids"]) <= set(pool["worker_pids"])
        assert got["waited_s"] == pytest.approx(sum(c["waited_s"] for c in calls), abs=1e-3)
        assert got["waited_s"] >= 0 and got["max_wait_s"] >= got["mean_wait_s"] >= 0
        assert got["priced_slowdown"] > 1.0  # the plan priced the sharing
    names = {e.name for e in ran.trace.events}
    assert {"env agent-a", "env agent-b"} <= names
    # one slot per call the plan's cores run at once (2 cores a laptop-cpu node, 1 a call), as
    # the simulator counts them; each request cut into one call per slot; never more at once
    assert pool["slots"] == use.nodes * 2
    per_request: dict[tuple[str, int, str], int] = {}
    for c in pool["calls"]:
        key = (c["job"], c["step"], c["what"])
        per_request[key] = per_request.get(key, 0) + 1
        assert 0 <= c["slot"] < pool["slots"]
        if c["reissue"] is not None:
            assert c["reissue"]["reissued_to"] != c["reissue"]["slow_worker"]
    assert max(per_request.values()) == pool["slots"] >= pool["workers"]
    # the stalled call was issued again to the other worker, whose copy answered; traced
    late = [c for c in pool["calls"] if c["reissue"] is not None]
    assert any(c["reissue"]["slow_worker"] == 0 and c["reissue"]["winner"] == "reissue"
               and c["worker"] == 1 for c in late), sorted(
                   (c["ran_s"], c["worker"], c["slot"]) for c in pool["calls"])
    assert sum(len(pool["jobs"][n]["reissued"]) for n in pool["jobs"]) == len(late)
    assert len(ran.trace.of("straggler")) == len(late)


@pytest.mark.ray
@pytest.mark.slow  # a two-node Ray cluster on loopback, two jobs' actors, 2 steps
def test_the_fleet_runs_on_a_cluster_it_joins(tmp_path: Path) -> None:
    """`address`: the fleet joins a running cluster (a head and one worker node on 127.0.0.1,
    token auth on, advertising the pools but no node keys), places by pool, and leaves it
    running."""
    import ray  # lazy: Ray (~1 s) loads when a Ray test runs, not at collection
    from ray.cluster_utils import Cluster

    from executors import cluster, ray_private
    from executors.fleetrun import execute_fleet, own_nodes, prepare

    if ray.is_initialized():
        ray.shutdown()
    fleet = load_fleet(str(EXAMPLE))
    result = plan_fleet(fleet, load_calibration(None), time_limit_s=10, job_time_limit_s=5,
                        workers=1, seed=0)
    total: dict[str, float] = {}
    for j in prepare(fleet, result, tmp_path / "sizes", "torch", False):
        for r in own_nodes(j.run):
            for k, v in r.items():
                if not k.startswith("placer_node_"):
                    total[k] = total.get(k, 0.0) + v
    cluster.ensure_token_auth()
    ray_private.loopback_only()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "node_ip_address": ray_private.LOOPBACK})
    c.add_node(num_cpus=int(total.pop("CPU", 0.0)), num_gpus=int(total.pop("GPU", 0.0)),
               resources=total, node_ip_address=ray_private.LOOPBACK)
    try:
        ran = execute_fleet(fleet, result, 1, tmp_path / "out", address=c.address)
        assert ran.described.startswith(f"Ray at {c.address}")
        assert not ray.is_initialized()  # the driver left the cluster
        assert c.head_node is not None and c.head_node.remaining_processes_alive()  # still up
    finally:
        ray.shutdown()
        c.shutdown()
    assert ran.ledger_ok and {n: len(s) for n, s in ran.jobs.items()} == {"agent-a": 1,
                                                                         "agent-b": 1}
    [pool] = ran.summary()["shared_cpu"]
    for name in ("agent-a", "agent-b"):
        got = pool["jobs"][name]
        assert got["calls"] >= 2 and set(got["worker_pids"]) <= set(pool["worker_pids"])
    assert all(r["in_bundle"] for rows in ran.placement.values() for r in rows)


# ---------------------------------------------------------------------------- --address
@pytest.mark.parametrize("address, want", [
    ("auto", None), ("10.0.0.5:6379", ("10.0.0.5", 6379)),
    ("ray://head.example.org:10001", ("head.example.org", 10001)),
    ("[::1]:6379", ("::1", 6379))])
def test_addresses_parse(address: str, want: tuple[str, int] | None) -> None:
    assert parse_address(address) == want


@pytest.mark.parametrize("address", ["head", "head:", "head:0", "head:70000", "::1:6379",
                                     "http://head:6379", "he ad:6379", "local"])
def test_malformed_addresses_are_refused(address: str) -> None:
    with pytest.raises(SpecError, match=r"^--address: not a Ray address"):
        parse_address(address)


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("kind", ["malformed", "unreachable"])
def test_a_bad_address_exits_2_with_one_line(tmp_path: Path, placer_cmd: list[str],
                                             kind: str) -> None:
    address = "not an address" if kind == "malformed" else f"127.0.0.1:{_closed_port()}"
    out = subprocess.run([*placer_cmd, "fleet", str(EXAMPLE), "--execute", "--steps", "1",
                          "--out", str(tmp_path / "out"), "--address", address],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # refused before planning: no progress lines either
    start = ("placer: error: --address: not a Ray address" if kind == "malformed"
             else f"placer: error: --address: cannot reach Ray at '{address}'")
    assert lines[0].startswith(start), lines[0]
    assert lines[0].endswith(f"(got '{address}')")
    assert not (tmp_path / "out").exists()


def test_address_applies_to_execute_only(placer_cmd: list[str]) -> None:
    out = subprocess.run([*placer_cmd, "fleet", str(EXAMPLE), "--address", "auto"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith(
        "--address: applies to --execute only (got 'auto')")


def _fleet_with(tmp_path: Path, b_per_call: float) -> Path:
    """The example fleet with agent-b's calls taking `b_per_call` cores each."""
    text = EXAMPLE.read_text().replace("job: ../tiny-agent.yaml",
                                       f"job: {ROOT / 'examples' / 'tiny-agent.yaml'}")
    assert text.count("cpu_per_call: 1\n") == 1
    out = tmp_path / "fleet.yaml"
    out.write_text(text.replace("cpu_per_call: 1\n", f"cpu_per_call: {b_per_call}\n"))
    return out


@pytest.mark.parametrize("b_per_call, want", [(1, {"agent-a": 4, "agent-b": 4}),
                                              (2, {"agent-a": 4, "agent-b": 2})])
def test_the_pool_has_the_simulators_slots(tmp_path: Path, b_per_call: float,
                                           want: dict[str, int]) -> None:
    """The executed pool of the example has, per member, as many slots as the simulator's
    shared pool serves it with and the cost model counts for it alone on those cores (the
    shared nodes' cores over its own cpu_per_call: 2 cores a laptop-cpu node, 2 nodes), its
    most spread over the lead's environment seats; a member of wider calls has fewer."""
    from executors.fleetcpu import lanes, pool_cores, pool_slots
    from placer.cost.model import call_slots
    from simulator.config import SimConfig
    from simulator.fleet import simulate_fleet

    fleet = load_fleet(str(_fleet_with(tmp_path, b_per_call)))
    calib = load_calibration(None)
    result = plan_fleet(fleet, calib, time_limit_s=10, job_time_limit_s=5, workers=1, seed=0)
    [use] = result.shared
    plans = {j.name: j.plan for j in result.jobs}
    sim = simulate_fleet(fleet, result, calib, iterations=1, config=SimConfig.no_variance())
    [simulated] = sim.cpu_pools
    slots = pool_slots(use, plans, fleet)
    assert slots == simulated.job_slots == want and use.nodes == 2
    assert slots == {n: call_slots(pool_cores(use, plans, fleet),
                                   plans[n].spec.environment.cpu_per_call) for n in use.jobs}
    assert simulated.slots == max(slots.values())
    seats = plans[use.jobs[0]].roles["environment"].devices
    most = max(slots.values())
    assert lanes(most, seats) * seats >= most > (lanes(most, seats) - 1) * seats


def test_the_shared_nodes_hold_the_first_members_bundles_only(tmp_path: Path) -> None:
    """The plan charges the shared CPU nodes once, to the first member: executed, agent-b
    makes no placement group there (its reward+environment slot is gone), its rule reward
    sits in agent-a's bundle on the same plan node, those bundles' seats share them over
    both jobs, and the embedded Ray advertises each shared node once."""
    from executors.cluster import node_key
    from executors.fleetrun import own_nodes, prepare

    fleet = load_fleet(str(EXAMPLE))
    result = plan_fleet(fleet, load_calibration(None), time_limit_s=10, job_time_limit_s=5,
                        workers=1, seed=0)
    [use] = result.shared
    runs = {j.name: j.run for j in prepare(fleet, result, tmp_path, "torch", False)}
    a, b = runs["agent-a"], runs["agent-b"]
    home = a.slots[a.roles["environment"].slot]
    assert home.bundles and all(x.pool == "cpu" for x in home.bundles)
    assert not any(x.pool == "cpu" for s in b.slots.values() for x in s.bundles)
    [reward] = [s for s in b.seats if s.role == "reward"]
    assert reward.slot == home.name and reward.bundle in home.bundles
    assert reward.bundle is home.bundles[reward.bundle_pos] and reward.bundle.node == 0
    on_it = [s for s in a.seats if s.bundle.index == reward.bundle.index and s.slot == home.name]
    assert reward.sharers == len(on_it) + 1 and all(s.sharers == reward.sharers for s in on_it)
    assert b.roles["reward"].slot == home.name
    assert [s for s in b.seats if s.role == "environment"] == [
        s for s in a.seats if s.role == "environment"]
    advertised = [r for j in runs.values() for r in own_nodes(j)]
    for node in range(use.nodes):
        assert sum(r.get(node_key("cpu", node), 0.0) > 0 for r in advertised) == 1
