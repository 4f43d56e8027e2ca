"""`placer compare JOB --framework all`: the best plan for each framework, side by side.

Each framework profile (`placer.spec.framework.PROFILES`) plans the job with the ILP on the
same cluster and calibration: only the layouts that framework can run, priced with its own
overheads. A framework that cannot run the job shows why (the planner's Infeasible message)
instead of a plan. The table gives each plan's iteration time, USD per hour of the devices it
uses, cost per sample and its time relative to the fastest; `--json` prints one document with
one plan per framework, so a team can see which framework runs this job fastest on this
cluster, and by how much.
"""
from __future__ import annotations

import argparse
from typing import Any

from placer.base.errors import Infeasible
from placer.cli import emit_json
from placer.commands.plan import check_solver_arguments, with_framework
from placer.cost.calibration import load_calibration
from placer.spec.catalog import resolve
from placer.spec.framework import PROFILES
from placer.spec.load import load_job


def best_per_framework(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Framework -> {"plan": the plan's document, figures} or {"refused": why}."""
    from placer.cost.pricer import Pricer
    from placer.solve.planner import plan_job

    check_solver_arguments(args)
    job, calib = load_job(args.job), load_calibration(args.calibration)
    out: dict[str, dict[str, Any]] = {}
    for name, profile in PROFILES.items():
        res = resolve(with_framework(job, name), args.job)
        try:
            plan = plan_job(Pricer(res, calib), time_limit_s=args.time_limit,
                            objective=args.objective, workers=args.workers, seed=args.seed)
        except Infeasible as e:
            out[name] = {"title": profile.title, "version": profile.version, "refused": str(e)}
            continue
        out[name] = {"title": profile.title, "version": profile.version,
                     "export": profile.exporter,
                     "predicted_iteration_s": plan.predicted_iteration_s,
                     "usd_per_hour": plan.used_usd_per_hour,
                     "cost_per_sample": plan.cost_per_sample,
                     "throughput_samples_s": plan.throughput_samples_s,
                     "plan": plan.model_dump(mode="json")}
    fastest = min((r["predicted_iteration_s"] for r in out.values() if "plan" in r), default=None)
    for r in out.values():
        if "plan" in r and fastest:
            r["ratio_to_fastest"] = r["predicted_iteration_s"] / fastest
    return out


def render(job: str, rows: dict[str, dict[str, Any]]) -> str:
    from placer.solve.planfile import Plan

    lines = [f"best plan per framework on {job}",
             f"{'framework':<14} {'iteration s':>12} {'x fastest':>9} {'USD/h':>10} "
             f"{'USD/sample':>11}  placement"]
    for name, r in rows.items():
        if "plan" not in r:
            lines.append(f"{name:<14} cannot run: {r['refused']}")
            continue
        plan = Plan.model_validate(r["plan"])
        where = ", ".join(f"{role}:" + "+".join(f"{pool}x{n}" for pool, n in x.pool_devices())
                          for role, x in plan.roles.items())
        lines.append(f"{name:<14} {r['predicted_iteration_s']:>12.3f} "
                     f"{r['ratio_to_fastest']:>9.2f} {r['usd_per_hour']:>10.2f} "
                     f"{r['cost_per_sample']:>11.6f}  {where}")
    return "\n".join(lines)


def compare_frameworks(args: argparse.Namespace) -> int:
    rows = best_per_framework(args)
    if args.json:
        emit_json({"job": args.job, "frameworks": rows})
    else:
        print(render(args.job, rows))
    return 0
