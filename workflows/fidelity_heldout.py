"""Held-out fidelity: calibrate on one executed run, predict runs that differ from it.

    python -m workflows.fidelity_heldout --out out/heldout [--steps 4] [--warmup 1]
                                         [--job examples/tiny-cpu.yaml]
                                         [--moe-job examples/tiny-moe.yaml]
    python -m workflows.fidelity_heldout --out out/heldout --reuse     # recompute from saved traces
    python -m workflows.fidelity_heldout --out out/h --runs 'tp 2,moe'  # base and these only

Runs (on the job's own cluster, one embedded Ray for all but the `moe` run's; a fresh Ray's first
run is a short warm-up of the next plan, not used): `base` (the job as the ILP plans it: the
calibration run), `batch x2` (twice the prompts), `response x2` (responses up to twice as long),
`colocated` and `split` (the baseline placements), `tp 2` (the actor pinned to TP 2), `moe`
(examples/tiny-moe.yaml, actor pinned to dp 2 x tp 2, predicted with the base run's profile: the
factors are per device type, so they carry over to another model) and `base again` (the base
plan once more, last: its error is the machine's own drift, the floor under every other row's).

Calibration has two levels, both fitted on the base run only: the event level (`placer
calibrate`, placer/calibrate/fit.py) and the stage level (workflows/stagefit.py, which `placer
calibrate` also runs). Each run's first `--warmup` steps (default 1) are left out of the stage
fit and of the means: the first step pays one-off costs, and on a small shared machine the next
two or three still run slower.

The table (heldout.md, heldout.json; drawn in heldout.png) reports, per held-out run, the
machine's load average per core when it ended (above 1, work queued for the cores, so measured
times stretch), the measured steady step time, the simulation with the event-level profile and
with both levels, and their errors. Everything is seeded by the job's seed; measured times are
what they are on the machine that ran them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.calibrate.fit import fit_trace, fitted_calibration
from placer.cost.calibration import write_calibration
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.baselines import colocated, split
from placer.solve.planfile import Plan, load_plan, save_plan
from placer.solve.planner import build_problem, plan_assignment, plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from placer.spec.pins import Pin, Pins
from traces.schema import Trace, read_trace
from workflows.fidelity import fidelity
from workflows.report import Pair
from workflows.stagefit import stage_calibrate

DEFAULT_JOB = Path(__file__).resolve().parent.parent / "examples" / "tiny-cpu.yaml"
MOE_JOB = Path(__file__).resolve().parent.parent / "examples" / "tiny-moe.yaml"
TP = 2  # the tensor-parallel degree of the `tp 2` run
# A fresh embedded Ray runs its first job slower throughout (its own start-up work competes for
# a small machine's cores): a short run of the same plan goes first there and is not used.
WARM_UP_DIR, WARM_UP_STEPS = "warm-up", 3


def variant_plans(job_path: str | Path = DEFAULT_JOB, moe_job: str | Path | None = MOE_JOB
                  ) -> dict[str, Plan]:
    """The base plan and the held-out plans (module docstring); no `moe` run without a job."""
    job = load_job(job_path)
    calib = Calibration()
    resp = job.lengths.response
    longer = resp.model_copy(update={k: getattr(resp, k) * 2 for k in ("value", "max")
                                     if getattr(resp, k, None) is not None})
    plans = {"base": plan_job(Pricer(resolve(job), calib)),
             "batch x2": plan_job(Pricer(resolve(job.model_copy(update={"batch": job.batch.model_copy(
                 update={"prompts": job.batch.prompts * 2})})), calib)),
             "response x2": plan_job(Pricer(resolve(job.model_copy(update={
                 "lengths": job.lengths.model_copy(update={"response": longer})})), calib))}
    problem = build_problem(Pricer(resolve(job), calib))
    for name, fn in (("colocated", colocated), ("split", split)):
        a = fn(problem)
        if a is not None:
            plans[name] = plan_assignment(problem, a, name)
    pins = (job.pin or Pins()).model_copy(update={"actor": Pin(tp=TP)})
    plans[f"tp {TP}"] = plan_job(Pricer(resolve(job.model_copy(update={"pin": pins})), calib))
    if moe_job is not None:
        plans["moe"] = plan_job(Pricer(resolve(load_job(moe_job)), calib))
    plans["base again"] = plans["base"]
    return plans


def execute_plan(plan: Plan, steps: int, out_dir: Path, note: Callable[[str], None]) -> Trace:
    """Execute `plan` for `steps` steps on the (embedded) Ray; writes plan.json and trace.json.
    An embedded Ray started for another job's cluster (the `moe` run's pools differ) is shut
    down first, so the next run starts one that advertises this plan's nodes. The Ray is this
    workflow's own (`cluster.start`), kept warm across its runs: a run stops only a Ray it
    started itself."""
    import ray  # lazy: torch and Ray (~2 s) only when executing

    from executors import cluster
    from executors.cluster import node_resources
    from executors.run import execute
    from executors.runplan import resolve_plan
    if ray.is_initialized():
        have, need = ray.cluster_resources(), Counter[str]()
        for r in node_resources(resolve_plan(plan)).values():
            need.update(r)
        if any(have.get(k, 0.0) < v for k, v in need.items()):
            ray.shutdown()
    if not ray.is_initialized():  # a fresh Ray: warm it up on this plan first
        cluster.start(resolve_plan(plan))
        note(f"  warming a fresh Ray up: {WARM_UP_STEPS} steps of this plan (not used)")
        (out_dir / WARM_UP_DIR).mkdir(parents=True, exist_ok=True)
        execute(plan, WARM_UP_STEPS, out_dir / WARM_UP_DIR, note=note)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_plan(plan, out_dir / "plan.json")

    def progress(s: Any) -> None:
        note(f"  step {s.step}: {s.step_s:.3f} s (reward {s.reward:.3f})")
    result = execute(plan, steps, out_dir, note=note, progress=progress)
    result.trace.metadata["plan_path"] = "plan.json"  # `placer calibrate` finds the plan by it
    # how busy the machine was (others' work included): a table row's error is read against it
    result.trace.metadata["load_avg_1min"] = round(os.getloadavg()[0], 2)
    result.trace.metadata["cpus"] = os.cpu_count() or 1
    result.trace.write(out_dir / "trace.json")
    return result.trace


def event_profile(plan: Plan, trace: Trace, source: str) -> Calibration:
    """The `placer calibrate` profile of a run (event-level factors)."""
    result = fit_trace(trace, plan, source)
    return fitted_calibration(result, plan, {"trace": source, "plan": "plan.json",
                                             "trace_source": trace.metadata.get("source", "unknown")})


@dataclass(frozen=True)
class Row:
    """One run of the held-out table. Its JSON form (heldout.json) rounds to 4 decimals and
    adds each simulation's error (simulated / measured - 1)."""

    run: str
    what: str
    measured_s: float
    event_s: float  # simulated with the event-level profile
    stage_s: float  # simulated with event + stage level
    predicted_s: float  # the plan's own (uncalibrated) prediction
    stages: dict[str, Pair] = field(default_factory=dict)  # per stage, measured vs simulated
    spread: float = 0.0  # std / mean of the measured steady steps: the run's own noise
    load: float | None = None  # the machine's 1-min load average per core at the run's end

    @property
    def event_error(self) -> float:
        """simulated with the event-level profile / measured - 1 (to 4 decimals)"""
        return round(self.event_s / self.measured_s - 1, 4)

    @property
    def stage_error(self) -> float:
        """simulated with both levels / measured - 1 (to 4 decimals)"""
        return round(self.stage_s / self.measured_s - 1, 4)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "what": self.what, "measured_s": round(self.measured_s, 4),
                "predicted_s": round(self.predicted_s, 4),
                "simulated_event_s": round(self.event_s, 4), "error_event": self.event_error,
                "simulated_stage_s": round(self.stage_s, 4), "error_stage": self.stage_error,
                "measured_step_cv": round(self.spread, 4), "load_per_core": self.load,
                "stages": {k: v.to_dict() for k, v in self.stages.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Row:
        """The row a `to_dict()` document describes (its errors are recomputed)."""
        return cls(d["run"], d["what"], d["measured_s"], d["simulated_event_s"],
                   d["simulated_stage_s"], d["predicted_s"],
                   {k: Pair.from_dict(v) for k, v in d["stages"].items()},
                   d["measured_step_cv"], d["load_per_core"])


WHAT = {"base": "calibration run (in-sample)", "batch x2": "twice the prompts",
        "response x2": "responses up to 2x longer", "colocated": "colocate-all placement",
        "split": "rollout on its own devices", f"tp {TP}": f"actor pinned to TP {TP}",
        "moe": "another job: MoE model, actor dp 2 x tp 2",
        "base again": "nothing: the base plan run again, last (drift)"}


def table(plans: dict[str, Plan], traces: dict[str, Trace], event: Calibration,
          stage: Calibration, warmup: int = 1) -> list[Row]:
    rows = []
    for name, plan in plans.items():
        ev, _ = fidelity(plan, traces[name], event, name, warmup=warmup)
        st, _ = fidelity(plan, traces[name], stage, name, warmup=warmup)
        ms = [st.steps[k].measured for k in st.steady]
        mean = sum(ms) / len(ms)
        cv = (sum((m - mean) ** 2 for m in ms) / len(ms)) ** 0.5 / mean
        rows.append(Row(name, WHAT.get(name, ""), st.step.measured, ev.step.simulated,
                        st.step.simulated, plan.predicted_iteration_s, dict(st.stages), cv,
                        _load_per_core(traces[name])))
    return rows


def _load_per_core(trace: Trace) -> float | None:
    """The machine's load average per core when the run ended (`execute_plan` records it)."""
    load, cpus = trace.metadata.get("load_avg_1min"), trace.metadata.get("cpus")
    if not isinstance(load, (int, float)) or not isinstance(cpus, int) or cpus < 1:
        return None
    return round(load / cpus, 2)


def format_table(rows: list[Row]) -> str:
    head = ("| run | differs by | load / core | measured s (step CV) | predicted s "
            "(uncalibrated) | simulated s (event calib.) | error | simulated s (event+stage "
            "calib.) | error |\n|---|---|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        load = "-" if r.load is None else f"{r.load:.1f}"
        lines.append(f"| {r.run} | {r.what} | {load} | {r.measured_s:.3f} ({r.spread:.0%}) | "
                     f"{r.predicted_s:.3f} | "
                     f"{r.event_s:.3f} | {r.event_error:+.1%} | {r.stage_s:.3f} | "
                     f"{r.stage_error:+.1%} |")
    return "\n".join(lines)


def figure(rows: list[Row], job: str = "") -> Any:
    """The table as a figure (heldout.png): per run, the measured steady step time beside the
    plan's uncalibrated prediction and the two calibrated simulations, each simulation's error
    written at its bar. Drawn here, beside its table, on the palette of `workflows.plots`."""
    import matplotlib.pyplot as plt  # lazy: matplotlib (~0.5 s) only when the figure is asked for

    bars = (("measured", "measured_s", "C3"), ("predicted (uncalibrated)", "predicted_s", "0.6"),
            ("simulated, event calib.", "event_s", "#9ecae1"),
            ("simulated, event+stage calib.", "stage_s", "C0"))
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.75 * len(rows)))
    h = 0.8 / len(bars)
    for k, (label, attr, colour) in enumerate(bars):
        ys = [i + (k - (len(bars) - 1) / 2) * h for i in range(len(rows))]
        vals = [getattr(r, attr) for r in rows]
        ax.barh(ys, vals, h, color=colour, label=label)
        if attr in ("event_s", "stage_s"):
            for y, v, r in zip(ys, vals, rows):
                err = r.event_error if attr == "event_s" else r.stage_error
                ax.annotate(f"{err:+.1%}", (v, y), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{r.run}\n{r.what}" if r.what else r.run for r in rows],
                  fontsize=8)
    ax.invert_yaxis()  # the table's order, top to bottom
    ax.set_xlabel("steady step time (s); % = simulated / measured - 1")
    ax.set_title(f"{job + ': ' if job else ''}held-out fidelity, calibrated on the base run only",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def run_heldout(out: Path, steps: int, job: str | Path, reuse: bool,
                note: Callable[[str], None], moe_job: str | Path | None = MOE_JOB,
                warmup: int = 1, only: list[str] | None = None) -> list[Row]:
    if reuse:
        found = {p.parent.name.replace("_", " "): p for p in out.glob("*/plan.json")}
        order = [n for n in WHAT if n in found] + sorted(set(found) - set(WHAT))
        plans = {n: load_plan(found[n]) for n in order}
        if "base" not in plans:
            raise SpecError(f"--reuse: {out}/base/plan.json: missing (run without --reuse first)")
        traces = {n: read_trace(out / n.replace(" ", "_") / "trace.json") for n in plans}
    else:
        plans = variant_plans(job, moe_job)
        if only:  # a subset: the base run always (it calibrates), then the named runs
            plans = {n: p for n, p in plans.items() if n == "base" or n in only}
        traces = {}
        for name, plan in plans.items():
            note(f"executing {name} ({WHAT.get(name, '')}): {steps} steps")
            traces[name] = execute_plan(plan, steps, out / name.replace(" ", "_"), note)
    event = event_profile(plans["base"], traces["base"], str(out / "base" / "trace.json"))
    stage = stage_calibrate(plans["base"], traces["base"], event, warmup)
    write_calibration(event, out / "profile.event.json")
    write_calibration(stage, out / "profile.json")
    rows = table(plans, traces, event, stage, warmup)
    atomic_write_text(out / "heldout.json", json.dumps([r.to_dict() for r in rows], indent=2))
    atomic_write_text(out / "heldout.md", format_table(rows) + "\n")
    from placer.base.palette import save  # lazy, as in `figure`
    save(figure(rows, plans["base"].spec.name), out / "heldout.png")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workflows.fidelity_heldout", description=__doc__
                                 .splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder (plans, traces, profiles, table)")
    ap.add_argument("--steps", type=int, default=4, help="executed steps per run (default 4)")
    ap.add_argument("--job", default=str(DEFAULT_JOB), help="job YAML (default tiny-cpu)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="first steps of each run left out of the fit and the table (default 1: "
                         "step 0; on a loaded machine the warm-up lasts longer)")
    ap.add_argument("--moe-job", default=str(MOE_JOB),
                    help="the MoE job of the `moe` run (default tiny-moe); 'none': no such run")
    ap.add_argument("--runs", default="",
                    help="comma-separated runs to execute besides base (e.g. 'tp 2,moe'); "
                         "default: all of them")
    ap.add_argument("--reuse", action="store_true",
                    help="recompute the table from the traces already under --out")
    args = ap.parse_args(argv)

    def note(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)
    try:
        if args.steps < 3:
            raise SpecError(f"--steps: need at least 3 (calibration needs 3 events of a kind; "
                            f"got {args.steps})")
        if not 1 <= args.warmup < args.steps:
            raise SpecError(f"--warmup: must be at least 1 and below --steps ({args.steps}) "
                            f"(got {args.warmup})")
        moe = None if args.moe_job == "none" else args.moe_job
        only = [r.strip() for r in args.runs.split(",") if r.strip()] or None
        unknown = sorted(set(only or ()) - set(WHAT))
        if unknown:
            raise SpecError(f"--runs: {unknown[0]!r}: no such run (runs: {', '.join(WHAT)})")
        rows = run_heldout(Path(args.out), args.steps, args.job, args.reuse, note, moe,
                           args.warmup, only)
    except SpecError as e:
        print(f"workflows.fidelity_heldout: error: {e}", file=sys.stderr)
        return 2
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
