"""`placer fleet --execute` with a CPU environment pool shared by two jobs, and `--address`.

The Ray run (2 agentic jobs x 2 steps, `examples/fleets/shared-cpu-tiny.yaml`) checks that both
jobs finish with balanced ledgers; that the pool's environment workers are the first member's
(as many as its plan puts on the shared nodes) and the other member starts none; that every
sandbox call of each job ran in one of those workers' processes (the pid the worker reports
with each call's timing, against the pids its runtime read when it started); that the pool has
the plan's slots and cuts each request into one call per slot; that a call its worker stalls
on (a test delay) is issued again to the other worker, whose answer is taken; and that each
job's measured queueing wait on the pool is in the executed summary beside the priced slowdown.
Without Ray: the pool's first-come-first-served order over the jobs' queues (not a round robin
over jobs), its slots over its workers, a straggler's re-issue (either copy may answer), its
re-run of a failed call, the simulator's slot count, and the address checks (a malformed or unreachable
`--address` exits 2 with one line, before any planning).
"""
from __future__ import annotations

import socket
import subprocess
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from executors.cluster import parse_address
from executors.envpool import SharedEnvPool
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


# ---------------------------------------------------------------------------- the pool alone
@dataclass
class _Ref:
    fut: Future[Any]

    def future(self) -> Future[Any]:
        return self.fut


@dataclass
class _Execute:
    """A worker's `execute` whose calls finish when the test says (in call order)."""

    pid: int
    fail_first: int = 0
    started: list[tuple[list[str], Future[Any]]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def remote(self, ids: list[str], answers: list[str]) -> _Ref:
        fut: Future[Any] = Future()
        with self.cond:
            self.started.append((ids, fut))
            self.cond.notify_all()
        return _Ref(fut)

    def finish(self, k: int) -> list[str]:
        """Wait for the k-th call to start, then complete it (or fail it)."""
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.started) > k, timeout=30), k
            ids, fut = self.started[k]
        if self.fail_first > k:
            fut.set_exception(RuntimeError("worker died"))
        else:
            fut.set_result(([{"status": "ok", "value": i} for i in ids], {"pid": self.pid}))
        return ids


@dataclass
class _Handle:
    execute: _Execute


@dataclass
class _Worker:
    handle: _Handle
    role: str = "environment"
    rank: int = 0


def _asker(pool: SharedEnvPool, job: str, ids: list[list[str]], got: dict[str, Any]
           ) -> threading.Thread:
    t = threading.Thread(target=lambda: got.setdefault(job, []).append(
        pool.run(job, 0, "tool call", [(i, ["1"] * len(i)) for i in ids])))
    t.start()
    return t


def _queued(pool: SharedEnvPool, job: str, n: int) -> None:
    with pool._cond:
        assert pool._cond.wait_for(lambda: len(pool._queues[job]) >= n, timeout=30)


def test_the_pool_serves_the_jobs_calls_first_come_first_served() -> None:
    ex = _Execute(pid=41)
    pool = SharedEnvPool("cpu", ["a", "b"], [_Worker(_Handle(ex))])  # type: ignore[list-item]
    got: dict[str, Any] = {}
    try:
        ta = _asker(pool, "a", [["a0"], ["a1"]], got)
        _queued(pool, "a", 1)  # a0 runs on the one worker, a1 waits
        tb = _asker(pool, "b", [["b0"]], got)
        _queued(pool, "b", 1)
        served = [ex.finish(0)]
        served.append(ex.finish(1))
        ta.join(timeout=30)
        ta2 = _asker(pool, "a", [["a2"]], got)  # asked after b0: served after it
        _queued(pool, "a", 1)
        served += [ex.finish(2), ex.finish(3)]
        for t in (tb, ta2):
            t.join(timeout=30)
    finally:
        pool.close()
    # first come first served: a1 (asked before b0) before b0; round robin would give b0 first
    assert served == [["a0"], ["a1"], ["b0"], ["a2"]]
    assert [(c.job, c.pid) for c in pool.records] == [("a", 41), ("a", 41), ("b", 41), ("a", 41)]
    assert pool.waits("b")[0] > 0  # b0 queued while a's calls held the worker
    assert pool.pids("a") == pool.pids("b") == {41}
    assert [x["value"] for v, _, _ in got["b"][0] for x in v] == ["b0"]


def test_a_failed_call_runs_again_once_then_fails_the_request() -> None:
    ex = _Execute(pid=7, fail_first=1)
    pool = SharedEnvPool("cpu", ["a"], [_Worker(_Handle(ex))])  # type: ignore[list-item]
    got: dict[str, Any] = {}
    try:
        t = _asker(pool, "a", [["x"]], got)
        ex.finish(0)  # fails: queued again
        ex.finish(1)
        t.join(timeout=30)
        assert [x["value"] for v, _, _ in got["a"][0] for x in v] == ["x"]
        ex.fail_first = 4
        out: list[BaseException] = []

        def ask() -> None:
            try:
                pool.run("a", 1, "verify", [(["y"], ["1"])])
            except RuntimeError as e:
                out.append(e)

        t = threading.Thread(target=ask)
        t.start()
        ex.finish(2)
        ex.finish(3)
        t.join(timeout=30)
    finally:
        pool.close()
    assert len(out) == 1 and "(shared CPU pool cpu): calls keep failing" in str(out[0])


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


def test_the_summary_sets_the_measured_wait_beside_the_priced_and_simulated() -> None:
    from executors.envpool import PoolCall
    from executors.fleetcpu import pool_summary
    from placer.fleet.result import SharedUse

    worker = _Worker(_Handle(_Execute(pid=3)))
    pool = SharedEnvPool("cpu", ["a", "b"], [worker])  # type: ignore[list-item]
    pool.close()
    pool.records += [PoolCall("a", 0, "tool call", 4, 10.0, 10.0, 11.0, 0, 3),
                     PoolCall("b", 0, "tool call", 4, 10.0, 11.0, 12.0, 0, 3),
                     PoolCall("b", 0, "verify", 4, 12.0, 12.5, 13.0, 0, 3)]
    use = SharedUse("cpu", 2, ["a", "b"], [2.0, 3.0], [1.0, 2.0])
    sim = {"slowdown": {"a": 1.5, "b": 1.25}, "pool_wait_s": [(["a", "b"], 0.2)]}
    doc = pool_summary(use, pool, [3], sim)
    assert doc["simulated_mean_wait_s"] == 0.2 and doc["worker_pids"] == [3]
    assert doc["jobs"]["a"] == {"calls": 1, "waited_s": 0.0, "mean_wait_s": 0.0,
                                "max_wait_s": 0.0, "worker_pids": [3], "reissued": [],
                                "priced_slowdown": 2.0, "simulated_slowdown": 1.5}
    assert doc["jobs"]["b"]["waited_s"] == 1.5 and doc["jobs"]["b"]["mean_wait_s"] == 0.75
    assert doc["jobs"]["b"]["priced_slowdown"] == 1.5
    assert pool_summary(use, pool, [3], None)["jobs"]["b"]["simulated_slowdown"] is None


def test_a_members_reissue_deadline_is_its_calls_timeout() -> None:
    """A member whose tail policy re-issues tool calls: its deadline is each of its calls'
    timeout on the pool (what the unshared executor re-issues at); a member without one is
    timed by its priced call time, and one with neither is never re-issued."""
    from types import SimpleNamespace

    from executors.envpool import STRAGGLER_FACTOR, PoolCall
    from executors.fleetcpu import pool_deadlines
    from placer.fleet.result import SharedUse
    from placer.spec.tailpolicy import TailPolicy

    runs = {"a": SimpleNamespace(job=SimpleNamespace(tail_policy=TailPolicy.model_validate(
                {"kind": "reissue", "deadline_s": 1.5}))),
            "b": SimpleNamespace(job=SimpleNamespace(tail_policy=TailPolicy()))}
    use = SharedUse("cpu", 1, ["a", "b"], [1.0, 1.0], [1.0, 1.0])
    deadlines = pool_deadlines(use, runs)  # type: ignore[arg-type]
    assert deadlines == {"a": 1.5}
    workers = [_Worker(_Handle(_Execute(pid=1))), _Worker(_Handle(_Execute(pid=2)), rank=1)]
    pool = SharedEnvPool("cpu", ["a", "b", "c"], workers, 2,  # type: ignore[arg-type]
                         {"a": 0.2, "b": 0.2}, deadlines)
    pool.close()
    assert pool.timeout_s(PoolCall("a", 0, "tool call", 4, 0.0)) == 1.5
    assert pool.timeout_s(PoolCall("b", 0, "tool call", 4, 0.0)) == pytest.approx(
        STRAGGLER_FACTOR * 4 * 0.2)
    assert pool.timeout_s(PoolCall("c", 0, "tool call", 4, 0.0)) is None
    pool._per_answer.extend([1.0, 1.0, 3.0])  # a host slower than priced: its median counts
    assert pool.timeout_s(PoolCall("b", 0, "tool call", 4, 0.0)) == pytest.approx(
        STRAGGLER_FACTOR * 4 * 1.0)


# ---------------------------------------------------------------------------- slots, stragglers
def _two_workers() -> tuple[list[_Execute], list[_Worker]]:
    ex = [_Execute(pid=10), _Execute(pid=11)]
    return ex, [_Worker(_Handle(e), rank=k) for k, e in enumerate(ex)]


def _started(ex: _Execute, n: int) -> None:
    with ex.cond:
        assert ex.cond.wait_for(lambda: len(ex.started) >= n, timeout=30), n


def test_the_pool_runs_one_call_per_slot_over_its_workers() -> None:
    """Two workers and four slots (two lanes each): four calls run at once, two on each
    worker, the fifth waits for a slot; each request is cut into one call per slot."""
    ex, workers = _two_workers()
    pool = SharedEnvPool("cpu", ["a"], workers, 4)  # type: ignore[arg-type]
    assert pool.lanes == 2 and [pool.worker_of(s) for s in range(4)] == [0, 1, 0, 1]
    got: dict[str, Any] = {}
    try:
        t = _asker(pool, "a", [[f"x{i}"] for i in range(5)], got)
        _started(ex[0], 2)
        _started(ex[1], 2)
        _queued(pool, "a", 1)  # the fifth: no slot free
        assert len(ex[0].started) + len(ex[1].started) == 4
        ex[1].finish(0)
        _started(ex[1], 3)  # the freed slot's worker takes it
        for e, k in ((ex[0], 0), (ex[0], 1), (ex[1], 1), (ex[1], 2)):
            e.finish(k)
        t.join(timeout=30)
    finally:
        pool.close()
    assert [x["value"] for v, _, _ in got["a"][0] for x in v] == [f"x{i}" for i in range(5)]
    assert sorted(c.slot for c in pool.records) == [0, 1, 1, 2, 3]
    assert {c.pid for c in pool.records} == {10, 11}


def test_a_straggler_is_reissued_to_another_worker_and_the_copy_answers() -> None:
    """A call past its timeout (3 x the priced call time) is issued again to the other
    worker's slot as soon as it frees; the copy answers first, so its answer is taken, its
    worker named, and the re-issue recorded and traced; the slow original is ignored."""
    from executors.fleetcpu import pool_trace
    from traces.schema import Trace

    ex, workers = _two_workers()
    pool = SharedEnvPool("cpu", ["a"], workers, 2, {"a": 1e-3})  # type: ignore[arg-type]
    got: dict[str, Any] = {}
    try:
        t = _asker(pool, "a", [["x0"], ["x1"]], got)
        _started(ex[0], 1)
        _started(ex[1], 1)
        ex[1].finish(0)  # x1 answers; x0 is past its timeout: its copy takes worker 1's slot
        _started(ex[1], 2)
        assert ex[1].started[1][0] == ["x0"]
        ex[1].finish(1)  # the copy answers first
        t.join(timeout=30)
        ex[0].finish(0)  # the original, late: ignored
    finally:
        pool.close()
    [(v0, _, w0), (v1, _, w1)] = got["a"][0]
    assert v0 == [{"status": "ok", "value": "x0"}] and w0 is workers[1] and w1 is workers[1]
    [late] = pool.reissues("a")
    assert late.pid == 11 and late.worker == 1 and late.slot == 0
    assert late.reissue is not None and late.reissue.to_dict() == {
        "slow_worker": 0, "reissued_to": 1, "deadline_s": pytest.approx(3e-3),
        "winner": "reissue"}
    assert len(pool.records) == 2  # one record per call, whichever copy answered
    trace = Trace()
    pool_trace(trace, pool, 0.0)
    [marker] = trace.of("straggler")
    assert marker.tid == "worker 0" and marker.args["reissued_to"] == 1


def test_the_original_answering_first_wins_over_its_copy() -> None:
    ex, workers = _two_workers()
    pool = SharedEnvPool("cpu", ["a"], workers, 2, {"a": 1e-3})  # type: ignore[arg-type]
    got: dict[str, Any] = {}
    try:
        t = _asker(pool, "a", [["x0"], ["x1"]], got)
        _started(ex[0], 1)
        _started(ex[1], 1)
        ex[1].finish(0)
        _started(ex[1], 2)  # x0's copy runs
        ex[0].finish(0)  # the original answers first
        t.join(timeout=30)
        ex[1].finish(1)  # the copy, late: ignored, its slot freed
        with pool._cond:
            assert pool._cond.wait_for(lambda: len(pool._free) == 2, timeout=30)
    finally:
        pool.close()
    [(_, _, w0), _] = got["a"][0]
    assert w0 is workers[0]
    [late] = pool.reissues("a")
    assert late.reissue is not None and late.reissue.winner == "original" and late.pid == 10


def test_the_pool_has_the_simulators_slots() -> None:
    """The executed pool of the example has as many slots as the simulator's shared pool
    serves with (its shared nodes' cores over cpu_per_call), spread over the lead's
    environment seats."""
    from executors.fleetcpu import lanes, pool_slots
    from simulator.config import SimConfig
    from simulator.fleet import simulate_fleet

    fleet = load_fleet(str(EXAMPLE))
    calib = load_calibration(None)
    result = plan_fleet(fleet, calib, time_limit_s=10, job_time_limit_s=5, workers=1, seed=0)
    [use] = result.shared
    plans = {j.name: j.plan for j in result.jobs}
    sim = simulate_fleet(fleet, result, calib, iterations=1, config=SimConfig.no_variance())
    [simulated] = sim.cpu_pools
    slots = pool_slots(use, plans, fleet)
    assert slots == simulated.slots == use.nodes * 2  # 2 cores a laptop-cpu node, 1 a call
    seats = plans[use.jobs[0]].roles["environment"].devices
    assert lanes(slots, seats) * seats >= slots > (lanes(slots, seats) - 1) * seats
