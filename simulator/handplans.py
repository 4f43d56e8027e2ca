"""Plans for the examples, the golden files and the benchmark.

`plan_for(res, calib)` asks the ILP (`placer.solve.planner.plan_job`); `place(res, placement, calib)`
assembles a fixed, hand-written placement (`EXAMPLE_PLACEMENTS`: role -> pool, device count,
slot) - no search: each role takes the fastest config the candidate enumeration offers for
exactly that device count (the agreement tests and the benchmark use those). Every plan goes
through `placer.solve.assemble`, so its predicted time is the placer's own.
"""
from __future__ import annotations

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.timing import Placed
from placer.solve.assemble import assemble
from placer.solve.candidates import role_candidates
from placer.solve.planfile import Plan, SolverInfo
from placer.spec.catalog import Resolved

Placement = dict[str, tuple[str, int, str]]  # role -> (pool, devices, slot)

EXAMPLE_PLACEMENTS: dict[str, Placement] = {
    # colocated GPU roles (the hybrid-engine default): pays onload/offload between roles
    "grpo-qwen7b-h100": {Role.ACTOR: ("h100", 16, "gpu"), Role.ROLLOUT: ("h100", 16, "gpu"),
                         Role.REFERENCE: ("h100", 16, "gpu"), Role.REWARD: ("cpu", 1, "verify")},
    # generation on one node, training on the other, tools spread over CPU nodes
    "agentic-code": {Role.ACTOR: ("h100", 8, "train"), Role.ROLLOUT: ("h100", 8, "gen"),
                     Role.REFERENCE: ("h100", 8, "train"), Role.REWARD: ("cpu", 1, "verify"),
                     Role.ENVIRONMENT: ("cpu", 8, "env")},
    # every pool for what it is good at
    "ppo-llama8b-hetero": {Role.ACTOR: ("train", 8, "actor"), Role.CRITIC: ("train", 8, "critic"),
                           Role.ROLLOUT: ("gen", 16, "gen"), Role.REFERENCE: ("lpu", 77, "ref"),
                           Role.REWARD: ("lpu", 77, "rm"), Role.ENVIRONMENT: ("cpu", 4, "env")},
    # policy roles time-share the H100s; the frozen reference runs on the H20s beside them
    "large-1k-nodes": {Role.ACTOR: ("h100", 4096, "h100"), Role.ROLLOUT: ("h100", 4096, "h100"),
                       Role.REFERENCE: ("h20", 2048, "h20"), Role.REWARD: ("h100", 4096, "h100")},
    "tiny-cpu": {Role.ACTOR: ("gpu", 2, "gpu"), Role.ROLLOUT: ("gpu", 2, "gpu"),
                 Role.REFERENCE: ("lpu", 4, "lpu"), Role.REWARD: ("cpu", 1, "cpu"),
                 Role.ENVIRONMENT: ("cpu", 1, "cpu")},
}

HAND = SolverInfo(name="hand", status="HAND", objective=0.0, bound=0.0, gap=0.0, solve_s=0.0)


def place(res: Resolved, placement: Placement, calib: Calibration) -> Plan:
    """Assemble a plan from a hand placement (fastest config for each given device count)."""
    placed = []
    for role in res.job.roles():
        if role not in placement:
            raise SpecError(f"placement: no entry for role {str(role)!r}")
        pool_name, devices, slot = placement[role]
        pool = res.cluster.pool(pool_name)
        cands = [c for c in role_candidates(Pricer(res, calib), role, pool, prune=False)
                 if c.devices == devices]
        if not cands:
            raise SpecError(f"placement: {role} has no feasible config on {devices} x "
                            f"{pool_name}")
        best = min(cands, key=lambda c: (c.time_s, c.est.memory.total))
        placed.append(Placed(slot, best.est))
    return assemble(Pricer(res, calib), placed, HAND)


def plan_for(res: Resolved, calib: Calibration) -> Plan:
    """The ILP's plan for the job."""
    from placer.solve.planner import plan_job  # lazy: ortools (~0.4 s) only when planning
    return plan_job(Pricer(res, calib))
