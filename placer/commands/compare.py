"""`placer compare JOB.yaml`: the ILP's plan against every baseline on the same job and cost model.

    placer compare JOB.yaml [--json] [--simulate [--iterations N] [--seed S]] [--time-limit S]
                            [--calibration F] [--objective time|cost]

For each plan: predicted iteration time, throughput, cost per sample, where the roles sit, and
the ratio of its time to the ILP's (> 1: the baseline is slower). With `--simulate`, every plan
is also run through the simulator (`simulator.api.simulate_plan`) and ranked by simulated time.
"""
from __future__ import annotations

# Heavy imports (ortools, simpy, torch, Ray) wait for `run`: the CLI imports every command
# module to build `placer --help`, and a command pays only for what it runs.
import argparse
from typing import Any

from placer.cli import emit_json
from placer.commands.plan import add_solver_arguments, load_inputs
from placer.plan import Plan
from placer.spec import SpecError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="JOB.yaml")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--simulate", action="store_true", help="also rank by simulated time")
    p.add_argument("--iterations", type=int, default=2, help="simulated iterations (default 2)")
    p.add_argument("--sim-seed", type=int, default=0, help="simulator seed (default 0)")
    add_solver_arguments(p)


def _simulator():
    try:
        from simulator.api import simulate_plan
    except ModuleNotFoundError as e:
        if e.name in ("simulator", "simulator.api"):
            raise SpecError("--simulate: the simulator is missing (no module simulator.api)") \
                from None
        raise
    return simulate_plan


def plans_for(res, calib, args, cdoc) -> dict[str, Plan | None]:
    """The ILP's plan and every baseline's, all through `assemble`."""
    from placer.baselines import baseline_assignments
    from placer.planner import build_problem, plan_assignment, plan_job

    ilp = plan_job(res, calib, time_limit_s=args.time_limit, objective=args.objective,
                   workers=args.workers, seed=args.seed, calibration_doc=cdoc)
    problem = build_problem(res, calib, args.objective)
    out: dict[str, Plan | None] = {"ilp": ilp}
    for name, a in baseline_assignments(problem).items():
        out[name] = None if a is None else plan_assignment(problem, a, name, cdoc)
    return out


def run(args: argparse.Namespace) -> int:
    if args.simulate and args.iterations < 1:
        raise SpecError(f"--iterations: must be >= 1 (got {args.iterations})")
    if args.sim_seed < 0:  # the simulator's seed sequences take non-negative integers only
        raise SpecError(f"--sim-seed: must be >= 0 (got {args.sim_seed})")
    simulate = _simulator() if args.simulate else None
    res, calib, cdoc = load_inputs(args)
    plans = plans_for(res, calib, args, cdoc)
    base = plans["ilp"]
    assert base is not None, "plan_job returns a plan or raises Infeasible"
    rows: dict[str, dict[str, Any]] = {}
    for name, p in plans.items():
        if p is None:
            rows[name] = {"applicable": False}
            continue
        row = {"applicable": True, "predicted_iteration_s": p.predicted_iteration_s,
               "throughput_samples_s": p.throughput_samples_s,
               "cost_per_sample": p.cost_per_sample,
               "ratio_to_ilp": p.predicted_iteration_s / base.predicted_iteration_s,
               "cost_ratio_to_ilp": (p.cost_per_sample / base.cost_per_sample
                                     if base.cost_per_sample else None),
               "placement": {r: f"{x.pool}x{x.devices} tp{x.tp} pp{x.pp} dp{x.dp} [{x.slot}]"
                             for r, x in p.roles.items()}}
        if simulate is not None:
            sim = simulate(p, iterations=args.iterations, seed=args.sim_seed)
            row["simulated_iteration_s"] = float(sim.metrics["iteration_s"]["mean"])
        rows[name] = row
    if simulate is not None:
        ilp_sim = rows["ilp"]["simulated_iteration_s"]
        for r in rows.values():
            if r["applicable"]:
                r["simulated_ratio_to_ilp"] = r["simulated_iteration_s"] / ilp_sim
    key = "simulated_iteration_s" if simulate is not None else "predicted_iteration_s"
    ranking = sorted((n for n, r in rows.items() if r["applicable"]), key=lambda n: rows[n][key])
    doc = {"job": res.job.name, "mode": res.job.pipeline.mode, "objective": base.objective,
           "ranked_by": key, "ranking": ranking, "plans": rows,
           "solver": base.solver.model_dump()}
    if args.json:
        emit_json(doc)
    else:
        print(render(doc))
    return 0


def render(doc: dict[str, Any]) -> str:
    sim = doc["ranked_by"] == "simulated_iteration_s"
    head = (f"{'plan':<10} {'iteration s':>12} {'samples/s':>10} {'USD/sample':>11} "
            f"{'x ILP time':>10} {'x ILP cost':>10}" + (f" {'simulated s':>12} {'x ILP sim':>9}"
                                                       if sim else "") + "  placement")
    lines = [f"compare on {doc['job']} ({doc['mode']} mode, objective {doc['objective']}; "
             f"ranked by {'simulated' if sim else 'predicted'} time)", head]
    for name in doc["ranking"] + [n for n, r in doc["plans"].items() if not r["applicable"]]:
        r = doc["plans"][name]
        if not r["applicable"]:
            lines.append(f"{name:<10} {'n/a (cannot express this job)':>12}")
            continue
        where = ", ".join(f"{role}:{p.split(' ')[0]}" for role, p in r["placement"].items())
        cr = r["cost_ratio_to_ilp"]
        line = (f"{name:<10} {r['predicted_iteration_s']:>12.3f} {r['throughput_samples_s']:>10.2f} "
                f"{r['cost_per_sample']:>11.6f} {r['ratio_to_ilp']:>10.2f} "
                f"{(f'{cr:.2f}' if cr is not None else '-'):>10}")
        if sim:
            line += f" {r['simulated_iteration_s']:>12.3f} {r['simulated_ratio_to_ilp']:>9.2f}"
        lines.append(f"{line}  {where}")
    return "\n".join(lines)
