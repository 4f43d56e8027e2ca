"""One engine replica's scheduling loop: admission by KV tokens, preemption by recompute.

The one loop that the planner (`run_replica` for `placer.cost.rollout_tail`,
`placer.cost.toolqueue`) and the simulator (`simulator.engine`) run, so they agree exactly with
variance off. It follows vLLM's v1 scheduler (vllm/v1/core/sched/scheduler.py) at the
granularity of batch changes: admit first come, first served while the free KV covers a
sequence's new tokens and fewer than `max_num_seqs` run; prefill the admitted sequences in one
step; decode until a turn ends, a tool call returns or the KV is full (a closed-form step, since
the KV in use grows by the batch per step); then preempt the newest sequences, which prefill their
whole context again when readmitted. A sequence holds its KV through its tool calls.

Rows: row i stands for weight[i] identical sequences moving together; a row is split when only
part of it is admitted, preempted, or returns from its tool calls at one time.

The rules in full and what is left out: docs/cost-model.md, "KV admission and continuous
batching".
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass

from placer.cost.batching import KvBudget, Run, StepTerms
from placer.cost.roofline import chunk_seq

# (time, source row, call index, sequences) -> [(return time, sequences)], earliest first
Calls = Callable[[float, int, int, int], list[tuple[float, int]]]


def _nothing(*_: object) -> None:
    return None


@dataclass
class Hooks:
    """What the loop reports and asks: tool calls (`calls`), finished sequences (`done`: time,
    source row, sequences), and, for traces and stats, each prefill (start, seconds, sequences,
    tokens, summed context, attention span priced), decode run (start, seconds, batch, steps,
    starting KV context) and preemption (time, sequences, context each)."""

    calls: Calls
    done: Callable[[float, int, int], None]
    prefill: Callable[[float, float, int, int, float, float], None] = _nothing
    decode: Callable[[float, float, int, int, int], None] = _nothing
    preempt: Callable[[float, int, int], None] = _nothing
    slow: float = 1.0  # every duration is multiplied by this (a straggler's slowdown)


def engine(st: StepTerms, kv: KvBudget, prompt: list[int], response: list[list[int]],
           weight: list[int], tool_output: int, hooks: Hooks, start: float
           ) -> Generator[tuple[float, float], float, None]:
    """The replica's loop from time `start`; yields (wake time, busy until) and is sent the time
    it resumes at (>= the wake time; `busy until` <= wake: the rest is idle waiting)."""
    s = _State(prompt, response, weight)
    # the row lists as locals (a clone appends to these same lists): this loop runs ~10^6
    # times for one large cost table, and attribute lookups were a third of its time
    wt, pend, ctx, a, end, order, left = s.wt, s.pend, s.ctx, s.a, s.end, s.order, s.left
    cap, slow, state, max_seqs, block = kv.tokens, hooks.slow, kv.seq, kv.max_seqs, kv.block
    on_prefill = None if hooks.prefill is _nothing else hooks.prefill
    on_decode = None if hooks.decode is _nothing else hooks.decode
    on_preempt = None if hooks.preempt is _nothing else hooks.preempt
    push, pop = heapq.heappush, heapq.heappop
    waiting = deque(range(len(prompt)))
    arrivals: list[tuple[float, int]] = []  # (time, row) back from a tool call
    active: list[tuple[int, int]] = []  # (engine step its turn ends, row)
    newest: list[tuple[int, int]] = []  # (-admission stamp, row): preemption victims first
    held = batch = sum_a = idle = steps = stamp = 0  # idle: KV of rows waiting on a tool
    now = start
    while waiting or arrivals or active:
        t = now
        new: list[tuple[int, int]] = []
        room = cap - idle - sum_a - batch * (steps + 1) - held * state  # free after the next step
        lone = not active and not arrivals  # nothing holds KV: the first sequence always fits
        while waiting and held < max_seqs:
            i = waiting[0]
            need = pend[i] + 1 + state
            take = min(wt[i], max_seqs - held, max(room, 0) // need)
            if take == 0 and lone and not new:
                take = 1
            if take == 0:
                break
            if take < wt[i]:  # split the row: `take` of its sequences start now
                wt[i] -= take
                i = s.clone(i, take)
            else:
                waiting.popleft()
            held += take
            room -= take * need
            new.append((i, pend[i]))
        while arrivals and arrivals[0][0] <= t:
            i = pop(arrivals)[1]
            idle -= wt[i] * ctx[i]
            new.append((i, tool_output))
        if new:
            seqs = toks = ctx_sum = 0
            keys = 0.0
            for i, n in new:
                w = wt[i]
                seqs += w
                toks += w * n
                ctx_sum += w * (ctx[i] + n)
                keys += w * n * chunk_seq(ctx[i] + n, n)
            if toks > 0:
                # attention is per token: the tokens' mean of chunk_seq(c, n), so a sequence
                # weighs by its new tokens (prompts of unequal lengths cost sum n^2, not n * mean)
                span = keys / toks
                dur = st.prefill(toks, span) * slow
                if on_prefill is not None:
                    on_prefill(t, dur, seqs, toks, ctx_sum, span)
                t += dur
            for i, n in new:
                stamp += 1
                c = ctx[i] = ctx[i] + n
                pend[i], order[i] = 0, stamp
                a[i], end[i] = c - steps, steps + left[i]
                push(active, (end[i], i))
                push(newest, (-stamp, i))
                sum_a += wt[i] * a[i]
                batch += wt[i]
            if arrivals and arrivals[0][0] <= t:  # arrived during the prefill: admit first
                now = yield t, t
                continue
        while active and wt[active[0][1]] == 0:  # rows preempted whole
            pop(active)
        if not active:
            now = yield (t if t > now else arrivals[0][0]), t
            continue
        over = idle + sum_a + batch * (steps + 1) + held * state - cap  # the next step lacks
        if over > 0:  # free a block's worth of steps for the rest (vLLM allocates pages)
            over += batch * (block - 1)
        while over > 0 and batch > 1:  # preempt the newest running sequences
            while wt[newest[0][1]] == 0 or order[newest[0][1]] != -newest[0][0]:
                pop(newest)
            v = newest[0][1]
            c = a[v] + steps
            x = min(wt[v], -(-over // (c + state + block)), batch - 1)
            j = s.clone(v, x)
            wt[v] -= x
            pend[j], ctx[j], left[j], order[j] = c, 0, end[v] - steps, 0
            sum_a -= x * a[v]
            batch -= x
            held -= x
            over -= x * (c + state + block)
            waiting.appendleft(j)
            if on_preempt is not None:
                on_preempt(t, x, c)
        while wt[active[0][1]] == 0:
            pop(active)
        kmax = active[0][0] - steps
        full = (cap - idle - sum_a - batch * steps - held * state) // batch  # steps to full
        if full >= 1:  # else a lone sequence over the KV (tool waits hold the rest): runs on
            kmax = min(kmax, full)
        c0 = sum_a + batch * steps
        run = Run(st, batch, c0, kmax)
        k = kmax
        if arrivals and arrivals[0][0] < t + run.time(kmax) * slow:
            k = run.steps_to_reach((arrivals[0][0] - t) / slow, kmax)
        dur = run.time(k) * slow
        if on_decode is not None:
            on_decode(t, dur, batch, k, c0)
        now = yield t + dur, t + dur
        steps += k
        t = now
        while active and active[0][0] <= steps:
            e, i = pop(active)
            w = wt[i]
            if w == 0:
                continue
            sum_a -= w * a[i]
            batch -= w
            ctx[i], order[i] = a[i] + e, 0
            s.turn[i] += 1
            if s.turn[i] >= len(s.resp[i]):  # rows may differ in turns (partial rollouts)
                held -= w
                hooks.done(t, s.src[i], w)
                continue
            left[i] = s.resp[i][s.turn[i]]
            idle += w * ctx[i]
            first = w
            for n, (back, calls) in enumerate(hooks.calls(t, s.src[i], s.turn[i] - 1, w)):
                row = i
                if n:  # calls returning later: their sequences become a row of their own
                    row = s.clone(i, calls)
                else:
                    first = calls
                push(arrivals, (back, row))
            wt[i] = first


class _State:
    """Per-row state, one list per field (rows are appended when split)."""

    def __init__(self, prompt: list[int], response: list[list[int]], weight: list[int]) -> None:
        n = len(prompt)
        self.src = list(range(n))  # the input row it came from
        self.wt = list(weight)
        self.resp = response
        self.turn = [0] * n
        self.ctx = [0] * n  # KV tokens held (at the start of its turn, while active)
        self.pend = list(prompt)  # tokens to prefill when admitted
        self.left = [r[0] for r in response]  # response tokens left in its turn
        self.a = [0] * n  # while active: ctx - the engine step it started at
        self.end = [0] * n  # while active: the engine step its turn ends
        self.order = [0] * n  # while active: its admission stamp

    def clone(self, i: int, weight: int) -> int:
        for lst in (self.src, self.turn, self.ctx, self.pend, self.left, self.a, self.end,
                    self.order):
            lst.append(lst[i])
        self.wt.append(weight)
        self.resp.append(self.resp[self.src[i]])
        return len(self.wt) - 1


def run_replica(st: StepTerms, prompt: list[int], response: list[list[int]],
                tool_s: list[list[float]], weight: list[int], tool_output: int,
                kv: KvBudget | None = None) -> list[tuple[float, int]]:
    """(finish time, sequences) of every row, in finishing order, on a replica admitting by
    `kv` (default: the replica's own, `st.kv`); `tool_s[i][c]` is the wait between turns c and
    c + 1 (none: the next turn follows at once)."""
    done: list[tuple[float, int]] = []

    def calls(t: float, i: int, c: int, w: int) -> list[tuple[float, int]]:
        return [(t + (tool_s[i][c] if tool_s[i] else 0.0), w)]

    hooks = Hooks(calls, lambda t, _i, w: done.append((t, w)))
    gen = engine(st, kv or st.kv, prompt, [list(r) for r in response], weight, tool_output,
                 hooks, 0.0)
    try:
        wake = next(gen)[0]
        while True:
            wake = gen.send(wake)[0]
    except StopIteration:
        pass
    return done
