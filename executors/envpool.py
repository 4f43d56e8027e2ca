"""A CPU environment pool shared by several jobs of an executed fleet: one set of environment
workers, per-job queues, first come first served.

The fleet's plan shares a CPU pool (`shared.cpu_pools`, `placer.fleet.sharing`) by giving its
members one count of the pool's nodes, charged once. Executed (`executors.fleetrun`), the pool is
the environment workers of its first member's plan (one per seat the plan puts on the pool's
nodes); the other members start no environment workers of their own, and every member's sandbox
calls - the tool calls between turns and each final answer's verification run
(`executors.rollouts.EnvironmentCalls`) - go to this pool's queue.

Policy. Each job has a FIFO queue of calls (a call: one worker's share of a request, the slice of
answers an unshared job would send to one of its environment workers). A worker that frees takes
the call at the head of the queue whose head arrived first: first come, first served over all
the jobs' calls. That is the simulator's shared-pool model (`simulator.environment.CorePool`: a
FIFO multi-server queue) and the allocation's pricing (`placer.fleet.sharing`: with every job's
calls of a wave waiting at once, a job's calls get cores in proportion to its share of what
waits). The per-job queues are kept so that each job's wait is measured apart: a `PoolCall`
records when the call was asked for, when a worker took it and when it returned, and the pid of
the worker process that ran it (the worker's own `os.getpid()`, read off its timing).

One thread per pool starts calls (a Ray call is never started from Ray's completion callbacks);
a call's completion frees its worker from Ray's callback. A failed call (its worker died: Ray
restarts it, `max_restarts`) is queued again at the head of its job's queue, once.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from executors.placement import Member

RETRIES = 1  # re-queues of a failed call before the job's request fails


@dataclass
class PoolCall:
    """One call on the shared pool: a job's slice of answers, run on one worker."""

    job: str
    step: int
    what: str  # tool call | verify
    size: int  # answers in the call
    asked: float  # time.time() it was queued
    started: float = 0.0  # a worker took it
    ended: float = 0.0  # its result came back
    worker: int = -1  # the environment worker's rank in the pool
    pid: int | None = None  # the worker's process (from its own timing)

    @property
    def waited_s(self) -> float:
        return max(self.started - self.asked, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "step": self.step, "what": self.what, "size": self.size,
                "waited_s": round(self.waited_s, 4),
                "ran_s": round(max(self.ended - self.started, 0.0), 4),
                "worker": self.worker, "pid": self.pid}


@dataclass
class _Request:
    call: PoolCall
    args: tuple[Any, ...]
    seq: int
    result: Future[Any] = field(default_factory=Future)
    tries: int = 0


class SharedEnvPool:
    """The shared workers of one CPU pool and the jobs' queues (see the module docstring)."""

    def __init__(self, pool: str, jobs: Sequence[str], workers: Sequence[Member]) -> None:
        if not workers:
            raise ValueError(f"shared CPU pool {pool}: no environment workers")
        self.pool, self.jobs, self.workers = pool, list(jobs), list(workers)
        self.records: list[PoolCall] = []
        self._queues: dict[str, deque[_Request]] = {j: deque() for j in self.jobs}
        self._free = list(range(len(self.workers)))
        self._cond = threading.Condition()
        self._seq = 0
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"envpool-{pool}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the jobs' side
    def run(self, job: str, step: int, what: str, slices: Sequence[tuple[list[str], list[str]]]
            ) -> list[tuple[list[dict[str, Any]], dict[str, Any], Member]]:
        """Queue one call per (ids, answers) slice for `job`, wait for all: each call's
        (results, timing, worker) in the slices' order."""
        now = time.time()
        reqs = []
        with self._cond:
            for ids, answers in slices:
                reqs.append(_Request(PoolCall(job, step, what, len(answers), now),
                                     (ids, answers), self._seq))
                self._seq += 1
            self._queues[job].extend(reqs)
            self._cond.notify_all()
        out = []
        for r in reqs:
            vals, timing = r.result.result()
            out.append((vals, timing, self.workers[r.call.worker]))
        return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ the pool's side
    def _next(self) -> _Request | None:
        """The head call that arrived first over every job's queue (FCFS)."""
        heads = [q[0] for q in self._queues.values() if q]
        if not heads:
            return None
        best = min(heads, key=lambda r: (r.call.asked, r.seq))
        self._queues[best.call.job].popleft()
        return best

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._free and any(self._queues.values())):
                    self._cond.wait()
                if self._closed:
                    return
                req = self._next()
                assert req is not None
                k = self._free.pop(0)
            self._start(req, k)

    def _start(self, req: _Request, k: int) -> None:
        req.call.worker, req.call.started = k, time.time()
        try:
            ref = self.workers[k].handle.execute.remote(*req.args)
            fut = ref.future()
        except Exception as e:  # noqa: BLE001 - reported to the job that asked
            self._finish(req, k, None, e)
            return
        fut.add_done_callback(lambda f: self._finish(req, k, f, None))

    def _finish(self, req: _Request, k: int, fut: Future[Any] | None,
                error: BaseException | None) -> None:
        if fut is not None:
            error = fut.exception()
        with self._cond:
            self._free.append(k)
            self._free.sort()
            if error is not None and req.tries < RETRIES:  # the worker restarts: run it again
                req.tries += 1
                req.call.started = 0.0
                self._queues[req.call.job].appendleft(req)
                self._cond.notify_all()
                return
            self._cond.notify_all()
        req.call.ended = time.time()
        if error is not None:
            req.result.set_exception(RuntimeError(
                f"environment (shared CPU pool {self.pool}): calls keep failing: "
                f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"))
            return
        assert fut is not None
        vals, timing = fut.result()
        req.call.pid = timing.get("pid")
        with self._cond:
            self.records.append(req.call)
        req.result.set_result((vals, timing))

    # ------------------------------------------------------------------ what was measured
    def waits(self, job: str) -> list[float]:
        return [c.waited_s for c in self.records if c.job == job]

    def pids(self, job: str) -> set[int]:
        return {c.pid for c in self.records if c.job == job and c.pid is not None}
