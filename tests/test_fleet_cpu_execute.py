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
summary beside the priced slowdown. Without Ray: the pool's first-come-first-served order over
the jobs' queues (not a round robin over jobs), its slots over its workers and each member's
cores, a straggler's re-issue (either copy may answer; in a one-worker pool to its other slot),
its re-run of a failed call, the simulator's slot count per member, and the address checks (a
malformed or unreachable `--address` exits 2 with one line, before any planning).
"""
from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
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
    assert doc["jobs"]["a"] == {"slots": 1, "calls": 1, "waited_s": 0.0, "mean_wait_s": 0.0,
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


@dataclass
class _Straggle:
    """A pool of `workers` whose call x0 is past its timeout, and the copy of it started."""

    ex: list[_Execute]
    workers: list[_Worker]
    pool: SharedEnvPool
    got: dict[str, Any]
    asker: threading.Thread
    copy: tuple[_Execute, int]  # the worker's `execute` running x0's copy, and its call index


@contextmanager
def _straggling(workers: int) -> Iterator[_Straggle]:
    """Two calls x0, x1 on two slots (of two workers, or of one worker: its two threads),
    timed at 3 x 1 ms: x1 answers, x0 is past its timeout and its copy takes x1's freed slot
    (another worker's, or the one worker's other thread). The pool closes on exit."""
    ex = [_Execute(pid=10 + k) for k in range(workers)]
    ws = [_Worker(_Handle(e), rank=k) for k, e in enumerate(ex)]
    pool = SharedEnvPool("cpu", ["a"], ws, 2, {"a": 1e-3})  # type: ignore[arg-type]
    got: dict[str, Any] = {}
    try:
        t = _asker(pool, "a", [["x0"], ["x1"]], got)
        _started(ex[0], 2 if workers == 1 else 1)
        _started(ex[-1], 2 if workers == 1 else 1)
        second = ex[-1]
        second.finish(1 if workers == 1 else 0)  # x1 answers: x0's copy takes its slot
        k = 2 if workers == 1 else 1
        _started(second, k + 1)
        assert second.started[k][0] == ["x0"]
        yield _Straggle(ex, ws, pool, got, t, (second, k))
    finally:
        pool.close()


def test_a_straggler_is_reissued_to_another_worker_and_the_copy_answers() -> None:
    """A call past its timeout (3 x the priced call time) is issued again to the other
    worker's slot as soon as it frees; the copy answers first, so its answer is taken, its
    worker named, and the re-issue recorded and traced; the slow original is ignored."""
    from executors.fleetcpu import pool_trace
    from traces.schema import Trace

    with _straggling(2) as s:
        s.ex[1].finish(1)  # the copy answers first
        s.asker.join(timeout=30)
        s.ex[0].finish(0)  # the original, late: ignored
    [(v0, _, w0), (v1, _, w1)] = s.got["a"][0]
    assert v0 == [{"status": "ok", "value": "x0"}] and w0 is s.workers[1] and w1 is s.workers[1]
    [late] = s.pool.reissues("a")
    assert late.pid == 11 and late.worker == 1 and late.slot == 0
    assert late.reissue is not None and late.reissue.to_dict() == {
        "slow_worker": 0, "reissued_to": 1, "reissued_slot": 1,
        "deadline_s": pytest.approx(3e-3), "winner": "reissue"}
    assert len(s.pool.records) == 2  # one record per call, whichever copy answered
    trace = Trace()
    pool_trace(trace, s.pool, 0.0)
    [marker] = trace.of("straggler")
    assert marker.tid == "worker 0" and marker.args["reissued_to"] == 1


def test_the_original_answering_first_wins_over_its_copy() -> None:
    with _straggling(2) as s:
        s.ex[0].finish(0)  # the original answers first
        s.asker.join(timeout=30)
        s.ex[1].finish(1)  # the copy, late: ignored, its slot freed
        with s.pool._cond:
            assert s.pool._cond.wait_for(lambda: len(s.pool._free) == 2, timeout=30)
    [(_, _, w0), _] = s.got["a"][0]
    assert w0 is s.workers[0]
    [late] = s.pool.reissues("a")
    assert late.reissue is not None and late.reissue.winner == "original" and late.pid == 10


def test_a_one_worker_pools_straggler_is_reissued_to_its_other_slot() -> None:
    """One worker of two slots (threads): a call past its timeout is issued again to the
    worker's other slot, the first answer taken, recorded and traced as a re-issue to another
    worker is (same worker, another slot); the slow original's answer is ignored."""
    from executors.fleetcpu import pool_trace
    from traces.schema import Trace

    with _straggling(1) as s:
        runner, k = s.copy
        runner.finish(k)  # the copy, on slot 1, answers first
        s.asker.join(timeout=30)
        s.ex[0].finish(0)  # the original, late: ignored
        with s.pool._cond:
            assert s.pool._cond.wait_for(lambda: len(s.pool._free) == 2, timeout=30)
    [(v0, _, w0), (v1, _, _)] = s.got["a"][0]
    assert v0 == [{"status": "ok", "value": "x0"}] and v1 == [{"status": "ok", "value": "x1"}]
    assert w0 is s.workers[0]
    [late] = s.pool.reissues("a")
    assert late.pid == 10 and late.worker == 0 and late.slot == 0
    assert late.reissue is not None and late.reissue.to_dict() == {
        "slow_worker": 0, "reissued_to": 0, "reissued_slot": 1,
        "deadline_s": pytest.approx(3e-3), "winner": "reissue"}
    assert len(s.pool.records) == 2
    trace = Trace()
    pool_trace(trace, s.pool, 0.0)
    [marker] = trace.of("straggler")
    assert marker.tid == "worker 0" and marker.args["reissued_slot"] == 1


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


def test_members_of_wider_calls_hold_more_of_the_pools_cores() -> None:
    """4 cores, a's calls 1 core, b's 2: a runs 4 at once, b 2; with 3 of a's calls running
    b's call (asked next) waits for 2 free cores, and a's call asked after it waits behind it
    (first come, first served), though a core is free."""
    ex, workers = _two_workers()
    pool = SharedEnvPool("cpu", ["a", "b"], workers, 4, cores=4,  # type: ignore[arg-type]
                         cpu_per_call={"a": 1.0, "b": 2.0})
    assert (pool.slots_of("a"), pool.slots_of("b")) == (4, 2)
    got: dict[str, Any] = {}
    try:
        ta = _asker(pool, "a", [["a0"], ["a1"], ["a2"]], got)
        _started(ex[0], 2)
        _started(ex[1], 1)
        tb = _asker(pool, "b", [["b0"]], got)
        _queued(pool, "b", 1)
        ta2 = _asker(pool, "a", [["a3"]], got)
        _queued(pool, "a", 1)
        assert len(ex[0].started) + len(ex[1].started) == 3  # one core free, b0 needs two
        ex[1].finish(0)  # a1 answers: two cores free, b0 takes them, a3 still waits
        _started(ex[1], 2)
        assert ex[1].started[1][0] == ["b0"] and pool._queues["a"][0].call.size == 1
        ex[0].finish(0)  # a0 answers: a3's core
        _started(ex[0], 3)
        assert ex[0].started[2][0] == ["a3"]
        for e, k in ((ex[0], 1), (ex[1], 1), (ex[0], 2)):
            e.finish(k)
        for t in (ta, tb, ta2):
            t.join(timeout=30)
    finally:
        pool.close()
    assert [c.job for c in sorted(pool.records, key=lambda c: c.started)] == [
        "a", "a", "a", "b", "a"]
    assert pool.waits("b")[0] > 0


def test_the_simulators_core_ledger_schedules_as_its_servers_at_one_width() -> None:
    """The shared pool's ledger of cores (members of different cpu_per_call) gives the heap
    of cores // cpu_per_call servers' schedule when every call has one width, and holds a
    wide call back until its cores are free (and the narrow calls behind it)."""
    import random

    from simulator.environment import CoreLedger, CorePool

    rng = random.Random(7)
    arrivals = sorted(rng.uniform(0, 10) for _ in range(200))
    servers = CorePool("cpu", 3)
    ledger = CorePool("cpu", 3, ledger=CoreLedger("cpu", 6), width=2.0)
    for t in arrivals:
        s = rng.expovariate(1.0)
        assert ledger.submit(t, s)[:2] == pytest.approx(servers.submit(t, s)[:2])
    assert ledger.wait_s == pytest.approx(servers.wait_s) and ledger.calls == 200
    shared = CoreLedger("cpu", 4)
    narrow = CorePool("cpu", 4, ledger=shared, width=1.0)
    wide = CorePool("cpu", 2, ledger=shared, width=2.0)
    assert [narrow.submit(0.0, 5.0)[0] for _ in range(3)] == [0.0, 0.0, 0.0]
    assert wide.submit(1.0, 1.0)[:2] == (5.0, 6.0)  # one core free until 5 s
    assert narrow.submit(2.0, 1.0)[0] == 5.0  # behind the wide call, first come first served
    # a call past its member's deadline: a copy on its width of free cores, the first wins
    late = CorePool("cpu", 2, ledger=CoreLedger("cpu", 4), width=2.0, deadline_s=1.0,
                    redraw=lambda: 0.5)
    assert late.submit(0.0, 5.0)[:2] == (0.0, 1.5) and late.reissued == 1
    assert late.saved_s == pytest.approx(3.5)
    assert late.submit(0.0, 0.5)[0] == 1.5  # both copies held the 4 cores until 1.5 s


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
