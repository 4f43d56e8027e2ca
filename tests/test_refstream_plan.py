"""The planner's streamed reference (`placer.solve.layouts.streamed_frozen`), the job's micro-batch
token budgets (`Job.micro_token_budget`) and the host memory parking and a host-stepped optimizer
fill (`placer.cost.offload.host_parked_gb`, `host_optimizer_gb`).

The planner's choice is checked against a brute force over the same small candidate table: every
choice of one candidate per role and every grouping of roles into slots that fits the pools and
the model's host-memory rule (`problem.host_fits`), scored by `ilp_bound.score`. That checks the
ILP's search and its host-memory constraint against an enumeration, not the prices themselves
(they are the cost model's, shared by both). Host-memory figures are worked by hand from the
sources each test names."""
from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from placer.base.roles import Role
from placer.cli import main
from placer.cost.efficiency import Calibration
from placer.cost.estimate import budgeted
from placer.cost.offload import (
    HOST_OPTIMIZER_BYTES,
    STREAM_SCHEMES,
    host_optimizer_gb,
    host_parked_gb,
)
from placer.cost.pricer import Pricer
from placer.cost.roofline import Memory
from placer.cost.sharding import Parallel
from placer.solve import hostmem
from placer.solve.baselines import partitions
from placer.solve.candidates import role_candidates
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import hint_assignment, solve
from placer.solve.moves import layout, moves
from placer.solve.planner import build_problem, hint_of, plan_job
from placer.solve.problem import Assignment, Problem, candidate_key, host_fits, slot_names
from placer.solve.render import render_plan
from placer.spec.catalog import resolve
from placer.spec.framework import PROFILES
from placer.spec.load import job_from_dict

QWEN32B_PARAMS = 32.76e9  # Qwen2.5-32B (the catalog's shape; Qwen/Qwen2.5-32B config.json)


def _job(host_gb: float, framework: str = "verl", **extra: object) -> dict:
    """GRPO on Qwen2.5-32B: the actor pinned to 8 of pool t's 16 H100 (its FSDP state ~70 GB a
    device), the rollout to pool r, the reference to pool t, priced by cost. A resident sharded
    reference (~12 GB a device) does not fit beside the actor (82 GB > 80), so sharing the
    actor's devices means switching the slot; streamed (~4 GB) it fits."""
    return {"name": "stream", "algorithm": "grpo", "framework": framework,
            "models": {"policy": "Qwen2.5-32B", "reward": "rule"},
            "batch": {"prompts": 16, "samples_per_prompt": 8, "mini_batches": 1},
            "lengths": {"prompt": {"kind": "fixed", "value": 256},
                        "response": {"kind": "fixed", "value": 256}},
            "pipeline": {"mode": "sync"}, "objective": "cost",
            "pin": {"actor": {"pool": "t", "devices": 8}, "reference": {"pool": "t"},
                    "rollout": {"pool": "r"}},
            "cluster": {"pools": [
                {"name": "t", "device": "H100-SXM", "devices_per_node": 8, "nodes": 2,
                 "host_memory_gb": host_gb},
                {"name": "r", "device": "H100-SXM", "devices_per_node": 8, "nodes": 1},
                {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}]},
            **extra}


def _small_table(problem: Problem) -> Problem:
    """The reference's 8-device candidates (whole, sharded, streamed where they survived the
    host check) and its two fewest-device ones, the rollout's three fewest-device ones and
    everything else: small enough to enumerate."""
    cands = dict(problem.cands)
    ref = cands[Role.REFERENCE]
    cands[Role.REFERENCE] = ([c for c in ref if c.devices == 8]
                             + sorted((c for c in ref if c.devices != 8),
                                      key=lambda c: c.devices)[:2])
    cands[Role.ROLLOUT] = sorted(cands[Role.ROLLOUT], key=lambda c: c.devices)[:3]
    return replace(problem, cands=cands)


def _brute_force(problem: Problem) -> tuple[float, Assignment]:
    """The best objective over every candidate choice x slot grouping that fits the pools'
    devices and the host-memory rule."""
    key = 0 if problem.objective == "time" else 1
    cap, roles = problem.capacity(), problem.roles
    best: tuple[float, Assignment] | None = None
    for combo in itertools.product(*(problem.cands[r] for r in roles)):
        choice = dict(zip(roles, combo))
        for groups in partitions(roles):
            if any(len({choice[r].pool for r in g}) > 1 for g in groups):
                continue
            used: dict[str, int] = {}
            for g in groups:
                pool = choice[g[0]].pool
                used[pool] = used.get(pool, 0) + max(choice[r].devices for r in g)
            if any(n > cap[p] for p, n in used.items()):
                continue
            a = Assignment(choice, slot_names(groups))
            if not host_fits(problem, a):
                continue
            obj = score(problem, a)[key]
            if best is None or obj < best[0]:
                best = (obj, a)
    assert best is not None
    return best


@pytest.mark.parametrize("host_gb, streams", [(400.0, True), (200.0, False)])
def test_the_planner_streams_the_reference_where_host_memory_holds_it(host_gb, streams) -> None:
    """400 GB: the streamed shard (4 B x 32.76 G / 8 = 16.4 GB a device, 131 GB a node, plus
    pinned buffers and Ray's 120 GB store) fits, and sharing the actor's 8 devices without a
    switch is the cheapest plan. 200 GB: 131 + 16 + 60 > 200, the streamed candidates are refused
    and the reference takes devices of its own. Either way the ILP's choice is the brute
    force's."""
    px = Pricer(resolve(job_from_dict(_job(host_gb))), Calibration())
    problem = _small_table(build_problem(px))
    streamed = [c for c in problem.cands[Role.REFERENCE] if c.est.par.stream_params_bytes]
    assert bool(streamed) == streams  # refused per node alone (`hostmem.refuse_candidates`)
    expect, best = _brute_force(problem)
    sol = solve(problem, time_limit_s=20.0, workers=1)
    assert sol.status == "OPTIMAL"
    assert score(problem, sol.assignment)[1] == pytest.approx(expect, rel=1e-5)
    ref = best.choice[Role.REFERENCE].est.par
    assert (ref.stream_params_bytes > 0) == streams
    got = sol.assignment.choice[Role.REFERENCE].est.par
    assert (got.stream_params_bytes > 0) == streams
    if streams:  # beside the actor, in its slot, with no switch
        assert sol.assignment.slot_of[Role.REFERENCE] == sol.assignment.slot_of[Role.ACTOR]
        assert got.stream_params_bytes == STREAM_SCHEMES[PROFILES["verl"].stream_scheme
                                                         ].bytes_per_param == 4.0


def test_the_plan_shows_the_streamed_reference_and_counts_its_host_memory() -> None:
    px = Pricer(resolve(job_from_dict(_job(400.0))), Calibration())
    plan = plan_job(px, time_limit_s=20)
    ref = plan.roles[Role.REFERENCE]
    assert ref.stream_params_bytes == 4.0 and ref.sharded_weights and ref.dp == 8
    assert json.loads(plan.model_dump_json())["roles"]["reference"]["stream_params_bytes"] == 4.0
    assert "stream_params_bytes" not in json.loads(plan.model_dump_json())["roles"]["actor"]
    (node,) = [n for n in hostmem.plan_nodes(plan, px) if n.pool == "t" and "reference" in n.roles]
    # 4 B x the BF16 shard (the model's parameters / 8) on each of the node's 8 devices
    assert node.parts["streamed"] == pytest.approx(4 * QWEN32B_PARAMS / 8 * 8 / 1e9, rel=0.01)
    assert node.parts["pinned"] == 16.0 and not node.over
    assert "reference: weights held in host memory (4 B a parameter)" in render_plan(plan)


def test_a_replan_tells_a_streamed_reference_from_its_resident_twin() -> None:
    """The layout key and the move report see how a frozen model holds its weights: the old
    plan's streamed reference is found again as itself (not its resident twin, the first match
    before), and re-planning onto nodes with too little host memory reports the reference moving
    to resident weights."""
    px = Pricer(resolve(job_from_dict(_job(400.0))), Calibration())
    problem = build_problem(px)
    refs = problem.cands[Role.REFERENCE]
    streamed = [c for c in refs if c.est.par.stream_params_bytes]
    twins = {candidate_key(c) for c in refs if not c.est.par.stream_params_bytes}
    assert streamed and not {candidate_key(c) for c in streamed} & twins
    plan = plan_job(px, time_limit_s=20)
    hint = hint_of(plan)
    found = hint_assignment(problem, hint)
    assert found is not None and found.choice[Role.REFERENCE].est.par.stream_params_bytes == 4.0
    assert layout(plan, Role.REFERENCE).endswith(" sharded-weights streamed")
    small = Pricer(resolve(job_from_dict(_job(200.0))), Calibration())
    again = plan_job(small, time_limit_s=20)
    assert not again.roles[Role.REFERENCE].stream_params_bytes
    assert not layout(again, Role.REFERENCE).endswith(" streamed")
    assert Role.REFERENCE in moves(plan, again)


def test_only_a_framework_that_streams_gets_streamed_candidates() -> None:
    for name, profile in PROFILES.items():
        px = Pricer(resolve(job_from_dict(_job(400.0, framework=name))), Calibration())
        if profile.job_problem(critic=False, async_steps=False, partial_rollout=False):
            continue
        cands = role_candidates(px, Role.REFERENCE, px.res.cluster.pool("t"))
        streamed = {c.est.par.stream_params_bytes for c in cands} - {0.0}
        want = ({STREAM_SCHEMES[profile.stream_scheme].bytes_per_param}
                if Role.REFERENCE in profile.stream_frozen else set())
        assert streamed == want, name
    # verl's host copy is its fp32 reference, EasyR1's its BF16 one (STREAM_SCHEMES' entries)
    assert PROFILES["verl"].stream_scheme == "verl-fsdp-ref"
    assert PROFILES["easyr1"].stream_scheme == "easyr1-ref"
    assert STREAM_SCHEMES["easyr1-ref"].bytes_per_param == 2.0
    assert "stream_frozen" in PROFILES["verl"].sources


# ------------------------------------------------------------------------ micro-batch budgets
def test_the_jobs_budgets_price_forward_and_update_micro_batches() -> None:
    res = resolve(job_from_dict(_job(400.0, micro_token_budget={"forward": 8192,
                                                                "update": 4096})))
    par = Parallel(dp=8)
    assert budgeted(res, par, "forward").micro_token_budget == 8192
    assert budgeted(res, par, "update").micro_token_budget == 4096
    # a layout's own budget or micro-batch count wins
    assert budgeted(res, replace(par, micro_token_budget=2048), "forward").micro_token_budget == 2048
    assert budgeted(res, replace(par, micro_batch=2), "update") == replace(par, micro_batch=2)
    # unset: the layout as it is (the cost model's MICRO_TOKENS)
    bare = resolve(job_from_dict(_job(400.0)))
    assert budgeted(bare, par, "forward") is par
    # the streamed reference copies its shard once per forward micro-batch: 16 x 512 x 8 /
    # 8 ranks = 8,192 tokens a rank, one micro-batch at 8,192, two at 4,096
    pool = res.cluster.pool("t")
    stream = Parallel(dp=8, sharded_weights=True, stream_params_bytes=4.0)
    small = resolve(job_from_dict(_job(400.0, micro_token_budget={"forward": 4096})))
    one = Pricer(res, Calibration()).estimate(Role.REFERENCE, pool, stream).stage_s["score"]
    two = Pricer(small, Calibration()).estimate(Role.REFERENCE, pool, stream).stage_s["score"]
    shard_gb = 4 * QWEN32B_PARAMS / 8 / 1e9
    offload_gbs = Calibration().for_device(res.device_of(pool)).offload_gbs
    assert two - one == pytest.approx(shard_gb / offload_gbs, rel=0.02)


@pytest.mark.parametrize("value", [0, -4096, "lots", 1.5])
def test_a_bad_budget_is_one_line_naming_the_field(tmp_path, capsys, value) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(_job(400.0, micro_token_budget={"forward": value})))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "micro_token_budget.forward" in err and len(err.splitlines()) == 1
    assert "Traceback" not in err


# ------------------------------------------------------------------------------ host memory
def test_verls_fsdp_worker_parks_twelve_bytes_a_parameter() -> None:
    """volcengine/verl @b178a3cd56f58b2d502255daba591e92833930a7 verl/utils/fsdp_utils.py:
    `offload_fsdp_model_to_cpu` (144-166) moves the flat parameters, fp32 for the actor
    (fsdp_workers.py 324-326): 4 B; `offload_fsdp_optimizer` (204-212) moves Adam's exp_avg and
    exp_avg_sq: 8 B. 12 B a parameter, not the model's 14 (BF16 2 + fp32 master and moments
    12), which a framework with no recorded scheme keeps."""
    mem = Memory(weights=2.0, optimizer=12.0)  # 1 G parameters of each state on the device
    assert host_parked_gb(mem, Role.ACTOR, "verl") == pytest.approx(12.0)
    assert host_parked_gb(mem, Role.ACTOR, "native") == pytest.approx(14.0)
    # verl's Megatron worker: BF16 parameter buffers and the fp32 master + moments, 14 B
    assert host_parked_gb(mem, Role.ACTOR, "verl-megatron") == pytest.approx(14.0)
    # a rollout engine's level-1 sleep moves its BF16 weights whatever drives it; level 2
    # (verl's hybrid engine on vLLM >= 0.8.5) discards them: nothing parked
    assert host_parked_gb(Memory(weights=2.0), Role.ROLLOUT, "verl") == pytest.approx(2.0)
    assert host_parked_gb(Memory(weights=2.0), Role.ROLLOUT, "verl", sleep_level=2) == 0.0
    assert hostmem.parked_gb(mem, "solver.actor", "verl", 2) == pytest.approx(12.0)


def test_a_host_stepped_optimizer_holds_sixteen_bytes_a_parameter() -> None:
    """radixark/Megatron-LM @235952df607b3820716e5e67728a5ab470ca33ae
    megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py: the fp32 parameter pinned on
    the host (274), Adam's two fp32 moments, and the pinned fp32 gradient buffer
    `_set_sub_optimizer_grads` allocates per parameter (109-111): 4 + 8 + 4."""
    assert HOST_OPTIMIZER_BYTES == 16.0
    assert host_optimizer_gb(12.0) == pytest.approx(16.0)  # 1 G parameters of state
