"""Metrics of a simulated run, and why it differs from the plan's prediction.

  iteration_s      mean / p50 / p99 of iteration times (async mode: the steady state, without
                   the first iteration's pipeline fill and the last one's drain)
  samples_per_s,   committed (trained) samples and their response tokens per second of the
  tokens_per_s     steady state (async: without fill and drain), times goodput; the rate a long
                   run reaches. wall_samples_per_s is the same over this short run's wall time
  utilization      busy share of each slot's devices over the run, and per pool (device-weighted;
                   a rollout split over pools counts each part's engines on its own pool)
  bubble_s         per iteration, the device-weighted mean time accelerator slots sit idle
  role_s           busy seconds per iteration of each role (rollout: per engine replica;
                   environment: per CPU server; sync: the weight sync on the rollout slot)
  goodput          useful iteration time over wall time under failures (1.0 without failures)
  tail_policy      the job's long-tail policy and what it did: rows generated and samples
                   committed per iteration, tokens carried to the next step, re-issued calls
  why              long_tail_s: rollout time after 90% of samples were done;
                   queueing_s: tool-call wait for a free core, per sample;
                   link_contention_s: weight-sync time beyond one transfer alone on its links;
                   max_slowdown: the slowest straggler's factor; dominant: the largest of the
                   three second-valued causes (or "none")
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from placer.base.roles import Role
from placer.solve.planfile import Plan
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind
from placer.spec.pipeline import PipelineMode
from simulator.faults import Timeline
from simulator.iteration import RunRecord

TAIL_QUANTILE = 0.9


def iteration_durations(run: RunRecord, mode: PipelineMode) -> list[float]:
    """Failure-free duration of every iteration (overlapping steps: time between training
    commits)."""
    if mode.overlaps_steps:
        ends = [r.end for r in run.iterations]
        return [ends[0]] + [b - a for a, b in zip(ends, ends[1:])]
    return [r.end - r.start for r in run.iterations]


def _stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=float)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p99": float(np.percentile(a, 99)), "min": float(a.min()), "max": float(a.max())}


def goodput_rate(tl: Timeline) -> float:
    """Share of wall time that makes progress (1.0 without failures or checkpoints)."""
    return tl.goodput if tl.goodput > 0 else 0.0


def steady(durations: list, mode: PipelineMode) -> list:
    """Overlapping steps (async): drop the pipeline fill (first) and, from three iterations on,
    the drain (last: its rollout ran ahead while earlier steps trained, so its interval is
    short)."""
    if not mode.overlaps_steps or len(durations) < 2:
        return durations
    return durations[1:-1] if len(durations) >= 3 else durations[1:]


def utilization(res: Resolved, plan: Plan, run: RunRecord) -> tuple[dict, dict, float]:
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


def why(run: RunRecord) -> dict[str, Any]:
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
    return {**causes, "max_slowdown": max((r.max_slowdown for r in run.iterations), default=1.0),
            "dominant": best.removesuffix("_s") if causes[best] > 0 else "none"}


def compute(res: Resolved, plan: Plan, run: RunRecord, tl: Timeline) -> dict[str, Any]:
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
        for stage in ("sync", "rollout", "score", "train"):
            stage_s[stage] = float(np.mean([r.stages[stage][1] - r.stages[stage][0]
                                            for r in run.iterations if stage in r.stages]))
    mean = float(np.mean(st))
    return {
        "iterations": n, "mode": plan.mode,
        "iteration_s": _stats(st),
        "first_iteration_s": durs[0],
        "predicted_iteration_s": plan.predicted_iteration_s,
        "error_vs_predicted": (mean - plan.predicted_iteration_s) / plan.predicted_iteration_s,
        "stage_s": stage_s,
        "samples_per_s": float(np.mean([d.n for d in kept])) * rate,
        "tokens_per_s": float(np.mean([d.response_tokens() for d in kept])) * rate,
        "wall_samples_per_s": samples / tl.wall_s if tl.wall_s > 0 else 0.0,
        "utilization": {"slot": per_slot, "pool": per_pool},
        "bubble_s": bubble,
        "role_s": role_s,
        "wall_s": tl.wall_s,
        "goodput": tl.goodput,
        "failures": len(tl.failures),
        "lost_s": float(sum(lost for _, lost in tl.failures)),
        "checkpoints": len(tl.checkpoints),
        "finished": tl.finished,
        "tool_calls": sum(r.tool_calls for r in run.iterations),
        "decode_runs": run.decode_runs,
        "why": why(run),
        "tail_policy": tail_stats(res, run),
    }


def tail_stats(res: Resolved, run: RunRecord) -> dict[str, Any]:
    """What the job's long-tail policy did, per iteration (see `simulator.tails`)."""
    recs = run.iterations
    n = max(len(recs), 1)
    return {**res.job.tail_policy.model_dump(exclude_none=True),
            "generated_per_iteration": sum(r.generated for r in recs) / n,
            "committed_per_iteration": sum(r.committed for r in recs) / n,
            "carried_tokens_per_iteration": sum(r.carried_tokens for r in recs) / n,
            "reissued_calls": sum(r.reissued for r in recs),
            "reissue_saved_s": float(sum(p.saved_s for p in run.pools))}
