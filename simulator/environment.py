"""CPU pools: tool calls and rule rewards queue for cores.

A pool of `cores` cores serves calls that need `cpu_per_call` cores each, so at most
`slots = cores // cpu_per_call` calls run at once (the same rounds `costmodel.tool_waves` prices).
Calls are served first come, first served.

Method: a FIFO multi-server queue whose service times are known when a call arrives (the latency
is drawn up front) is solved exactly by keeping the servers' next-free times in a heap: a call
arriving at t starts at max(t, earliest free time) on that server. This is the same schedule a
simpy `Resource(capacity=slots)` would produce, without a process and four events per call, which
matters at 65,536 samples x several turns. Arrivals must be submitted in nondecreasing time order;
the simpy clock guarantees that (callers submit at `env.now`).

Speculative re-issue (the job's `tail_policy: {kind: reissue, deadline_s}`): a call whose latency
exceeds the deadline gets a copy, issued `deadline_s` (+ the fixed per-call overhead) after it
started, on the core that frees first among the others, with a fresh latency draw; the first copy
to finish wins and both cores are free from then on. The copy's core is taken when the original is
submitted (its start is in the future): a call arriving in between cannot take that core first,
a small departure from strict FIFO that only re-issued calls cause.

A pool shared by jobs of different `cpu_per_call` (a fleet's shared CPU pool, `simulator.fleet`)
counts cores, not servers: a `CoreLedger` of the pool's cores, where a call of a job takes that
job's `cpu_per_call` of them (`width`), and one `CorePool` per member (its slots `cores //
cpu_per_call`, its own waits and re-issues) submitting to it. First come, first served over all
the members' calls: a call starts at the earliest time, not before the previous call's start,
when its cores are free (a wide call at the head holds back the narrow ones behind it, as the
executed pool's queue does, `executors.envpool`). With one `cpu_per_call` the ledger schedules
exactly as the heap of `cores // cpu_per_call` servers does.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction


@dataclass
class CorePool:
    """One CPU pool seen as `slots` parallel servers, FIFO."""

    name: str
    slots: int
    _free: list[tuple[float, int]] = field(default_factory=list)
    busy_s: float = 0.0  # server-seconds of work served
    wait_s: float = 0.0  # total time calls waited for a free server
    calls: int = 0
    max_wait_s: float = 0.0
    _last_t: float = 0.0
    deadline_s: float | None = None  # re-issue a call still running this long after it began
    redraw: Callable[[], float] | None = None  # a fresh latency (overhead included) for a copy
    reissued: int = 0
    saved_s: float = 0.0  # call time saved by copies that won
    ledger: CoreLedger | None = None  # cores shared with members of other widths (docstring)
    width: float = 1.0  # cores one call takes on `ledger`

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"pool {self.name}: needs at least one slot (got {self.slots})")
        self._free = [(0.0, i) for i in range(self.slots)]
        heapq.heapify(self._free)

    def submit(self, t: float, service_s: float) -> tuple[float, float, int]:
        """A call arriving at `t` needing `service_s`: (start, end, server index)."""
        if t < self._last_t - 1e-9:
            raise ValueError(f"pool {self.name}: calls must arrive in time order ({t} < "
                             f"{self._last_t})")
        self._last_t = t
        if self.ledger is not None:
            return self._on_ledger(t, service_s)
        free_at, idx = self._free[0]
        start = free_at if free_at > t else t
        end = start + service_s
        if self.deadline_s is not None and service_s > self.deadline_s and self.slots > 1:
            end = self._reissue(start, service_s, idx)
        else:
            heapq.heapreplace(self._free, (end, idx))
            self.busy_s += service_s
        wait = start - t
        self.wait_s += wait
        self.calls += 1
        if wait > self.max_wait_s:
            self.max_wait_s = wait
        return start, end, idx

    def _on_ledger(self, t: float, service_s: float) -> tuple[float, float, int]:
        assert self.ledger is not None
        copy = None
        if self.deadline_s is not None and service_s > self.deadline_s:
            assert self.redraw is not None, "a re-issue needs deadline_s and redraw"
            copy = (self.deadline_s, self.redraw)
        start, end, idx, ran = self.ledger.submit(t, service_s, self.width, copy)
        if ran:
            self.reissued += 1
            self.saved_s += max(start + service_s - end, 0.0)
        self.busy_s += (end - start) + ran
        wait = start - t
        self.wait_s += wait
        self.calls += 1
        self.max_wait_s = max(self.max_wait_s, wait)
        return start, end, idx

    def _reissue(self, start: float, service_s: float, idx: int) -> float:
        """Run a copy of the call on the next free core from start + deadline; first wins."""
        deadline_s, redraw = self.deadline_s, self.redraw
        assert deadline_s is not None and redraw is not None, "a re-issue needs deadline_s and redraw"
        heapq.heappop(self._free)
        free2, idx2 = self._free[0]
        start2 = max(start + deadline_s, free2)
        end = start + service_s
        if start2 < end:
            end2 = start2 + redraw()
            if end2 < end:
                self.saved_s += end - end2
                end = end2
            if start2 < end:  # the copy ran (until the winner finished)
                heapq.heapreplace(self._free, (end, idx2))
                self.busy_s += end - start2
                self.reissued += 1
        heapq.heappush(self._free, (end, idx))
        self.busy_s += end - start
        return end


def pool_slots(cores: int, cpu_per_call: float) -> int:
    """Calls a pool runs at once (as `costmodel.tool_waves` counts a round)."""
    return max(int(cores // cpu_per_call), 1)


@dataclass
class CoreLedger:
    """The cores of a pool shared by calls of different widths, first come, first served
    (module docstring). `submit` returns (start, end, lane, seconds a re-issued copy ran)."""

    name: str
    cores: float
    _running: list[tuple[float, int, Fraction]] = field(default_factory=list)  # (end, lane, w)
    _used: Fraction = Fraction(0)
    _last_start: float = 0.0

    def _need(self, width: float) -> Fraction:
        return min(Fraction(width), Fraction(self.cores))  # a call wider than the pool: all

    def _pop(self) -> float:
        end, _, w = heapq.heappop(self._running)
        self._used -= w
        return end

    def submit(self, t: float, service_s: float, width: float,
               copy: tuple[float, Callable[[], float]] | None = None
               ) -> tuple[float, float, int, float]:
        """A call arriving at `t` needing `service_s` on `width` cores; `copy`: (deadline,
        redraw) of a re-issue when it runs past the deadline (on `width` more cores)."""
        w, cap = self._need(width), Fraction(self.cores)
        start = max(t, self._last_start)
        while self._running and self._running[0][0] <= start:
            self._pop()
        while self._used + w > cap:
            start = max(start, self._pop())
        while self._running and self._running[0][0] <= start:
            self._pop()
        self._last_start = start
        end, ran = start + service_s, 0.0
        lanes = {lane for _, lane, _ in self._running}
        lane = next(k for k in range(len(lanes) + 1) if k not in lanes)
        if copy is not None:
            start2 = self._free_at(start + copy[0], 2 * w, end)
            if start2 is not None:
                end = min(end, start2 + copy[1]())
                ran = end - start2
                lanes.add(lane)
                lane2 = next(k for k in range(len(lanes) + 1) if k not in lanes)
                heapq.heappush(self._running, (end, lane2, w))
                self._used += w
        heapq.heappush(self._running, (end, lane, w))
        self._used += w
        return start, end, lane, ran

    def _free_at(self, at: float, need: Fraction, before: float) -> float | None:
        """The first time from `at`, before `before`, with `need` cores free beside the running
        calls (None: none)."""
        used, x = self._used, at
        for end, _, w in sorted(self._running):
            if used + need <= Fraction(self.cores):
                break
            if end > x:
                x = end
            used -= w
        if used + need > Fraction(self.cores) or x >= before:
            return None
        return x
