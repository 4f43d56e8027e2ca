"""Rollout engines: one continuous-batching generation engine per replica of the rollout role.

What one engine does (vLLM-like, prefill-priority scheduling):
  * it holds at most `concurrency` sequences, the number whose longest possible context fits its
    KV memory (`placer.estimate.rollout_shape`); a sequence keeps its slot (its KV) while it
    waits on a tool call, and frees it when its last turn ends;
  * whenever sequences are admitted (a new sample, or one whose tool call returned) the engine
    first runs one prefill step over all their new tokens (`costmodel.prefill_time`), then
    decodes every active sequence one token per step (`costmodel.decode_step_time` of the batch
    and its total KV context);
  * when a sequence finishes a turn it leaves the batch and, if turns remain, submits a tool call
    to the CPU pool (`simulator.environment`); the tool's output tokens are prefilled on return.

Method (why this is fast and still exact). Simulating each decode step of each sample as a simpy
event is far too slow at 65,536 samples, and even one event per engine step is too many at 8,192
GPUs. Between two *batch changes* (a sequence finishing its turn, or an admission) the batch is
fixed: B sequences whose total context grows by B tokens per step, so step i costs f(i) =
decode_step_time(B, C0 + B*i). The engine advances a whole run of steps as ONE simpy event. f is the
max of a constant (compute-bound) and a line (memory-bound), plus constants, so a run is at most two
arithmetic series; its time is summed in closed form from a few cost-model calls
(`placer.batching.Run`, shared with the planner's tail model), the same sum
`costmodel.decode_run_time` computes. Admissions that arrive mid-run (a tool call returning) are
known in advance (their end times are fixed when submitted, FIFO), so the engine cuts its run at the
first step boundary at or after the arrival (closed-form inversion of the run's cumulative time) -
no interrupts, no lost exactness. Active sequences sit in a heap by the engine step at which their
turn ends, and the total context is kept as sum(ctx0 - s0) + B*s, so every batch change costs O(log
B). With every source of variance off, all sequences of a lockstep wave start and end together, so
an engine makes one prefill and one decode event per turn per wave: the placer's `wave_time`
exactly.

Rows may differ in their number of turns (partial rollouts carry a cut sample's rest into the next
step, `simulator.tails`). An over-provisioned rollout gives every engine one shared `Quota`; once
enough samples are done the rollout interrupts the engines, and each cuts the operation it was in
(its busy time and its trace events end at that moment).
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field

import simpy

from placer.batching import Run, StepTerms
from placer.costmodel import Efficiency, Parallel
from placer.roles import Role
from placer.spec import DeviceType, ModelArch
from simulator.environment import CorePool
from simulator.recorder import Recorder
from simulator.workload import Samples


@dataclass(frozen=True)
class EngineSpec:
    """What every replica of one engine group shares (the rollout role on one pool, or one part
    of a rollout split over pools: `simulator.groups`)."""

    model: ModelArch
    dev: DeviceType
    par: Parallel  # one replica: tp, pp, dp=1
    eff: Efficiency
    concurrency: int
    pool: str
    slot: str


PREFILL_KEYS = ("role", "step", "batch", "tokens", "context")
DECODE_KEYS = ("role", "step", "batch", "steps", "tokens", "context")
TOOL_KEYS = ("role", "step", "sample_ids", "wait_s")


@dataclass
class Quota:
    """Over-provisioned rollouts: the stage ends once `need` samples finished (every engine of
    the role counts into one quota; `event` fires on the last one needed)."""

    need: int
    event: simpy.Event
    done: int = 0

    def hit(self) -> None:
        self.done += 1
        if self.done == self.need:
            self.event.succeed()


@dataclass
class EngineStats:
    busy_s: float = 0.0
    decode_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    runs: int = 0


@dataclass
class Engine:
    """One replica. `run()` is its simpy process over the samples it is given."""

    spec: EngineSpec
    index: int
    samples: Samples
    sample_ids: list[int]
    slowdown: float
    tools: CorePool | None
    tool_overhead_s: float
    rec: Recorder
    step: int  # iteration index (trace args)
    steps: StepTerms  # shared by the replicas of one rollout role
    done_at: dict[int, float] = field(default_factory=dict)
    stats: EngineStats = field(default_factory=EngineStats)
    quota: Quota | None = None
    _busy_end: float = 0.0  # end of the busy part of the wait in progress
    _rows_from: int = 0  # first trace row of the operation in progress

    def run(self, env: simpy.Environment) -> Generator:
        """The engine's process; an over-provisioned rollout interrupts it once enough samples
        are done: the operation in progress is cut at that moment (busy time and trace)."""
        try:
            yield from self._loop(env)
        except simpy.Interrupt:
            now = env.now
            self.stats.busy_s -= max(self._busy_end - now, 0.0)
            self.rec.cut(self._rows_from, f"{self.spec.slot}/engine{self.index}", now)

    def _loop(self, env: simpy.Environment) -> Generator:
        """A prefill and the decode run after it are one simpy event unless a sequence arrives
        during the prefill (then it is admitted first)."""
        smp, s, slow = self.samples, self.spec, self.slowdown
        prompt, response, tool_s, tool_out = smp.prompt, smp.response, smp.tool_s, smp.tool_output
        push, pop = heapq.heappush, heapq.heappop
        rec = self.rec
        add, st, done_at = rec.add_fields, self.stats, self.done_at
        events, prefill = rec.ts, self.steps.prefill  # len(events): the events recorded so far
        quota = self.quota
        waiting = deque(self.sample_ids)
        arrivals: list[tuple[float, int]] = []  # (time, sample) returning from a tool call
        active: list[tuple[int, int, int]] = []  # (engine step its turn ends, sample, ctx0 - s0)
        turn = dict.fromkeys(self.sample_ids, 0)
        ctx = dict.fromkeys(self.sample_ids, 0)
        held = 0  # KV slots held: active, prefilling or waiting on a tool
        sum_a, steps = 0, 0
        pid, tid, it = s.pool, f"{s.slot}/engine{self.index}", self.step
        while waiting or arrivals or active:
            now = t = env.now
            self._rows_from = len(events)
            new: list[tuple[int, int]] = []
            while waiting and held < s.concurrency:
                sid = waiting.popleft()
                held += 1
                new.append((sid, prompt[sid]))
            while arrivals and arrivals[0][0] <= t:
                new.append((pop(arrivals)[1], tool_out))
            if new:
                tokens = sum(n for _, n in new)
                if tokens > 0:
                    mean_ctx = sum(ctx[i] + n for i, n in new) / len(new)
                    dur = prefill(tokens, mean_ctx) * slow
                    add("prefill", "prefill", t, dur, pid, tid, PREFILL_KEYS,
                        (Role.ROLLOUT, it, len(new), tokens, round(mean_ctx * len(new))))
                    st.busy_s += dur
                    st.prefill_tokens += tokens
                    t += dur
                for sid, n in new:
                    c = ctx[sid] + n
                    ctx[sid] = c
                    push(active, (steps + response[sid][turn[sid]], sid, c - steps))
                    sum_a += c - steps
                if arrivals and arrivals[0][0] <= t:  # arrived during the prefill: admit first
                    self._busy_end = t
                    yield env.timeout(t - now)
                    continue
            if not active:
                self._busy_end = t
                yield env.timeout((t if t > now else arrivals[0][0]) - now)
                continue
            batch = len(active)
            kmax = active[0][0] - steps
            c0 = sum_a + batch * steps
            run = Run(self.steps, batch, c0, kmax)
            k = kmax
            if arrivals and arrivals[0][0] < t + run.time(kmax) * slow:
                k = run.steps_to_reach((arrivals[0][0] - t) / slow, kmax)
            dur = run.time(k) * slow
            add("decode", "decode", t, dur, pid, tid, DECODE_KEYS,
                (Role.ROLLOUT, it, batch, k, batch * k, c0))
            st.busy_s += dur
            st.decode_steps += k
            st.decode_tokens += batch * k
            st.runs += 1
            self._busy_end = t + dur
            yield env.timeout(t + dur - now)
            steps += k
            t = env.now
            while active and active[0][0] <= steps:
                end_step, sid, a = pop(active)
                sum_a -= a
                ctx[sid] = a + end_step
                turn[sid] += 1
                if turn[sid] >= len(response[sid]):  # rows may differ in turns (partial)
                    held -= 1
                    done_at[sid] = t
                    if quota is not None:
                        quota.hit()
                elif self.tools is not None and tool_s[sid]:
                    push(arrivals, (self._tool(t, sid, turn[sid] - 1), sid))
                else:  # a multi-turn job without an environment: the next turn follows at once
                    push(arrivals, (t, sid))

    def _tool(self, now: float, sid: int, call: int) -> float:
        tools = self.tools
        assert tools is not None, "a tool call runs on the environment's cores"
        lat = self.samples.tool_s[sid][call] + self.tool_overhead_s
        start, end, server = tools.submit(now, lat)
        if self.rec.record_tools:
            self.rec.add_fields("tool", "tool", start, lat, tools.name, f"env{server}",
                                TOOL_KEYS, (Role.ENVIRONMENT, self.step, [sid], start - now))
        return end
