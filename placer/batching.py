"""Continuous batching of weighted representative sequences on one engine replica, in closed form.

The placer's miniature of the simulator's engine (`simulator.engine`, which layer 1 may not
import), used by `placer.rollout_tail` to price a rollout's tail. Scheduling is the engine's:
admit waiting sequences while KV slots are free (a sequence holds its slot through its tool calls
and frees it when its last turn ends), run one prefill step over every admitted sequence's new
tokens at their mean context, then decode the whole batch one token per step until the next
sequence ends its turn or a tool call returns. A row of weight w is w identical sequences moving
together (split when only part of it fits the free slots), so batch sizes stay whole numbers.

Between two batch changes the batch B is fixed and its total KV context grows by B per step, so
step i costs f(i) = decode_step_time(B, C0 + B i) = max(m0 + k C, floor): a run of steps is at most
two arithmetic series, summed (and inverted, to stop at a tool call's return) in closed form from
three cost-model calls per batch size (`StepTerms`); a batch whose step lacks that shape (a cost
model changed under us) is summed step by step. With identical sequences every wave starts and
ends together and the result is `estimate.wave_time`'s lockstep waves exactly.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field, replace

from placer.costmodel import Efficiency, Parallel, decode_step_time, prefill_time
from placer.spec import DeviceType, ModelArch


@dataclass
class StepTerms:
    """decode_step_time(B, C) of one replica as max(m0 + k C, flat), per batch size B."""

    model: ModelArch
    dev: DeviceType
    par: Parallel  # one replica (dp = 1)
    eff: Efficiency
    terms: dict[int, tuple[float, float, float] | None] = field(default_factory=dict)
    prefills: dict[tuple[float, float], float] = field(default_factory=dict)

    PROBE = 1e9  # KV tokens far into the memory-bound regime

    def step(self, batch: int, context: float) -> float:
        return decode_step_time(self.model, self.dev, self.par, batch, context, self.eff)

    def of(self, batch: int) -> tuple[float, float, float] | None:
        if batch not in self.terms:
            hi, hi2 = self.step(batch, self.PROBE), self.step(batch, 2 * self.PROBE)
            k = (hi2 - hi) / self.PROBE
            m0, flat = hi - k * self.PROBE, self.step(batch, 0.0)
            probe = 3.7e4 * batch
            ok = math.isclose(max(m0 + k * probe, flat), self.step(batch, probe), rel_tol=1e-9)
            self.terms[batch] = (m0, k, flat) if ok else None
        return self.terms[batch]

    def prefill(self, tokens: float, ctx: float) -> float:
        key = (tokens, ctx)  # the same admissions recur across runs and candidates
        t = self.prefills.get(key)
        if t is None:
            t = self.prefills[key] = prefill_time(self.model, self.dev, self.par, tokens, ctx,
                                                  self.eff)
        return t


_SHARED: dict[tuple[int, int, Parallel, int], tuple[object, object, object, StepTerms]] = {}


def step_terms(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> StepTerms:
    """The replica's `StepTerms`, shared by every candidate with its layout (candidates differ
    in dp; one replica's steps do not), so each batch size is probed once per plan."""
    rep = replace(par, dp=1)  # the whole replica layout (EP, FP8, CUDA graphs), one replica
    key = (id(m), id(dev), rep, id(eff))
    hit = _SHARED.get(key)
    if hit is not None and hit[0] is m and hit[1] is dev and hit[2] is eff:
        return hit[3]
    if len(_SHARED) > 256:
        _SHARED.clear()
    st = StepTerms(m, dev, rep, eff)
    _SHARED[key] = (m, dev, eff, st)  # the objects too: their ids stay theirs while cached
    return st


class Run:
    """Cumulative time T(k) of k decode steps of a fixed batch from total context c0."""

    __slots__ = ("j", "f0", "a", "b", "table")

    def __init__(self, st: StepTerms, batch: int, c0: float, kmax: int) -> None:
        terms = st.of(batch)
        self.table: list[float] | None = None
        if terms is None:  # unknown shape: sum the steps one by one (slow, exact)
            self.table = [st.step(batch, c0 + batch * i) for i in range(kmax)]
            self.j, self.f0, self.a, self.b = kmax, 0.0, 0.0, 0.0
            return
        m0, k, flat = terms
        u0, du = m0 + k * c0, k * batch
        self.f0 = max(u0, flat)
        if u0 >= flat:
            self.j = 0
        elif du <= 0:
            self.j = kmax
        else:
            self.j = min(max(math.ceil((flat - u0) / du), 0), kmax)
        self.a, self.b = u0 + du * self.j, du

    def time(self, k: int) -> float:
        if self.table is not None:
            return sum(self.table[:k])
        if k <= self.j:
            return k * self.f0
        n = k - self.j
        return self.j * self.f0 + n * self.a + self.b * n * (n - 1) / 2

    def steps_to_reach(self, dt: float, kmax: int) -> int:
        """Smallest k in [1, kmax] with time(k) >= dt."""
        if dt <= 0:
            return 1
        if self.time(kmax) <= dt:
            return kmax
        if self.table is not None:
            k = 1
        elif dt <= self.j * self.f0:
            k = math.ceil(dt / self.f0)
        elif self.b <= 0:
            k = self.j + math.ceil((dt - self.j * self.f0) / self.a)
        else:  # n a + b n (n - 1) / 2 = rest
            q = self.a - self.b / 2
            k = self.j + math.ceil((-q + math.sqrt(q * q + 2 * self.b * (dt - self.j * self.f0)))
                                   / self.b)
        k = min(max(k, 1), kmax)
        while k > 1 and self.time(k - 1) >= dt:  # float guard: make k the smallest
            k -= 1
        while k < kmax and self.time(k) < dt:
            k += 1
        return k


def run_replica(st: StepTerms, prompt: list[int], response: list[list[int]],
                tool_s: list[list[float]], weight: list[int], concurrency: int,
                tool_output: int) -> list[tuple[float, int]]:
    """(finish time, sequences) of every row, in finishing order; `tool_s[i][c]` is the wait
    between turns c and c + 1 (none: the next turn follows at once)."""
    rows = len(prompt)
    turn, ctx, wt, pr = [0] * rows, [0] * rows, list(weight), list(prompt)
    resp, lat = [list(r) for r in response], [list(t) for t in tool_s]
    waiting = deque(range(rows))
    arrivals: list[tuple[float, int]] = []  # (time, row) back from a tool call
    active: list[tuple[int, int, int]] = []  # (engine step its turn ends, row, ctx0 - s0)
    held = batch = sum_a = steps = 0
    t = 0.0
    done: list[tuple[float, int]] = []
    while waiting or arrivals or active:
        new: list[tuple[int, int]] = []
        while waiting and held < concurrency:
            i = waiting[0]
            take = min(wt[i], concurrency - held)
            if take < wt[i]:  # split the row: `take` of its sequences start now
                wt[i] -= take
                i = len(wt)
                j = waiting[0]
                wt.append(take)
                turn.append(0)
                ctx.append(0)
                resp.append(resp[j])
                lat.append(lat[j])
                pr.append(pr[j])
            else:
                waiting.popleft()
            held += take
            new.append((i, pr[i]))
        while arrivals and arrivals[0][0] <= t:
            new.append((heapq.heappop(arrivals)[1], tool_output))
        if new:
            seqs = sum(wt[i] for i, _ in new)
            toks = sum(wt[i] * n for i, n in new)
            if toks > 0:
                t += st.prefill(toks, sum(wt[i] * (ctx[i] + n) for i, n in new) / seqs)
            for i, n in new:
                ctx[i] += n
                heapq.heappush(active, (steps + resp[i][turn[i]], i, ctx[i] - steps))
                sum_a += wt[i] * (ctx[i] - steps)
                batch += wt[i]
            if arrivals and arrivals[0][0] <= t:  # arrived during the prefill: admit first
                continue
        if not active:
            t = max(t, arrivals[0][0])
            continue
        kmax = active[0][0] - steps
        run = Run(st, batch, sum_a + batch * steps, kmax)
        k = kmax
        if arrivals and arrivals[0][0] < t + run.time(kmax):
            k = run.steps_to_reach(arrivals[0][0] - t, kmax)
        t += run.time(k)
        steps += k
        while active and active[0][0] <= steps:
            end, i, a = heapq.heappop(active)
            sum_a -= wt[i] * a
            batch -= wt[i]
            ctx[i] = a + end
            turn[i] += 1
            if turn[i] >= len(resp[i]):
                held -= wt[i]
                done.append((t, wt[i]))
            else:
                heapq.heappush(arrivals, (t + (lat[i][turn[i] - 1] if lat[i] else 0.0), i))
    return done
