"""Simulator benchmark: wall time, events per second and peak memory against the sample count.

The goal case: one iteration of an 8,192-GPU plan (1,024 nodes x 8 H100) with 65,536 samples of
3 turns each (two tool calls per sample on 64 CPU nodes, 4,096 cores), on one core, in <= 10 s and
<= 2 GB. Each case runs in a fresh subprocess pinned to one core with one BLAS/OpenMP thread, so
its peak RSS is its own. Printed: a table per variance setting and the slope of wall time against
samples (least squares), with the ratio of the largest case's cost per sample to the smallest's
(1.0 = linear).

    python -m bench sim                 # variance off and on, 8k..64k, the goal row (64k, variance
                                        # on) checked against 10 CPU s and 2 GB, and the figure
                                        # time at 64k (goal: <= 3x the simulation; ~3 min)
    python -m bench.bench_sim --quick   # 8k and 16k only

Columns: `cpu s` is the simulation's CPU time (the figure that matters on a shared machine; `wall
s` is wall time), `events/s` trace events per CPU second, `sim MB` the peak resident memory once
the simulation is done and `peak MB` after its Chrome trace was built too (`trace s`).
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np

from placer.cost.efficiency import Calibration
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from simulator.api import simulate_plan
from simulator.config import SimConfig
from simulator.handplans import place

SAMPLES = (8192, 16384, 32768, 65536)
QUICK = (8192, 16384)
GOAL = {"samples": 65536, "cpu_s": 10.0, "mb": 2048.0}  # one variance-on iteration, one core


def goal_job(samples: int) -> dict[str, Any]:
    """GRPO on Qwen2.5-7B, 3-turn tool use, 16 samples per prompt."""
    return {
        "name": f"bench-8k-gpus-{samples}", "algorithm": "grpo",
        "models": {"policy": "Qwen2.5-7B", "reward": "rule"},
        "batch": {"prompts": samples // 16, "samples_per_prompt": 16, "mini_batches": 8},
        "lengths": {"prompt": {"kind": "normal", "mean": 512, "std": 128, "min": 64, "cap": 2048},
                    "response": {"kind": "lognormal", "median": 512, "sigma": 0.8,
                                 "cap": 4096}},
        "environment": {"kind": "code", "turns": 3, "cpu_per_call": 1, "tool_output_tokens": 128,
                        "tool_latency_s": {"kind": "lognormal", "median": 1.0, "sigma": 0.8,
                                           "cap": 60}},
        "pipeline": {"mode": "sync"},
        "cluster": {"pools": [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8,
                               "nodes": 1024},
                              {"name": "cpu", "device": "cpu-node", "devices_per_node": 1,
                               "nodes": 128}]},
    }


PLACEMENT = {"actor": ("h100", 4096, "train"), "reference": ("h100", 4096, "train"),
             "rollout": ("h100", 4096, "gen"), "reward": ("cpu", 64, "verify"),
             "environment": ("cpu", 64, "env")}


def case(samples: int, variance: bool) -> dict[str, Any]:
    """One measurement (runs inside the subprocess)."""
    res = resolve(job_from_dict(goal_job(samples)))
    plan = place(res, PLACEMENT, Calibration())
    cfg = SimConfig() if variance else SimConfig.no_variance()
    t0, c0 = time.perf_counter(), time.process_time()
    r = simulate_plan(plan, iterations=1, seed=0, config=cfg)
    sim_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    sim_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t1 = time.perf_counter()
    n_events = len(r.trace.events)
    trace_s = time.perf_counter() - t1
    gpus = sum(s.devices for s in plan.slots if s.pool == "h100")
    return {"samples": samples, "variance": variance, "gpus": gpus, "sim_s": sim_s, "cpu_s": cpu_s,
            "trace_s": trace_s, "events": n_events, "decode_runs": r.metrics.decode_runs,
            "tool_calls": r.metrics.tool_calls, "iteration_s": r.metrics.iteration_s.mean,
            "predicted_s": plan.predicted_iteration_s, "sim_mb": sim_mb,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def figure_case(samples: int) -> dict[str, Any]:
    """Simulation and figure time of one variance-on iteration (runs inside the subprocess)."""
    import tempfile

    from simulator.plots import write_plots

    plan = place(resolve(job_from_dict(goal_job(samples))), PLACEMENT, Calibration())
    c0 = time.process_time()
    r = simulate_plan(plan, iterations=1, seed=0, config=SimConfig())
    c1 = time.process_time()
    with tempfile.TemporaryDirectory() as d:
        write_plots(r, d)
    c2 = time.process_time()
    return {"samples": samples, "events": len(r.trace.events), "sim_cpu_s": c1 - c0,
            "figures_cpu_s": c2 - c1}


def _run_case(samples: int, variance: bool) -> dict[str, Any]:
    return _subprocess(f"case({samples}, {variance})")


def _subprocess(call: str) -> dict[str, Any]:
    """`call` (a function of this module) in a fresh interpreter pinned to one core."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "import json; import bench.bench_sim as b; "
           f"print(json.dumps(b.{call}))"]
    if sys.platform.startswith("linux"):
        cmd = ["taskset", "-c", "0", *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict[str, Any]]) -> None:
    print(f"{'samples':>8} {'GPUs':>6} {'wall s':>7} {'cpu s':>7} {'trace s':>8} {'events':>8} "
          f"{'events/s':>9} {'runs':>7} {'tools':>7} {'sim MB':>7} {'peak MB':>8} {'iter s':>8} "
          f"{'pred s':>8}")
    for r in rows:
        print(f"{r['samples']:>8} {r['gpus']:>6} {r['sim_s']:>7.2f} {r['cpu_s']:>7.2f} "
              f"{r['trace_s']:>8.2f} {r['events']:>8} {r['events'] / r['cpu_s']:>9.0f} "
              f"{r['decode_runs']:>7} {r['tool_calls']:>7} {r['sim_mb']:>7.0f} "
              f"{r['peak_mb']:>8.0f} {r['iteration_s']:>8.1f} {r['predicted_s']:>8.1f}")
    x = np.array([r["samples"] for r in rows], dtype=float)
    y = np.array([r["cpu_s"] for r in rows])  # CPU seconds: the machine may be shared
    if len(rows) >= 2:
        slope, icpt = np.polyfit(x, y, 1)
        ratio = (y[-1] / x[-1]) / (y[0] / x[0])
        print(f"  slope {slope * 1000:.3f} CPU s per 1,000 samples (intercept {icpt:.2f} s); "
              f"cost per sample at {int(x[-1])} / at {int(x[0])}: {ratio:.2f}")


def goal_line(rows: list[dict[str, Any]]) -> None:
    """The simulator's speed and memory goal, checked on the 65,536-sample variance-on row (when
    it ran)."""
    row = next((r for r in rows if r["samples"] == GOAL["samples"]), None)
    if row is None:
        return
    ok = row["cpu_s"] <= GOAL["cpu_s"] and row["sim_mb"] <= GOAL["mb"]
    print(f"  goal ({GOAL['samples']:,} samples x 3 turns, variance on, one iteration): "
          f"{row['cpu_s']:.2f} CPU s (<= {GOAL['cpu_s']:.0f}), {row['sim_mb']:.0f} MB "
          f"(<= {GOAL['mb']:.0f}), {row['events'] / row['cpu_s']:,.0f} events/s: "
          f"{'met' if ok else 'NOT met'}")


def main(argv: list[str] | None = None) -> None:
    args = argv if argv is not None else sys.argv[1:]
    sizes = QUICK if "--quick" in args else SAMPLES
    print("one iteration, 8,192-GPU cluster (rollout 4,096 H100, actor+reference 4,096 H100), "
          "3 turns, one core")
    for variance in (False, True):
        print(f"\nvariance {'on (lengths and latencies drawn)' if variance else 'off (means)'}:")
        rows = [_run_case(n, variance) for n in sizes]
        table(rows)
        if variance:
            goal_line(rows)
    print("\nfigures (timeline, utilization, lengths; `placer simulate --plots`), variance on, "
          "CPU seconds:")
    print(f"{'samples':>8} {'events':>8} {'simulate':>9} {'figures':>8} {'ratio':>6}")
    for n in (QUICK[-1],) if "--quick" in args else (SAMPLES[-1],):
        f = _subprocess(f"figure_case({n})")
        print(f"{f['samples']:>8} {f['events']:>8} {f['sim_cpu_s']:>9.2f} "
              f"{f['figures_cpu_s']:>8.2f} {f['figures_cpu_s'] / f['sim_cpu_s']:>6.2f}")


if __name__ == "__main__":
    main()
