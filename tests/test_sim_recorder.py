"""The trace recorder's columns give back exactly the events recorded; the engine's prefill memo
is the cost model's number; simulated work grows linearly with the samples (counted in events,
not seconds)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from simplans import small_plan

from placer.cost.batching import StepTerms
from placer.cost.efficiency import Calibration
from placer.cost.generation import prefill_time
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from simulator.api import simulate_plan
from simulator.config import SimConfig
from simulator.engine import EngineSpec
from simulator.handplans import place
from simulator.recorder import Recorder


def _rec() -> Recorder:
    rec = Recorder()
    rec.add("onload", "transfer", 0.0, 1.0, "h100", "gen", role="rollout", step=0)
    rec.add_fields("decode", "decode", 1.0, 2.0, "h100", "gen/engine0", ("batch", "steps"), (4, 9))
    rec.add_fields("tool", "tool", 1.5, 0.5, "cpu", "env0", ("sample_ids",), ([3],))
    rec.add_fields("prefill", "prefill", 3.0, 1.0, "h100", "gen/engine1", ("tokens",), (64,))
    return rec


def test_rows_give_back_what_was_recorded():
    rec = _rec()
    assert len(rec) == 4
    assert rec.rows == [
        ("onload", "transfer", 0.0, 1.0, "h100", "gen", {"role": "rollout", "step": 0}),
        ("decode", "decode", 1.0, 2.0, "h100", "gen/engine0", (("batch", "steps"), (4, 9))),
        ("tool", "tool", 1.5, 0.5, "cpu", "env0", (("sample_ids",), ([3],))),
        ("prefill", "prefill", 3.0, 1.0, "h100", "gen/engine1", (("tokens",), (64,)))]
    events = rec.to_trace({"source": "simulate"}).events
    assert [e.args for e in events] == [{"role": "rollout", "step": 0}, {"batch": 4, "steps": 9},
                                        {"sample_ids": [3]}, {"tokens": 64}]


def test_cut_ends_only_that_engines_running_events():
    rec = _rec()
    rec.cut(1, "gen/engine0", 2.5)
    assert rec.dur == [1.0, 1.5, 0.5, 1.0]  # decode cut at 2.5; other threads untouched
    rec.cut(0, "gen/engine1", 2.5)
    assert rec.dur[3] == 0.0  # it had not begun: zero length, never negative


def test_shifted_moves_and_clips():
    rows = _rec().shifted(1.0, 2.0, 10.0)
    assert [(r[0], r[2], r[3]) for r in rows] == [("decode", 11.0, 1.0), ("tool", 11.5, 0.5)]


def test_prefill_memo_is_the_cost_models_number():
    plan = small_plan()
    res = plan.resolved()
    dev = res.device_of("h100")
    eff = Calibration().for_device(dev)
    rp = plan.roles["rollout"]
    spec = EngineSpec(res.arch_of("rollout"), dev, replace(rp.par, dp=1), eff, "h100", rp.slot)
    model = StepTerms(spec.model, dev, spec.par, eff)
    for tokens, ctx in [(256, 256.0), (64, 700.5), (256, 1024.0), (4096, 1234.25)]:
        assert model.prefill(tokens, ctx) == pytest.approx(
            prefill_time(spec.model, dev, spec.par, tokens, ctx, eff), rel=1e-12)
    assert len(model.prefills) == 3  # one line per token count, whatever the context


def _events_per_sample(samples: int) -> float:
    job = {"name": "scale", "algorithm": "grpo",
           "models": {"policy": "Qwen2.5-7B", "reward": "rule"},
           "batch": {"prompts": samples // 16, "samples_per_prompt": 16, "mini_batches": 2},
           "lengths": {"prompt": {"kind": "normal", "mean": 512, "std": 128, "min": 64,
                                  "cap": 2048},
                       "response": {"kind": "lognormal", "median": 512, "sigma": 0.8,
                                    "cap": 4096}},
           "environment": {"kind": "code", "turns": 3, "cpu_per_call": 1,
                           "tool_output_tokens": 128,
                           "tool_latency_s": {"kind": "lognormal", "median": 1.0, "sigma": 0.8,
                                              "cap": 60}},
           "pipeline": {"mode": "sync"},
           "cluster": {"pools": [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8,
                                  "nodes": 16},
                                 {"name": "cpu", "device": "cpu-node", "devices_per_node": 1,
                                  "nodes": 4}]}}
    placement = {"actor": ("h100", 64, "train"), "reference": ("h100", 64, "train"),
                 "rollout": ("h100", 64, "gen"), "reward": ("cpu", 2, "verify"),
                 "environment": ("cpu", 2, "env")}
    plan = place(resolve(job_from_dict(job)), placement, Calibration())
    r = simulate_plan(plan, iterations=1, seed=0, config=SimConfig())
    return r.metrics.events / samples


def test_work_grows_linearly_with_the_samples():
    """Events (each a fixed amount of simulator work) per sample stay flat from 1k to 4k."""
    small, large = _events_per_sample(1024), _events_per_sample(4096)
    assert large / small == pytest.approx(1.0, abs=0.25)
