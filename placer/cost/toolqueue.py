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
estimate (`estimate._waves`) plus this difference is the simulator's rollout stage. A rollout
split over pools replays every part's replicas, each on its own layout, against the one pool
(`queue_delays`): the parts' calls meet in the pool only where their bursts overlap in time.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
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
        self.last = 0.0  # the latest arrival: calls must come in time order, as in `CorePool`

    def submit(self, t: float, calls: int) -> list[tuple[float, int]]:
        """(return time, calls) of `calls` identical calls arriving at `t`, earliest first."""
        if t < self.last - 1e-9:
            raise ValueError(f"tool calls must arrive in time order ({t} < {self.last})")
        self.last = t
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


Engines = tuple[StepTerms, Replicas]  # one layout's replicas (a split rollout's part)


def rollout_span(st: StepTerms, shape: Replicas, prompt: int, response: list[int],
                 tool_output: int, latency_s: float, slots: int | None) -> float:
    """Seconds until the rollout stage ends (over-provisioned: `kept` samples done) when every
    replica runs lockstep waves of identical samples and their calls share `slots` servers."""
    return rollout_spans(((st, shape),), prompt, response, tool_output, latency_s, slots)[0]


def rollout_spans(groups: tuple[Engines, ...], prompt: int, response: list[int],
                  tool_output: int, latency_s: float, slots: int | None) -> tuple[float, ...]:
    """`rollout_span` of each group of replicas when all of them (a split rollout's parts, each
    on its own layout) run at once and their calls share one pool of `slots` servers. Kept on
    the first group's `StepTerms` by value: the other groups' layouts and every count."""
    st = groups[0][0]
    others = tuple((g.model, g.dev, g.par, g.eff) for g, _ in groups[1:])
    key = ("queue", tuple(sh for _, sh in groups), others, prompt, tuple(response), tool_output,
           latency_s, slots)
    return st.remember(key, lambda: _spans(groups, prompt, response, tool_output, latency_s,
                                           slots))


def _spans(groups: tuple[Engines, ...], prompt: int, response: list[int], tool_output: int,
           latency_s: float, slots: int | None) -> tuple[float, ...]:
    pool = FifoPool(slots, latency_s)
    done: list[list[tuple[float, int]]] = [[] for _ in groups]
    heap: list[tuple[float, int, int]] = []
    engines = []
    # engines start in group order, then replica order, as the simulator starts them
    for (st, shape), out in zip(groups, done):
        per, reps = shape.per_replica, shape.replicas
        big = shape.generated - (per - 1) * reps  # replicas given `per` samples (round-robin)
        for k in range(reps):
            n = per if k < big else per - 1
            if n <= 0:
                continue
            hooks = Hooks(lambda t, _i, _c, w: pool.submit(t, w), _recorder(out))
            gen = engine(st, st.kv, [prompt], [list(response)], [n], tool_output, hooks, 0.0)
            engines.append(gen)
            heap.append((next(gen)[0], len(engines) - 1, len(engines) - 1))
    heapq.heapify(heap)  # the replicas start at different times (uneven sample counts)
    seq = len(engines)
    while heap:  # resume in time order, ties in scheduling order (as simpy does)
        t, _, k = heapq.heappop(heap)
        try:
            wake = engines[k].send(t)[0]
        except StopIteration:
            continue
        heapq.heappush(heap, (wake, seq, k))
        seq += 1
    return tuple(_end(out, shape) for out, (_, shape) in zip(done, groups))


def _recorder(out: list[tuple[float, int]]) -> Callable[[float, int, int], None]:
    """A `Hooks.done` that appends (time, sequences) to `out`."""
    def done(t: float, _row: int, w: int) -> None:
        out.append((t, w))
    return done


def _end(done: list[tuple[float, int]], shape: Replicas) -> float:
    """When a group's stage ends: its last sample, or over-provisioned its `kept`-th."""
    if not done:
        return 0.0
    span = max(t for t, _ in done)
    if shape.generated > shape.kept > 0:  # the stage ends once `kept` samples are done
        count = 0
        for t, w in sorted(done):
            count += w
            if count >= shape.kept:
                return t
    return span


MAX_REPLICAS = 8  # a rollout with more replicas is priced on this many (cores scaled alike)
REDUCE = 4  # a replica with more than REDUCE x concurrency samples is priced by extrapolation


def queue_delay(st: StepTerms, shape: Replicas, prompt: int, response: list[int],
                tool_output: int, latency_s: float, slots: int) -> float:
    """Seconds the rollout stage grows when its calls share `slots` servers instead of each
    finding one free: `rollout_span` with the pool minus without it (negative where an
    over-provisioned stage reaches its kept count sooner; the extrapolated line is kept >= 0).
    One group of `queue_delays` (see there: where it is exact, how it bounds the work)."""
    return queue_delays(((st, shape),), prompt, response, tool_output, latency_s, slots)[0]


def queue_delays(groups: tuple[Engines, ...], prompt: int, response: list[int],
                 tool_output: int, latency_s: float, slots: int) -> tuple[float, ...]:
    """`queue_delay` of each group of replicas (a split rollout's parts) when all of them share
    one pool of `slots` servers, as the simulator's parts share the environment's `CorePool`:
    a part's calls queue behind another's only where their bursts meet in time.

    Exact (the simulator's variance-off run) up to MAX_REPLICAS replicas per group and REDUCE
    waves per replica. Beyond, the work per candidate pair is bounded: more replicas are priced
    on MAX_REPLICAS per group in all, each group's scaled by the same factor and the cores alike
    (the pool's rounds per wave are kept), and more waves by scaling every group's samples by
    one factor, to REDUCE waves on the replica with the most and to half that, and extending
    each group's line (the middle of a long rollout is a steady state), as
    `rollout_tail.makespan` does."""
    keeps = [sh.kept / sh.generated if sh.generated > sh.kept > 0 else 1.0 for _, sh in groups]
    total = sum(sh.replicas for _, sh in groups)
    if total > MAX_REPLICAS * len(groups):
        f = MAX_REPLICAS * len(groups) / total
        reps = [max(round(sh.replicas * f), 1) for _, sh in groups]
        slots = max(round(slots * sum(reps) / total), 1)
        groups = tuple((st, _even(sh, r, sh.per_replica, k))
                       for (st, sh), r, k in zip(groups, reps, keeps))

    def delays(ns: list[int]) -> tuple[float, ...]:
        gs = tuple((st, sh if n == sh.per_replica else _even(sh, sh.replicas, n, k))
                   for (st, sh), n, k in zip(groups, ns, keeps))
        pooled = rollout_spans(gs, prompt, response, tool_output, latency_s, slots)
        free = rollout_spans(gs, prompt, response, tool_output, latency_s, None)
        return tuple(a - b for a, b in zip(pooled, free))

    pers = [sh.per_replica for _, sh in groups]
    if all(per <= REDUCE * sh.concurrency for per, (_, sh) in zip(pers, groups)):
        # exact, so unclipped: over-provisioned, the pool's staggered returns can end the stage
        # (the kept count) sooner than calls that all return at once, as the simulator runs it
        return delays(pers)
    scale = min(REDUCE * sh.concurrency / per for per, (_, sh) in zip(pers, groups))
    n2 = [max(round(per * scale), 1) for per in pers]
    n1 = [n // 2 for n in n2]
    d1, d2 = delays(n1), delays(n2)
    return tuple(max(b + (b - a) / (m2 - m1) * (per - m2) if m2 > m1 else b, 0.0)
                 for a, b, m1, m2, per in zip(d1, d2, n1, n2, pers))


def _even(shape: Replicas, replicas: int, per: int, keep: float) -> Replicas:
    """`replicas` replicas of `shape`'s concurrency holding `per` samples each, keeping the
    `keep` share of them (over-provisioned)."""
    return Replicas(replicas, per, shape.concurrency, replicas * per,
                    math.ceil(replicas * per * keep))
