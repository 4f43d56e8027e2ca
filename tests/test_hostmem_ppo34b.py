"""PPO with four 34B models colocated on A100-80G nodes (examples/ppo-34b-a100.yaml, HybridFlow's
smallest 34B setting) plans on 2 to 16 nodes within each node's 2 TB of host RAM, and the host
memory a node parks is its own ranks' shards of the state: checked against a closed form written
here from the model's published shape, not against placer.solve.hostmem."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from placer.base.errors import Infeasible
from placer.base.roles import TRAINING_ROLES
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve import hostmem
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ppo-34b-a100.yaml"
# CodeLlama-34B, codellama/CodeLlama-34b-hf config.json: 48 layers, hidden 8192, 64 heads of 128,
# 8 KV heads, SwiGLU MLP 22016, vocab 32000, untied embeddings, RMSNorm weights
L, H, KV, F, V = 48, 8192, 8 * 128, 22016, 32000
PARAMS = L * (2 * H * H + 2 * H * KV + 3 * H * F + 2 * H) + 2 * V * H + H  # 33.74e9
HOST_GB, NODE_DEVICES = 2048, 8


def job(nodes: int, host_gb: float | None = None) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["cluster"]["pools"][0]["nodes"] = nodes
    if host_gb is not None:
        doc["cluster"]["pools"][0]["host_memory_gb"] = host_gb
    return doc


def parked_per_device_gb(plan: Plan, role: str) -> float:
    """What one device of `role` keeps on the host while its slot runs another role: 2 B/param of
    bf16 weights split over tp x pp (and ZeRO-3's shard group for a trainer), plus a trainer's
    12 B/param of fp32 master weights and Adam moments over its shard group (on the device unless
    offloaded, then on the host already and not parked again); gradients are freed."""
    r = plan.roles[role]
    split = r.tp * r.pp
    if role not in TRAINING_ROLES:
        return 2 * PARAMS / split / 1e9
    group = (r.par.shard if 0 < r.par.shard < r.dp else r.dp) * r.cp
    weights = 2 * PARAMS / split / (group if r.zero >= 3 else 1)
    optimizer = 0 if r.offload else 12 * PARAMS / split / (group if r.zero >= 1 else 1)
    return (weights + optimizer) / 1e9


def parked_per_node_gb(plan: Plan) -> dict[int, float]:
    """Per node: each switching slot parks all members but the smallest (a member spread evenly
    over the slot's devices), on every device of the slot the node holds."""
    slots = {s.name: s for s in plan.slots}
    out: dict[int, float] = {}
    for b in plan.bundles:
        out.setdefault(b.node, 0.0)
        slot = slots[b.slot]
        if b.slot not in plan.breakdown.switch_s:
            continue  # its roles fit on its devices together: nothing leaves them
        per = [parked_per_device_gb(plan, r) * plan.roles[r].devices / slot.devices
               for r in slot.roles]
        out[b.node] += (sum(per) - min(per)) * len(b.devices)
    return out


@pytest.mark.parametrize("nodes", [2, 4, 8, 12, 16], ids=lambda n: f"{n * NODE_DEVICES}gpu")
def test_ppo_34b_plans_within_host_memory_and_parks_its_own_shards(nodes: int) -> None:
    res = resolve(job_from_dict(job(nodes)))
    px = Pricer(res, Calibration())
    plan = plan_job(px, time_limit_s=10, workers=1)
    assert set(plan.roles) == {"actor", "rollout", "reference", "reward", "critic"}
    nodes_used = hostmem.plan_nodes(plan, px)
    assert nodes_used and not any(n.over for n in nodes_used)
    expected = parked_per_node_gb(plan)
    assert any(expected.values())  # four 34B models do not fit 80 GB devices together
    for n in nodes_used:
        assert n.capacity_gb == HOST_GB
        assert n.parts["parked"] == pytest.approx(expected[n.node], rel=1e-6)
        assert n.parts["object_store"] == 200.0  # Ray: 30% of RAM, at most 200 GB
        assert n.total_gb <= HOST_GB


def test_ppo_34b_parks_less_than_the_four_models_whole_state() -> None:
    """The four models' whole state, 2 x 16 B/param (actor, critic) + 2 x 2 B/param (reference,
    reward), is 1.2 TB; a node of the 16-GPU plan parks less (a solver blind to host memory
    chose a placement that parked 2,160 GB a node, and the job was refused)."""
    res = resolve(job_from_dict(job(2)))
    px = Pricer(res, Calibration())
    plan = plan_job(px, time_limit_s=10, workers=1)
    whole_gb = (2 * 16 + 2 * 2) * PARAMS / 1e9
    assert max(n.parts["parked"] for n in hostmem.plan_nodes(plan, px)) < whole_gb


def test_ppo_34b_on_small_host_memory_is_refused_naming_the_node_and_amounts() -> None:
    """400 GB a node cannot hold what any colocated placement of four 34B models parks."""
    res = resolve(job_from_dict(job(2, host_gb=400)))
    with pytest.raises(Infeasible, match=r"host memory: .*pool a100 node \d needs [\d,]+ GB of "
                                         r"host memory \(parked [\d,]+.*\) of 400 GB"):
        plan_job(Pricer(res, Calibration()), time_limit_s=10, workers=1)


def test_the_solvers_host_rule_agrees_with_the_node_check_on_the_baselines() -> None:
    """`problem.host_fits` (the rule the solver keeps to) and `hostmem.over_nodes` (the node-by-node
    check of the assembled plan) agree on the baselines' placements of the 16-GPU job, where
    every slot fills whole nodes: the fastest-config colocation is over, the others fit."""
    from placer.solve.baselines import REGISTRY
    from placer.solve.planner import build_problem, plan_assignment
    from placer.solve.problem import host_fits

    res = resolve(job_from_dict(job(2)))
    px = Pricer(res, Calibration())
    problem = build_problem(px)
    verdicts = {}
    for name, rule in REGISTRY.items():
        a = rule(problem)
        if a is None:
            continue
        over = hostmem.over_nodes(plan_assignment(problem, a, name), px)
        verdicts[name] = host_fits(problem, a)
        assert verdicts[name] == (not over), name
    assert verdicts["colocated"] is False and any(verdicts.values())
