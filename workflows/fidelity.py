"""Fidelity: a plan's simulation laid against the run that executed it.

`fidelity(plan, trace)` simulates the plan with the run's own seed-independent inputs (every
sample's prompt and response lengths and every tool call's latency, recorded from the executed
trace by `traces.record` and replayed by `simulate_plan(..., workload=...)`), so that what is
left between the two is the cost model and the simulator, not the luck of the draw. It reports:

  steps     each step's measured and simulated time and the relative error (simulated/measured-1);
            the headline is over the steady steps (the first step pays one-off costs and is left
            out of the steady mean when there are later steps);
  stages    sync, rollout, environment, score, train, checkpoint and "other" per step, mean over
            the steady steps; a checkpoint is priced by `hostmem.plan_checkpoint_s` after the
            steps that saved one; "other" is the measured time no stage covers (the driver's
            work between stages), which the simulator does not have: pure model error;
  roles     each role's busy time per step (its slowest worker); weight pushes count as `sync`,
            the single controller's dispatch before each pass as `dispatch`; with a rule reward,
            reward and environment are one entry, as the cost model prices the check as reward;
  lengths   per sample, response tokens against when its generation finished: the rollout's
            makespan and the least-squares slope in seconds per response token.

Reading an executed trace (executors/loop.py writes it, traces/schema.py fixes the format): a
step runs from its first `stage` event (its sync) to the end of its `step` event; `stage` events
give sync, rollout, score and train; the environment, when it runs between rollout and score, is
that gap (inside the score stage, score holds it). A sample's finish time is the end of the
`generate` event that produced it. The simulator and matplotlib are imported where used.
"""
from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from pathlib import Path

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.solve.hostmem import plan_checkpoint_s
from placer.solve.planfile import Plan
from simulator.api import simulate_plan
from simulator.result import SimResult
from traces.record import rows_from_trace
from traces.schema import Trace, TraceEvent
from traces.workload import write_rows
from workflows.report import LengthRelation, Lengths, Pair, ReplayInputs, Report

STAGES = ("sync", "rollout", "environment", "score", "train", "checkpoint", "other")
ENV_GAP_S = 1e-3  # a gap between the rollout and score stages shorter than this is bookkeeping


# ------------------------------------------------------------------ reading the executed trace
def _by_step(events: list[TraceEvent]) -> dict[int, list[TraceEvent]]:
    out: dict[int, list[TraceEvent]] = defaultdict(list)
    for ev in events:
        if ev.fields.step is not None:
            out[ev.fields.step].append(ev)
    return out


def measured_spans(trace: Trace, source: str = "trace") -> dict[int, tuple[float, float]]:
    """(start, end) of every executed step: first stage event to the end of its step event."""
    spans = {}
    for step, evs in _by_step(trace.events).items():
        ends = [e.end_s for e in evs if e.cat == "step"]
        if not ends:
            continue  # a step the run did not finish (or redid after a restart)
        starts = [e.ts_s for e in evs if e.cat in ("stage", "step")]
        spans[step] = (min(starts), max(ends))
    if not spans:
        raise SpecError(f"{source}: no `step` events: not an executed trace (traces/schema.py) "
                        "or the run finished no step")
    return dict(sorted(spans.items()))


def measured_stages(trace: Trace, spans: dict[int, tuple[float, float]]
                    ) -> dict[int, dict[str, float]]:
    out = {}
    by = _by_step(trace.events)
    for step, (t0, t1) in spans.items():
        st: dict[str, float] = defaultdict(float)
        first: dict[str, TraceEvent] = {}
        for e in by[step]:
            if e.cat == "stage" and e.name in STAGES:
                st[e.name] += e.dur_s
                first.setdefault(e.name, e)
            elif e.cat == "checkpoint":  # after the train stage, inside the step
                st["checkpoint"] += e.dur_s
        gap = (first["score"].ts_s - first["rollout"].end_s
               if "rollout" in first and "score" in first else 0.0)
        if gap > ENV_GAP_S:  # the environment ran between them (else inside a stage)
            st["environment"] = gap
        st["other"] = max((t1 - t0) - sum(st.values()), 0.0)
        out[step] = dict(st)
    return out


DISPATCH = " dispatch"  # the single controller's batch shipment: `<role> dispatch` (simulator)


def transfer_row(ev: TraceEvent) -> str:
    """The row a transfer event counts in: `sync` for a weight push (`weight sync`, or any sized
    copy: bytes or gb, what `placer.calibrate.fit_events` prices as one), `dispatch` for the driver's
    shipment of a pass's batch (`<role> dispatch`: unsized, host-side, not the rollout's), else
    (an onload: the role's own state back on its devices) the event's role."""
    if ev.name == "weight sync" or "bytes" in ev.args or "gb" in ev.args:
        return "sync"
    if ev.name.endswith(DISPATCH):
        return "dispatch"
    return str(ev.fields.role)


def role_times(trace: Trace) -> dict[int, dict[str, float]]:
    """Per step and role: the slowest worker's summed event time (weight pushes as `sync`, the
    driver's batch dispatches as `dispatch`: `transfer_row`)."""
    per: dict[tuple[int, str, str], float] = defaultdict(float)
    for ev in trace.events:
        role, step = ev.fields.role, ev.fields.step
        if step is None or role is None or ev.cat in ("stage", "step"):
            continue
        if ev.cat in ("checkpoint", "failure", "restart"):
            continue
        name = transfer_row(ev) if ev.cat == "transfer" else str(role)
        # the simulator draws every replica's weight push on one lane; they run side by side
        lane = f"{ev.pid}/{ev.tid}/{ev.fields.replica if ev.fields.replica is not None else ''}"
        per[(step, name, lane)] += ev.dur_s
    out: dict[int, dict[str, float]] = defaultdict(dict)
    for (step, name, _), t in per.items():
        out[step][name] = max(out[step].get(name, 0.0), t)
    return dict(out)


def measured_finishes(trace: Trace, rows: list[dict], spans: dict[int, tuple[float, float]]
                      ) -> list[tuple[int, float, float]]:
    """(step, response tokens, finish time after the rollout began) of every executed sample."""
    starts: dict[int, float] = {}
    for e in trace.events:
        step = e.fields.step
        if e.cat == "stage" and e.name == "rollout" and step is not None:
            starts[step] = min(starts.get(step, math.inf), e.ts_s)
    done: dict[tuple[int, str], float] = {}
    for e in trace.events:
        step = e.fields.step
        if (e.cat in ("generate", "decode") and step is not None and step in spans
                and e.fields.role != Role.REWARD):  # a generative judge's: not a sample's
            for sid in e.fields.sample_ids or []:
                t0 = starts.get(step, spans[step][0])
                done[(step, str(sid))] = max(done.get((step, str(sid)), 0.0), e.end_s - t0)
    return [(r["step"], float(sum(r["response_tokens"])), done[(r["step"], str(r["sample_id"]))])
            for r in rows if (r["step"], str(r["sample_id"])) in done]


def _relation(points: list[tuple[int, float, float]]) -> LengthRelation:
    """Makespan (mean over steps of the last finish) and the least-squares slope s/token."""
    if not points:
        return LengthRelation(0.0, 0.0, 0)
    last: dict[int, float] = defaultdict(float)
    for step, _, t in points:
        last[step] = max(last[step], t)
    xs = [p[1] for p in points]
    ys = [p[2] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    return LengthRelation(round(sum(last.values()) / len(last), 6), float(f"{slope:.4g}"),
                          len(points), tuple((s, x, round(t, 6)) for s, x, t in points))


# ------------------------------------------------------------------ the simulated side
def simulated_stages(sim: SimResult, checkpoints: dict[int, float] | None = None
                     ) -> dict[int, dict[str, float]]:
    """Per iteration, its stages' seconds; `checkpoints`: step -> the checkpoint's seconds
    after the steps that save one (`checkpoint_steps`), which the step then lasts longer."""
    out = {}
    for rec in sim.run.iterations:
        st = {k: max(b - a, 0.0) for k, (a, b) in rec.stages.items()}
        st["other"] = max(rec.end - rec.start - sum(st.values()), 0.0)
        if checkpoints and rec.index in checkpoints:
            st["checkpoint"] = checkpoints[rec.index]
        out[rec.index] = st
    return out


def checkpoint_steps(trace: Trace) -> set[int]:
    """The executed steps that saved a checkpoint (a `checkpoint` event; executors/training.py
    saves one every `checkpoint_every` steps, after the train stage)."""
    return {e.fields.step for e in trace.events
            if e.cat == "checkpoint" and e.fields.step is not None}


def simulated_finishes(sim: SimResult) -> list[tuple[int, float, float]]:
    pts = []
    for rec in sim.run.iterations:
        smp = sim.run.samples.get(rec.index)
        t0 = rec.stages.get("rollout", (rec.start, rec.start))[0]
        if smp is None:
            continue
        pts += [(rec.index, float(sum(smp.response[i])), t - t0)
                for i, t in sorted(rec.done_at.items())]
    return pts


# ------------------------------------------------------------------ the comparison
def replay_rows(trace: Trace, job_prompt_tokens: int, source: str = "trace"
                ) -> tuple[list[dict], list[str]]:
    """Workload rows of the executed steps, and notes on what the trace did not say.

    A row without `prompt_tokens` (the run's generate events did not list them) gets the job's
    mean prompt length, and the note says so: replay then fixes responses and tool latencies but
    not prompts.
    """
    rows = rows_from_trace(trace, source)
    notes = []
    missing = [r for r in rows if "prompt_tokens" not in r]
    if missing:
        for r in missing:
            r["prompt_tokens"] = job_prompt_tokens
        notes.append(f"{len(missing)} of {len(rows)} samples have no recorded prompt length: "
                     f"replayed with the job's mean ({job_prompt_tokens} tokens)")
    if any("response_tokens" not in r for r in rows):
        raise SpecError(f"{source}: some samples have no response length: cannot replay")
    for r in rows:  # a turn that recorded no token (equal shares rounding down) still decodes one
        r["response_tokens"] = [max(int(v), 1) for v in r["response_tokens"]]
    return rows, notes


def _mean(d: dict[int, dict[str, float]], steps: list[int], key: str) -> float:
    return sum(d.get(s, {}).get(key, 0.0) for s in steps) / len(steps)


def fidelity(plan: Plan, trace: Trace, calibration: Calibration | None = None,
             source: str = "trace", seed: int | None = None,
             sim_trace_path: str | Path | None = None, warmup: int = 1
             ) -> tuple[Report, SimResult]:
    """Simulate `plan` with the run's recorded inputs and compare with the executed `trace`;
    the first `warmup` steps are left out of the steady means (all but the last, when the run
    has no more steps than that)."""
    spans = measured_spans(trace, source)
    steps = sorted(spans)
    if steps != list(range(len(steps))):
        raise SpecError(f"{source}: executed steps {steps} are not 0..n-1: cannot line them up "
                        "with simulated iterations")
    res = plan.resolved()
    rows, notes = replay_rows(trace, max(round(res.job.lengths.prompt.mean_value()), 1), source)
    n = res.job.batch.samples
    per_step: defaultdict[int, int] = defaultdict(int)
    for r in rows:
        per_step[r["step"]] += 1
    short = {s: c for s, c in per_step.items() if c != n}
    if short:
        raise SpecError(f"{source}: step {min(short)} has {short[min(short)]} recorded samples, "
                        f"the plan's job has {n} per step: is this the plan the run executed?")
    with tempfile.TemporaryDirectory() as tmp:
        wl = Path(tmp) / "workload.jsonl"
        write_rows(wl, rows)
        sim = simulate_plan(plan, iterations=len(steps),
                            seed=res.job.seed if seed is None else seed,
                            calibration=calibration, workload=wl, trace_path=sim_trace_path)
    saved = checkpoint_steps(trace)
    ckpt_s = plan_checkpoint_s(plan, calibration) if saved else 0.0
    ckpts = {i: ckpt_s for i in saved}
    mst, sst = measured_stages(trace, spans), simulated_stages(sim, ckpts)
    sim_span = {rec.index: rec.end - rec.start + ckpts.get(rec.index, 0.0)
                for rec in sim.run.iterations}
    pairs = {s: Pair(spans[s][1] - spans[s][0], sim_span[s]) for s in steps}
    steady = steps[warmup:] if len(steps) > warmup else steps[-1:]
    stages = {k: Pair(_mean(mst, steady, k), _mean(sst, steady, k)) for k in STAGES
              if any(k in mst[s] or k in sst[s] for s in steady)}
    mrt, srt = role_times(trace), role_times(sim.trace)
    for s in steps:  # the executor's environment call has no timed event of its own: its
        mine = mrt.setdefault(s, {})  # stage gap, or (run inside score) the score stage
        if "environment" in mst[s]:
            mine["environment"] = mst[s]["environment"]
        elif mine.get("environment", 0.0) <= 0.0 and "score" in mst[s]:
            mine["environment"] = max(mst[s]["score"] - mine.get("reward", 0.0), 0.0)
    if res.model_of(Role.REWARD) is None:  # a rule reward: the cost model prices the sandboxed
        for side in (mrt, srt):         # check of every answer as reward work on the CPU
            for s in side:
                side[s]["reward+environment"] = (side[s].pop("reward", 0.0)
                                                 + side[s].pop("environment", 0.0))
    names = sorted({r for s in steady for r in (*mrt.get(s, {}), *srt.get(s, {}))})
    roles = {r: Pair(_mean(mrt, steady, r), _mean(srt, steady, r)) for r in names}
    lengths = Lengths(_relation([p for p in measured_finishes(trace, rows, spans)
                                 if p[0] in steady]),
                      _relation([p for p in simulated_finishes(sim) if p[0] in steady]))
    inputs = ReplayInputs(len(rows), len(steps), tuple(notes),
                          "given" if calibration is not None else "the plan's own")
    report = Report(res.job.name, plan.predicted_iteration_s, pairs, steady, stages, roles,
                    lengths, inputs)
    return report, sim


def write_figures(report: Report, sim: SimResult, trace: Trace, out_dir: str | Path
                  ) -> list[Path]:
    """fidelity_timelines.png (executed above simulated), fidelity_steps.png, and
    fidelity_lengths.png under `out_dir`."""
    from workflows import plots  # lazy: matplotlib (~0.5 s) only when figures are asked for
    out = Path(out_dir)
    spans = measured_spans(trace)
    t0 = min(a for a, _ in spans.values())
    edges = ([b - t0 for _, b in spans.values()], [rec.end for rec in sim.run.iterations])
    st = report.step
    title = (f"{report.job}: executed vs simulated; steady step {st.measured:.3f} s measured, "
             f"{st.simulated:.3f} s simulated ({st.error:+.1%})")
    env = []  # the executor's environment call has no event: draw its stage gap
    for evs in _by_step(trace.events).values():
        first = {e.name: e for e in sorted(evs, key=lambda e: -e.ts_s) if e.cat == "stage"}
        if "rollout" in first and "score" in first and (
                first["score"].ts_s - first["rollout"].end_s > ENV_GAP_S):
            a, b = first["rollout"].end_s, first["score"].ts_s
            env.append(("driver/environment (stage gap)", a, max(b - a, 0.0), "environment"))
    return [plots.save(plots.timelines(trace, sim.trace, edges, title, env),
                       out / "fidelity_timelines.png"),
            plots.save(plots.step_bars(report), out / "fidelity_steps.png"),
            plots.save(plots.length_finish(report), out / "fidelity_lengths.png")]
