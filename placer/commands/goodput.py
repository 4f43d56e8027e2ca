"""`placer goodput PLAN.json`: goodput of a plan over days of training under failures.

Simulates a few steps of the plan (failures off) for its step-time distribution, then composes
failures per device type (Poisson, `--mtbf TYPE:HOURS` = one device's MTBF), restarts and
checkpoints over the whole run with the exact renewal-reward formula and a seeded Monte Carlo
(method: `simulator.longrun`). A checkpoint costs its size (the trained models' weights and
optimizer state, `placer.solve.hostmem.checkpoint_gb`) over the cluster's `storage_gbs`, after a sharded
trainer gathers its optimizer state, plus a fixed overhead (`placer.solve.hostmem.plan_checkpoint_s`),
unless `--checkpoint-cost` gives the seconds. Prints goodput and the expected time to finish at the chosen
checkpoint interval, at the best interval, and at Young/Daly's sqrt(2 C MTBF).

    placer goodput PLAN.json [--mtbf gpu:8090]... [--hours 72 | --steps N]
                   [--checkpoint-interval S] [--checkpoint-cost S] [--restart 300]
                   [--iterations 6] [--seed 0] [--trials 100] [--json]
"""
from __future__ import annotations

# Heavy imports (ortools, simpy, torch, Ray) wait for `run`: the CLI imports every command
# module to build `placer --help`, and a command pays only for what it runs.
import argparse
import math
from dataclasses import asdict
from typing import Any

from placer.base.errors import SpecError
from placer.cli import emit_json, note
from placer.solve.planfile import load_plan

# The Monte Carlo's work and memory are proportional to trials x steps; these bounds keep a run
# within about a minute and a few hundred MB (72 h of the tiny example: 1.6M steps x 100 trials).
MAX_STEPS = 20_000_000
MAX_DRAWS = 1_000_000_000
MAX_TIME = 1e9  # hours or seconds: beyond it a product with a step count overflows a float
DEFAULT_MTBF = "gpu:8090"  # per-GPU hours implied by 7.9 h for 1,024-GPU jobs (REFERENCES.md)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--mtbf", action="append", default=[], metavar="TYPE:HOURS",
                   help="MTBF of ONE device of a type name or kind (gpu/cpu/lpu), hours; "
                        f"repeatable (default {DEFAULT_MTBF}: 1,024-GPU jobs fail every 7.9 h)")
    run_len = p.add_mutually_exclusive_group()
    run_len.add_argument("--hours", type=float, default=None,
                         help="failure-free hours of training to finish (default 72)")
    run_len.add_argument("--steps", type=int, default=None, help="steps to finish")
    p.add_argument("--checkpoint-interval", type=float, default=None, metavar="S",
                   help="seconds of work between checkpoints (default: the best interval)")
    p.add_argument("--checkpoint-cost", type=float, default=None, metavar="S",
                   help="seconds one checkpoint blocks the job (default: its size over the "
                        "cluster's storage_gbs)")
    p.add_argument("--restart", type=float, default=300.0, metavar="S",
                   help="seconds from a failure until the job runs again (default 300)")
    p.add_argument("--iterations", type=int, default=6,
                   help="steps to simulate for the step-time distribution (default 6; async "
                        "plans drop the pipeline fill and drain)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--trials", type=int, default=100, help="Monte Carlo runs (default 100)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def parse_mtbf(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for text in items:
        kind, sep, hours = text.rpartition(":")
        if not sep or not kind:
            raise SpecError(f"--mtbf: expected TYPE:HOURS (got {text!r})")
        try:
            value = float(hours)
        except ValueError:
            raise SpecError(f"--mtbf: HOURS must be a number (got {text!r})") from None
        if not (math.isfinite(value) and 0 < value <= MAX_TIME):
            raise SpecError(f"--mtbf: HOURS must be > 0 and at most {MAX_TIME:g} (got {text!r})")
        out[kind] = value
    return out


def report(plan, mtbf: dict[str, float], costs, steps: int | None, hours: float | None,
           interval_s: float | None, iterations: int, seed: int, trials: int) -> dict[str, Any]:
    """Everything `placer goodput` prints, as one document (also used by bench_faults)."""
    from simulator import longrun as lr

    if iterations < 1:
        raise SpecError(f"--iterations: must be at least 1 (got {iterations})")
    durs = lr.step_durations(plan, iterations, seed)
    n = steps if steps is not None else lr.steps_for_hours(durs, hours if hours is not None else 72.0)
    if n < 1:
        raise SpecError(f"--steps: must be at least 1 (got {n})")
    flag = "--steps" if steps is not None else "--hours"
    if n > MAX_STEPS:  # the Monte Carlo draws every step of a run: arrays of n floats
        raise SpecError(f"{flag}: {n:,} steps exceed the {MAX_STEPS:,} a goodput run models "
                        f"(got {steps if steps is not None else hours})")
    if trials * n > MAX_DRAWS:
        raise SpecError(f"--trials: {trials:,} trials x {n:,} steps = {trials * n:,} step draws "
                        f"exceed the {MAX_DRAWS:,} a goodput run makes (got {trials})")
    rate = lr.job_failure_rate(plan, mtbf)
    best = lr.best_interval(durs, rate, costs)
    yd = lr.young_daly_s(rate, costs.checkpoint_s)
    mean = sum(durs) / len(durs)
    chosen = lr.every_for_interval(durs, interval_s) if interval_s is not None else best
    rows = {}
    for label, every in (("chosen", chosen), ("best", best),
                         ("young_daly", max(1, round(yd / mean)) if math.isfinite(yd) else best)):
        est = lr.expected(durs, every, rate, costs, n)
        mc = lr.monte_carlo(durs, every, rate, costs, n, trials, seed)
        rows[label] = {**asdict(est), "monte_carlo": asdict(mc)}
    return {"plan_iteration_s": plan.predicted_iteration_s, "step_s": durs, "mean_step_s": mean,
            "mtbf_hours": mtbf, "job_mtbf_h": (1 / rate / 3600) if rate > 0 else math.inf,
            "restart_s": costs.restart_s, "checkpoint_s": costs.checkpoint_s, "steps": n,
            "failure_free_h": n * mean / 3600, "young_daly_s": yd,
            "best_interval_s": best * mean, "intervals": rows}


def run(args: argparse.Namespace) -> int:
    from simulator.longrun import Costs

    mtbf = parse_mtbf(args.mtbf or [DEFAULT_MTBF])
    if args.trials < 1:
        raise SpecError(f"--trials: must be at least 1 (got {args.trials})")
    for flag, value in (("--hours", args.hours), ("--checkpoint-interval", args.checkpoint_interval),
                        ("--checkpoint-cost", args.checkpoint_cost), ("--restart", args.restart)):
        # NaN, infinite or beyond MAX_TIME here; a negative one is named by the check below
        if value is not None and not value <= MAX_TIME:
            raise SpecError(f"{flag}: must be a finite number up to {MAX_TIME:g} "
                            f"(got {value!r})")
    plan = load_plan(args.plan)
    ckpt = checkpoint_doc(plan)
    cost_s = args.checkpoint_cost if args.checkpoint_cost is not None else ckpt["checkpoint_s"]
    costs = Costs(args.restart, cost_s).check()
    doc = report(plan, mtbf, costs, args.steps, args.hours,
                 args.checkpoint_interval, args.iterations, args.seed, args.trials)
    doc["checkpoint"] = ckpt | {"source": "--checkpoint-cost" if args.checkpoint_cost is not None
                                else PRICED}
    if not args.mtbf:  # said once the run succeeded: an error stays the one line on stderr
        note(f"no --mtbf given: using {DEFAULT_MTBF} (per-GPU MTBF of 1,024-GPU jobs)")
    if args.json:
        emit_json(doc)
        return 0
    _print(doc)
    return 0


PRICED = "priced on the plan's layouts: gather, size / storage_gbs, overhead"


def checkpoint_doc(plan) -> dict[str, float]:
    """The plan's checkpoint: size (GB), the storage bandwidth and the seconds it takes on the
    plan's layouts (`hostmem.plan_checkpoint_s`: sharded state gathered, written, overhead)."""
    from placer.solve.hostmem import checkpoint_gb, plan_checkpoint_s

    res = plan.resolved()
    return {"size_gb": round(checkpoint_gb(res), 3), "storage_gbs": res.job.cluster.storage_gbs,
            "checkpoint_s": plan_checkpoint_s(plan)}


def _print(d: dict[str, Any]) -> None:
    mt = ", ".join(f"{k} {v:g} h" for k, v in d["mtbf_hours"].items())
    print(f"{d['steps']} steps of {d['mean_step_s']:.2f} s ({d['failure_free_h']:.1f} h "
          f"failure-free); device MTBF {mt} -> job MTBF {d['job_mtbf_h']:.2f} h")
    c = d["checkpoint"]
    print(f"checkpoint {c['size_gb']:,.1f} GB at {c['storage_gbs']:g} GB/s ({c['source']})")
    print(f"restart {d['restart_s']:g} s, checkpoint {d['checkpoint_s']:.3g} s; Young/Daly "
          f"interval {d['young_daly_s']:.0f} s, best simulated {d['best_interval_s']:.0f} s")
    print(f"{'interval':<11} {'every':>6} {'work_s':>8} {'goodput':>8} {'expected_h':>11} "
          f"{'mc_mean_h':>10} {'mc_p10_h':>9} {'mc_p90_h':>9} {'failures':>9}")
    for label, r in d["intervals"].items():
        mc = r["monte_carlo"]
        print(f"{label:<11} {r['every']:>6} {r['interval_s']:>8.0f} {r['goodput']:>8.3f} "
              f"{r['expected_s'] / 3600:>11.2f} {mc['mean_s'] / 3600:>10.2f} "
              f"{mc['p10_s'] / 3600:>9.2f} {mc['p90_s'] / 3600:>9.2f} {mc['failures']:>9.1f}")
