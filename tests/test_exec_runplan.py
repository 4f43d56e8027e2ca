"""The run plan (`executors.runplan`): a plan resolved once into what the executor's parts read.

Built from the golden plans (traces/golden/*.plan.json) and from examples planned now: every
role is there with the plan's layout, parts and memory share, every slot with the plan's
bundles in order, every actor seated in its role's slot (split roles part by part), the pools
and nodes the cluster advertises. The errors a plan's structure can hold exit 2 with the field.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from exec_util import GRPO_LAYOUT, hand_plan
from simplans import example_plan

from executors.runplan import Layout, RunPlan, actor_counts, resolve_plan
from placer.base.errors import SpecError
from placer.cost.calibration import calibration_from_dict
from placer.solve.planfile import Plan, load_plan
from placer.spec.agents import split_role

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = sorted((ROOT / "traces" / "golden").glob("*.plan.json"))
PLANNED = ["tiny-cpu", "tiny-agent", "hetero-split", "ppo-llama8b-hetero"]


def _cases() -> list[tuple[str, Plan]]:
    return ([(p.name.removesuffix(".plan.json"), load_plan(p)) for p in GOLDEN]
            + [(f"planned-{n}", example_plan(n)) for n in PLANNED])


def _dp_attention(plan: Plan) -> bool:
    return any(r.attn_dp > 1 or any(p.attn_dp > 1 for p in r.parts) for r in plan.roles.values())


# The plans the executor runs; one with data-parallel attention engines is refused (below)
ALL_CASES = dict(_cases())
CASES = {name: plan for name, plan in ALL_CASES.items() if not _dp_attention(plan)}


def test_the_cases_hold_a_split_rollout_hsdp_a_critic_and_environments() -> None:
    """The checks below must meet each kind of role and layout at least once."""
    roles = [r for p in CASES.values() for r in p.roles.values()]
    assert any(r.parts for r in roles) and any(0 < r.shard < r.dp for r in roles)
    assert any("critic" in p.roles for p in CASES.values())
    assert any("environment" in p.roles for p in CASES.values())
    assert len(GOLDEN) >= 10


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_role_with_the_plans_layout(name: str) -> None:
    plan = CASES[name]
    run = resolve_plan(plan, agents=True)
    assert set(run.roles) == set(plan.roles)
    res = plan.resolved()
    for role, r in plan.roles.items():
        got = run.roles[role]
        assert (got.slot, got.pool, got.devices) == (r.slot, r.pool, r.devices)
        shard = r.shard if 0 < r.shard < r.dp else 0
        # the trainer's expert parallelism is part of its layout (`executors.experts`)
        ep = r.ep if role == "actor" else 1
        assert got.layout == Layout(r.dp, r.tp, r.pp, shard, recompute=r.recompute, ep=ep)
        assert (got.cp, got.ep, got.etp, got.zero, got.offload) == (r.cp, r.ep, r.etp, r.zero,
                                                                   r.offload)
        assert (got.precision.fp8_weights, got.precision.fp8_kv, got.precision.fp8_train) == (
            r.fp8_weights, r.fp8_kv, r.fp8_train)
        assert got.mem_fraction == pytest.approx(r.memory_gb / res.device_of(r.pool).memory_gb)
        assert [(p.pool, p.devices, p.layout.as_dict(), p.share, p.samples) for p in got.parts] \
            == [(p.pool, p.devices, {"dp": p.dp, "tp": p.tp, "pp": p.pp}, p.share, p.samples)
                for p in r.parts]


@pytest.mark.parametrize("name", sorted(CASES))
def test_slots_hold_the_plans_bundles_in_order(name: str) -> None:
    plan = CASES[name]
    run = resolve_plan(plan, agents=True)
    want: dict[str, list[int]] = {}
    for b in sorted(plan.bundles, key=lambda b: b.index):
        want.setdefault(b.slot, []).append(b.index)
    assert {s: [b.index for b in slot.bundles] for s, slot in run.slots.items()} == want
    for s in plan.slots:
        if s.name in run.slots:
            assert set(run.slots[s.name].roles) == set(s.roles)
    assert set(run.nodes) == {(b.pool, b.node) for b in plan.bundles}
    res = plan.resolved()
    assert list(run.pools) == [p.name for p in res.cluster.pools]
    for p in res.cluster.pools:
        got = run.pools[p.name]
        assert (got.devices_per_node, got.nodes, got.kind) == (p.devices_per_node, p.nodes,
                                                                res.device_of(p).kind.value)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_actor_is_seated_in_its_roles_slot(name: str) -> None:
    plan = CASES[name]
    run = resolve_plan(plan, agents=True)
    counts = actor_counts(plan)
    assert Counter(s.role for s in run.seats) == Counter(counts)
    for role, n in counts.items():
        ranks = [s.rank for s in run.seats if s.role == role]
        assert ranks == list(range(n)) and run.roles[role].actors == n
    per_bundle = Counter(s.bundle.index for s in run.seats)
    for s in run.seats:
        slot = run.slots[s.slot]
        assert s.slot == run.roles[s.role].slot and slot.bundles[s.bundle_pos] == s.bundle
        assert s.sharers == per_bundle[s.bundle.index]
        parts = run.roles[s.role].parts
        if parts:  # a split role: each engine on its own part's pool and bundles
            assert s.part is not None and s.bundle.pool == parts[s.part].pool
            assert s.bundle_pos in parts[s.part].bundles
    for role in run.roles.values():
        if role.parts:  # the parts take the slot's bundles between them, in order
            positions = [p for part in role.parts for p in part.bundles]
            assert positions == list(range(len(run.slots[role.slot].bundles)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_rollout_engine_groups_cover_its_ranks(name: str) -> None:
    run = resolve_plan(CASES[name], agents=True)
    names = [n for n in run.roles if split_role(n)[1] == "rollout"]  # each agent's, if several
    assert names
    for name in names:
        rollout = run.roles[name]
        groups = rollout.engines
        assert [g.first for g in groups] == [sum(g.replicas for g in groups[:i])
                                             for i in range(len(groups))]
        assert sum(g.replicas for g in groups) == rollout.actors
        want = [(p.pool, p.layout.tp, p.mem_fraction) for p in rollout.parts] or [
            (rollout.pool, rollout.layout.tp, rollout.mem_fraction)]
        assert [(g.pool, g.tp, g.mem_fraction) for g in groups] == want
        for s in (s for s in run.seats if s.role == name):
            assert rollout.group_of(s.rank).pool == s.bundle.pool


def test_job_facts_are_the_jobs() -> None:
    plan = CASES["planned-tiny-agent"]
    run, job, res = resolve_plan(plan), plan.spec, plan.resolved()
    f = run.job
    assert (f.name, f.algorithm, f.seed, f.mode) == (job.name, job.algorithm.value, job.seed,
                                                     job.pipeline.mode)
    assert (f.samples, f.mini_batches, f.turns, f.tool_output_tokens) == (
        job.batch.samples, job.batch.mini_batches, job.environment.turns,
        job.environment.tool_output_tokens)
    assert f.max_new_tokens == job.lengths.response.max_value() and f.turns == 2
    assert f.max_context == job.max_context and f.tail_policy == job.tail_policy
    assert f.policy == res.model_of("actor") and f.reward is None
    assert run.predicted_iteration_s == plan.predicted_iteration_s > 0


def test_sync_buckets_are_each_pools_calibrated_ones() -> None:
    plan = hand_plan(GRPO_LAYOUT).model_copy(update={"calibration": calibration_from_dict({
        "default": {"sync_bucket_gb": 1e-5}, "devices": {"emu-lpu": {"sync_bucket_gb": 0.0}}})})
    run: RunPlan = resolve_plan(plan)
    assert {n: p.sync_bucket_bytes for n, p in run.pools.items()} == {
        "gpu": 10_000, "lpu": 0, "cpu": 10_000}  # 0: a call per tensor
    assert run.pools["gpu"].node_devices == {"GPU": 2.0}  # a whole node: 2 devices


def test_a_slot_without_bundles_exits_2() -> None:
    plan = hand_plan(GRPO_LAYOUT)
    bad = plan.model_copy(update={"bundles": [b for b in plan.bundles if b.slot != "gen"]})
    with pytest.raises(SpecError, match=r"^plan: slot gen of role rollout has no bundles"):
        resolve_plan(bad)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_rank_holds_a_trainer_device_or_an_engine_replica(name: str) -> None:
    """Device-seconds are rank-seconds times `devices_per_rank`: one device per trainer
    process, an engine replica's TP x PP group per rollout rank (read from the plan's fields)."""
    plan = CASES[name]
    run = resolve_plan(plan, agents=True)
    agents = sorted({split_role(n)[0] or "" for n in plan.roles})  # [""]: one policy
    for a in agents:
        actor_name, rollout_name = (f"{a}.actor", f"{a}.rollout") if a else ("actor", "rollout")
        actor, rollout = plan.roles[actor_name], plan.roles[rollout_name]
        assert run.devices_per_rank(actor_name) == actor.cp
        if not rollout.parts:
            assert run.devices_per_rank(rollout_name) == rollout.tp * rollout.pp
    assert run.devices_per_rank("a role the plan does not place") == 1.0


def test_execute_refuses_data_parallel_attention_it_does_not_launch() -> None:
    """An engine planned with data-parallel attention would start as plain TP here (another
    price than the plan's): exit 2 naming the field, before anything starts."""
    refused = [name for name, plan in ALL_CASES.items() if _dp_attention(plan)]
    assert refused == ["grpo-qwen3-30b-a3b"]  # its 4-node H20 pool's engines
    with pytest.raises(SpecError, match=r"^plan\.roles\.rollout\.attn_dp: "):
        resolve_plan(ALL_CASES["grpo-qwen3-30b-a3b"])
    plan = CASES[sorted(CASES)[0]]
    rollout = plan.roles["rollout"]
    dp_attn = plan.model_copy(update={"roles": {
        **plan.roles, "rollout": rollout.model_copy(update={"attn_dp": 2})}})
    with pytest.raises(SpecError, match=r"^plan\.roles\.rollout\.attn_dp: 2: placer execute"):
        resolve_plan(dp_attn)
