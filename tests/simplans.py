"""Plans for the simulator's tests: the ILP's when `placer.solve.planner` exists, hand placements
otherwise and always for the fixed placements of `simulator.handplans.EXAMPLE_PLACEMENTS`."""
from __future__ import annotations

from functools import cache
from pathlib import Path

from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.planfile import Plan
from placer.spec.catalog import resolve
from placer.spec.job import Job
from placer.spec.load import job_from_dict, load_job
from simulator.handplans import EXAMPLE_PLACEMENTS, place, plan_for

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.yaml"))


@cache
def example_plan(name: str) -> Plan:
    res = resolve(load_job(EXAMPLES / f"{name}.yaml"), name)
    return plan_for(res, Calibration())


@cache
def hand_plan(name: str) -> Plan:
    res = resolve(load_job(EXAMPLES / f"{name}.yaml"), name)
    return place(res, EXAMPLE_PLACEMENTS[name], Calibration())


def small_job(**over) -> dict:
    """A 1-node GRPO job on 8 H100 (+ a CPU pool) small enough to simulate in milliseconds."""
    job = {
        "name": "sim-small", "algorithm": "grpo",
        "models": {"policy": "Qwen2.5-7B", "reward": "rule"},
        "batch": {"prompts": 32, "samples_per_prompt": 4, "mini_batches": 2},
        "lengths": {"prompt": {"kind": "fixed", "value": 256},
                    "response": {"kind": "lognormal", "median": 256, "sigma": 0.3, "cap": 2048}},
        "environment": {"kind": "tool", "turns": 2, "cpu_per_call": 1, "tool_output_tokens": 64,
                        "tool_latency_s": {"kind": "fixed", "value": 1.0}},
        "pipeline": {"mode": "sync"},
        "cluster": {"pools": [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8,
                               "nodes": 1},
                              {"name": "cpu", "device": "cpu-node", "devices_per_node": 1,
                               "nodes": 4}]},
    }
    for key, value in over.items():
        cur = job
        parts = key.split("__")
        for p in parts[:-1]:
            cur = cur[p]
        cur[parts[-1]] = value
    return job


SMALL_PLACEMENT = {"actor": ("h100", 4, "train"), "reference": ("h100", 4, "train"),
                   "rollout": ("h100", 4, "gen"), "reward": ("cpu", 1, "verify"),
                   "environment": ("cpu", 1, "env")}


def small_plan(placement: dict | None = None, **over) -> Plan:
    res = resolve(job_from_dict(small_job(**over)))
    return place(res, placement or SMALL_PLACEMENT, Calibration())


@cache
def hetero_split_plans() -> tuple[Plan, Plan]:
    """examples/hetero-split.yaml planned twice from one cost table: (the ILP's plan, which
    splits the rollout over pools; the best plan with every split candidate dropped)."""
    from dataclasses import replace

    from placer.cost.pricer import Pricer
    from placer.solve.ilp_solve import solve
    from placer.solve.planner import build_problem, to_plan

    res = resolve(load_job(EXAMPLES / "hetero-split.yaml"), "hetero-split")
    problem = build_problem(Pricer(res, Calibration()))
    single = replace(problem, cands={r: [c for c in cs if not c.split]
                                     for r, cs in problem.cands.items()})
    return to_plan(problem, solve(problem)), to_plan(single, solve(single))


def for_job(plan: Plan, job: Job) -> Plan:
    """`plan`'s placement (pools, layouts, parts, slots) priced and mapped for `job` (the plan's
    job with, say, another pipeline mode or tail policy)."""
    from placer.cost.timing import Placed
    from placer.solve.assemble import assemble, placed_estimate
    from simulator.handplans import HAND

    res, calib = resolve(job, plan.spec.name), Calibration()
    px = Pricer(res, calib)
    placed = [Placed(r.slot, placed_estimate(px, role, r)) for role, r in plan.roles.items()]
    return assemble(px, placed, HAND)
