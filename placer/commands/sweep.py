"""`placer sweep JOB.yaml --vary PATH=VALUES ...`: the what-if grid on your own job.

    placer sweep JOB.yaml --vary POOL.nodes=1..8 [--vary lengths.response.cap=2048,4096]...
                 [--simulate [--iterations N] [--sim-seed S]] [--plots DIR] [--json]
                 [--time-limit S] [--calibration F] [--workers N] [--seed S]

Every combination of the `--vary` values is a point: the job with those fields changed
(`POOL.nodes` sets a pool's node count, 0 removes the pool; any other PATH is dotted into the job
file, e.g. `batch.prompts`, `lengths.response.cap`, `pipeline.max_staleness`), re-planned by
the ILP (`workflows.whatif.grid`) and, with `--simulate`, simulated (its steady state, until the
mean is known, or exactly `--iterations N`). One row a point: iteration time (predicted;
simulated steady-state mean and p99 with `--simulate`), the predicted time's error band
(`placer.cost.band`), throughput, USD/h used and booked,
cost per sample used and booked, and the best plan's shape (slot@pool xdevices); `*` marks
the points on the throughput / booked-cost-per-sample Pareto frontier (a point with fewer nodes
books less even where its plan uses the same devices). `--plots DIR` writes `pareto.png` (every
point labelled) and `sweep.png`. Progress goes to stderr when it is a terminal and `--json` is
off: the points done, and under them what is under way (planning or simulating point i/n) with
its elapsed time. Every point's job is checked before the first solve: a bad PATH or value
exits 2 naming it.
"""
from __future__ import annotations

# Heavy imports (ortools, simpy, torch, Ray) wait for `run`: the CLI imports every command
# module to build `placer --help`, and a command pays only for what it runs.
import argparse
import math
from typing import Any

from placer.base.errors import SpecError
from placer.base.inputs import check_output
from placer.cli import emit_json, note
from placer.commands.plan import (
    add_framework_argument,
    add_solver_arguments,
    check_solver_arguments,
    with_framework,
)

MAX_ITERATIONS = 1000
# The frontier ranks points by what their booking costs: a point with fewer nodes books less
# even where the plan uses the same devices.
PARETO_COST = "booked_cost_per_sample"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="JOB.yaml")
    p.add_argument("--vary", action="append", default=[], metavar="PATH=VALUES", required=True,
                   help="a field and its values: POOL.nodes=1..8, lengths.response.cap=2048,4096 "
                        "(repeatable: the grid is every combination)")
    p.add_argument("--simulate", action="store_true", help="also simulate every point's plan")
    p.add_argument("--iterations", type=int, default=None,
                   help="simulated iterations per point with --simulate (default: until the "
                        "steady-state mean is known, as `placer simulate`)")
    p.add_argument("--sim-seed", type=int, default=None,
                   help="simulator seed (default: the job's seed)")
    p.add_argument("--plots", metavar="DIR", help="write pareto.png and sweep.png here")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    add_framework_argument(p)
    add_solver_arguments(p, time_limit_s=2.0)  # per point: `placer plan` solves properly


def run(args: argparse.Namespace) -> int:
    from placer.cost.calibration import load_calibration
    from placer.spec.load import load_job
    from workflows import whatif

    check_solver_arguments(args)
    if args.iterations is not None and not 1 <= args.iterations <= MAX_ITERATIONS:
        raise SpecError(f"--iterations: must be 1 to {MAX_ITERATIONS} (got {args.iterations})")
    if args.sim_seed is not None and not 0 <= args.sim_seed < 2**63:  # numpy seeds: >= 0
        raise SpecError(f"--sim-seed: must be 0 to {2**63 - 1} (got {args.sim_seed})")
    check_output(args.plots, "--plots", folder=True)
    varies = [whatif.parse_vary(v) for v in args.vary]
    paths = [v.path for v in varies]
    if len(set(paths)) < len(paths):
        raise SpecError(f"--vary: a field given twice (got {', '.join(paths)})")
    job = with_framework(load_job(args.job), args.framework)
    calib = load_calibration(args.calibration)
    from placer.progress import grid_callback, progress  # off under --json and into a pipe

    total = math.prod(len(v.values) for v in varies)
    with progress("sweep", total=total, unit="points", json_out=args.json) as bar:
        rows = whatif.grid(job, varies, simulate=args.simulate, iterations=args.iterations,
                           seed=args.sim_seed, calib=calib, time_limit_s=args.time_limit,
                           solver={"objective": args.objective, "workers": args.workers,
                                   "seed": args.seed},
                           progress=grid_callback(bar) if bar.shown else None,
                           on_phase=bar.phase)
        bar.advance(total - bar.done)  # the callback moves to a point before solving it
    front = {id(r) for r in whatif.pareto(rows, cost=PARETO_COST)}
    if args.json:
        emit_json({"varies": {v.path: list(v.values) for v in varies},
                   "simulated": args.simulate,
                   "points": [_doc(r, id(r) in front) for r in rows]})
    else:
        print(render(rows, paths, front, args.simulate))
    if args.plots:
        _plots(rows, args.plots)
    return 0


def _doc(r: dict[str, Any], pareto: bool) -> dict[str, Any]:
    out = {k: v for k, v in r.items() if k not in ("plan", "knob", "value")}
    out["label"] = r["value"]
    if "plan" in r:
        p = r["plan"]
        out["pareto"] = pareto
        out["best_plan"] = {role: {"pool": x.pool, "devices": x.devices, "tp": x.tp, "pp": x.pp,
                                   "dp": x.dp, "slot": x.slot,
                                   **({"parts": [q.model_dump(include={"pool", "devices", "tp",
                                                                       "pp", "dp", "share"})
                                                 for q in x.parts]} if x.parts else {})}
                            for role, x in p.roles.items()}
    return out


def render(rows: list[dict[str, Any]], paths: list[str], front: set[int], simulated: bool) -> str:
    """The grid as a table, one point a line; `*` marks the Pareto frontier."""
    time_key, time_head = ("simulated_s", "sim s") if simulated else ("predicted_s", "time s")
    heads = [*paths, time_head, "band s", "samples/s", "USD/h used", "USD/h booked", "USD/sample",
             "booked/sample", "best plan"]
    cells = [heads]
    for r in rows:
        vals = [str(r["point"][p]) for p in paths]
        if "infeasible" in r:
            cells.append([*vals, "infeasible", r["infeasible"][:90], "", "", "", "", "", ""])
            continue
        mark = "*" if id(r) in front else " "
        band = r.get("predicted_s_band")
        cells.append([*vals, f"{r[time_key]:.3f}", f"{band[0]:.3f}-{band[1]:.3f}" if band else "-",
                      f"{r['samples_per_s']:.2f}",
                      f"{r['usd_per_hour']:.2f}", f"{r['booked_usd_per_hour']:.2f}",
                      f"{r['cost_per_sample']:.6f}", f"{r['booked_cost_per_sample']:.6f}{mark}",
                      r["placement"]])
    widths = [max(len(c[i]) for c in cells) for i in range(len(heads) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1]
             for row in cells]
    return "\n".join([*lines, "(* on the throughput / booked cost-per-sample Pareto frontier; "
                      f"{'simulated' if simulated else 'predicted'} throughput)"])


def _plots(rows: list[dict[str, Any]], folder: str) -> None:
    from workflows import plots

    ok = [r for r in rows if "infeasible" not in r]
    points = [{PARETO_COST: r[PARETO_COST], "samples_per_s": r["samples_per_s"],
               "label": r["value"]} for r in ok]
    written = []
    if points:
        fig = plots.pareto(points, x=PARETO_COST, title="sweep: every point, the frontier joined")
        written.append(plots.save(fig, f"{folder}/pareto.png"))
    written.append(plots.save(plots.sweep(rows), f"{folder}/sweep.png"))
    note(f"figures: {', '.join(p.name for p in written)} in {folder}/")
