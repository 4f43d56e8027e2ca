"""`placer plan JOB.yaml`: place every role with the ILP; print a table, write the plan.

    placer plan JOB.yaml [-o plan.json] [--plot FILE.png] [--json] [--explain] [--sweep]
                         [--robust] [--time-limit S] [--calibration F] [--objective time|cost] [--workers N]
                         [--seed S]

The plan carries `used_usd_per_hour` (its slots' devices) and `booked_usd_per_hour` (every node
of every pool of the job's cluster) with the cost per sample of each; the summary lists the idle
nodes of each pool that can be released at the same iteration time.
`--json` prints the plan JSON (with `--explain`: {"plan": ..., "explain": ...}; with `--sweep`:
{"frontier": [plan, ...]}, fastest first). `-o` writes the plan atomically (with `--sweep`, the
frontier document). `--plot` draws the plan's placement (`placer.plots.placement`: pools, nodes
and devices coloured by slot) as a PNG, written atomically; it draws one plan, so not with `--sweep`.
`--robust` picks, among the ILP's plan and the baselines `placer compare` lines up, the one whose
error band's upper end is smallest (`placer.solve.robust`), says which and what the
predicted-time choice would have been, and records `choice` in the plan; with `--explain` it
also names the inputs whose plausible range flips which of the chosen plan and the runner-up
is faster. The band is on iteration time, so `--robust` needs the time objective.
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
from placer.solve.planfile import Plan, dumps
from placer.solve.render import render_frontier, render_plan
from placer.spec.catalog import Resolved, resolve
from placer.spec.framework import PROFILES
from placer.spec.job import Job
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
    p.add_argument("--robust", action="store_true",
                   help="pick the plan whose error band's upper end is smallest")
    p.add_argument("--points", type=int, default=8, help="most frontier points with --sweep")
    add_solver_arguments(p)
    add_framework_argument(p)


def add_solver_arguments(p: argparse.ArgumentParser, time_limit_s: float = 10.0) -> None:
    p.add_argument("--time-limit", type=float, default=time_limit_s, metavar="S",
                   help=f"solver time limit in seconds (default {time_limit_s:g})")
    p.add_argument("--calibration", metavar="F", help="calibration profile (YAML/JSON)")
    p.add_argument("--objective", choices=("time", "cost"), help="override the job's objective")
    p.add_argument("--workers", type=int, default=2,
                   help="CP-SAT search workers, and the processes that price a large cluster's "
                   "cost table (default 2)")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default 0)")


def add_framework_argument(p: argparse.ArgumentParser, *, every: bool = False) -> None:
    """`--framework F`: plan for framework F in place of the job's `framework:` (`every`:
    also `all`, each framework side by side)."""
    names = [*PROFILES, "all"] if every else list(PROFILES)
    p.add_argument("--framework", choices=names, metavar="F",
                   help="the framework the plan runs under, overriding the job's framework: "
                   f"({', '.join(names)}; default: the job's, else native)")


def with_framework(job: Job, framework: str | None) -> Job:
    """The job planned for `framework` (None: as it says); SpecError naming an unknown one."""
    if framework is None:
        return job
    if framework not in PROFILES:
        raise SpecError(f"--framework: unknown framework {framework!r} (known: "
                        f"{', '.join(PROFILES)})")
    return job.model_copy(update={"framework": framework})


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
    job = with_framework(load_job(args.job), getattr(args, "framework", None))
    return resolve(job, args.job), load_calibration(args.calibration)


def run(args: argparse.Namespace) -> int:
    from placer.cost.pricer import Pricer
    from placer.solve.planner import plan_job, sweep_job

    check_output(args.output, "--output")  # before the solve, not after it
    check_plot(args)
    res, calib = load_inputs(args)
    check_robust(args, res)
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
    robust: dict[str, Any] | None = None
    if args.robust:
        plan, robust = _robust(plan, res, calib, args)
    out: Any = plan.model_dump(mode="json")
    text = None
    if args.explain:
        from placer.solve.explain import explain, render
        ex = explain(plan, Pricer(res, calib), time_limit_s=min(args.time_limit, 5.0))
        out, text = {"plan": out, "explain": ex.to_dict()}, render(ex)
        if robust is not None:
            out["robust"] = robust
            text += "\n" + render_sensitivity(robust)
    _write(args, plan.to_json())  # -o is always a plan that `simulate`/`execute` read
    if args.plot:
        from placer import plots  # matplotlib only when a figure is asked for
        plots.save(plots.placement(plan), args.plot)
        note(f"wrote {args.plot}")
    if args.json:
        emit_json(out)
        return 0
    from placer.solve.booking import releases
    print(render_plan(plan, [r.line() for r in releases(plan, Pricer(res, calib))]))
    if plan.choice is not None:
        print(render_choice(plan))
    if text:
        print(text)
    return 0


def check_robust(args: argparse.Namespace, res: Resolved) -> None:
    """`--robust` chooses one plan by its time band: not a frontier, not the cost objective."""
    if not args.robust:
        return
    if args.sweep:
        raise SpecError("--robust: chooses one plan, not a --sweep frontier")
    objective = args.objective or res.job.objective
    if objective != "time":
        raise SpecError(f"--robust: the error band is on iteration time; needs objective time "
                        f"(got {objective!r})")


def _robust(plan: Plan, res: Resolved, calib: Calibration, args: argparse.Namespace
            ) -> tuple[Plan, dict[str, Any]]:
    """The robust choice among the ILP's plan and the baselines; with `--explain`, the inputs
    that flip it against the runner-up (`placer.solve.robust`)."""
    from placer.cost.factor_ranges import load_ranges
    from placer.cost.pricer import Pricer
    from placer.solve import robust as rb

    plans = rb.alternatives(Pricer(res, calib), plan, args.objective)
    name, chosen = rb.robust_choice(plans)
    doc: dict[str, Any] = {"chosen": name, "runner_up": None, "flips": []}
    other = rb.runner_up(plans, name)
    if args.explain and other is not None:
        second = plans[other]
        assert second is not None
        doc["runner_up"] = other
        ranges = load_ranges().ranges  # the row factors' leave-one-out ranges
        doc["flips"] = [f.to_dict() for f in rb.sensitivity(chosen, second, calib, ranges)]
    return chosen, doc


def render_choice(plan: Plan) -> str:
    """Which alternative `--robust` chose and what the predicted-time rule would have chosen."""
    c = plan.choice
    assert c is not None and plan.predicted_iteration_s_band is not None
    lo, hi = plan.predicted_iteration_s_band
    line = (f"robust choice: {c.chosen} (smallest band upper end among {len(c.candidates)} plans: "
            f"{', '.join(c.candidates)}): predicted {plan.predicted_iteration_s:.3f} s, band "
            f"{lo:.3f}-{hi:.3f} s")
    plo, phi = c.plain_band
    if c.plain == c.chosen:
        return line + "; the predicted-time choice is the same plan"
    return (line + f"\npredicted-time choice would be {c.plain}: predicted "
            f"{c.plain_predicted_s:.3f} s, band {plo:.3f}-{phi:.3f} s")


def render_sensitivity(doc: dict[str, Any]) -> str:
    """The inputs whose plausible range flips the chosen plan against the runner-up."""
    if doc["runner_up"] is None:
        return "sensitivity: no other placement among the alternatives to compare with"
    head = f"sensitivity of the choice ({doc['chosen']} against {doc['runner_up']}): "
    if not doc["flips"]:
        return head + "no input's plausible range flips which is faster"
    lines = [head + "inputs whose range flips which is faster"]
    lines += [f"  {f['input']} {f['nominal']:.4g} -> {f['value']:.4g}: {doc['chosen']} "
              f"{f['chosen_s']:.3f} s, {doc['runner_up']} {f['other_s']:.3f} s"
              for f in doc["flips"]]
    return "\n".join(lines)


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
