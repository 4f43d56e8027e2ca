"""`placer replan PLAN.json --lost POOL:NODES --added POOL:NODES`: re-plan after the cluster changes.

The new plan is solved on the changed cluster, warm-started from the old plan (a CP-SAT solution
hint) with a movement cost in the objective: each role whose config (pool, TP/PP/DP, offload)
changes costs `--move-cost` seconds (default: 2% of the old iteration time), so the solver moves
a role only when that buys more than it costs. The report says which roles moved and where.

    placer replan PLAN.json [--lost POOL:NODES]... [--added POOL:NODES]... [-o NEW.json] [--json]
                            [--move-cost S] [--time-limit S]

`--json` prints {"plan": ..., "moved": {role: {"from": ..., "to": ...}}, "nodes": {...}};
`-o` writes the new plan.
"""
from __future__ import annotations

# Heavy imports (ortools, simpy, torch, Ray) wait for `run`: the CLI imports every command
# module to build `placer --help`, and a command pays only for what it runs.
import argparse
from typing import Any

from placer.base.errors import SpecError
from placer.base.inputs import check_output
from placer.cli import emit_json, note
from placer.commands.plan import check_solver_arguments
from placer.solve.moves import moves
from placer.solve.planfile import calibration_of, load_plan, save_plan
from placer.solve.render import render_plan
from placer.spec.hardware import check_cluster_size
from placer.spec.job import Job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--lost", action="append", default=[], metavar="POOL:NODES",
                   help="nodes a pool lost (repeatable)")
    p.add_argument("--added", action="append", default=[], metavar="POOL:NODES",
                   help="nodes a pool gained (repeatable)")
    p.add_argument("-o", "--output", metavar="NEW.json", help="write the new plan here")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--move-cost", type=float, default=None, metavar="S",
                   help="seconds charged per moved role (default: 2%% of the old iteration)")
    p.add_argument("--time-limit", type=float, default=5.0, metavar="S",
                   help="solver time limit in seconds (default 5)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT search workers (default 2)")


def parse_change(text: str, flag: str) -> tuple[str, int]:
    pool, sep, n = text.rpartition(":")
    if not sep or not pool:
        raise SpecError(f"{flag}: expected POOL:NODES (got {text!r})")
    try:
        count = int(n)
    except ValueError:
        raise SpecError(f"{flag}: NODES must be a whole number (got {text!r})") from None
    if count < 1:
        raise SpecError(f"{flag}: NODES must be >= 1 (got {text!r})")
    return pool, count


def new_node_counts(job: Job, lost: list[str], added: list[str]) -> dict[str, int]:
    nodes = {p.name: p.nodes for p in job.cluster.pools}
    for flag, items, sign in (("--lost", lost, -1), ("--added", added, 1)):
        for text in items:
            pool, n = parse_change(text, flag)
            if pool not in nodes:
                raise SpecError(f"{flag}: no pool {pool!r} in the plan's cluster (pools: "
                                f"{', '.join(sorted(nodes))})")
            nodes[pool] += sign * n
    dpn = {p.name: p.devices_per_node for p in job.cluster.pools}
    try:  # the grown cluster must still fit in memory (checked before any planning)
        check_cluster_size({name: (max(n, 0), dpn[name]) for name, n in nodes.items()})
    except ValueError as e:
        raise SpecError(f"--added: {e} (got {', '.join(added)})") from None
    return nodes


def run(args: argparse.Namespace) -> int:
    from placer.cost.pricer import Pricer
    from placer.solve.planner import plan_job
    from placer.spec.catalog import with_nodes

    if not args.lost and not args.added:
        raise SpecError("replan: give at least one --lost POOL:NODES or --added POOL:NODES")
    check_output(args.output, "--output")  # before the solve, not after it
    check_solver_arguments(args)
    if args.move_cost is not None and args.move_cost < 0:
        raise SpecError(f"--move-cost: must be >= 0 seconds (got {args.move_cost!r})")
    old = load_plan(args.plan)
    job = old.spec
    nodes = new_node_counts(job, args.lost, args.added)
    res = with_nodes(job, nodes, "replan")
    move = args.move_cost if args.move_cost is not None else 0.02 * old.predicted_iteration_s
    new = plan_job(Pricer(res, calibration_of(old)), time_limit_s=args.time_limit, hint=old,
                   move_cost_s=move, workers=args.workers)
    moved = {role: m.to_dict() for role, m in moves(old, new).items()}
    if args.output:
        save_plan(new, args.output)
        note(f"wrote {args.output}")
    doc: dict[str, Any] = {"plan": new.model_dump(mode="json"), "moved": moved, "nodes": nodes,
                           "old_iteration_s": old.predicted_iteration_s, "move_cost_s": move}
    if args.json:
        emit_json(doc)
        return 0
    print(render_plan(new))
    print(f"\nre-planned from {old.predicted_iteration_s:.3f} s to "
          f"{new.predicted_iteration_s:.3f} s per iteration (move cost {move:.3f} s per role)")
    if not moved:
        print("nothing moved")
    for role, m in moved.items():
        print(f"moved {role} ({m['why']}): {m['from']} -> {m['to']}")
    return 0
