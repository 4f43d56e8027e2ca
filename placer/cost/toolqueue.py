"""Tool calls queueing for CPU cores while the rollout engines keep decoding.

A multi-turn rollout's sequence keeps its engine slot while its tool call runs. When the engines
submit more calls at once than the environment's cores serve (`slots = cores // cpu_per_call`),
the calls queue first come, first served (`simulator.environment.CorePool`). Charging every queued
round to a whole lockstep wave overprices this: the engine admits each group of sequences as soon
as its calls return, so the later rounds' waits overlap the earlier groups' prefill and decoding.

Method: the lockstep waves of mean sequences (every source of variance off), replayed on all
replicas at once with the simulator engine's scheduling (`placer.cost.admission.engine`) and one
shared FIFO pool of `slots` servers. Replicas are coroutines resumed in time order, ties in the
order they were scheduled (simpy's rule), so calls reach the pool in the simulator's order. With
equal call latencies a FIFO pool's next-free times are nondecreasing, so the pool is a queue of
(free time, servers) chunks and a group of w identical calls is served in O(chunks). The queueing
cost is this makespan minus the same replay with unlimited cores: with variance off the rollout
estimate (`estimate._waves`) plus this difference is the simulator's rollout stage.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from placer.cost.admission import Hooks, engine
from placer.cost.batching import StepTerms
from placer.cost.rollout_tail import Replicas


@dataclass(slots=True)
class _Free:
    """`servers` servers that are free from time `at` on."""

    at: float
    servers: int


class FifoPool:
    """`slots` servers, first come first served, every call `latency_s` long (None: unlimited)."""

    def __init__(self, slots: int | None, latency_s: float) -> None:
        self.lat = latency_s
        self.free: deque[_Free] | None = None if slots is None else deque([_Free(0.0, slots)])

    def submit(self, t: float, calls: int) -> list[tuple[float, int]]:
        """(return time, calls) of `calls` identical calls arriving at `t`, earliest first."""
        if self.free is None:
            return [(t + self.lat, calls)]
        out: list[tuple[float, int]] = []
        free = self.free
        while calls:
            chunk = free[0]
            take = min(chunk.servers, calls)
            end = max(chunk.at, t) + self.lat
            if take == chunk.servers:
                free.popleft()
            else:
                chunk.servers -= take
            calls -= take
            if out and out[-1][0] == end:
                out[-1] = (end, out[-1][1] + take)
            else:
                out.append((end, take))
            if free and free[-1].at == end:  # the servers it took are free again at `end`
                free[-1].servers += take
            else:
                free.append(_Free(end, take))
        return out


def rollout_span(st: StepTerms, shape: Replicas, prompt: int, response: list[int],
                 tool_output: int, latency_s: float, slots: int | None) -> float:
    """Seconds until the rollout stage ends (over-provisioned: `kept` samples done) when every
    replica runs lockstep waves of identical samples and their calls share `slots` servers."""
    key = ("queue", shape, prompt, tuple(response), tool_output, latency_s, slots)
    return st.remember(key, lambda: _span(st, shape, prompt, response, tool_output, latency_s,
                                          slots))


def _span(st: StepTerms, shape: Replicas, prompt: int, response: list[int], tool_output: int,
          latency_s: float, slots: int | None) -> float:
    pool = FifoPool(slots, latency_s)
    done: list[tuple[float, int]] = []
    per, reps = shape.per_replica, shape.replicas
    big = shape.generated - (per - 1) * reps  # replicas given `per` samples (round-robin)
    heap: list[tuple[float, int, int]] = []
    engines = []
    for k in range(reps):
        n = per if k < big else per - 1
        if n <= 0:
            continue
        hooks = Hooks(lambda t, _i, _c, w: pool.submit(t, w),
                      lambda t, _i, w: done.append((t, w)))
        gen = engine(st, st.kv, [prompt], [list(response)], [n], tool_output, hooks, 0.0)
        engines.append(gen)
        heap.append((next(gen)[0], len(engines) - 1, len(engines) - 1))
    seq = len(engines)
    while heap:  # resume in time order, ties in scheduling order (as simpy does)
        t, _, k = heapq.heappop(heap)
        try:
            wake = engines[k].send(t)[0]
        except StopIteration:
            continue
        heapq.heappush(heap, (wake, seq, k))
        seq += 1
    span = max(t for t, _ in done)
    if shape.generated > shape.kept > 0:  # the stage ends once `kept` samples are done
        count = 0
        for t, w in sorted(done):
            count += w
            if count >= shape.kept:
                span = t
                break
    return span


MAX_REPLICAS = 8  # a rollout with more replicas is priced on this many (cores scaled alike)
REDUCE = 4  # a replica with more than REDUCE x concurrency samples is priced by extrapolation


def queue_delay(st: StepTerms, shape: Replicas, prompt: int, response: list[int],
                tool_output: int, latency_s: float, slots: int) -> float:
    """Seconds the rollout stage grows when its calls share `slots` servers instead of each
    finding one free: `rollout_span` with the pool minus without it (negative where an
    over-provisioned stage reaches its kept count sooner; the extrapolated line is kept >= 0).

    Exact (the simulator's variance-off run) up to MAX_REPLICAS replicas and REDUCE waves per
    replica. Beyond, the work per candidate pair is bounded: more replicas are priced on
    MAX_REPLICAS of them with the cores scaled by the same factor (the pool's rounds per wave are
    kept), and more waves by extending the line through REDUCE / 2 and REDUCE waves (the middle
    of a long rollout is a steady state), as `rollout_tail.makespan` does."""
    reps, per, conc = shape.replicas, shape.per_replica, shape.concurrency
    keep = shape.kept / shape.generated if shape.generated > shape.kept > 0 else 1.0
    if reps > MAX_REPLICAS:
        slots = max(round(slots * MAX_REPLICAS / reps), 1)
        reps = MAX_REPLICAS
        shape = Replicas(reps, per, conc, reps * per, math.ceil(reps * per * keep))

    def delay(n: int) -> float:
        sh = shape if n == per else Replicas(reps, n, conc, reps * n, math.ceil(reps * n * keep))
        return (rollout_span(st, sh, prompt, response, tool_output, latency_s, slots)
                - rollout_span(st, sh, prompt, response, tool_output, latency_s, None))

    if per <= REDUCE * conc:
        # exact, so unclipped: over-provisioned, the pool's staggered returns can end the stage
        # (the kept count) sooner than calls that all return at once, as the simulator runs it
        return delay(per)
    n2 = REDUCE * conc
    n1 = n2 // 2
    d1, d2 = delay(n1), delay(n2)
    return max(d2 + (d2 - d1) / (n2 - n1) * (per - n2), 0.0)
