"""`placer simulate PLAN.json`: discrete-event simulation of a plan's iterations (simpy).

Prints the steady-state iteration time with its 95% confidence interval (`simulator.steady`:
warm-up and drain excluded; without `--iterations`, iterations are added until the interval is
within `--ci` of the mean or a cap), iteration time (mean/p50/p99) against the plan's
prediction, throughput, utilization, bubble time, goodput and why the run differs from the
prediction; `--json` prints the metrics as one JSON document (the interval under
`steady_state`). `--trace` writes a Chrome trace (opens in Perfetto), `--plots` the figures.
`--compare-policies` simulates the plan under each long-tail policy (none, overprovision, partial,
reissue; `simulator.policies`) with the same seed and ranks them by trained samples per second.
"""
from __future__ import annotations

# Heavy imports (ortools, simpy, torch, Ray) wait for `run`: the CLI imports every command
# module to build `placer --help`, and a command pays only for what it runs.
import argparse
import sys
from typing import TYPE_CHECKING

from placer.base.errors import SpecError
from placer.base.inputs import check_output
from placer.cli import emit_json, note
from placer.cost.calibration import load_calibration
from placer.spec.load import read_structured

if TYPE_CHECKING:
    from simulator.metrics import SimMetrics
    from simulator.steady import SteadyState

POLICY_ITERATIONS = 1  # --compare-policies without --iterations (one run per policy)


def add_steady_arguments(p: argparse.ArgumentParser) -> None:
    """`--iterations` and `--ci`: how long a simulation runs (`simulate`, `compare --simulate`)."""
    p.add_argument("--iterations", type=int, default=None,
                   help="iterations to simulate (default: until the steady-state mean is known "
                        "within --ci, warm-up excluded; at most 100)")
    p.add_argument("--ci", type=float, default=None, metavar="FRACTION",
                   help="target half width of the steady-state 95%% confidence interval of each "
                        "simulated mean, as a fraction of it (default 0.05)")


def steady_targets(args: argparse.Namespace) -> tuple[int | None, float]:
    """(`--iterations`, `--ci` or the default), checked: bad values exit 2 naming the flag."""
    from simulator.steady import REL_CI

    rel_ci = REL_CI if args.ci is None else args.ci
    if not (0 < rel_ci < 1):  # NaN fails too
        raise SpecError(f"--ci: must be a fraction in (0, 1), e.g. 0.05 (got {args.ci})")
    if args.iterations is not None and args.iterations < 1:
        raise SpecError(f"--iterations: must be at least 1 (got {args.iterations})")
    return args.iterations, rel_ci


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", metavar="PLAN.json")
    add_steady_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--trace", metavar="OUT.json", help="write the Chrome trace here")
    p.add_argument("--plots", metavar="DIR", help="write timeline/utilization/length figures")
    p.add_argument("--calibration", help="calibration profile (YAML/JSON); default: the plan's")
    p.add_argument("--config", metavar="SIM.yaml",
                   help="simulator settings (stragglers, failures, network, workload; see "
                        "simulator.config)")
    p.add_argument("--workload", metavar="TRACE.jsonl", help="replay per-sample lengths and "
                   "tool latencies from a JSONL workload trace")
    p.add_argument("--no-variance", action="store_true",
                   help="lengths and latencies at their means, no stragglers or failures")
    p.add_argument("--compare-policies", action="store_true",
                   help="rank the long-tail policies (tail_policy) for this plan by simulating "
                        "each with the same seed")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    from simulator.api import simulate_plan
    from simulator.config import SimConfig, config_from_dict
    from simulator.steady import first_run, simulate_steady, steady_state

    _, rel_ci = steady_targets(args)
    check_output(args.trace, "--trace")  # before the simulation, not after it
    check_output(args.plots, "--plots", folder=True)
    cfg = config_from_dict(read_structured(args.config), args.config) if args.config else None
    if args.no_variance:
        if cfg is not None:
            raise SpecError("--no-variance: cannot be combined with --config")
        cfg = SimConfig.no_variance()
    calib = load_calibration(args.calibration) if args.calibration else None
    if args.compare_policies:
        return _compare(args, cfg, calib)
    from placer.progress import count_callback, progress  # off under --json and into a pipe
    from placer.solve.planfile import load_plan

    plan = load_plan(args.plan)
    # iterations of the (first) run: an adaptive run's longer re-run resets the bar's total
    total = first_run(plan) if args.iterations is None else args.iterations
    with progress("simulate", total=total, unit="iterations", json_out=args.json) as bar:
        tick = count_callback(bar) if bar.shown else None
        if args.iterations is None:
            result, st = simulate_steady(plan, seed=args.seed, config=cfg, calibration=calib,
                                         workload=args.workload, rel_ci=rel_ci, on_iteration=tick)
            if args.trace:
                result.trace.write(args.trace)
        else:
            result = simulate_plan(plan, iterations=args.iterations, seed=args.seed,
                                   config=cfg, trace_path=args.trace, calibration=calib,
                                   workload=args.workload, on_iteration=tick)
            st = steady_state(result, rel_ci)
    if args.trace:
        note(f"trace: {args.trace} ({len(result.trace.events)} events)")
    if args.json:  # the metrics' JSON form, the steady state beside them
        emit_json({**result.metrics.to_dict(), "steady_state": st.to_dict()})
    else:
        _print(result.metrics, st)
    if args.plots:  # the numbers first: figures of a large run take a few seconds
        sys.stdout.flush()
        note(f"figures: writing {args.plots}/ ({len(result.trace.events):,} events) ...")
        from simulator.plots import write_plots
        paths = write_plots(result, args.plots)
        note(f"figures: {', '.join(p.name for p in paths)} in {args.plots}/")
    return 0


def _print(m: SimMetrics, ss: SteadyState) -> None:
    it, predicted = m.iteration_s, m.predicted_iteration_s
    print(f"{m.iterations} iteration(s), {m.mode} mode")
    print(f"  steady state {ss.describe()}")
    rate_ci = ss.samples_per_s_ci95
    print(f"               {ss.samples_per_s:.2f} samples/s" + (
        f" (95% CI {rate_ci[0]:.2f}..{rate_ci[1]:.2f})" if rate_ci else "") +
        f", {(ss.iteration_s - predicted) / predicted:+.1%} vs predicted")
    print(f"  iteration    mean {it.mean:.3f} s  p50 {it.p50:.3f} s  p99 {it.p99:.3f} s"
          f"  (predicted {predicted:.3f} s, {m.error_vs_predicted:+.1%})")
    print(f"  throughput   {m.samples_per_s:.2f} samples/s, {m.tokens_per_s:.0f} tokens/s")
    print(f"  wall         {m.wall_s:.1f} s, goodput {m.goodput:.3f}, "
          f"{m.failures} failure(s), bubble {m.bubble_s:.2f} s/iteration")
    print("  utilization  " + ", ".join(f"{k} {v:.0%}" for k, v in m.utilization.pool.items()))
    print("  role time    " + ", ".join(f"{k} {v:.2f} s" for k, v in m.role_s.items()))
    w = m.why
    print(f"  why          long tail {w.long_tail_s:.2f} s, tool queueing "
          f"{w.queueing_s:.2f} s/sample, link contention {w.link_contention_s:.2f} s, "
          f"slowest device x{w.max_slowdown:.2f} -> {w.dominant}")


def _compare(args: argparse.Namespace, cfg, calib) -> int:
    from simulator.policies import compare_policies

    for flag in ("trace", "plots", "workload"):
        if getattr(args, flag):
            raise SpecError(f"--{flag}: cannot be combined with --compare-policies")
    if calib is not None:
        raise SpecError("--calibration: cannot be combined with --compare-policies")
    iterations = args.iterations or POLICY_ITERATIONS
    from placer.progress import progress
    with progress("simulate policies", json_out=args.json):
        rows = compare_policies(args.plan, iterations=iterations, seed=args.seed, config=cfg)
    if args.json:
        emit_json({"ranking": rows, "iterations": iterations, "seed": args.seed})
        return 0
    print(f"long-tail policies, {iterations} iteration(s), seed {args.seed}; ranked by "
          "trained samples per second")
    print(f"{'#':>2} {'policy':<28} {'samples/s':>10} {'vs none':>8} {'step_s':>8} "
          f"{'tail_s':>7} {'trained':>8}")
    for r in rows:
        params = ", ".join(f"{k} {v:g}" for k, v in r["policy"].items() if k != "kind")
        label = r["kind"] + (f" ({params})" if params else "")
        print(f"{r['rank']:>2} {label:<28} {r['samples_per_s']:>10.3f} {r['vs_none']:>+8.1%} "
              f"{r['iteration_s']:>8.2f} {r['long_tail_s']:>7.2f} {r['committed']:>8.0f}")
    for r in rows:
        print(f"  {r['kind']}: {r['why']}")
    return 0
