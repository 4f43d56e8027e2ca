"""The trainer's micro-batch as a chosen, priced knob: activations against per-micro-batch
efficiency (`placer.cost.model.train_time`, `train_memory`), the planner's choice
(`placer.solve.candidates.micro_batches`), and the exports that carry it."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from placer import api
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.model import layer_comm, micro_tokens, train_memory, train_time, zero3_gathers
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.interop.miles import command_args as miles_args
from placer.interop.nemorl import export_nemo_rl
from placer.interop.openrlhf import command_args as openrlhf_args
from placer.interop.verl import overrides
from placer.solve.candidates import MICRO_BATCH_CHOICES, micro_batches, role_candidates
from placer.solve.planfile import Plan
from placer.spec.catalog import resolve
from placer.spec.load import load_job

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "grpo-qwen7b-h100.yaml"
SEQ = 2048.0  # mean tokens of a trained sequence


@pytest.fixture(scope="module")
def px() -> Pricer:
    return Pricer(resolve(load_job(EXAMPLE)), Calibration())


def _arch_dev(px: Pricer):
    res = px.res
    return res.arch_of("actor"), res.device_of(res.cluster.pools[0])


def test_a_larger_micro_batch_is_faster_without_pipeline_stages(px: Pricer) -> None:
    """Fewer, larger micro-batches: GEMMs on more tokens, fewer TP all-reduce calls and ZeRO-3
    gathers; so without pipeline stages the step's time falls as the micro-batch grows."""
    m, dev = _arch_dev(px)
    eff = Efficiency()
    tokens = 256 * SEQ
    times = [train_time(m, dev, Parallel(tp=2, dp=4, micro_batch=k), tokens, SEQ, 2, eff)
             for k in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True) and times[-1] < 0.95 * times[0]
    one, eight = Parallel(tp=2, dp=4, micro_batch=1), Parallel(tp=2, dp=4, micro_batch=8)
    rank = tokens / 4
    assert (layer_comm(m, dev, eight, rank, eff, micro_tokens(eight, SEQ))
            < layer_comm(m, dev, one, rank, eff, micro_tokens(one, SEQ)))
    assert (zero3_gathers(m, dev, eight, rank, 3, eff, micro_tokens(eight, SEQ))
            < zero3_gathers(m, dev, one, rank, 3, eff, micro_tokens(one, SEQ)))


def test_with_pipeline_stages_the_bubble_can_make_a_smaller_one_faster(px: Pricer) -> None:
    """1F1B's bubble is (pp - 1) stage times over the step's micro-batches: 8 pipeline stages
    with a step of 16 sequences a rank fill it better with micro-batches of 2 than of 8."""
    m, dev = _arch_dev(px)
    eff = Efficiency()
    par = Parallel(pp=8, dp=2)
    tokens = 64 * SEQ  # 2 steps of 16 sequences per dp rank
    t = {k: train_time(m, dev, replace(par, micro_batch=k), tokens, SEQ, 2, eff) for k in (2, 8)}
    assert t[2] < t[8]


def test_the_planner_takes_the_fastest_micro_batch_that_fits(px: Pricer) -> None:
    """Regression guard over the choice itself: each chosen layout is no slower than the same
    layout at any other micro-batch that fits."""
    pool = px.res.cluster.pools[0]
    for c in role_candidates(px, "actor", pool, prune=False)[:40]:
        for k in micro_batches(px.res, c.est.par):
            other = px.estimate("actor", pool, replace(c.est.par, micro_batch=k))
            assert not other.feasible or c.time_s <= other.time_s + 1e-9


def test_a_larger_micro_batch_holds_more_activations(px: Pricer) -> None:
    m, _ = _arch_dev(px)
    small = train_memory(m, Parallel(dp=8), 1 * 8192)
    big = train_memory(m, Parallel(dp=8), 8 * 8192)
    assert big.activations == pytest.approx(8 * small.activations)
    assert (big.weights, big.grads, big.optimizer) == (small.weights, small.grads, small.optimizer)


def test_memory_forces_a_smaller_micro_batch(px: Pricer) -> None:
    """Qwen2.5-7B on 2 H100s: the training state alone is ~61 GB a device, so 8 sequences of
    9K tokens do not fit beside it and the planner takes a smaller micro-batch; on 16 devices
    the state is small and the largest fits (and is the faster one)."""
    pool = px.res.cluster.pools[0]
    chosen = {c.devices: c.est.par for c in role_candidates(px, "actor", pool, prune=False)
              if c.est.par.tp == c.est.par.pp == 1 and not c.est.par.hsdp}
    assert chosen[16].micro_batch == 8
    assert 0 < chosen[2].micro_batch < 8
    too_big = px.estimate("actor", pool, replace(chosen[2], micro_batch=8))
    assert not too_big.feasible and "activations" in too_big.reason
    fits = px.estimate("actor", pool, chosen[2])
    smaller = px.estimate("actor", pool, replace(chosen[2], micro_batch=1))
    assert fits.feasible and fits.time_s <= smaller.time_s


def test_micro_batches_divide_a_ranks_share_of_a_mini_batch(px: Pricer) -> None:
    batch = px.res.job.batch
    for dp in (1, 3, 16, 64, 4096):
        share = batch.samples // batch.mini_batches // dp
        ks = micro_batches(px.res, Parallel(dp=dp))
        assert ks and all(k in MICRO_BATCH_CHOICES or k == 1 for k in ks)
        assert ks == [1] or all(share % k == 0 for k in ks)
        assert ks == sorted(ks, reverse=True)


def test_a_token_budget_layout_prices_as_before(px: Pricer) -> None:
    """Regression guard: a layout without a micro-batch (0, what imported runs and hand-built
    layouts carry) is priced with the `MICRO_TOKENS` budget, unchanged by the knob."""
    m, dev = _arch_dev(px)
    eff = Efficiency()
    par = Parallel(tp=2, pp=2, dp=2)
    assert micro_tokens(par, SEQ) == 16384
    assert train_time(m, dev, par, 256 * SEQ, SEQ, 2, eff) != train_time(
        m, dev, replace(par, micro_batch=2), 256 * SEQ, SEQ, 2, eff)


@pytest.fixture(scope="module")
def plan() -> Plan:
    return api.plan(EXAMPLE, time_limit=2.0, workers=1)


def test_the_plan_carries_its_micro_batch(plan: Plan) -> None:
    actor = plan.roles["actor"]
    assert actor.micro_batch in MICRO_BATCH_CHOICES
    assert actor.par.micro_batch == actor.micro_batch
    assert "micro_batch" not in plan.roles["rollout"].model_dump()  # written where chosen only
    from placer.solve.render import render_plan
    assert f"actor: micro-batch {actor.micro_batch}" in render_plan(plan)


def test_every_export_names_the_plans_micro_batch(plan: Plan) -> None:
    """verl's ppo_micro_batch_size_per_gpu (verl trainer/config/actor/actor.yaml), OpenRLHF's
    --train.micro_batch_size (openrlhf/cli/train_ppo_ray.py), NeMo-RL's
    policy.train_micro_batch_size (examples/configs/grpo_math_1B.yaml) and Miles' (Megatron's)
    --micro-batch-size carry the plan's own, not one derived from the context."""
    roles = dict(plan.roles)
    roles["actor"] = roles["actor"].model_copy(update={"micro_batch": 3, "shard": 0})
    p3 = plan.model_copy(update={"roles": roles})
    flat, _ = overrides(p3)
    assert flat["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 3
    assert flat["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == 3
    args, _ = openrlhf_args(p3)
    assert args[args.index("--train.micro_batch_size") + 1] == "3"
    (recipe,) = export_nemo_rl(p3).files.values()
    assert "train_micro_batch_size: 3" in recipe
    _, margs, _ = miles_args(p3)
    assert margs[margs.index("--micro-batch-size") + 1] == "3"
