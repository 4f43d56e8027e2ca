"""Fault-tolerance benchmark (issue 7): re-plan time, goodput under failures, checkpoint interval.

Prints three tables (figures for the closing note; nothing here asserts a time):

1. Re-plan time at 1,024 and 8,192 GPUs (+ LPU chips and CPU nodes, the solver benchmark's PPO
   job with tools): the `placer replan` path - job from the old plan, the changed cluster, the
   ILP warm-started from the old plan with a movement cost, what moved - after losing one node,
   losing eight, and gaining eight. Median of `--repeats` runs, in process (no interpreter start).
2. Goodput of examples/large-1k-nodes.yaml (its ILP plan; steps from `simulate_plan`) at the
   per-GPU MTBFs the failure facts imply (`simulator.longrun.FAILURE_FACTS`), at the best
   checkpoint interval and a fixed 30-minute one, and the expected time to finish 72 failure-free
   hours of steps; exact renewal-reward formula, with the seeded Monte Carlo beside it.
3. The best checkpoint interval (exact formula, scanned) against Young/Daly sqrt(2 C MTBF) on the
   same step distribution, for several checkpoint costs and MTBFs; C/MTBF says where Young/Daly's
   assumption (C << MTBF) holds.
4. Executor recovery after node loss on a local multi-node Ray cluster (`executors.localcluster`):
   the tiny job planned on two 1-GPU nodes and a CPU node; before step 2 the node of trainer rank
   0 is removed without warning. Per run: seconds until the loop noticed, recovery time and its
   parts (re-plan, placement groups, actor start), the actors kept; median over `--recoveries`
   runs (each a fresh cluster, ~1 min).

    python -m bench.bench_faults [--repeats 3] [--iterations 3] [--trials 200] [--recoveries 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.bench_solver import synthetic_job
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.moves import Move, moves
from placer.solve.planfile import Plan, calibration_of
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve, with_nodes
from placer.spec.job import Job
from placer.spec.load import load_job
from simulator import longrun as lr

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
REPLAN_SIZES = [
    ("1,024 GPUs", [("h100", "H100-SXM", 8, 96), ("h20", "H20", 8, 32), ("lpu", "groq-lpu", 8, 16),
                    ("cpu", "cpu-node", 1, 64)]),
    ("8,192 GPUs", [("h100", "H100-SXM", 8, 512), ("h20", "H20", 8, 512),
                    ("lpu", "groq-lpu", 8, 128), ("cpu", "cpu-node", 1, 256)]),
]
CHANGES = [("lose 1 h100 node", {"h100": -1}), ("lose 8 h100 nodes", {"h100": -8}),
           ("gain 8 h20 nodes", {"h20": 8})]


def replan_once(old: Plan, change: dict[str, int]) -> tuple[float, Plan, dict[str, Move]]:
    """What `placer replan` does after loading the plan file, timed."""
    t0 = time.perf_counter()
    job = old.spec
    nodes = {p.name: p.nodes + change.get(p.name, 0) for p in job.cluster.pools}
    new = plan_job(Pricer(with_nodes(job, nodes), calibration_of(old)), time_limit_s=5.0, hint=old,
                   move_cost_s=0.02 * old.predicted_iteration_s)
    moved = moves(old, new)
    return time.perf_counter() - t0, new, moved


def replan_table(repeats: int) -> None:
    print(f"{'cluster':<12} {'devices':>8} {'change':<18} {'median_s':>9} {'max_s':>7} "
          f"{'old_iter_s':>10} {'new_iter_s':>10}  moved")
    for label, pools in REPLAN_SIZES:
        job = synthetic_job(label, "Llama-3-70B", pools, "sync")
        old = plan_job(Pricer(resolve(job), Calibration()), time_limit_s=10.0)
        devices = sum(per * n for _, _, per, n in pools)
        for name, change in CHANGES:
            runs = [replan_once(old, change) for _ in range(repeats)]
            times = [t for t, _, _ in runs]
            _, new, moved = runs[0]
            print(f"{label:<12} {devices:>8} {name:<18} {statistics.median(times):>9.3f} "
                  f"{max(times):>7.3f} {old.predicted_iteration_s:>10.2f} "
                  f"{new.predicted_iteration_s:>10.2f}  {', '.join(moved) or '-'}", flush=True)


def goodput_table(durs: list[float], plan, trials: int) -> None:
    costs = lr.Costs(restart_s=300.0, checkpoint_s=30.0)
    steps = lr.steps_for_hours(durs, 72.0)
    mean = sum(durs) / len(durs)
    print(f"large-1k-nodes: {steps} steps of {mean:.1f} s (72 h failure-free); restart "
          f"{costs.restart_s:g} s, checkpoint {costs.checkpoint_s:g} s; GPUs fail, LPU/CPU not")
    print(f"{'failure fact':<52} {'gpu_mtbf_h':>10} {'job_mtbf_h':>10} {'best_s':>7} "
          f"{'goodput':>8} {'mc':>6} {'finish_h':>9} {'yd_s':>6} {'@30min':>7} {'finish_h':>9}")
    for fact, gpu_h in [("no failures", float("inf")), *lr.FAILURE_FACTS.items()]:
        rate = lr.job_failure_rate(plan, {"gpu": gpu_h}) if gpu_h != float("inf") else 0.0
        best = lr.best_interval(durs, rate, costs, max_every=steps)
        e = lr.expected(durs, best, rate, costs, steps)
        mc = lr.monte_carlo(durs, best, rate, costs, steps, trials, seed=0)
        half = lr.expected(durs, lr.every_for_interval(durs, 1800.0), rate, costs, steps)
        job_h = 1 / rate / 3600 if rate else float("inf")
        best_s = f"{best * mean:>7.0f}" if rate else f"{'-':>7}"
        print(f"{fact:<52} {gpu_h:>10.0f} {job_h:>10.2f} {best_s} {e.goodput:>8.3f} "
              f"{mc.goodput:>6.3f} {e.expected_s / 3600:>9.1f} "
              f"{lr.young_daly_s(rate, costs.checkpoint_s):>6.0f} {half.goodput:>7.3f} "
              f"{half.expected_s / 3600:>9.1f}", flush=True)


def interval_table(durs: list[float], plan) -> None:
    mean = sum(durs) / len(durs)
    print(f"best checkpoint interval vs Young/Daly (steps of {mean:.1f} s; restart 300 s)")
    print(f"{'gpu_mtbf_h':>10} {'job_mtbf_h':>10} {'ckpt_s':>7} {'C/MTBF':>7} {'best_s':>8} "
          f"{'yd_s':>8} {'best/yd':>8} {'goodput':>8} {'at_yd':>7}")
    for gpu_h in (8090.0, 29491.0, 50677.0, 200000.0):
        rate = lr.job_failure_rate(plan, {"gpu": gpu_h})
        for ckpt in (10.0, 30.0, 120.0, 600.0):
            costs = lr.Costs(restart_s=300.0, checkpoint_s=ckpt)
            best = lr.best_interval(durs, rate, costs)
            yd = lr.young_daly_s(rate, ckpt)
            g = lr.expected(durs, best, rate, costs, 10_000).goodput
            g_yd = lr.expected(durs, max(1, round(yd / mean)), rate, costs, 10_000).goodput
            print(f"{gpu_h:>10.0f} {1 / rate / 3600:>10.2f} {ckpt:>7.0f} {ckpt * rate:>7.4f} "
                  f"{best * mean:>8.0f} {yd:>8.0f} {best * mean / yd:>8.2f} {g:>8.3f} "
                  f"{g_yd:>7.3f}", flush=True)


def recovery_table(runs: int) -> None:
    from executors.localcluster import Change, run_with_changes  # lazy: torch, Ray: only with --recoveries
    job = load_job(EXAMPLES / "tiny-cpu.yaml").model_copy(deep=True)
    job = Job.model_validate({**job.model_dump(mode="json"), "cluster": {"pools": [
        {"name": "gpu", "device": "emu-gpu", "devices_per_node": 1, "nodes": 2},
        {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 2, "nodes": 1}]}})
    plan = plan_job(Pricer(resolve(job), Calibration()), time_limit_s=10.0)
    print(f"executor recovery: {job.name} on 2 x 1-GPU nodes + 1 CPU node (local Ray cluster); "
          f"trainer rank 0's node removed before step 2; 4 steps")
    print(f"{'run':>3} {'noticed_s':>9} {'recovery_s':>10} {'replan_s':>8} {'groups_s':>8} "
          f"{'actors_s':>8} {'ledger':>7}  kept / moved")
    rows = []
    for k in range(runs):
        with tempfile.TemporaryDirectory() as out:
            run = run_with_changes(plan, 4, out, [Change(2, "lose", "gpu", 0)], quiet=True)
        r = run.recovery_rows()[0]
        rows.append(r)
        print(f"{k:>3} {r['noticed_s']:>9.1f} {r['recovery_s']:>10.1f} {r['replan_s']:>8.2f} "
              f"{r['groups_s']:>8.2f} {r['actors_s']:>8.1f} "
              f"{'ok' if run.result.ledger_ok else 'BROKEN':>7}  {', '.join(r['kept'])} / "
              f"{'; '.join(r['moves'])}", flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("noticed_s", "recovery_s",
                                                              "actors_s")}
    print(f"median: noticed {med['noticed_s']:.1f} s, recovered {med['recovery_s']:.1f} s "
          f"(actor start {med['actors_s']:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.bench_faults", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=6,
                    help="simulated steps of the large example (async: fill and drain dropped)")
    ap.add_argument("--trials", type=int, default=200, help="Monte Carlo runs")
    ap.add_argument("--recoveries", type=int, default=3,
                    help="node-loss runs on the local cluster (0: skip)")
    args = ap.parse_args(argv)
    print("re-plan time (in process: plan -> changed cluster -> warm-started ILP -> moves)")
    replan_table(args.repeats)
    plan = plan_job(Pricer(resolve(load_job(EXAMPLES / "large-1k-nodes.yaml")), Calibration()),
                    time_limit_s=10.0)
    t0 = time.perf_counter()
    durs = lr.step_durations(plan, args.iterations, seed=0)
    print(f"\nstep times of large-1k-nodes ({args.iterations} simulated, "
          f"{time.perf_counter() - t0:.1f} s): " + ", ".join(f"{d:.1f}" for d in durs))
    goodput_table(durs, plan, args.trials)
    print()
    interval_table(durs, plan)
    if args.recoveries:
        print()
        recovery_table(args.recoveries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
