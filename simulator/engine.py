"""Rollout engines: one continuous-batching generation engine per replica of the rollout role.

What one engine does (vLLM-like, prefill-priority scheduling, `placer.cost.admission.engine`,
the loop the planner runs too): it admits sequences while its free KV covers their tokens and it
holds fewer than `max_num_seqs`, and preempts the newest when the batch's KV outgrows its memory;
admitted sequences (a new sample, or one whose tool call returned) get one prefill step over their
new tokens, then every active sequence decodes one token per step; a sequence that ends a turn
leaves the batch and, if turns remain, submits a tool call to the CPU pool
(`simulator.environment`), keeping its KV while it waits.

Why it is fast and still exact. One simpy event per decode step is far too slow at 65,536
samples, and one per engine step too many at 8,192 GPUs. Between two batch changes the batch is
fixed: B sequences whose total context grows by B tokens per step, so a run of steps is at most
two arithmetic series (the step is the max of a compute floor and a memory line), summed in closed
form (`placer.cost.batching.Run`, shared with the planner) and advanced as ONE simpy event.
Admissions that arrive mid-run (a tool call returning) are known in advance, so the engine cuts
its run at the first step boundary at or after the arrival (a closed-form inversion): no
interrupts, no lost exactness. Active sequences sit in a heap by the step at which their turn
ends, so every batch change costs O(log B). With every source of variance off an engine makes one
prefill and one decode event per turn per wave: the planner's `wave_time` exactly.

Rows may differ in their number of turns (partial rollouts carry a cut sample's rest into the next
step, `simulator.tails`). An over-provisioned rollout gives every engine one shared `Quota`; once
enough samples are done the rollout interrupts the engines, and each cuts the operation it was in.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import simpy

from placer.base.roles import Role
from placer.cost.admission import Hooks, engine
from placer.cost.batching import StepTerms
from placer.cost.efficiency import Efficiency
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceType
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
    pool: str
    slot: str


PREFILL_KEYS = ("role", "step", "batch", "tokens", "context", "span")
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
    preempted: int = 0  # sequences preempted (KV full), each recomputed when readmitted
    recomputed_tokens: int = 0


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
    encode_s: float = 0.0  # a VLM's images of this replica's samples, encoded first
    _busy_end: float = 0.0  # end of the busy part of the wait in progress
    _rows_from: int = 0  # first trace row of the operation in progress

    def run(self, env: simpy.Environment) -> Generator:
        """The engine's process; an over-provisioned rollout interrupts it once enough samples
        are done: the operation in progress is cut at that moment (busy time and trace)."""
        try:
            if self.encode_s > 0:  # the vision encoder over this replica's images (busy time;
                # no trace event: no event category's fitted factor prices an encoder)
                self.stats.busy_s += self.encode_s
                self._busy_end = env.now + self.encode_s
                yield env.timeout(self.encode_s)
            yield from self._loop(env)
        except simpy.Interrupt:
            now = env.now
            self.stats.busy_s -= max(self._busy_end - now, 0.0)
            self.rec.cut(self._rows_from, f"{self.spec.slot}/engine{self.index}", now)

    def _loop(self, env: simpy.Environment) -> Generator:
        """The shared scheduling loop (`placer.cost.admission.engine`) on this replica's samples, one
        row each; a prefill and the decode run after it are one simpy event unless a sequence
        arrives during the prefill (then it is admitted first)."""
        smp, s, rec, st = self.samples, self.spec, self.rec, self.stats
        ids = self.sample_ids
        add, events, quota, done_at = rec.add_fields, rec.ts, self.quota, self.done_at
        pid, tid, it = s.pool, f"{s.slot}/engine{self.index}", self.step

        def prefill(t: float, dur: float, seqs: int, tokens: int, ctx_sum: float,
                    span: float) -> None:
            add("prefill", "prefill", t, dur, pid, tid, PREFILL_KEYS,
                (Role.ROLLOUT, it, seqs, tokens, round(ctx_sum), span))
            st.busy_s += dur
            st.prefill_tokens += tokens

        def decode(t: float, dur: float, batch: int, k: int, c0: int) -> None:
            add("decode", "decode", t, dur, pid, tid, DECODE_KEYS,
                (Role.ROLLOUT, it, batch, k, batch * k, c0))
            st.busy_s += dur
            st.decode_steps += k
            st.decode_tokens += batch * k
            st.runs += 1

        def preempt(_t: float, seqs: int, ctx: int) -> None:
            st.preempted += seqs
            st.recomputed_tokens += seqs * ctx

        def calls(t: float, i: int, call: int, _w: int) -> list[tuple[float, int]]:
            if self.tools is not None and smp.tool_s[ids[i]]:
                return [(self._tool(t, ids[i], call), 1)]
            return [(t, 1)]  # a multi-turn job without an environment: the next turn at once

        def done(t: float, i: int, _w: int) -> None:
            done_at[ids[i]] = t
            if quota is not None:
                quota.hit()

        hooks = Hooks(calls, done, prefill, decode, preempt, self.slowdown)
        loop = engine(self.steps, self.steps.kv, [smp.prompt[i] for i in ids],
                      [smp.response[i] for i in ids], [1] * len(ids), smp.tool_output, hooks,
                      env.now)
        self._rows_from = len(events)
        try:
            wake, busy = next(loop)
            while True:
                self._busy_end = busy
                yield env.timeout(wake - env.now)
                self._rows_from = len(events)
                wake, busy = loop.send(env.now)
        except StopIteration:
            return

    def _tool(self, now: float, sid: int, call: int) -> float:
        tools = self.tools
        assert tools is not None, "a tool call runs on the environment's cores"
        lat = self.samples.tool_s[sid][call] + self.tool_overhead_s
        start, end, server = tools.submit(now, lat)
        if self.rec.record_tools:
            self.rec.add_fields("tool", "tool", start, lat, tools.name, f"env{server}",
                                TOOL_KEYS, (Role.ENVIRONMENT, self.step, [sid], start - now))
        return end
