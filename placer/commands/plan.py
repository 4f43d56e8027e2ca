"""`placer plan JOB.yaml`: place every role with the ILP; print a table, write the plan.

    placer plan JOB.yaml [-o plan.json] [--json] [--explain] [--sweep] [--time-limit S]
                         [--calibration F] [--objective time|cost] [--workers N] [--seed S]

`--json` prints the plan JSON (with `--explain`: {"plan": ..., "explain": ...}; with `--sweep`:
{"frontier": [plan, ...]}, fastest first). `-o` writes the plan atomically (with `--sweep`, the
frontier document).
Exit 2 for bad input, 3 for a job that cannot be placed (the message says why).
"""
from __future__ import annotations

import argparse
from typing import Any

from placer.calibration import load_calibration
from placer.catalog import resolve
from placer.cli import emit_json, note
from placer.plan import Plan, atomic_write_text, dumps
from placer.spec import SpecError, load_job, read_structured


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="JOB.yaml")
    p.add_argument("-o", "--output", metavar="PLAN.json",
                   help="write the plan here (with --sweep: the frontier document)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--explain", action="store_true",
                   help="per-role breakdown, binding constraints, value of one more node per pool")
    p.add_argument("--sweep", action="store_true", help="the time/cost Pareto frontier")
    p.add_argument("--points", type=int, default=8, help="most frontier points with --sweep")
    add_solver_arguments(p)


def add_solver_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--time-limit", type=float, default=10.0, metavar="S",
                   help="solver time limit in seconds (default 10)")
    p.add_argument("--calibration", metavar="F", help="calibration profile (YAML/JSON)")
    p.add_argument("--objective", choices=("time", "cost"), help="override the job's objective")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT search workers (default 2)")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default 0)")


def check_solver_arguments(args: argparse.Namespace) -> None:
    if not args.time_limit > 0:
        raise SpecError(f"--time-limit: must be > 0 seconds (got {args.time_limit!r})")
    if args.workers < 1:
        raise SpecError(f"--workers: must be >= 1 (got {args.workers})")
    if getattr(args, "points", 2) < 2:
        raise SpecError(f"--points: a frontier needs >= 2 points (got {args.points})")


def load_inputs(args: argparse.Namespace):
    """(resolved job, calibration, calibration document) from the command line."""
    check_solver_arguments(args)
    res = resolve(load_job(args.job), args.job)
    calib = load_calibration(args.calibration)
    doc = read_structured(args.calibration) if args.calibration else None
    return res, calib, doc


def run(args: argparse.Namespace) -> int:
    from placer.planner import plan_job, sweep_job  # noqa: PLC0415  (ortools only when planning)

    res, calib, cdoc = load_inputs(args)
    if args.sweep:
        plans = sweep_job(res, calib, time_limit_s=args.time_limit, max_points=args.points,
                          workers=args.workers, seed=args.seed, calibration_doc=cdoc)
        doc: Any = {"frontier": [p.model_dump(mode="json") for p in plans]}
        _write(args, dumps(doc))
        if args.json:
            emit_json(doc)
        else:
            print(render_frontier(plans))
        return 0
    plan = plan_job(res, calib, time_limit_s=args.time_limit, objective=args.objective,
                    workers=args.workers, seed=args.seed, calibration_doc=cdoc)
    out: Any = plan.model_dump(mode="json")
    text = None
    if args.explain:
        from placer.explain import explain, render  # noqa: PLC0415
        ex = explain(plan, res, calib, time_limit_s=min(args.time_limit, 5.0))
        out, text = {"plan": out, "explain": ex}, render(ex)
    _write(args, plan.to_json())  # -o is always a plan that `simulate`/`execute` read
    if args.json:
        emit_json(out)
        return 0
    print(render_plan(plan))
    if text:
        print(text)
    return 0


def _write(args: argparse.Namespace, text: str) -> None:
    if args.output:
        atomic_write_text(args.output, text)
        note(f"wrote {args.output}")


def render_plan(plan: Plan) -> str:
    """The readable table of one plan."""
    s = plan.solver
    unit = "s" if plan.objective == "time" else "USD/sample"
    per_hour = plan.cost_per_sample * plan.throughput_samples_s * 3600
    lines = [f"plan for {plan.job.get('name', 'job')}: {plan.job.get('algorithm')}, {plan.mode} "
             f"mode, objective {plan.objective}",
             f"solver: {s.name} {s.status}, objective {s.objective:.6g} {unit}, bound "
             f"{s.bound:.6g}, gap {s.gap:.2%}, {s.solve_s:.2f} s",
             f"predicted iteration {plan.predicted_iteration_s:.3f} s | "
             f"{plan.throughput_samples_s:.2f} samples/s | {plan.cost_per_sample:.6f} USD/sample | "
             f"{per_hour:.2f} USD/h", "",
             f"{'role':<12} {'pool':<8} {'devices':>7} {'tp':>3} {'pp':>3} {'dp':>5} "
             f"{'slot':<28} {'time s':>9} {'mem GB':>7}"]
    for name, r in plan.roles.items():
        lines.append(f"{name:<12} {r.pool:<8} {r.devices:>7} {r.tp:>3} {r.pp:>3} {r.dp:>5} "
                     f"{r.slot:<28} {r.time_s:>9.3f} {r.memory_gb:>7.1f}")
    lines += ["", f"{'slot':<28} {'pool':<8} {'devices':>7} {'nodes':>6}  busy s"]
    for sl in plan.slots:
        busy = plan.breakdown.slot_busy_s.get(sl.name, 0.0)
        lines.append(f"{sl.name:<28} {sl.pool:<8} {sl.devices:>7} {len(set(sl.nodes)):>6}  "
                     f"{busy:.3f}")
    st = plan.breakdown.stage_s
    lines.append("")
    lines.append("stages: " + ", ".join(f"{k} {v:.3f} s" for k, v in st.items()) +
                 f" ({'busiest slot' if plan.mode == 'async' else 'sum of stages'})")
    lines.append(f"bundles: {len(plan.bundles)}, weight-sync routes: {len(plan.sync_routes)}")
    return "\n".join(lines)


def render_frontier(plans: list[Plan]) -> str:
    lines = ["time/cost Pareto frontier (fastest first)",
             f"{'#':>2} {'iteration s':>12} {'samples/s':>10} {'USD/sample':>11} {'USD/h':>9}  "
             "placement"]
    for i, p in enumerate(plans):
        per_hour = p.cost_per_sample * p.throughput_samples_s * 3600
        where = ", ".join(f"{r}:{x.pool}x{x.devices}" for r, x in p.roles.items())
        lines.append(f"{i:>2} {p.predicted_iteration_s:>12.3f} {p.throughput_samples_s:>10.2f} "
                     f"{p.cost_per_sample:>11.6f} {per_hour:>9.2f}  {where}")
    return "\n".join(lines)
