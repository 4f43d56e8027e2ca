"""A mixed rollout (`placer.cost.split.colocated`), executed: one part of the rollout
time-shares the actor's slot (its engines in the actor's placement-group bundle, asleep while
the trainer trains), the other runs on a pool of its own; every step's samples are dealt to the
parts as the plan gives them, and each part takes its weights by its own refresh path (the
colocated part apart from the other, whose engines form the weight-sync group).

The tiny GRPO job (tests/exec_util.py) on two emulated GPUs, two emulated LPU chips and the CPU
node: trainer and reference on GPU 0, the rollout's part 0 (1 engine, 20 of the 32 samples)
beside them in their bundle, part 1 (1 engine, 12 samples) on an LPU chip. The in-process tests
run without Ray; one embedded Ray run of two steps checks placement, shares and weights there.
"""
from __future__ import annotations

import pytest
import torch
from exec_util import GRPO_LAYOUT, VirtualRuntime, hand_plan, job_dict

from executors import placement as pl
from executors.context import LoopConfig
from executors.loop import Loop
from executors.precision import wire_dtype, wire_state
from executors.roles import run_config
from executors.run import prepare_model
from executors.runplan import resolve_plan
from executors.weights import by_path, path_key
from placer.cost.sharding import Parallel
from traces.schema import Trace

POOLS = [{"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": 1},
         {"name": "lpu", "device": "emu-lpu", "devices_per_node": 2, "nodes": 1},
         {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 1}]
LAYOUT = {**GRPO_LAYOUT, "actor": ("gpu", Parallel(dp=1), "train")}
PARTS = [("gpu", Parallel(dp=1), 20), ("lpu", Parallel(dp=1), 12)]  # 32 = 8 prompts x 4
STEPS = 2


ONE = Parallel(dp=1)


def mixed_plan(actor: Parallel = ONE, part0: Parallel = ONE):
    """The rollout split over gpu and lpu, its gpu part in the actor's slot `train`."""
    (pool, _, samples), other = PARTS
    return hand_plan({**LAYOUT, "actor": ("gpu", actor, "train")},
                     job_dict(cluster={"pools": POOLS}),
                     split=("train", [(pool, part0, samples), other]))


def bundles_of(run, role: str) -> list[int]:
    return [s.bundle.index for s in run.seats if s.role == role]


# ------------------------------------------------------------------ without Ray
@pytest.mark.parametrize(("actor", "part0", "engines"), [
    (Parallel(dp=1), Parallel(dp=1), [0, 1]),
    (Parallel(dp=2), Parallel(dp=1), [0, 1]),  # the slot's gpu bundle holds the actor's 2
    (Parallel(dp=2), Parallel(dp=2), [0, 0, 1])])
def test_the_colocated_part_sits_in_the_actors_bundles(actor, part0, engines) -> None:
    """The trainer's ranks sit on the slot's bundles on its pool only (never on the other
    part's), the colocated part's engines in those same bundles, the other part's on its pool;
    only the colocated part's engines sleep while the trainer trains."""
    plan = mixed_plan(actor, part0)
    run = resolve_plan(plan)
    slot = [b for b in plan.bundles if b.slot == "train"]
    assert [b.pool for b in slot] == ["gpu", "lpu"]
    gpu, lpu = slot[0].index, slot[1].index
    assert set(bundles_of(run, "actor")) == set(bundles_of(run, "reference")) == {gpu}
    assert bundles_of(run, "rollout") == [(gpu, lpu)[k] for k in engines]
    assert [s.part for s in run.seats if s.role == "rollout"] == engines
    groups = run.roles["rollout"].engines
    assert [(g.pool, g.replicas, g.colocated) for g in groups] == [
        ("gpu", part0.dp, True), ("lpu", 1, False)]
    sharers = {s.bundle.index: s.sharers for s in run.seats}
    assert sharers[gpu] == actor.dp + 1 + part0.dp and sharers[lpu] == 1
    assert run.slots["train"].strategy == "PACK"  # two pools: two machines


def test_each_part_refreshes_by_its_own_path() -> None:
    """The parts' engines are on devices of one bucket size here, yet each part is a refresh
    path of its own: the colocated part's never shares the other part's group."""
    run = resolve_plan(mixed_plan())
    members = pl.assign(run.seats)
    engines = [m for m in members if m.role == "rollout"]
    paths = by_path(run, engines)
    assert [(colocated, [m.rank for m in ms]) for (_, colocated), ms in paths.items()] == [
        (True, [0]), (False, [1])]
    assert len({size for size, _ in paths}) == 1  # one bucket size, two paths
    assert len({path_key(size, c) for size, c in paths}) == 2


def test_in_one_process_both_parts_generate_and_take_the_weights(tmp_path) -> None:
    """Every rank an in-process worker: a refresh gives both engines the trainer's weights
    exactly, the step's 32 samples go 20 / 12 to the parts, and only the colocated part's
    engine is woken for the refresh and put to sleep for the training phase."""
    plan = mixed_plan()
    run = resolve_plan(plan)
    cfg = run_config(run, model_dir=prepare_model(run.job, tmp_path))
    rt = VirtualRuntime(run, cfg, {})
    calls: list[tuple[str, int]] = []
    for m in (m for m in rt.members if m.role == "rollout"):
        for method in ("sleep_engine", "wake_engine"):
            setattr(m.handle, method, lambda m=m, method=method: calls.append((method, m.rank)))
    loop = Loop(run, rt, cfg, LoopConfig(steps=1, out_dir=tmp_path), Trace())
    loop.sync_weights(0)
    loop.collect_rollout(loop.launch_rollout(0))
    assert calls == [("wake_engine", 0), ("sleep_engine", 0)]
    got = {p: sum(len(e.args["sample_ids"]) for e in loop.trace.of("generate")
                  if e.args["part"] == p) for p in (0, 1)}
    assert got == {0: 20, 1: 12}
    # the trainer's weights as the refresh carries them (BF16 for a bf16 job, the engines' dtype)
    want = wire_state(next(m for m in rt.members if m.role == "actor").handle.weights(),
                      wire_dtype(cfg.precision))
    for m in (m for m in rt.members if m.role == "rollout"):
        [own] = m.handle.engine_shards()
        assert own.keys() == want.keys() and all(torch.equal(own[k], want[k].to(own[k].dtype))
                                                 for k in want)


# ------------------------------------------------------------------ on the embedded Ray
@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    """Two steps of the mixed plan on Ray, as `executors.run.execute` runs them, then one more
    refresh (the trainer's final version): the run, its placement rows, and per rollout rank
    whether its weights equal the trainer's after that refresh."""
    import ray  # lazy: Ray (~1 s) loads when a Ray test runs, not at collection

    from executors.backends import backend_of
    from executors.run import preflight
    from executors.world import World
    plan = mixed_plan()
    out = tmp_path_factory.mktemp("mixed")
    run = resolve_plan(plan)
    torch_engines = backend_of("torch")
    preflight(run, torch_engines, False, False)
    cfg = run_config(run, model_dir=prepare_model(run.job, out))
    if ray.is_initialized():
        ray.shutdown()
    world = World.ray(plan, run, cfg, torch_engines, None, 3, None)
    try:
        loop = Loop(run, world.rt, cfg, LoopConfig(steps=STEPS, out_dir=out), Trace())
        stats = loop.run()
        version = loop.sync_weights(STEPS)
        rt = world.rt
        [actor] = loop.by_role["actor"]
        want = wire_state(rt.results([rt.call(actor, "weights")])[0].value,
                          wire_dtype(cfg.precision))  # as the refresh carries them
        same = {}
        for m in loop.by_role["rollout"]:
            [own] = rt.results([rt.call(m, "engine_shards")])[0].value
            held = rt.results([rt.call(m, "current_version")])[0].value
            same[m.rank] = (held == version and own.keys() == want.keys()
                            and all(torch.equal(own[k], want[k].to(own[k].dtype)) for k in want))
        placement = world.close()
        yield plan, run, loop, stats, placement, same
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_a_mixed_plan_runs_two_steps_on_ray(ray_run) -> None:
    """Two steps with a balanced ledger; every actor in its planned bundle (the verifier,
    `placement.check`, passed before the first step), the colocated part's engine in the
    trainer's bundle, the executed layout the plan's parts; each part generates its share
    every step; each refresh reaches both parts, and after the last one every engine holds the
    trainer's weights exactly."""
    plan, run, loop, stats, placement, same = ray_run
    assert len(stats) == STEPS
    assert not loop.ledger.problems(STEPS), loop.ledger.problems(STEPS)
    assert all(r["in_bundle"] and r["on_plan_node"] for r in placement), placement
    where = {(r["role"], r["rank"]): r["bundle"] for r in placement}
    assert where[("rollout", 0)] == where[("actor", 0)] == where[("reference", 0)]
    pools = {(r["role"], r["rank"]): r["pool"] for r in placement}
    assert pools[("rollout", 0)] == "gpu" and pools[("rollout", 1)] == "lpu"
    gens = [e for e in loop.trace.events if e.cat == "generate"]
    for step in range(STEPS):
        got = {p: sum(len(e.args["sample_ids"]) for e in gens
                      if e.args["step"] == step and e.args["part"] == p) for p in (0, 1)}
        assert got == {0: 20, 1: 12}, (step, got)
    syncs = [e for e in loop.trace.events if e.name == "weight sync"]
    for step in range(STEPS):
        assert {(e.tid, e.args["part"]) for e in syncs if e.args["step"] == step} == {
            ("rollout0", 0), ("rollout1", 1)}
    assert same == {0: True, 1: True}
    assert loop.trace.metadata["executed_layout"]["rollout"] == {"parts": [
        {"pool": "gpu", "dp": 1, "tp": 1, "pp": 1}, {"pool": "lpu", "dp": 1, "tp": 1, "pp": 1}]}
