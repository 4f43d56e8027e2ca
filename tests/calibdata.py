"""Shared test data for the calibration tests: a hand-made heterogeneous plan and known factors."""
from __future__ import annotations

from pathlib import Path

from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.cost.timing import Placed
from placer.solve.assemble import assemble
from placer.solve.planfile import Plan, SolverInfo
from placer.spec.catalog import resolve
from placer.spec.load import load_job

ROOT = Path(__file__).resolve().parents[1]

# PPO on Llama-3-8B: training on H100s, generation and frozen models on L40S, tools on CPU nodes.
CHOICES = {"actor": ("train", Parallel(dp=8), "s0"), "critic": ("train", Parallel(dp=8), "s1"),
           "rollout": ("gen", Parallel(tp=1, dp=8), "s2"),
           "reference": ("gen", Parallel(dp=4), "s3"), "reward": ("gen", Parallel(dp=4), "s4"),
           "environment": ("cpu", Parallel(dp=4), "s5")}

# The factors a synthetic run is generated at, and that calibration must recover.
TRUTH = Calibration(per_device={
    "H100-SXM": Efficiency(mfu_train=0.30, mfu_score=0.45, train_overhead_s=0.08),
    "L40S": Efficiency(decode_bw_eff=0.55, decode_flops_eff=0.45, mfu_prefill=0.40, mfu_score=0.50,
                       step_overhead_s=0.004, link_eff=0.60, sync_latency_s=0.02),
})


def hand_plan(job: str = "examples/ppo-llama8b-hetero.yaml",
              choices: dict[str, tuple[str, Parallel, str]] | None = None) -> Plan:
    """A plan for `job` with the given (pool, parallel config, slot) per role, priced as usual."""
    res = resolve(load_job(ROOT / job))
    calib = Calibration()
    placed = []
    for role, (pool, par, slot) in (choices or CHOICES).items():
        est = Pricer(res, calib).estimate(role, res.cluster.pool(pool), par)
        assert est.feasible, (role, est.reason)
        placed.append(Placed(slot, est))
    return assemble(Pricer(res, calib), placed, SolverInfo(name="hand", status="hand", objective=0.0,
                                                    bound=0.0, gap=0.0, solve_s=0.0))


# tiny-cpu with a dp-2 actor: the emulated-GPU plan the collective and checkpoint tests price
TINY_DP2 = {"actor": ("gpu", Parallel(dp=2), "g"), "rollout": ("gpu", Parallel(dp=2), "g"),
            "reference": ("lpu", Parallel(dp=1), "l"), "reward": ("cpu", Parallel(dp=1), "c"),
            "environment": ("cpu", Parallel(dp=1), "c")}


def tiny_dp2_plan() -> Plan:
    return hand_plan("examples/tiny-cpu.yaml", TINY_DP2)
