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

import argparse
from typing import Any

from placer.cli import emit_json, note
from placer.plan import Plan, RolePlacement, calibration_of, load_plan, save_plan
from placer.spec import Job, SpecError


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
    return nodes


def _where(r: RolePlacement) -> str:
    return f"{r.pool}x{r.devices} tp{r.tp} pp{r.pp} dp{r.dp}" + (" offload" if r.offload else "")


def moves(old: Plan, new: Plan) -> dict[str, dict[str, str]]:
    """Roles whose config (pool, layout) or colocation partners changed."""
    out = {}
    for role, r in new.roles.items():
        o = old.roles[role]
        partners_old = set(next(s.roles for s in old.slots if s.name == o.slot))
        partners_new = set(next(s.roles for s in new.slots if s.name == r.slot))
        if _where(o) != _where(r) or partners_old != partners_new:
            why = "config" if _where(o) != _where(r) else "colocation"
            out[role] = {"from": f"{_where(o)} [{o.slot}]", "to": f"{_where(r)} [{r.slot}]",
                         "why": why}
    return out


def run(args: argparse.Namespace) -> int:
    from placer.planner import plan_job, with_nodes  # noqa: PLC0415

    if not args.lost and not args.added:
        raise SpecError("replan: give at least one --lost POOL:NODES or --added POOL:NODES")
    if not args.time_limit > 0:
        raise SpecError(f"--time-limit: must be > 0 seconds (got {args.time_limit!r})")
    if args.move_cost is not None and args.move_cost < 0:
        raise SpecError(f"--move-cost: must be >= 0 seconds (got {args.move_cost!r})")
    old = load_plan(args.plan)
    job = Job.model_validate(old.job)
    nodes = new_node_counts(job, args.lost, args.added)
    res = with_nodes(job, nodes, "replan")
    move = args.move_cost if args.move_cost is not None else 0.02 * old.predicted_iteration_s
    calib = calibration_of(old)
    new = plan_job(res, calib, time_limit_s=args.time_limit, hint=old, move_cost_s=move,
                   workers=args.workers, calibration_doc=old.calibration)
    moved = moves(old, new)
    if args.output:
        save_plan(new, args.output)
        note(f"wrote {args.output}")
    doc: dict[str, Any] = {"plan": new.model_dump(mode="json"), "moved": moved, "nodes": nodes,
                           "old_iteration_s": old.predicted_iteration_s, "move_cost_s": move}
    if args.json:
        emit_json(doc)
        return 0
    from placer.commands.plan import render_plan  # noqa: PLC0415
    print(render_plan(new))
    print(f"\nre-planned from {old.predicted_iteration_s:.3f} s to "
          f"{new.predicted_iteration_s:.3f} s per iteration (move cost {move:.3f} s per role)")
    if not moved:
        print("nothing moved")
    for role, m in moved.items():
        print(f"moved {role} ({m['why']}): {m['from']} -> {m['to']}")
    return 0
