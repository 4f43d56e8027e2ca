"""The shared CPU pool of an executed fleet without Ray (`executors.envpool.SharedEnvPool` over
stand-in workers whose calls finish when the test says), and the simulator's ledger of a shared
pool's cores.

Checked: first come, first served over the jobs' queues (not a round robin over jobs); a failed
call re-run once; the summary's measured waits beside the priced and simulated slowdowns; each
member's call timeout; one call per slot over the workers; a straggler's re-issue to another
worker (either copy may answer) or, in a one-worker pool, to the worker's other slot; members of
different `cpu_per_call` holding their own of the pool's cores (a wide call at the head holds the
queue); and the simulator's `CoreLedger` scheduling as its heap of servers at one width, holding
a wide call back, and re-issuing on free cores. The Ray runs are in
tests/test_fleet_cpu_execute.py.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from executors.envpool import SharedEnvPool


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
