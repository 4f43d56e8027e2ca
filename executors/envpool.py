"""A CPU environment pool shared by several jobs of an executed fleet: one set of environment
workers, its call slots, per-job queues, first come first served, and slow calls re-issued.

The fleet's plan shares a CPU pool (`shared.cpu_pools`, `placer.fleet.sharing`) by giving its
members one count of the pool's nodes, charged once. Executed (`executors.fleetrun`), the pool is
the environment workers of its first member's plan (one per seat the plan puts on the pool's
nodes); the other members start no environment workers of their own, and every member's sandbox
calls - the tool calls between turns and each final answer's verification run
(`executors.rollouts.EnvironmentCalls`) - go to this pool's queue.

Slots and cores. The pool holds the cores of the plan's shared nodes; a call of a member takes
that member's `cpu_per_call` of them (`cores`, `cpu_per_call`), so each member alone runs
`cores // cpu_per_call` calls at once (`executors.fleetcpu.pool_slots`: the count the cost model
prices a wave with and the simulator's shared pool serves with, `simulator.environment`), and
members of different `cpu_per_call` share the cores as the simulator's shared pool shares them.
The slots are the threads the calls run in (the most calls at once, those of the member with the
smallest `cpu_per_call`), spread over the workers round robin (slot s on worker s mod W; each
worker's actor runs its slots' calls in threads, one fresh sandbox per call); without `cores`
every call takes one of `slots` cores. A job's request is cut into one call per slot it may hold,
as an unshared job cuts it into one per worker.

Policy. Each job has a FIFO queue of calls (a call: one slot's share of a request). When a slot
and the cores of the call at the head of the queue whose head arrived first are free, that call
starts (a head whose cores are not free yet waits, and the calls behind it too): first come, first
served over all the jobs' calls, the simulator's FIFO multi-server queue, and the allocation's pricing
(`placer.fleet.sharing`). A free slot is taken on the worker running the fewest calls. The
per-job queues keep each job's wait apart: a `PoolCall` records when the call was asked for,
when a slot took it, when it returned, and the pid of the worker process that ran it (the
worker's own `os.getpid()`, read off its timing).

Stragglers. A call still running past its timeout is issued again, once, to a slot of another
worker, or, in a pool of one worker, to another slot (thread) of that worker (the first that
frees with the call's cores, ahead of the queues, as the simulator's re-issue takes the next
free core); the first copy to return is the call's answer and the other is ignored (a running
actor task cannot be interrupted; the sandbox is a pure function of the answer, so either copy
gives the same values). The timeout is the job's tail-policy deadline where it sets one (what
the unshared executor re-issues at, `executors.stragglers`), else `STRAGGLER_FACTOR` times the
call's expected time: its answers times the larger of the priced time of one tool call (the
cost model's latency plus overhead, `executors.fleetcpu.priced_call_s`) and the median per
answer of the calls this pool has run (a host slower than priced does not re-issue every
call). Each re-issue is on its call's record (`Reissue`) and in the trace.

One thread per pool starts calls (a Ray call is never started from Ray's completion callbacks);
a call's completion frees its slot from Ray's callback. A failed call (its worker died: Ray
restarts it, `max_restarts`) with no copy still running is queued again at the head of its job's
queue, once.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from executors.placement import Member

RETRIES = 1  # re-queues of a failed call before the job's request fails
STRAGGLER_FACTOR = 3.0  # a call this many times its expected time is re-issued
OBSERVED = 64  # the per-answer times of the last calls that set the expected time


@dataclass
class Reissue:
    """A call's copy on another worker: the slow worker, the copy's, the timeout it missed, when
    the copy started (time.time()) and which copy answered."""

    slow_worker: int
    to_worker: int
    deadline_s: float
    at: float
    winner: str = "original"  # or "reissue"
    to_slot: int = -1  # the copy's slot (another thread of the same worker in a one-worker pool)

    def to_dict(self) -> dict[str, Any]:
        return {"slow_worker": self.slow_worker, "reissued_to": self.to_worker,
                "reissued_slot": self.to_slot, "deadline_s": round(self.deadline_s, 4),
                "winner": self.winner}


@dataclass
class PoolCall:
    """One call on the shared pool: a job's slice of answers, run on one slot."""

    job: str
    step: int
    what: str  # tool call | verify
    size: int  # answers in the call
    asked: float  # time.time() it was queued
    started: float = 0.0  # a slot took it
    ended: float = 0.0  # its answer came back
    worker: int = -1  # the environment worker (rank in the pool) whose answer was taken
    pid: int | None = None  # the answering worker's process (from its own timing)
    slot: int = -1  # the slot the call first ran on
    reissue: Reissue | None = None

    @property
    def waited_s(self) -> float:
        return max(self.started - self.asked, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "step": self.step, "what": self.what, "size": self.size,
                "waited_s": round(self.waited_s, 4),
                "ran_s": round(max(self.ended - self.started, 0.0), 4),
                "worker": self.worker, "slot": self.slot, "pid": self.pid,
                "reissue": None if self.reissue is None else self.reissue.to_dict()}


@dataclass
class _Request:
    call: PoolCall
    args: tuple[Any, ...]
    seq: int
    result: Future[Any] = field(default_factory=Future)
    tries: int = 0
    running: set[int] = field(default_factory=set)  # slots running a copy of it
    limit: float | None = None  # its timeout (None: never re-issued)
    due: float | None = None  # time.time() past which it is a straggler
    copied: bool = False
    done: bool = False


class SharedEnvPool:
    """The shared workers of one CPU pool, their slots and the jobs' queues (module
    docstring). `slots`: calls run at once (one per worker if not given); `call_s`: per job, the
    priced seconds of one tool call; `deadline_s`: per job, its tail-policy timeout of a call
    (a job in neither is never re-issued); `cores` and `cpu_per_call` (per job): the pool's
    cores and each member's call's (None: every call takes one of `slots` cores)."""

    def __init__(self, pool: str, jobs: Sequence[str], workers: Sequence[Member],
                 slots: int | None = None, call_s: dict[str, float] | None = None,
                 deadline_s: dict[str, float] | None = None, cores: float | None = None,
                 cpu_per_call: dict[str, float] | None = None) -> None:
        if not workers:
            raise ValueError(f"shared CPU pool {pool}: no environment workers")
        self.pool, self.jobs, self.workers = pool, list(jobs), list(workers)
        self.slots = max(slots if slots is not None else len(self.workers), 1)
        self.call_s, self.deadline_s = dict(call_s or {}), dict(deadline_s or {})
        self.cores = Fraction(cores) if cores is not None else Fraction(self.slots)
        # a call asking more than the pool's cores takes them all (at least one call runs)
        self._need = {j: min(Fraction((cpu_per_call or {}).get(j, 1.0)), self.cores)
                      for j in self.jobs}
        self._used = Fraction(0)  # cores the running calls (and copies) hold
        self.records: list[PoolCall] = []
        self._queues: dict[str, deque[_Request]] = {j: deque() for j in self.jobs}
        self._free = set(range(self.slots))
        self._busy = [0] * len(self.workers)  # calls running per worker
        self._running: list[_Request] = []  # originals that may still turn stragglers
        self._late: list[_Request] = []  # stragglers waiting for a slot on another worker
        self._per_answer: deque[float] = deque(maxlen=OBSERVED)
        self._cond = threading.Condition()
        self._seq = 0
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"envpool-{pool}", daemon=True)
        self._thread.start()

    @property
    def lanes(self) -> int:
        """The most slots one worker holds: the calls its actor must run at once."""
        return -(-self.slots // len(self.workers))

    def slots_of(self, job: str) -> int:
        """Calls of `job` the pool runs at once: its cores over the job's `cpu_per_call` (at
        least one; `executors.fleetcpu.pool_slots`), at most the slots."""
        return max(min(int(self.cores // self._need[job]), self.slots), 1)

    def worker_of(self, slot: int) -> int:
        return slot % len(self.workers)

    # ------------------------------------------------------------------ the jobs' side
    def run(self, job: str, step: int, what: str, slices: Sequence[tuple[list[str], list[str]]]
            ) -> list[tuple[list[dict[str, Any]], dict[str, Any], Member]]:
        """Queue one call per (ids, answers) slice for `job`, wait for all: each call's
        (results, timing, worker whose answer was taken) in the slices' order."""
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

    def timeout_s(self, call: PoolCall) -> float | None:
        """The call's timeout (module docstring); None: the job's calls are not re-issued."""
        if call.job in self.deadline_s:
            return self.deadline_s[call.job]
        if call.job not in self.call_s:
            return None
        seen = statistics.median(self._per_answer) if self._per_answer else 0.0
        return STRAGGLER_FACTOR * call.size * max(self.call_s[call.job], seen)

    # ------------------------------------------------------------------ the pool's side
    def _serve(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    picked = self._pick(time.time())
                    if picked is not None:
                        break
                    self._cond.wait(self._until_due())
                req, slot, copy = picked
                self._free.discard(slot)
                self._used += self._need[req.call.job]
                self._busy[self.worker_of(slot)] += 1
                req.running.add(slot)
                self._mark_started(req, slot, copy)
            self._start(req, slot, copy)

    def _pick(self, now: float) -> tuple[_Request, int, bool] | None:
        """The next (request, slot, whether a straggler's copy) to start, or None."""
        for r in [r for r in self._running if r.due is not None and now >= r.due]:
            self._running.remove(r)
            if not r.done and r.running and (len(self.workers) > 1 or self.slots > 1):
                self._late.append(r)
        self._late = [r for r in self._late if not r.done and r.running]
        for r in self._late:
            other = self._copy_slots(r)
            if other:
                self._late.remove(r)
                return r, self._least_busy(other), True
        heads = [q[0] for q in self._queues.values() if q]
        if not heads or not self._free:
            return None
        best = min(heads, key=lambda r: (r.call.asked, r.seq))
        if not self._fits(best):  # first come, first served: the head waits for its cores
            return None
        self._queues[best.call.job].popleft()
        return best, self._least_busy(self._free), False

    def _fits(self, req: _Request) -> bool:
        return self._used + self._need[req.call.job] <= self.cores

    def _copy_slots(self, r: _Request) -> list[int]:
        """Free slots a straggler's copy may take: another worker's, or in a pool of one
        worker another of its slots; none while the call's cores are not free."""
        if not self._fits(r):
            return []
        busy = {self.worker_of(s) for s in r.running}
        if len(self.workers) == 1:
            return [s for s in self._free if s not in r.running]
        return [s for s in self._free if self.worker_of(s) not in busy]

    def _least_busy(self, slots: Sequence[int] | set[int]) -> int:
        return min(slots, key=lambda s: (self._busy[self.worker_of(s)], s))

    def _until_due(self) -> float | None:
        """Seconds until the next running call turns straggler (None: none may)."""
        dues = [r.due for r in self._running if r.due is not None]
        return max(min(dues) - time.time(), 0.0) + 1e-3 if dues else None

    def _mark_started(self, req: _Request, slot: int, copy: bool) -> None:
        now = time.time()
        if copy:
            assert req.limit is not None
            req.copied = True
            req.call.reissue = Reissue(self.worker_of(req.call.slot), self.worker_of(slot),
                                       req.limit, now, to_slot=slot)
            return
        req.call.slot, req.call.started = slot, now
        req.limit = None if req.copied else self.timeout_s(req.call)
        req.due = None if req.limit is None else now + req.limit
        if req.due is not None:
            self._running.append(req)

    def _start(self, req: _Request, slot: int, copy: bool) -> None:
        try:
            ref = self.workers[self.worker_of(slot)].handle.execute.remote(*req.args)
            fut = ref.future()
        except Exception as e:  # noqa: BLE001 - reported to the job that asked
            self._finish(req, slot, copy, None, e)
            return
        fut.add_done_callback(lambda f: self._finish(req, slot, copy, f, None))

    def _finish(self, req: _Request, slot: int, copy: bool, fut: Future[Any] | None,
                error: BaseException | None) -> None:
        if fut is not None:
            error = fut.exception()
        with self._cond:
            self._free.add(slot)
            self._used -= self._need[req.call.job]
            self._busy[self.worker_of(slot)] -= 1
            req.running.discard(slot)
            self._cond.notify_all()
            if req.done or (error is not None and req.running):
                return  # the other copy answered, or still may
            if error is not None and req.tries < RETRIES:  # the worker restarts: run it again
                req.tries += 1
                req.call.started, req.call.slot, req.call.reissue = 0.0, -1, None
                req.due = None
                self._queues[req.call.job].appendleft(req)
                return
            req.done = True
            if req in self._running:
                self._running.remove(req)
            req.call.ended = time.time()
            if error is None:
                req.call.worker = self.worker_of(slot)
                if req.call.reissue is not None:
                    req.call.reissue.winner = "reissue" if copy else "original"
                elif req.call.size:
                    self._per_answer.append((req.call.ended - req.call.started) / req.call.size)
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

    def reissues(self, job: str) -> list[PoolCall]:
        return [c for c in self.records if c.job == job and c.reissue is not None]
