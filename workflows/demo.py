"""`make demo` (`python -m workflows.demo --out DIR`): the whole loop on the embedded default job.

On examples/tiny-cpu.yaml (a tiny GRPO job: two emulated GPUs, four emulated LPU chips, one CPU
node; the work runs on this machine's CPU):

  1. plan        the ILP places every role                          DIR/plan.json
  2. simulate    three iterations of the plan                       DIR/sim/ (trace, figures)
  3. execute     a few steps on an embedded local Ray               DIR/run/trace.json (+ ledger)
  4. record      the run's per-sample workload                      DIR/run/workload.jsonl
  5. calibrate   event-level factors (placer calibrate) and the
                 stage-level ones (workflows/fidelity_heldout.py)      DIR/profile.json
  6. fidelity    simulate the plan with the run's inputs and the
                 calibration, lay it against the run                DIR/fidelity/ (figures)

and prints one line: the plan's predicted step time, the calibrated simulation's and the measured
one. The calibration is fitted on this same run (in-sample); for held-out runs see
`python -m workflows.fidelity_heldout`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.cost.calibration import write_calibration
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.planfile import save_plan
from placer.solve.planner import plan_job
from placer.solve.render import where
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from simulator.api import simulate_plan
from traces.record import rows_from_trace
from traces.workload import write_rows
from workflows.fidelity import fidelity, write_figures
from workflows.fidelity_heldout import event_profile, execute_plan
from workflows.stagefit import stage_calibrate

DEFAULT_JOB = Path(__file__).resolve().parent.parent / "examples" / "tiny-cpu.yaml"


def _say(msg: str) -> None:
    print(msg, flush=True)


def demo(out: Path, job_path: Path, steps: int) -> str:
    """Run the six stages (module docstring); returns the fidelity line."""
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    _say(f"[1/6] plan {job_path.name}")
    plan = plan_job(Pricer(resolve(load_job(job_path)), Calibration()))
    save_plan(plan, out / "plan.json")
    for name, r in plan.roles.items():
        _say(f"      {name:<12} {where(r)} (slot {r.slot})")
    _say(f"      predicted step {plan.predicted_iteration_s:.3f} s -> {out / 'plan.json'}")

    _say("[2/6] simulate 3 iterations")
    sim = simulate_plan(plan, iterations=3, seed=plan.resolved().job.seed,
                        trace_path=out / "sim" / "trace.json", plots_dir=out / "sim")
    _say(f"      simulated step {sim.metrics.iteration_s.mean:.3f} s -> {out / 'sim'}/")

    _say(f"[3/6] execute {steps} steps on a local embedded Ray (first start takes a while)")
    trace = execute_plan(plan, steps, out / "run", lambda m: _say(f"      {m}"))
    _say(f"      trace -> {out / 'run' / 'trace.json'} ({len(trace.events)} events)")

    _say("[4/6] record the run's workload (per-sample lengths, tool latencies)")
    rows = rows_from_trace(trace, "run/trace.json")
    write_rows(out / "run" / "workload.jsonl", rows)
    _say(f"      {len(rows)} samples -> {out / 'run' / 'workload.jsonl'}")

    _say("[5/6] calibrate (event-level fit, then stage-level)")
    calib = stage_calibrate(plan, trace, event_profile(plan, trace, str(out / "run" / "trace.json")))
    write_calibration(calib, out / "profile.json")
    for dev, values in sorted((calib.overrides.devices or {}).items()):
        _say(f"      {dev}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted((values or {}).items())))
    _say(f"      -> {out / 'profile.json'}")

    _say("[6/6] fidelity: simulate with the run's inputs and the calibration")
    report, fsim = fidelity(plan, trace, calib, "run/trace.json",
                            sim_trace_path=out / "fidelity" / "sim_trace.json")
    paths = write_figures(report, fsim, trace, out / "fidelity")
    atomic_write_text(out / "fidelity" / "report.json", report.to_json())
    for line in report.table():
        _say("    " + line)
    _say(f"      figures: {', '.join(str(p) for p in paths)}")
    st = report.step
    line = (f"FIDELITY {report.job}: step time predicted {plan.predicted_iteration_s:.3f} s "
            f"(plan, uncalibrated) | simulated {st.simulated:.3f} s (calibrated on this run, "
            f"replayed inputs, {st.error:+.1%}) | measured {st.measured:.3f} s "
            f"(steady steps {report.steady[0]}-{report.steady[-1]})")
    _say(f"done in {time.time() - t0:.0f} s; everything under {out}/")
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workflows.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/demo", help="output folder (default out/demo)")
    ap.add_argument("--job", default=str(DEFAULT_JOB), help="job YAML (default tiny-cpu)")
    ap.add_argument("--steps", type=int, default=4, help="executed steps (default 4; >= 3)")
    args = ap.parse_args(argv)
    try:
        if args.steps < 3:
            raise SpecError(f"--steps: need at least 3 (calibration needs 3 events of a kind; "
                            f"got {args.steps})")
        line = demo(Path(args.out), Path(args.job), args.steps)
    except SpecError as e:
        print(f"workflows.demo: error: {e}", file=sys.stderr)
        return 2
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
