"""Solver benchmark: solve time and optimality gap against cluster size, and re-plan time.

Prints a table (figures for the closing note; nothing here asserts a time). Each row is a PPO job
with a multi-turn environment (six roles: the largest model the ILP solves) on mixed pools of
H100 and H20 GPUs, Groq LPU chips and CPU nodes, scaled from 8 to ~16k devices; the goal rows are
8,192 GPUs of three types (H100, H20, L40S) + 1,024 LPU chips + 256 CPU nodes (so the rollout may
be split over pools: `placer.cost.split`), once with a dense 70B model and once with
Qwen3-30B-A3B (a mixture of experts: expert-parallel candidates) and responses up to 32K tokens
(context-parallel candidates). The re-plan row loses one H100 node of
examples/large-1k-nodes.yaml (1,024 nodes) and re-solves warm-started from the first plan.

    python -m bench.bench_solver [--time-limit S] [--workers N] [--quick]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.candidates import PARALLEL_DEVICES
from placer.solve.ilp_solve import solve
from placer.solve.layouts import layouts
from placer.solve.moves import moves
from placer.solve.planner import build_problem, hint_of, plan_job, to_plan
from placer.spec.catalog import Resolved, resolve, with_nodes
from placer.spec.load import job_from_dict, load_job

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# (label, model, [(pool, device, per_node, nodes)])
SIZES = [
    ("8", "Llama-3-8B", [("h100", "H100-SXM", 4, 1), ("lpu", "groq-lpu", 2, 1),
                         ("cpu", "cpu-node", 1, 2)]),
    ("64", "Llama-3-8B", [("h100", "H100-SXM", 8, 4), ("h20", "H20", 8, 2),
                          ("lpu", "groq-lpu", 8, 1), ("cpu", "cpu-node", 1, 8)]),
    ("512", "Llama-3-8B", [("h100", "H100-SXM", 8, 32), ("h20", "H20", 8, 16),
                           ("lpu", "groq-lpu", 8, 8), ("cpu", "cpu-node", 1, 64)]),
    ("4096", "Llama-3-70B", [("h100", "H100-SXM", 8, 256), ("h20", "H20", 8, 128),
                             ("lpu", "groq-lpu", 8, 96), ("cpu", "cpu-node", 1, 256)]),
    ("goal 8192+1024+256", "Llama-3-70B", [("h100", "H100-SXM", 8, 384), ("h20", "H20", 8, 384),
                                           ("l40s", "L40S", 8, 256),
                                           ("lpu", "groq-lpu", 8, 128), ("cpu", "cpu-node", 1, 256)]),
    # a mixture of experts with responses beyond one micro-batch: EP and CP candidates
    ("goal MoE 8192+1024+256", "Qwen3-30B-A3B", [("h100", "H100-SXM", 8, 384),
                                                 ("h20", "H20", 8, 384),
                                                 ("l40s", "L40S", 8, 256),
                                                 ("lpu", "groq-lpu", 8, 128),
                                                 ("cpu", "cpu-node", 1, 256)]),
    ("16384", "Llama-3-70B", [("h100", "H100-SXM", 8, 1024), ("h20", "H20", 8, 512),
                              ("lpu", "groq-lpu", 8, 384), ("cpu", "cpu-node", 1, 1024)]),
]


# Response cap of the MoE row: past `costmodel.MICRO_TOKENS`, so training tries context parallelism
LONG_CAP = 32768


def synthetic_job(label: str, model: str, pools: list[tuple[str, str, int, int]], mode: str):
    devices = sum(per * n for _, _, per, n in pools)
    cap = LONG_CAP if "MoE" in label else 8192
    return job_from_dict({
        "name": f"bench-{label}", "algorithm": "ppo",
        "models": {"policy": model, "reward": model},
        "batch": {"prompts": max(devices // 2, 16), "samples_per_prompt": 4, "mini_batches": 4},
        "lengths": {"prompt": {"kind": "normal", "mean": 512, "std": 128, "min": 64, "cap": 2048},
                    "response": {"kind": "lognormal", "median": 1024, "sigma": 0.7, "cap": cap}},
        "environment": {"kind": "tool", "turns": 3, "cpu_per_call": 1, "tool_output_tokens": 128,
                        "tool_latency_s": {"kind": "lognormal", "median": 1.0, "sigma": 0.8,
                                           "cap": 60}},
        "pipeline": {"mode": mode, "max_staleness": 1 if mode == "async" else 0},
        "cluster": {"pools": [{"name": p, "device": d, "devices_per_node": per, "nodes": n}
                              for p, d, per, n in pools],
                    "topology": {"spine_gbs": 3200, "cross_pool_gbs": 100}},
    }, f"bench-{label}")


def row(label: str, res, calib, limit: float, workers: int) -> dict:
    t0 = time.perf_counter()
    problem = build_problem(Pricer(res, calib), workers=workers)
    t1 = time.perf_counter()
    sol = solve(problem, time_limit_s=limit, workers=workers)
    plan = to_plan(problem, sol)
    total = time.perf_counter() - t0
    raw = solve(problem, time_limit_s=limit, workers=workers, prune=False)
    devices = sum(p.devices_per_node * p.nodes for p in res.cluster.pools)
    return {"case": label, "devices": devices, "mode": res.job.pipeline.mode,
            "cands": sum(len(c) for c in problem.cands.values()), "table_s": t1 - t0,
            "ep_cp": "/".join(str(sum(getattr(c.est.par, k) > 1 for cs in problem.cands.values()
                                      for c in cs)) for k in ("ep", "cp")),
            "tried": _tried(res, calib),
            "solve_s": sol.solve_s, "total_s": total,
            "status": sol.status.lower(), "gap": sol.gap, "iter_s": plan.predicted_iteration_s,
            "raw_s": raw.solve_s, "raw_gap": raw.gap,
            "raw_agrees": abs(raw.objective - sol.objective) <= 1e-6 * sol.objective}


def _tried(res: Resolved, calib: Calibration) -> str:
    """Layouts with expert / context parallelism enumerated before memory checks and pruning."""
    px = Pricer(res, calib)
    pars = [p for role in res.job.roles() for pool in res.cluster.pools
            for p in layouts(px, role, pool)]
    return f"{sum(p.ep > 1 for p in pars)}/{sum(p.cp > 1 for p in pars)}"


def replan_row(limit: float, workers: int) -> dict:
    """Lose one H100 node of the 1,024-node example; re-plan warm-started from the old plan."""
    calib = Calibration()
    job = load_job(EXAMPLES / "large-1k-nodes.yaml")
    old = plan_job(Pricer(resolve(job), calib), time_limit_s=limit, workers=workers)
    t0 = time.perf_counter()
    new_res = with_nodes(job, {"h100": job.cluster.pool("h100").nodes - 1})
    move_s = 0.02 * old.predicted_iteration_s
    problem = build_problem(Pricer(new_res, calib), slack_s=len(job.roles()) * move_s, workers=workers)
    t1 = time.perf_counter()
    sol = solve(problem, time_limit_s=limit, hint=hint_of(old, move_s), workers=workers)
    new = to_plan(problem, sol)
    total = time.perf_counter() - t0
    return {"case": "replan: lose 1 of 1,024 nodes", "devices": sum(
        p.devices_per_node * p.nodes for p in new_res.cluster.pools), "mode": job.pipeline.mode,
        "cands": sum(len(c) for c in problem.cands.values()), "table_s": t1 - t0, "ep_cp": "-",
        "tried": "-",
        "solve_s": sol.solve_s, "total_s": total, "status": sol.status.lower(), "gap": sol.gap,
        "iter_s": new.predicted_iteration_s, "moved": ",".join(moves(old, new)) or "-",
        "old_iter_s": old.predicted_iteration_s, "raw_s": float("nan"), "raw_gap": float("nan"),
        "raw_agrees": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.bench_solver", description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="only the sizes up to 512 devices")
    ap.add_argument("--case", default=None,
                    help="only the cases whose label contains this text (and no re-plan row)")
    args = ap.parse_args(argv)
    calib = Calibration()
    print(f"solver benchmark: CP-SAT, {args.workers} workers, time limit {args.time_limit:g} s")
    head = (f"{'case':<32} {'devices':>8} {'mode':>5} {'cands':>6} {'ep/cp':>6} {'tried':>11} "
            f"{'table_s':>8} "
            f"{'solve_s':>8} "
            f"{'total_s':>8} {'status':>9} {'gap':>7} {'iter_s':>9} {'unpruned_s':>10} "
            f"{'gap':>6}")
    print(head)
    print("-" * len(head))
    sizes = SIZES[:3] if args.quick else SIZES
    if args.case is not None:
        sizes = [c for c in sizes if args.case in c[0]]
    rows = []
    for label, model, pools in sizes:
        modes = ("sync", "async") if label == "goal 8192+1024+256" else ("sync",)
        for mode in modes:
            res = resolve(synthetic_job(label, model, pools, mode))
            rows.append(row(label, res, calib, args.time_limit, args.workers))
            _print(rows[-1])
    if args.case is not None:
        return 0
    r = replan_row(args.time_limit, args.workers)
    _print(r)
    print("ep/cp: candidates with expert / context parallelism in the cost table (tried: "
          "layouts enumerated before memory checks and pruning); "
          "table_s: the cost table (candidates; single-pool ones priced in --workers processes "
          f"from {PARALLEL_DEVICES:,} devices on, splits only where they may beat the heuristic "
          "plan); solve_s: CP-SAT incl. model build and the tie-break phase; total_s: table + "
          "solve + assemble (mapping every device); unpruned_s: the same solve keeping the "
          "single-pool candidates slower than the heuristic plan")
    print(f"re-plan: moved {r['moved']}; iteration {r['old_iter_s']:.2f} s -> {r['iter_s']:.2f} s")
    return 0


def _print(r: dict) -> None:
    print(f"{r['case']:<32} {r['devices']:>8} {r['mode']:>5} {r['cands']:>6} {r['ep_cp']:>6} "
          f"{r['tried']:>11} "
          f"{r['table_s']:>8.3f} "
          f"{r['solve_s']:>8.3f} {r['total_s']:>8.3f} {r['status']:>9} {r['gap']:>7.2%} "
          f"{r['iter_s']:>9.2f} {r['raw_s']:>10.3f} {r['raw_gap']:>6.1%}"
          + ("" if r["raw_agrees"] else "  (unpruned objective differs!)"), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
