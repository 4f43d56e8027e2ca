"""RL iterations on simpy: stages in sync mode, a staleness-bounded pipeline in async mode.

One iteration: weight sync (actor -> every rollout replica, `simulator.network`), rollout
(continuous-batching engines with tool calls, `simulator.engine`), score (frozen forwards) and
train (`simulator.training`). A rollout split over pools runs one engine group per part, each on
its own pool with its own contiguous share of the rows (`simulator.groups`); the stage ends when
the last part is done. Every slot is a simpy `PriorityResource` of capacity one: roles that
share a slot take turns on it (and pay onload when their memory does not fit together), the oldest
step first; different slots run side by side.

sync mode   stages are barriers: sync, then rollout, then score, then train; a stage lasts as
            long as its busiest slot. This is `placer.cost.timing`'s sum over stages of the max over
            slots, event by event.
async mode  rollout of step i may start once the weights on the engines are at most
            `max_staleness` versions old (version v = after v training steps); before each
            rollout the engines pull the newest trained version if they lack it. Scoring and
            training of step i start when its rollout is done. Where one slot holds the rollout and
            another role (the reference, the actor), that slot time-shares, serving its oldest
            waiting step first: step i's reference pass runs between rollouts i and i+1, so
            the slot is busy sync + onload + rollout + score per step, and one step's chain
            sync -> rollout -> score -> train is not cut by the next rollout (what
            `placer.cost.timing`'s async bounds price). In steady state the busiest slot
            sets the pace - the placer's async rule - and the first iteration pays the pipeline
            fill. Iteration time in async mode is the time between consecutive training commits.

A job with a periodic validation (`Job.validation`) runs one pass inside the steps it picks,
after their train, on the rollout's slot (`simulator.validation`); in async mode the step's
commit waits for it.

Long-tail policies (the job's `tail_policy`, `simulator.tails`): over-provisioning ends the
rollout stage once n samples are done and trains those; partial rollouts run each step's rows cut
at the token budget and carry the rest into the next step; speculative re-issue lives in the CPU
pool. Scoring and training always see the samples the step commits.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import simpy
from simpy.resources.resource import PriorityRequest

from placer.base.roles import Role
from placer.cost.pricer import Pricer
from placer.solve.planfile import Plan
from placer.spec.sampling import draw, rng
from simulator import tails
from simulator.config import SimConfig
from simulator.engine import Quota
from simulator.environment import CorePool, pool_slots
from simulator.faults import device_slowdowns, role_slowdown
from simulator.groups import engines_for, groups_of
from simulator.judge import verdict_tokens
from simulator.network import record_sync, sync_plan
from simulator.recorder import Recorder
from simulator.training import Work, onload_costs, stage_work
from simulator.validation import Validating, run_validation, validates
from simulator.workload import Samples, has_tools, samples_for

STREAM_REISSUE = 400


@dataclass
class IterRecord:
    index: int
    start: float = 0.0
    end: float = 0.0
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    done_at: dict[int, float] = field(default_factory=dict)  # sample -> rollout finish time
    engine_of: dict[int, int] = field(default_factory=dict)  # sample -> engine that finished it
    sync_s: float = 0.0
    sync_alone_s: float = 0.0
    tool_wait_s: float = 0.0
    tool_calls: int = 0
    max_slowdown: float = 1.0
    generated: int = 0  # rows the rollout ran (over-provisioned samples, carried rows)
    committed: int = 0  # samples scored and trained
    carried_tokens: int = 0  # response tokens cut at the budget, left for the next step
    reissued: int = 0  # tool calls run twice


@dataclass
class RunRecord:
    iterations: list[IterRecord]
    samples: dict[int, Samples]
    busy: list[tuple[str, float, float, float]]  # (slot, start, dur, share of the slot's devices)
    engine_busy_s: dict[str, float]  # rollout slot -> engine busy seconds / replicas
    role_s: dict[str, float]
    end_s: float
    pools: list[CorePool]
    decode_runs: int = 0
    replicas: int = 1  # rollout engine replicas over all of the role's pools
    committed: dict[int, Samples] = field(default_factory=dict)  # what each step trained
    # a rollout split over pools: (slot, pool) -> engine busy seconds / the part's replicas
    part_busy_s: dict[tuple[str, str], float] = field(default_factory=dict)
    # (pool, replicas, devices) of each rollout engine group (devices 0: the whole slot)
    engine_groups: list[tuple[str, int, int]] = field(default_factory=list)


class Model(Validating):
    """A plan made runnable: engines, pools, links and slots for `run(iterations)`."""

    def __init__(self, px: Pricer, plan: Plan, cfg: SimConfig, seed: int,
                 rec: Recorder, replay: list[dict] | None = None,
                 on_iteration: Callable[[int, int], None] | None = None,
                 env: simpy.Environment | None = None) -> None:
        self.px, self.plan, self.cfg, self.seed = px, plan, cfg, seed
        self.res, self.calib = px.res, px.calib
        self.rec, self.replay = rec, replay
        self.on_iteration = on_iteration  # (iterations done, of) as each one's train step ends
        # a fleet's jobs share one environment (`simulator.fleet`); a job alone has its own
        self.env = env if env is not None else simpy.Environment()
        self.stopped = False  # set when the job loses its nodes: no new stage starts
        self.started_at = self.env.now
        # oldest step first: step i's score/train go before step i+1's sync/rollout on a
        # shared slot (the chain the placer's async bounds price; see the module doc)
        self.slot_res = {s.name: simpy.PriorityResource(self.env, 1) for s in plan.slots}
        self.onload = onload_costs(px, plan)
        self.sync = sync_plan(px, plan, cfg.network)
        self._rollout_setup()
        self.busy: list[tuple[str, float, float, float]] = []
        self.engine_busy: dict[str, float] = defaultdict(float)
        self.part_busy: dict[tuple[str, str], float] = defaultdict(float)
        self.role_s: dict[str, float] = defaultdict(float)
        self.records: list[IterRecord] = []
        self.samples: dict[int, Samples] = {}
        self.onloaded: dict[int, set[str]] = defaultdict(set)
        self.runs = 0
        self.committed: dict[int, Samples] = {}  # what step i scores and trains
        job = self.res.job
        grpo = job.algorithm.value == "grpo"
        self.partial = (tails.Partial(job.batch.samples_per_prompt if grpo else 1)
                        if job.tail_policy.mechanism.carries_over else None)

    def _rollout_setup(self) -> None:
        res, plan = self.res, self.plan
        self.groups = groups_of(self.px, plan)  # one per pool the rollout runs on
        self.replicas = sum(g.replicas for g in self.groups)
        self.tools: CorePool | None = None  # one core pool for every group's tool calls
        job = res.job
        if Role.ENVIRONMENT in plan.roles and has_tools(job):
            e = plan.roles[Role.ENVIRONMENT]
            cores = e.devices * res.device_of(e.pool).cores
            self.tools = CorePool(e.pool, pool_slots(cores, job.environment.cpu_per_call))
            self.tool_overhead = self.calib.for_device(res.device_of(e.pool)).tool_overhead_s
            deadline_s = job.tail_policy.mechanism.tool_deadline_s
            if deadline_s is not None:
                self._reissue_setup(self.tools, deadline_s)
        else:
            self.tool_overhead = 0.0

    def _reissue_setup(self, pool: CorePool, deadline_s: float) -> None:
        """Copies of slow calls draw fresh latencies from their own seeded stream, in batches."""
        dist = self.res.job.environment.tool_latency_s
        mean = self.cfg.workload.tool_latency == "mean"
        g = rng(self.seed, STREAM_REISSUE)
        buf: list[float] = []

        def redraw() -> float:
            if mean:
                return dist.mean_value() + self.tool_overhead
            if not buf:
                buf.extend(draw(dist, g, 1024).tolist())
            return buf.pop() + self.tool_overhead

        pool.deadline_s = deadline_s + self.tool_overhead
        pool.redraw = redraw

    # ------------------------------------------------------------------------------ driver
    def run(self, iterations: int) -> RunRecord:
        self.start(iterations)
        self.env.run()
        return self.record()

    def start(self, iterations: int) -> simpy.Event:
        """Start `iterations` iterations on the environment; the event fires when the last one
        has trained (`run` runs the environment to its end; a fleet runs many jobs' at once)."""
        self.started_at = self.env.now
        self.records = [IterRecord(i) for i in range(iterations)]
        if self.plan.pipeline.overlaps_steps:
            return self._start_async(iterations)
        return self.env.process(self._sync_loop(iterations))

    def record(self) -> RunRecord:
        """What the run did so far."""
        groups = [(g.spec.pool, g.replicas, g.devices or 0) for g in self.groups]
        return RunRecord(self.records, self.samples, self.busy, dict(self.engine_busy),
                         dict(self.role_s), self.env.now, [self.tools] if self.tools else [],
                         self.runs, self.replicas, self.committed, dict(self.part_busy), groups)

    def _ended(self, i: int) -> None:
        """Iteration i trained. Trains run in order in both modes (async step i waits for step
        i-1's), so the callback sees 1, 2, ..., n."""
        if self.on_iteration is not None:
            self.on_iteration(i + 1, len(self.records))

    def _prepare(self, i: int) -> tuple[Samples, dict]:
        job = self.res.job
        smp = samples_for(job, self.cfg.workload, self.seed, i, self.replay)
        if self.partial is not None:
            smp = self.partial.rows_for(i, smp, job.batch.samples)
        self.samples[i] = smp
        self.records[i].generated = smp.n
        factors = device_slowdowns(self.plan, self.cfg.stragglers, self.seed, i)
        self.records[i].max_slowdown = max((float(f.max()) for f in factors.values() if len(f)),
                                           default=1.0)
        return smp, factors

    def _sync_loop(self, n: int) -> Generator:
        env = self.env
        for i in range(n):
            if self.stopped:
                return
            rec = self.records[i]
            rec.start = env.now
            smp, factors = self._prepare(i)
            stages = [("sync", partial(self._weight_sync, i)),
                      ("rollout", partial(self._rollout, i, smp, factors)),
                      ("score", partial(self._stage, i, "score", factors)),
                      ("train", partial(self._stage, i, "train", factors))]
            if validates(self.res.job, i):  # inside the step, after its update
                stages.append(("validate", partial(run_validation, self, i, factors)))
            for stage, proc in stages:
                if self.stopped:
                    return
                t0 = env.now
                yield env.process(proc())
                rec.stages[stage] = (t0, env.now)
            rec.end = env.now
            self._ended(i)

    def _start_async(self, n: int) -> simpy.Event:
        env = self.env
        rolled = [env.event() for _ in range(n)]
        trained = [env.event() for _ in range(n)]
        staleness = self.plan.pipeline.staleness
        prepared: dict[int, tuple[Samples, dict]] = {}

        def rollouts() -> Generator:
            synced = 0  # policy version on the engines
            for i in range(n):
                need = i - staleness  # oldest version rollout i may use
                if need > synced:
                    yield trained[need - 1]
                if self.stopped:
                    return
                newest = sum(1 for e in trained if e.triggered)
                if newest > synced:
                    synced = newest
                    yield env.process(self._weight_sync(i))
                self.records[i].start = env.now
                prepared[i] = self._prepare(i)
                t0 = env.now
                yield env.process(self._rollout(i, *prepared[i]))
                self.records[i].stages["rollout"] = (t0, env.now)
                rolled[i].succeed()
                # yield the instant: step i's scoring (woken by `rolled[i]`) asks for a shared
                # slot before the next sync/rollout does, so the priority order holds
                yield env.timeout(0)

        def step(i: int) -> Generator:
            """Score step i as soon as its rollout is done; train after step i-1 trained."""
            yield rolled[i]
            if self.stopped:
                return
            factors = prepared[i][1]
            t0 = env.now
            yield env.process(self._stage(i, "score", factors))
            self.records[i].stages["score"] = (t0, env.now)
            if i > 0:
                yield trained[i - 1]
            if self.stopped:
                return
            t0 = env.now
            yield env.process(self._stage(i, "train", factors))
            self.records[i].stages["train"] = (t0, env.now)
            if validates(self.res.job, i):  # the step's commit waits for its validation
                t0 = env.now
                yield env.process(run_validation(self, i, factors))
                self.records[i].stages["validate"] = (t0, env.now)
            self.records[i].end = env.now
            self._ended(i)
            trained[i].succeed()

        env.process(rollouts())
        for i in range(n):
            env.process(step(i))
        return trained[-1]

    # ------------------------------------------------------------------------------- work
    def _hold(self, slot: str, role: str, i: int) -> Generator[simpy.Event, Any, PriorityRequest]:
        """Take the slot; pay the role's onload the first time it runs in iteration i."""
        req = self.slot_res[slot].request(priority=i)
        yield req
        cost = self.onload.get(role, 0.0)
        if cost and role not in self.onloaded[i]:
            self.onloaded[i].add(role)
            self.rec.add("onload", "transfer", self.env.now, cost, self.plan.roles[role].pool,
                         slot, role=role, step=i)
            self.busy.append((slot, self.env.now, cost, 1.0))
            self.role_s[role] += cost
            yield self.env.timeout(cost)
        return req

    def _weight_sync(self, i: int) -> Generator:
        if self.sync is None:
            return
        env, slot = self.env, self.plan.roles[Role.ROLLOUT].slot
        req = yield from self._hold(slot, Role.ROLLOUT, i)
        total = record_sync(self.sync, self.rec, env.now, slot, i, i)
        rec = self.records[i]
        rec.sync_s += total
        rec.sync_alone_s += self.sync.fixed_s + self.sync.alone_s
        self.busy.append((slot, env.now, total, 1.0))
        self.role_s["sync"] += total
        yield env.timeout(total)
        self.slot_res[slot].release(req)

    def _rollout(self, i: int, smp: Samples, factors: dict) -> Generator:
        env, r = self.env, self.plan.roles[Role.ROLLOUT]
        req = yield from self._hold(r.slot, Role.ROLLOUT, i)
        policy, n = self.res.job.tail_policy.mechanism, self.res.job.batch.samples
        cut = None
        if policy.token_budget is not None:
            cut = tails.cut(tails.rows_of(smp), policy.token_budget, smp.tool_output)
            smp = self.samples[i] = cut.run
        quota = Quota(n, env.event()) if policy.keeps_first else None
        engines = engines_for(self.groups, smp, self.res.job.lengths.images_per_prompt,
                              factors[r.slot], self.tools, self.tool_overhead, self.rec, i,
                              quota)
        wait0 = self.tools.wait_s if self.tools else 0.0
        calls0 = self.tools.calls if self.tools else 0
        again0 = self.tools.reissued if self.tools else 0
        procs = [env.process(e.run(env)) for _, e in engines]
        if quota is not None:
            yield simpy.AllOf(env, procs) | quota.event
            for p in procs:  # enough samples are done: abort the rest
                if p.is_alive:
                    p.interrupt()
        # a fresh condition: a triggered `|` detaches the conditions nested in it
        yield simpy.AllOf(env, procs)
        rec = self.records[i]
        for g, e in engines:
            rec.done_at.update(e.done_at)
            rec.engine_of.update(dict.fromkeys(e.done_at, e.index))
            self.engine_busy[r.slot] += e.stats.busy_s / g.busy_div
            if g.devices is not None:
                self.part_busy[(r.slot, g.spec.pool)] += e.stats.busy_s / g.part_div
            self.role_s[Role.ROLLOUT] += e.stats.busy_s / self.replicas
            self.runs += e.stats.runs
        if self.tools:
            rec.tool_wait_s += self.tools.wait_s - wait0
            rec.tool_calls += self.tools.calls - calls0
            rec.reissued += self.tools.reissued - again0
        if cut is not None:
            assert self.partial is not None, "a cut rollout runs under the partial tail policy"
            rec.carried_tokens = cut.carried_tokens
            done = tails.from_rows(self.partial.settle(i, cut), smp.tool_output)
        elif quota is not None:
            done = tails.subset(smp, tails.first_done(rec.done_at, n))
        else:
            done = smp
        self.committed[i] = done
        rec.committed = done.n
        self.slot_res[r.slot].release(req)

    def _stage(self, i: int, stage: str, factors: dict) -> Generator:
        by_slot: dict[str, list[Work]] = defaultdict(list)
        smp = self.committed[i]
        verdicts = (verdict_tokens(self.px, smp.n, self.seed, i,
                                   self.cfg.workload.lengths == "mean")
                    if self.res.job.judge is not None else None)
        for w in stage_work(self.px, self.plan, smp, stage, verdicts):
            by_slot[self.plan.roles[w.role].slot].append(w)
        procs = [self.env.process(self._slot_work(i, slot, works, factors[slot]))
                 for slot, works in by_slot.items()]
        yield simpy.AllOf(self.env, procs)

    def _slot_work(self, i: int, slot: str, works: list[Work], factors) -> Generator:
        env = self.env
        for w in works:
            rp = self.plan.roles[w.role]
            slow = role_slowdown(factors, rp.devices)
            req = yield from self._hold(slot, w.role, i)
            cat = "train" if w.stage == "train" else ("reward" if w.role == Role.REWARD else "forward")
            if w.dispatch_s > 0:  # the driver ships the batch (no straggler: host-side work)
                self.rec.add(f"{w.role} dispatch", "transfer", env.now, w.dispatch_s, rp.pool,
                             slot, role=w.role, step=i, policy_version=i)
                self.busy.append((slot, env.now, w.dispatch_s,
                                  rp.devices / self._slot_devices(slot)))
                self.role_s[w.role] += w.dispatch_s
                yield env.timeout(w.dispatch_s)
            if w.verify_s > 0:  # the environment's sandbox runs the answers: its kind of work
                dur = w.verify_s * slow
                self.rec.add("environment verify", "tool", env.now, dur, rp.pool, slot,
                             role=Role.ENVIRONMENT, step=i, policy_version=i, call="verify")
                self.busy.append((slot, env.now, dur, rp.devices / self._slot_devices(slot)))
                self.role_s[w.role] += dur
                yield env.timeout(dur)
            for k, d in enumerate(w.steps):
                dur = d * slow
                self.rec.add(f"{w.role} {w.stage}", cat, env.now, dur, rp.pool, slot,
                             role=w.role, step=i, policy_version=i, tokens=w.tokens // len(w.steps),
                             minibatch=k)
                self.busy.append((slot, env.now, dur, rp.devices / self._slot_devices(slot)))
                self.role_s[w.role] += dur
                yield env.timeout(dur)
            self.slot_res[slot].release(req)

    def _slot_devices(self, slot: str) -> int:
        return next(s.devices for s in self.plan.slots if s.name == slot)
