"""`placer fidelity PLAN.json TRACE.json [--calibration F] [--plots DIR] [--sim-trace F] [--json]`.

Simulates the plan with the executed run's own inputs (per-sample lengths and tool latencies
recorded from TRACE.json and replayed) and prints measured against simulated per step, stage and
role, and the rollout length / finish-time relation (workflows/fidelity.py). `--plots` writes the
two timelines one above the other, the per-step bars and the length/finish scatter.
"""
from __future__ import annotations

# Heavy imports (ortools, simpy, torch, Ray) wait for `run`: the CLI imports every command
# module to build `placer --help`, and a command pays only for what it runs.
import argparse

from placer.base.inputs import check_output
from placer.cli import emit_json, note
from placer.cost.calibration import load_calibration
from placer.solve.planfile import load_plan
from traces.schema import read_trace


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", metavar="PLAN.json", help="the plan the run executed")
    p.add_argument("trace", metavar="TRACE.json", help="the executed run's trace")
    p.add_argument("--calibration", metavar="F",
                   help="calibration profile to simulate with (default: the plan's own)")
    p.add_argument("--plots", metavar="DIR", help="write the fidelity figures (PNG) here")
    p.add_argument("--sim-trace", metavar="OUT.json", help="write the simulated trace here")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    from workflows.fidelity import fidelity, write_figures

    check_output(args.plots, "--plots", folder=True)  # before the simulation, not after it
    check_output(args.sim_trace, "--sim-trace")
    plan = load_plan(args.plan)
    trace = read_trace(args.trace)
    calib = load_calibration(args.calibration) if args.calibration else None
    report, sim = fidelity(plan, trace, calib, args.trace, sim_trace_path=args.sim_trace)
    for n in report.inputs.notes if report.inputs is not None else ():
        note(f"note: {n}")
    if args.plots:
        paths = write_figures(report, sim, trace, args.plots)
        note("figures: " + ", ".join(str(p) for p in paths))
    if args.json:
        emit_json(report.to_dict())
        return 0
    print("\n".join(report.table()))
    print(report.line())
    return 0
