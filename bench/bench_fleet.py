"""Fleet benchmark: `plan_fleet`'s wall time and proven gap against fleet size, as a ratio to
one job's plan.

Each fleet is built here: a cluster of four device types (H100, H20 and L40S nodes of 8 GPUs,
CPU nodes) split among teams of one cohort (nominal 1/teams of each pool, borrowing as much
again), and jobs cut from the example job files (GRPO, PPO with a tool environment, an agentic
coding job, a heterogeneous split, a 72B judge) at one to four times their batch. Jobs come in
sweeps of four identical documents (the same job at four seeds, as a learning-rate sweep runs),
so a 64-job fleet has 16 kinds of job. The goal row is 64 jobs on 2,048 nodes within the fleet's
60 s time limit on 2 cores. `one plan` is the first job planned alone on its team's cap (the
largest allocation the fleet search may give it), the unit the fleet's time is quoted in.
`cpu s` is the fleet's CPU time (its worker processes included): on a shared machine the wall
time also counts the neighbours' work.

    python -m bench.bench_fleet [--quick] [--time-limit S] [--workers N]
"""
from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any

import yaml

from placer.cost.calibration import load_calibration
from placer.fleet.inner import plan_on
from placer.fleet.planner import plan_fleet
from placer.fleet.spec import fleet_from_dict

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
KINDS = ("grpo-qwen7b-h100", "ppo-llama8b-hetero", "agentic-code", "hetero-split",
         "judge-72b-h100-l40s")
POOLS = (("h100", "H100-SXM", 8, 0.3125), ("h20", "H20", 8, 0.25), ("l40s", "L40S", 8, 0.1875),
         ("cpu", "cpu-node", 1, 0.25))
SWEEP = 4  # identical jobs per sweep
ROWS = [(8, 256, 2), (16, 512, 4), (64, 2048, 8)]  # jobs, nodes, teams


def scale_fleet(jobs: int = 64, nodes: int = 2048, teams: int = 8) -> dict[str, Any]:
    """The fleet document of one row (module docstring)."""
    sizes = {n: round(nodes * share) for n, _, _, share in POOLS}
    pools = [{"name": n, "device": d, "devices_per_node": per, "nodes": sizes[n]}
             for n, d, per, _ in POOLS]
    quota = {f"team{t}": {"cohort": "org", "quota": {
        n: {"nominal": size // teams, "borrowing_limit": size // teams}
        for n, size in sizes.items()}} for t in range(teams)}
    out = []
    for i in range(jobs):
        sweep = i // SWEEP
        kind = KINDS[sweep % len(KINDS)]
        doc = yaml.safe_load((EXAMPLES / f"{kind}.yaml").read_text())
        doc.pop("cluster", None)
        doc["batch"]["prompts"] *= 1 + (sweep // len(KINDS)) % 4
        out.append({"name": f"j{i:02d}-{kind}", "team": f"team{i * teams // jobs}", "job": doc,
                    "weight": float(1 + sweep % 3)})
    return {"name": f"bench-{jobs}x{nodes}", "cluster": {"pools": pools}, "teams": quota,
            "jobs": out}


def row(jobs: int, nodes: int, teams: int, limit: float, workers: int) -> dict[str, Any]:
    fleet = fleet_from_dict(scale_fleet(jobs, nodes, teams), EXAMPLES, "bench")
    calib = load_calibration(None)
    first = fleet.jobs[0]
    t0 = time.perf_counter()
    plan_on(first.job, {p: fleet.team_cap(first.team, p) for p in fleet.pool_nodes()}, calib,
            5.0, 0)
    one = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), _cpu()
    res = plan_fleet(fleet, calib, time_limit_s=limit, workers=workers)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"jobs": jobs, "nodes": nodes, "kinds": len({str(j.job.model_dump(exclude={"name"}))
                                                        for j in fleet.jobs}),
            "grid": res.grid_size, "priced": res.plans_priced, "rounds": res.rounds,
            "one": one, "wall": wall, "cpu": cpu, "gap": res.gap, "optimal": res.optimal}


def _cpu() -> float:
    """CPU seconds of this process and its ended workers: on a shared machine the wall time
    counts the neighbours' work too."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_fleet")
    ap.add_argument("--quick", action="store_true", help="the smallest row only")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    print(f"{'jobs':>4} {'nodes':>5} {'kinds':>5} {'grid':>6} {'priced':>6} {'rounds':>6} "
          f"{'one plan s':>10} {'fleet s':>8} {'cpu s':>6} {'fleet/one':>9} {'gap':>6}",
          flush=True)
    for jobs, nodes, teams in ROWS[:1] if args.quick else ROWS:
        r = row(jobs, nodes, teams, args.time_limit, args.workers)
        gap = "opt" if r["optimal"] else f"{r['gap']:.1%}"
        print(f"{r['jobs']:>4} {r['nodes']:>5} {r['kinds']:>5} {r['grid']:>6} {r['priced']:>6} "
              f"{r['rounds']:>6} {r['one']:>10.1f} {r['wall']:>8.1f} {r['cpu']:>6.1f} "
              f"{r['wall'] / r['one']:>9.1f} {gap:>6}", flush=True)


if __name__ == "__main__":
    main()
