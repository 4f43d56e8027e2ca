"""`placer plan JOB.yaml`: place every role with the ILP; print a table, write the plan.

    placer plan JOB.yaml [-o plan.json] [--plot FILE.png] [--json] [--explain] [--sweep]
                         [--time-limit S] [--calibration F] [--objective time|cost] [--workers N]
                         [--seed S]

The plan carries `used_usd_per_hour` (its slots' devices) and `booked_usd_per_hour` (every node
of every pool of the job's cluster) with the cost per sample of each; the summary lists the idle
nodes of each pool that can be released at the same iteration time.
`--json` prints the plan JSON (with `--explain`: {"plan": ..., "explain": ...}; with `--sweep`:
{"frontier": [plan, ...]}, fastest first). `-o` writes the plan atomically (with `--sweep`, the
frontier document). `--plot` draws the plan's placement (`placer.plots.placement`: pools, nodes
and devices coloured by slot) as a PNG, written atomically; it draws one plan, so not with `--sweep`.
Exit 2 for bad input, 3 for a job that cannot be placed (the message says why).
"""
from __future__ import annotations

# Heavy imports (ortools, simpy, torch, Ray) wait for `run`: the CLI imports every command
# module to build `placer --help`, and a command pays only for what it runs.
import argparse
from typing import Any

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.base.inputs import check_output
from placer.cli import emit_json, note
from placer.cost.calibration import load_calibration
from placer.cost.efficiency import Calibration
from placer.solve.planfile import dumps
from placer.solve.render import render_frontier, render_plan
from placer.spec.catalog import Resolved, resolve
from placer.spec.load import load_job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="JOB.yaml")
    p.add_argument("-o", "--output", metavar="PLAN.json",
                   help="write the plan here (with --sweep: the frontier document)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the plan's placement (pools, nodes, devices by slot) as a PNG")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--explain", action="store_true",
                   help="per-role breakdown, binding constraints, value of one more node per pool")
    p.add_argument("--sweep", action="store_true", help="the time/cost Pareto frontier")
    p.add_argument("--points", type=int, default=8, help="most frontier points with --sweep")
    add_solver_arguments(p)


def add_solver_arguments(p: argparse.ArgumentParser, time_limit_s: float = 10.0) -> None:
    p.add_argument("--time-limit", type=float, default=time_limit_s, metavar="S",
                   help=f"solver time limit in seconds (default {time_limit_s:g})")
    p.add_argument("--calibration", metavar="F", help="calibration profile (YAML/JSON)")
    p.add_argument("--objective", choices=("time", "cost"), help="override the job's objective")
    p.add_argument("--workers", type=int, default=2,
                   help="CP-SAT search workers, and the processes that price a large cluster's "
                   "cost table (default 2)")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default 0)")


def check_solver_arguments(args: argparse.Namespace) -> None:
    if not 0 < args.time_limit <= 86400:  # an infinite limit would let a hard solve run forever
        raise SpecError(f"--time-limit: must be > 0 and at most 86400 seconds (got "
                        f"{args.time_limit!r})")
    if not 1 <= args.workers <= 256:  # CP-SAT starts one thread per worker
        raise SpecError(f"--workers: must be 1 to 256 (got {args.workers})")
    if not 0 <= getattr(args, "seed", 0) < 2**31:  # CP-SAT's random_seed is a 32-bit integer
        raise SpecError(f"--seed: must be 0 to {2**31 - 1} (got {args.seed})")
    if not 2 <= getattr(args, "points", 2) <= 100:  # one solve per point
        raise SpecError(f"--points: a frontier needs 2 to 100 points (got {args.points})")


def load_inputs(args: argparse.Namespace) -> tuple[Resolved, Calibration]:
    """(resolved job, calibration profile) from the command line."""
    check_solver_arguments(args)
    return resolve(load_job(args.job), args.job), load_calibration(args.calibration)


def run(args: argparse.Namespace) -> int:
    from placer.cost.pricer import Pricer
    from placer.solve.planner import plan_job, sweep_job

    check_output(args.output, "--output")  # before the solve, not after it
    check_plot(args)
    res, calib = load_inputs(args)
    if args.sweep:
        plans = sweep_job(Pricer(res, calib), time_limit_s=args.time_limit, max_points=args.points,
                          workers=args.workers, seed=args.seed)
        doc: Any = {"frontier": [p.model_dump(mode="json") for p in plans]}
        _write(args, dumps(doc))
        if args.json:
            emit_json(doc)
        else:
            print(render_frontier(plans))
        return 0
    plan = plan_job(Pricer(res, calib), time_limit_s=args.time_limit, objective=args.objective,
                    workers=args.workers, seed=args.seed)
    out: Any = plan.model_dump(mode="json")
    text = None
    if args.explain:
        from placer.solve.explain import explain, render
        ex = explain(plan, Pricer(res, calib), time_limit_s=min(args.time_limit, 5.0))
        out, text = {"plan": out, "explain": ex.to_dict()}, render(ex)
    _write(args, plan.to_json())  # -o is always a plan that `simulate`/`execute` read
    if args.plot:
        from placer import plots  # matplotlib only when a figure is asked for
        plots.save(plots.placement(plan), args.plot)
        note(f"wrote {args.plot}")
    if args.json:
        emit_json(out)
        return 0
    from placer.solve.explain import releases
    print(render_plan(plan, [r.line() for r in releases(plan, Pricer(res, calib))]))
    if text:
        print(text)
    return 0


def check_plot(args: argparse.Namespace) -> None:
    """`--plot` names a writable `.png` file (the figure is always PNG: another suffix would
    mislabel it) and draws one plan, which a `--sweep` frontier is not."""
    if args.plot is None:
        return
    if args.sweep:
        raise SpecError(f"--plot: draws one plan, not a --sweep frontier (got {args.plot!r})")
    check_output(args.plot, "--plot")
    if not str(args.plot).lower().endswith(".png"):
        raise SpecError(f"--plot: the figure is a PNG; the path must end in .png "
                        f"(got {args.plot!r})")


def _write(args: argparse.Namespace, text: str) -> None:
    if args.output:
        atomic_write_text(args.output, text)
        note(f"wrote {args.output}")
