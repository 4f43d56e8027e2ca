"""Per-role estimates: each role's work priced by the cost model; infeasibility explained."""
from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
from specdata import ROOT, base

from placer.base.roles import Role
from placer.cost.batching import kv_budget
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.estimate import can_host, mean_context, pass_dispatch, reducing, trained_span
from placer.cost.layercomm import weight_gather_time
from placer.cost.model import score_time, train_memory, train_time
from placer.cost.pricer import Pricer
from placer.cost.rolloutcost import rollout_shape, wave_time
from placer.cost.roofline import (
    attention_flops_per_token,
    chunk_seq,
    kv_bytes_per_token,
    weight_tensors,
)
from placer.cost.sharding import Parallel
from placer.cost.tail_samples import at_means
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict, load_job

CAL = Calibration()
EFF = Efficiency()


@pytest.fixture(scope="module")
def hetero():
    """PPO on Llama-3-8B over H100 (train), L40S (gen), LPU and CPU pools: every role."""
    return resolve(load_job(ROOT / "examples" / "ppo-llama8b-hetero.yaml"))


STAGES = {"actor": {"score", "train"}, "critic": {"score", "train"}, "rollout": {"rollout"},
          "reference": {"score"}, "reward": {"score"}, "environment": {"rollout"}}
PLACES = {"actor": ("train", Parallel(dp=8)), "critic": ("train", Parallel(dp=8)),
          "rollout": ("gen", Parallel(dp=8)), "reference": ("lpu", Parallel(dp=80)),
          "reward": ("gen", Parallel(dp=4)), "environment": ("cpu", Parallel(dp=4))}


@pytest.mark.parametrize("role", list(STAGES))
def test_every_role_has_a_feasible_estimate(hetero, role: str) -> None:
    pool_name, par = PLACES[role]
    pool = hetero.cluster.pool(pool_name)
    assert can_host(hetero, role, pool)
    est = Pricer(hetero, CAL).estimate(role, pool, par)
    assert est.feasible, est.reason
    assert set(est.stage_s) == STAGES[role]
    assert est.time_s > 0 and all(v >= 0 for v in est.stage_s.values())
    assert est.memory.total <= hetero.device_of(pool).memory_gb
    assert est.devices == par.devices


def test_hosting_rules(hetero) -> None:
    pools = {p.name: p for p in hetero.cluster.pools}
    assert not can_host(hetero, "actor", pools["gen"])  # L40S: inference only here
    assert not can_host(hetero, "actor", pools["lpu"])
    assert can_host(hetero, "rollout", pools["lpu"])
    assert not can_host(hetero, "environment", pools["train"])
    rule = resolve(job_from_dict(base()))
    assert can_host(rule, "reward", rule.cluster.pool("cpu"))
    assert not can_host(rule, "reward", rule.cluster.pool("gpu"))  # a rule runs on CPU


def test_mean_context_counts_turns_and_tool_outputs(hetero) -> None:
    j = hetero.job
    expect = (j.lengths.prompt.mean_value() + 2 * j.lengths.response.mean_value() + 128)
    assert mean_context(hetero) == pytest.approx(expect)


def test_frozen_forward_is_the_cost_models_score_pass(hetero) -> None:
    pool, par = hetero.cluster.pool("train"), Parallel(tp=2, dp=4)
    est = Pricer(hetero, CAL).estimate("reference", pool, par)
    s = mean_context(hetero)
    m, dev = hetero.model_of("reference"), hetero.device_of(pool)
    assert est.stage_s["score"] == pytest.approx(  # + the driver's dispatch of the batch
        score_time(m, dev, par, hetero.job.batch.samples * s, s, EFF,
                   attn_seq=trained_span(hetero))
        + pass_dispatch(hetero, EFF))
    # the lengths vary, so the attention is priced at E[s^2] / E[s] (placer.cost.attnspan)
    assert trained_span(hetero) > s


def test_training_estimate_prices_forward_and_optimizer_steps(hetero) -> None:
    pool, par = hetero.cluster.pool("train"), Parallel(dp=16)
    est = Pricer(hetero, CAL).estimate("actor", pool, par)
    s, m, dev = mean_context(hetero), hetero.model_of("actor"), hetero.device_of(pool)
    n = hetero.job.batch.samples
    # the passes, the batch's dispatch, and the sharded weights gathered once for the sync
    gather = weight_gather_time(m, dev, par, weight_tensors(m), EFF)
    assert gather > 0
    assert est.stage_s["train"] == pytest.approx(
        train_time(m, dev, reducing(hetero, par), n * s, s, 4, EFF, attn_seq=trained_span(hetero))
        + pass_dispatch(hetero, EFF) + gather)
    assert est.memory == train_memory(m, par, hetero.job.max_context, EFF)


def test_rule_reward_and_environment_estimates() -> None:
    res = resolve(job_from_dict(base(environment={"kind": "tool", "turns": 3, "cpu_per_call": 1,
                                                  "tool_latency_s": {"kind": "fixed",
                                                                     "value": 0.5}})))
    cpu = res.cluster.pool("cpu")  # one laptop node, 2 cores; 8 samples
    reward = Pricer(res, CAL).estimate("reward", cpu, Parallel(dp=1))
    # an in-process check on 2 cores, after the answers ran in one sandbox (placer.cost.rulecheck)
    assert reward.stage_s["score"] == pytest.approx(math.ceil(8 / 2) * EFF.rule_reward_s
                                                    + EFF.sandbox_batch_s
                                                    + 8 * EFF.sandbox_sample_s)
    env = Pricer(res, CAL).estimate("environment", cpu, Parallel(dp=1))
    assert env.stage_s["rollout"] == pytest.approx((3 - 1) * math.ceil(8 / 2) * 0.5)


def test_rollout_waves_follow_kv_concurrency(hetero) -> None:
    """Lengths and latencies at their means: lockstep waves of mean sequences, each wave's
    sequences waiting out one tool latency between turns (queueing is `timing`'s pair term),
    when `max_num_seqs` caps a wave where its KV fits to the last token."""
    means = resolve(at_means(hetero.job))
    pool, par = means.cluster.pool("gen"), Parallel(dp=2)
    dev = means.device_of(pool)
    ctx = mean_context(means)  # a mean sample's final context, prompt to last token
    kv = kv_budget(means.arch_of("rollout"), dev, par, EFF)
    eff = replace(EFF, max_num_seqs=int(kv.tokens // ctx))
    assert 1 <= eff.max_num_seqs < 256
    shape = rollout_shape(Pricer(means), dev, par, eff)
    assert shape.replicas == 2 and shape.per_replica == 256
    assert shape.concurrency == eff.max_num_seqs
    assert shape.waves == math.ceil(256 / shape.concurrency)
    est = Pricer(means, Calibration(default=eff)).estimate("rollout", pool, par)
    full, rest = divmod(256, shape.concurrency)
    gen = full * wave_time(means, dev, par, eff, shape.concurrency, None)[0]
    if rest:
        gen += wave_time(means, dev, par, eff, rest, None)[0]
    env = means.job.environment
    gen += ((env.turns - 1) * shape.waves
            * (env.tool_latency_s.mean_value() + eff.tool_overhead_s))
    assert est.stage_s["rollout"] == pytest.approx(gen)
    assert est.concurrency == shape.concurrency


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]


def test_training_that_does_not_fit_names_the_numbers() -> None:
    res = resolve(job_from_dict(base(models={"policy": "Qwen2.5-72B"}, cluster={"pools": [
        {"name": "h100", "device": "H100-SXM", "devices_per_node": 8, "nodes": 1}]})))
    pool, par = res.cluster.pool("h100"), Parallel(dp=1)
    est = Pricer(res, CAL).estimate("actor", pool, par)
    assert not est.feasible
    need = train_memory(res.model_of("actor"), par, res.job.max_context, EFF).total
    assert f"needs {need:.1f} GB per device" in est.reason
    assert "H100-SXM has 80 GB" in est.reason
    assert "optimizer" in est.reason  # the breakdown says what takes the room


def test_lpu_short_of_chips_names_the_counts() -> None:
    res = resolve(job_from_dict(base(models={"policy": "Llama-2-70B"}, cluster={"pools": [
        {"name": "lpu", "device": "groq-lpu", "devices_per_node": 8, "nodes": 100}]})))
    est = Pricer(res, CAL).estimate("rollout", res.cluster.pool("lpu"), Parallel(dp=64))
    assert not est.feasible
    assert "needs 660 groq-lpu chips" in est.reason and "got 64" in est.reason


def test_context_beyond_the_kv_cache_names_both_sizes() -> None:
    long = {"prompt": {"kind": "fixed", "value": 1000},
            "response": {"kind": "fixed", "value": 299_000}}
    res = resolve(job_from_dict(base(models={"policy": "Llama-3-8B"}, lengths=long, cluster={
        "pools": [{"name": "gen", "device": "L40S", "devices_per_node": 8, "nodes": 1}]})))
    est = Pricer(res, CAL).estimate("rollout", res.cluster.pool("gen"), Parallel(dp=1))
    assert not est.feasible
    need = 300_000 * kv_bytes_per_token(res.model_of("rollout")) / 1e9
    assert f"one 300000-token sequence needs {need:.2f} GB of KV cache" in est.reason
    free = 48 * EFF.kv_mem_fraction - 16.06 - EFF.engine_mem_gb
    assert _numbers(est.reason.split("GB is left")[0])[-1] == pytest.approx(free, abs=0.01)
    # with tensor parallelism over 4 cards the same sequence fits
    assert Pricer(res, CAL).estimate("rollout", res.cluster.pool("gen"), Parallel(tp=4)).feasible


@pytest.mark.parametrize(("ctx", "new"), [(0, 7), (5, 3), (100, 1), (64, 64)])
def test_a_prefill_chunk_prices_every_key_its_tokens_see(hetero, ctx: int, new: int) -> None:
    # Independent count: new token i (0-based) of a chunk after `ctx` cached tokens attends to
    # ctx + i + 1 keys, 4 * L * w FLOPs per key (QK^T and AV, 2 FLOPs a multiply-add). The
    # closed form `attention_flops_per_token` at `chunk_seq` must match the sum (up to the
    # diagonal's half key per token, which the causal mean seq / 2 leaves out).
    m = hetero.arch_of(Role.ROLLOUT)
    per_key = 4 * m.full_attention_layers * m.attention_width()
    counted = sum(per_key * (ctx + i + 0.5) for i in range(new))
    priced = (attention_flops_per_token(m, chunk_seq(ctx + new, new))
              - attention_flops_per_token(m, 0.0)) * new
    assert priced == pytest.approx(counted, rel=1e-12)
