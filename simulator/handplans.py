"""Plans for the examples, the golden files and the benchmark.

`plan_for(res, calib)` asks the ILP (`placer.planner.plan_job`) when that module is present;
without it, it assembles a fixed, hand-written placement (`EXAMPLE_PLACEMENTS`: role -> pool,
device count, slot) - no search: each role takes the fastest config the candidate enumeration
offers for exactly that device count. Every plan goes through `placer.assemble`, so its predicted
time is the placer's own.
"""
from __future__ import annotations

import importlib
import importlib.util

from placer.assemble import assemble
from placer.candidates import role_candidates
from placer.catalog import Resolved
from placer.costmodel import Calibration
from placer.plan import Plan, SolverInfo
from placer.spec import SpecError
from placer.timing import Placed

Placement = dict[str, tuple[str, int, str]]  # role -> (pool, devices, slot)

EXAMPLE_PLACEMENTS: dict[str, Placement] = {
    # colocated GPU roles (the hybrid-engine default): pays onload/offload between roles
    "grpo-qwen7b-h100": {"actor": ("h100", 16, "gpu"), "rollout": ("h100", 16, "gpu"),
                         "reference": ("h100", 16, "gpu"), "reward": ("cpu", 1, "verify")},
    # generation on one node, training on the other, tools spread over CPU nodes
    "agentic-code": {"actor": ("h100", 8, "train"), "rollout": ("h100", 8, "gen"),
                     "reference": ("h100", 8, "train"), "reward": ("cpu", 1, "verify"),
                     "environment": ("cpu", 8, "env")},
    # every pool for what it is good at
    "ppo-llama8b-hetero": {"actor": ("train", 8, "actor"), "critic": ("train", 8, "critic"),
                           "rollout": ("gen", 16, "gen"), "reference": ("lpu", 77, "ref"),
                           "reward": ("lpu", 77, "rm"), "environment": ("cpu", 4, "env")},
    # policy roles time-share the H100s; the frozen reference runs on the H20s beside them
    "large-1k-nodes": {"actor": ("h100", 4096, "h100"), "rollout": ("h100", 4096, "h100"),
                       "reference": ("h20", 2048, "h20"), "reward": ("h100", 4096, "h100")},
    "tiny-cpu": {"actor": ("gpu", 2, "gpu"), "rollout": ("gpu", 2, "gpu"),
                 "reference": ("lpu", 4, "lpu"), "reward": ("cpu", 1, "cpu"),
                 "environment": ("cpu", 1, "cpu")},
}

HAND = SolverInfo(name="hand", status="HAND", objective=0.0, bound=0.0, gap=0.0, solve_s=0.0)


def has_planner() -> bool:
    return importlib.util.find_spec("placer.planner") is not None


def place(res: Resolved, placement: Placement, calib: Calibration) -> Plan:
    """Assemble a plan from a hand placement (fastest config for each given device count)."""
    placed = []
    for role in res.job.roles():
        if role not in placement:
            raise SpecError(f"placement: no entry for role {role!r}")
        pool_name, devices, slot = placement[role]
        pool = res.cluster.pool(pool_name)
        cands = [c for c in role_candidates(res, role, pool, calib, prune=False)
                 if c.devices == devices]
        if not cands:
            raise SpecError(f"placement: {role} has no feasible config on {devices} x "
                            f"{pool_name}")
        best = min(cands, key=lambda c: (c.time_s, c.est.memory.total))
        placed.append(Placed(slot, best.est))
    return assemble(res, placed, calib, HAND)


def plan_for(res: Resolved, calib: Calibration) -> Plan:
    """The ILP's plan when the planner exists, else the example's hand placement."""
    if has_planner():
        planner = importlib.import_module("placer.planner")
        return planner.plan_job(res, calib)
    if res.job.name not in EXAMPLE_PLACEMENTS:
        raise SpecError(f"no hand placement for job {res.job.name!r} and no planner yet")
    return place(res, EXAMPLE_PLACEMENTS[res.job.name], calib)
