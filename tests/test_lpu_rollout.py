"""A multi-turn rollout on LPU replicas (variance off): the planner's estimate, the simulator's
engines and a hand computation agree. An LPU replica is `lpu_chips` chips (Llama-3-8B: 77), its
KV is the SRAM reserve beyond the weights (~12k tokens), a decode step costs lpu_step_s + chips *
lpu_hop_s + (batch - 1) * one chip's stage time whatever the context, and a prefill costs its
FLOPs at mfu_prefill plus one pass through the chips."""
from __future__ import annotations

import pytest
from simplans import small_job

from placer.base.roles import Role
from placer.cost import rollout_tail
from placer.cost.batching import step_terms
from placer.cost.efficiency import Calibration
from placer.cost.generation import lpu_chips
from placer.cost.pricer import Pricer
from placer.cost.rolloutcost import rollout_shape
from placer.cost.roofline import GB, decode_read_bytes
from placer.solve.assemble import reprice
from placer.solve.planfile import Plan
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from simulator.api import simulate_plan
from simulator.config import SimConfig
from simulator.handplans import Placement, place

PLACEMENT: Placement = {Role.ACTOR: ("h100", 8, "train"), Role.REFERENCE: ("h100", 8, "train"),
             Role.ROLLOUT: ("lpu", 154, "gen"), Role.REWARD: ("cpu", 1, "verify"),
             Role.ENVIRONMENT: ("cpu", 3, "env")}


def _plan(prompts: int, prompt: int, response: int) -> Plan:
    job = small_job(models={"policy": "Llama-3-8B", "reward": "rule"},
                    batch={"prompts": prompts, "samples_per_prompt": 4, "mini_batches": 2},
                    lengths={"prompt": {"kind": "fixed", "value": prompt},
                             "response": {"kind": "fixed", "value": response}})
    job["cluster"]["pools"].append({"name": "lpu", "device": "groq-lpu", "devices_per_node": 8,
                                    "nodes": 20})
    res = resolve(job_from_dict(job), "lpu-rollout")
    return place(res, PLACEMENT, Calibration())


def _both(plan: Plan) -> tuple[float, float]:
    """(planner's rollout stage at the job's means, the simulator's variance-off one)."""
    pred = reprice(plan, rollout_tail.at_means(plan.spec), Calibration()).stage_s["rollout"]
    run = simulate_plan(plan, iterations=1, seed=0, config=SimConfig.no_variance())
    return pred, run.metrics.stage_s.rollout


def test_lockstep_lpu_rollout_by_hand() -> None:
    """32 samples on two 77-chip replicas: one wave of 16 per replica (its 16 x 576 final tokens
    fit the KV), two turns of 128 tokens with a 1 s tool call between."""
    plan = _plan(8, 256, 128)
    res = resolve(plan.spec, "lpu-rollout")
    m, dev = res.arch_of(Role.ROLLOUT), res.device_of("lpu")
    eff = Calibration().for_device(dev)
    chips = lpu_chips(m, dev, eff)
    shape = rollout_shape(Pricer(res), dev, plan.roles[Role.ROLLOUT].par, eff)
    assert (chips, shape.replicas, shape.concurrency, shape.waves) == (77, 2, 16, 1)
    stage = max(decode_read_bytes(m, 1) / chips / (dev.mem_bw_gbs * GB * eff.decode_bw_eff),
                2 * m.matmul_params() / chips / (dev.bf16_tflops * 1e12 * eff.decode_flops_eff))
    step = eff.lpu_step_s + chips * eff.lpu_hop_s + 15 * stage  # batch 16

    def prefill(tokens: int) -> float:
        flops = 2 * m.matmul_params() * tokens
        return flops / (chips * dev.bf16_tflops * 1e12 * eff.mfu_prefill) + chips * eff.lpu_hop_s

    tool = 1.0 + eff.tool_overhead_s
    hand = prefill(16 * 256) + 128 * step + tool + prefill(16 * 64) + 128 * step
    pred, sim = _both(plan)
    assert sim == pytest.approx(pred, rel=1e-9)
    assert pred == pytest.approx(hand, rel=1e-9)


def test_preempting_lpu_rollout_agrees_exactly() -> None:
    """256 samples of 512 + 2 x 512 + 128 tokens on the same replicas: the first wave is admitted
    on its prompts' KV and preempted down to a steady seven sequences, 128 samples per replica
    (ppo-llama8b-hetero's shape at half its batch). The planner replays the engine exactly (a
    line through a few steady waves would be 12% high on the example)."""
    plan = _plan(64, 512, 512)
    res = resolve(plan.spec, "lpu-rollout")
    dev = res.device_of("lpu")
    par = plan.roles[Role.ROLLOUT].par
    eff = Calibration().for_device(dev)
    shape = rollout_shape(Pricer(res), dev, par, eff)
    kv = step_terms(res.arch_of(Role.ROLLOUT), dev, par, eff).kv
    assert not rollout_tail.fits_lockstep(res.job, kv, shape.concurrency)
    assert shape.per_replica > rollout_tail.REDUCE * shape.steady
    pred, sim = _both(plan)
    assert sim == pytest.approx(pred, rel=1e-9)


def test_many_waves_with_a_tail_match_the_exact_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """ppo-llama8b-hetero's lengths (variance on) on the same replicas: 256 samples per replica,
    a first wave of 23 preempted down to a steady 6. The line `makespan` extends must run through
    throughput-bound counts: through 12 and 24 samples the longest sample dominated both points
    and the extension came out 16% short of replaying all 256."""
    job = small_job(models={"policy": "Llama-3-8B", "reward": "rule"},
                    batch={"prompts": 128, "samples_per_prompt": 4, "mini_batches": 2},
                    lengths={"prompt": {"kind": "normal", "mean": 512, "std": 128, "min": 64,
                                        "cap": 2048},
                             "response": {"kind": "lognormal", "median": 512, "sigma": 0.6,
                                          "cap": 4096}})
    job["cluster"]["pools"].append({"name": "lpu", "device": "groq-lpu", "devices_per_node": 8,
                                    "nodes": 20})
    plan = place(resolve(job_from_dict(job), "lpu-rollout"), PLACEMENT, Calibration())
    res = resolve(plan.spec, "lpu-rollout")
    m, dev, par = res.arch_of(Role.ROLLOUT), res.device_of("lpu"), plan.roles[Role.ROLLOUT].par
    eff = Calibration().for_device(dev)
    shape = rollout_shape(Pricer(res), dev, par, eff)
    assert rollout_tail.has_variance(res.job) and shape.concurrency > 2 * shape.steady
    reps = rollout_tail.Replicas(shape.replicas, shape.per_replica, shape.steady, shape.generated,
                                 shape.kept)
    st = step_terms(m, dev, par, eff)
    assert shape.per_replica > rollout_tail.reduced_count(res.job, st, reps, eff.tool_overhead_s)
    reduced = rollout_tail.makespan(res.job, step_terms(m, dev, par, eff), eff, reps)
    monkeypatch.setattr(rollout_tail, "REDUCE", 10**6)  # every sample replayed
    exact = rollout_tail.makespan(res.job, step_terms(m, dev, par, eff), eff, reps)
    assert reduced == pytest.approx(exact, rel=0.10)
