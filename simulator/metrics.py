"""Metrics of a simulated run (`SimMetrics`, typed, with its JSON form), and why the run differs
from the plan's prediction.

`SimMetrics` is the one schema: each field below is one key of the document `placer simulate
--json` prints and `traces/golden/*.metrics.json` stores (`SimMetrics.to_dict()`), in that
order. Its sections: iteration times (mean / p50 / p99 / min / max: `IterationStats`), the
stages of a sync step (`StageSeconds`), utilization per slot and per pool (`Utilization`), why
the run differs from the prediction (`Why`) and what the long-tail policy did
(`TailPolicyStats`); the docstring of each field says what it measures.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import ConfigDict, SerializerFunctionWrapHandler, model_serializer, model_validator

from placer.base.records import Record
from placer.base.roles import Role
from placer.solve.planfile import Plan
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind
from placer.spec.pipeline import PipelineMode
from placer.spec.tailpolicy import TailPolicy
from simulator.faults import Timeline
from simulator.iteration import RunRecord

TAIL_QUANTILE = 0.9
T = TypeVar("T")
SYNC_STAGES = ("sync", "rollout", "score", "train")


class _Section(Record):
    model_config = ConfigDict(use_attribute_docstrings=True)


class IterationStats(_Section):
    """Iteration times in seconds (async mode: the steady state, without the first iteration's
    pipeline fill and the last one's drain)."""

    mean: float
    p50: float
    p99: float
    min: float
    max: float


class StageSeconds(_Section):
    """Mean seconds per iteration of each stage of a sync step (stages in sequence, each its own
    span); async steps overlap their stages, so an async run has none (the JSON form `{}`)."""

    sync: float | None = None
    rollout: float | None = None
    score: float | None = None
    train: float | None = None
    # the plan's `validate` stage (pydantic's models own that name): a periodic validation's
    # share of a step (`Job.validation`), its passes' seconds over every iteration, as the plan
    # prices it; absent when no step validated
    validation: float | None = None

    @model_serializer(mode="wrap")
    def _stages_run(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        return {k: v for k, v in out.items() if v is not None}


class Utilization(_Section):
    """Busy share of each slot's devices over the run, and per pool (device-weighted; a rollout
    split over pools counts each part's engines on its own pool)."""

    slot: dict[str, float]
    pool: dict[str, float]


class Why(_Section):
    """Why the run differs from the plan's prediction."""

    long_tail_s: float
    """rollout time after 90% of samples were done (mean per iteration)"""
    queueing_s: float
    """tool-call wait for a free core, per sample"""
    link_contention_s: float
    """weight-sync time beyond one transfer alone on its links"""
    max_slowdown: float
    """the slowest straggler's factor"""
    dominant: Literal["long_tail", "queueing", "link_contention", "none"]
    """the largest of the three second-valued causes ("none" when all are 0)"""


class TailPolicyStats(_Section):
    """The job's long-tail policy and what it did. The JSON form inlines the policy's own
    fields (`kind` and its parameter) before the figures."""

    policy: TailPolicy
    generated_per_iteration: float
    """rows generated per iteration"""
    committed_per_iteration: float
    """samples committed (trained) per iteration"""
    carried_tokens_per_iteration: float
    """response tokens carried to the next step (partial rollouts)"""
    reissued_calls: int
    """tool calls issued again after their deadline (the whole run)"""
    reissue_saved_s: float
    """seconds the re-issued calls saved"""

    @model_serializer(mode="wrap")
    def _policy_inline(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        del out["policy"]
        return {**self.policy.model_dump(exclude_none=True), **out}

    @model_validator(mode="before")
    @classmethod
    def _policy_from_inline(cls, data: Any) -> Any:
        if isinstance(data, dict) and "policy" not in data:
            own = set(TailPolicy.model_fields)
            data = {"policy": {k: v for k, v in data.items() if k in own},
                    **{k: v for k, v in data.items() if k not in own}}
        return data


class SimMetrics(_Section):
    """The metrics of one simulated run (see the module docstring)."""

    iterations: int
    """iterations simulated"""
    mode: Literal["sync", "async"]
    """the plan's pipeline mode"""
    iteration_s: IterationStats
    first_iteration_s: float
    """the first iteration's time (async: with the pipeline fill)"""
    predicted_iteration_s: float
    """the plan's (cost model's) iteration time"""
    error_vs_predicted: float
    """mean iteration time / predicted - 1"""
    stage_s: StageSeconds
    samples_per_s: float
    """committed (trained) samples per second of the steady state (async: without fill and
    drain), times goodput: the rate a long run reaches"""
    tokens_per_s: float
    """their response tokens per second, as `samples_per_s`"""
    wall_samples_per_s: float
    """committed samples over this short run's wall time"""
    utilization: Utilization
    bubble_s: float
    """per iteration, the device-weighted mean time accelerator slots sit idle"""
    role_s: dict[str, float]
    """busy seconds per iteration of each role (rollout: per engine replica; environment: per
    CPU server; sync: the weight sync on the rollout slot)"""
    wall_s: float
    """wall time of the run, failures, restarts and checkpoints included"""
    goodput: float
    """useful iteration time over wall time under failures (1.0 without failures)"""
    failures: int
    lost_s: float
    """work lost to failures (seconds)"""
    checkpoints: int
    finished: bool
    """False when failures kept the run from finishing its iterations"""
    tool_calls: int
    decode_runs: int
    """compressed decode runs the engines simulated"""
    why: Why
    tail_policy: TailPolicyStats
    restart_s: float
    """seconds one restart costs (0 without failures)"""
    checkpoint_s: float
    """seconds one checkpoint costs (0 without checkpoints)"""
    events: int
    """trace events recorded"""


def iteration_durations(run: RunRecord, mode: PipelineMode) -> list[float]:
    """Failure-free duration of every iteration (overlapping steps: time between training
    commits)."""
    if mode.overlaps_steps:
        ends = [r.end for r in run.iterations]
        return [ends[0]] + [b - a for a, b in zip(ends, ends[1:])]
    return [r.end - r.start for r in run.iterations]


def _stats(xs: list[float]) -> IterationStats:
    a = np.asarray(xs, dtype=float)
    return IterationStats(mean=float(a.mean()), p50=float(np.percentile(a, 50)),
                          p99=float(np.percentile(a, 99)), min=float(a.min()), max=float(a.max()))


def goodput_rate(tl: Timeline) -> float:
    """Share of wall time that makes progress (1.0 without failures or checkpoints)."""
    return tl.goodput if tl.goodput > 0 else 0.0


def steady(durations: list[T], mode: PipelineMode) -> list[T]:
    """Overlapping steps (async): drop the pipeline fill (first) and, from three iterations on,
    the drain (last: its rollout ran ahead while earlier steps trained, so its interval is
    short)."""
    if not mode.overlaps_steps or len(durations) < 2:
        return durations
    return durations[1:-1] if len(durations) >= 3 else durations[1:]


def utilization(res: Resolved, plan: Plan, run: RunRecord
                ) -> tuple[dict[str, float], dict[str, float], float]:
    """(per slot, per pool, bubble seconds per iteration)."""
    span = max(run.end_s, 1e-12)
    busy: dict[str, float] = defaultdict(float)
    for slot, _, dur, share in run.busy:
        busy[slot] += dur * share
    for slot, secs in run.engine_busy_s.items():
        busy[slot] += secs
    per_slot = {s.name: min(busy[s.name] / span, 1.0) for s in plan.slots}
    for pool in run.pools:  # the CPU pool serving tool calls: busy server-seconds
        for s in plan.slots:
            if Role.ENVIRONMENT in s.roles and s.pool == pool.name:
                per_slot[s.name] = min(pool.busy_s / pool.slots / span, 1.0)
    per_pool: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    idle = devs = 0.0
    for s in plan.slots:
        for name, n in s.pool_devices():
            # a split role's slot: its slot work (weight sync) on every part, engines per part
            u = (per_slot[s.name] if not s.parts else
                 min((busy[s.name] - run.engine_busy_s.get(s.name, 0.0)
                      + run.part_busy_s.get((s.name, name), 0.0)) / span, 1.0))
            per_pool[name][0] += u * n
            per_pool[name][1] += n
            if res.device_of(name).kind is not DeviceKind.cpu:
                idle += (1 - u) * span * n
                devs += n
    pools = {p: v[0] / v[1] for p, v in per_pool.items()}
    bubble = idle / devs / max(len(run.iterations), 1) if devs else 0.0
    return per_slot, pools, bubble


def why(run: RunRecord) -> Why:
    tails, queue, contention = [], [], []
    for rec in run.iterations:
        t0, t1 = rec.stages.get("rollout", (rec.start, rec.start))
        done = sorted(rec.done_at.values())
        if done:
            k = min(int(np.ceil(TAIL_QUANTILE * len(done))) - 1, len(done) - 1)
            tails.append(t1 - done[max(k, 0)])
        n = max(len(rec.done_at), 1)
        queue.append(rec.tool_wait_s / n)
        contention.append(max(rec.sync_s - rec.sync_alone_s, 0.0))
    causes = {"long_tail_s": float(np.mean(tails)) if tails else 0.0,
              "queueing_s": float(np.mean(queue)) if queue else 0.0,
              "link_contention_s": float(np.mean(contention)) if contention else 0.0}
    best = max(causes, key=causes.__getitem__)
    return Why(**causes, max_slowdown=max((r.max_slowdown for r in run.iterations), default=1.0),
               dominant=best.removesuffix("_s") if causes[best] > 0 else "none")


def compute(res: Resolved, plan: Plan, run: RunRecord, tl: Timeline, restart_s: float,
            checkpoint_s: float, events: int) -> SimMetrics:
    """The run's metrics; `restart_s` and `checkpoint_s`: what a restart and a checkpoint cost
    (0 where none happened), `events`: the trace events recorded."""
    mode = plan.pipeline
    durs = iteration_durations(run, mode)
    per_slot, per_pool, bubble = utilization(res, plan, run)
    n = len(durs)
    done = [run.committed.get(i, run.samples[i]) for i in range(n)]
    samples = sum(d.n for d in done)
    role_s = {r: v / n for r, v in run.role_s.items()}
    for pool in run.pools:
        role_s[Role.ENVIRONMENT] = pool.busy_s / pool.slots / n
    st = steady(durs, mode)
    kept = steady(done, mode)  # the same iterations as st
    rate = float(goodput_rate(tl)) / float(np.mean(st)) if st else 0.0
    stage_s = {}
    if not mode.overlaps_steps:  # stages in sequence: each has its own span
        for stage in SYNC_STAGES:
            stage_s[stage] = float(np.mean([r.stages[stage][1] - r.stages[stage][0]
                                            for r in run.iterations if stage in r.stages]))
        passes = [r.stages["validate"] for r in run.iterations if "validate" in r.stages]
        if passes:
            stage_s["validation"] = sum(b - a for a, b in passes) / len(run.iterations)
    mean = float(np.mean(st))
    return SimMetrics(
        iterations=n, mode=plan.mode,
        iteration_s=_stats(st),
        first_iteration_s=durs[0],
        predicted_iteration_s=plan.predicted_iteration_s,
        error_vs_predicted=(mean - plan.predicted_iteration_s) / plan.predicted_iteration_s,
        stage_s=StageSeconds(**stage_s),
        samples_per_s=float(np.mean([d.n for d in kept])) * rate,
        tokens_per_s=float(np.mean([d.response_tokens() for d in kept])) * rate,
        wall_samples_per_s=samples / tl.wall_s if tl.wall_s > 0 else 0.0,
        utilization=Utilization(slot=per_slot, pool=per_pool),
        bubble_s=bubble,
        role_s=role_s,
        wall_s=tl.wall_s,
        goodput=tl.goodput,
        failures=len(tl.failures),
        lost_s=float(sum(lost for _, lost in tl.failures)),
        checkpoints=len(tl.checkpoints),
        finished=tl.finished,
        tool_calls=sum(r.tool_calls for r in run.iterations),
        decode_runs=run.decode_runs,
        why=why(run),
        tail_policy=tail_stats(res, run),
        restart_s=restart_s, checkpoint_s=checkpoint_s, events=events)


def tail_stats(res: Resolved, run: RunRecord) -> TailPolicyStats:
    """What the job's long-tail policy did, per iteration (see `simulator.tails`)."""
    recs = run.iterations
    n = max(len(recs), 1)
    return TailPolicyStats(
        policy=res.job.tail_policy,
        generated_per_iteration=sum(r.generated for r in recs) / n,
        committed_per_iteration=sum(r.committed for r in recs) / n,
        carried_tokens_per_iteration=sum(r.carried_tokens for r in recs) / n,
        reissued_calls=sum(r.reissued for r in recs),
        reissue_saved_s=float(sum(p.saved_s for p in run.pools)))
