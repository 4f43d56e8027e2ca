"""A job's own inference-engine settings (`engine`: vLLM's gpu_memory_utilization and
max_num_seqs), which replace the calibration's `kv_mem_fraction` and `max_num_seqs` for that job.

A run that sets vLLM's `gpu_memory_utilization` to 0.6 (NeMo-RL's default,
NVIDIA-NeMo/RL v0.6.0 @5fb58893 examples/configs/grpo_math_1B.yaml:298) gives its engines a
smaller KV pool than the cost model's 0.9: fewer sequences at once, a longer rollout.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "grpo-qwen7b-h100.yaml"
TP2 = Parallel(tp=2, dp=4)


def _job(engine: dict[str, Any] | None) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(JOB.read_text())
    if engine is not None:
        data["engine"] = engine
    return data


def _long(engine: dict[str, Any] | None) -> Pricer:
    """The job with 8,192-token prompts: its KV pool, not its batch, bounds what a replica
    admits at once."""
    data = _job(engine)
    data["lengths"]["prompt"] = {"kind": "fixed", "value": 8192}
    return Pricer(resolve(job_from_dict(data), str(JOB)), Calibration())


def _pricer(engine: dict[str, Any] | None) -> Pricer:
    return Pricer(resolve(job_from_dict(_job(engine)), str(JOB)), Calibration())


def _rollout(px: Pricer) -> tuple[float, float, int, float]:
    """(the engine's memory per device, its KV pool per device, sequences a replica admits at
    once, the rollout's seconds) of a TP 2 x DP 4 engine on the job's H100s."""
    est = px.estimate(str(Role.ROLLOUT), px.res.cluster.pool("h100"), TP2)
    assert est.feasible, est.reason
    return est.memory.total, est.memory.kv_cache, est.concurrency, est.stage_s["rollout"]


def test_memory_fraction_sets_the_engines_share_of_the_device_and_its_kv_pool() -> None:
    dev = _long(None).res.device_of("h100")
    total_09, kv_09, conc_09, time_09 = _rollout(_long(None))
    total_06, kv_06, conc_06, time_06 = _rollout(_long({"memory_fraction": 0.6}))
    assert Calibration().default.kv_mem_fraction == pytest.approx(0.9)  # the model's default
    assert total_09 == pytest.approx(dev.memory_gb * 0.9)
    assert total_06 == pytest.approx(dev.memory_gb * 0.6)
    # the weights and the engine's own memory stay: the KV pool loses the whole difference
    assert kv_09 - kv_06 == pytest.approx(dev.memory_gb * 0.3)
    assert conc_06 < conc_09
    assert time_06 > time_09


def test_max_num_seqs_caps_a_replicas_sequences() -> None:
    _, _, free, time_free = _rollout(_pricer(None))
    _, _, capped, time_capped = _rollout(_pricer({"max_num_seqs": 8}))
    assert free > 8 and capped == 8
    assert time_capped > time_free


def test_the_job_settings_win_over_the_calibration_and_the_plan_keeps_the_given_one() -> None:
    px = _pricer({"memory_fraction": 0.6, "max_num_seqs": 32})
    eff = px.eff("h100")
    assert (eff.kv_mem_fraction, eff.max_num_seqs) == (0.6, 32)
    assert px.given.default.kv_mem_fraction == pytest.approx(0.9)  # what a plan records


@pytest.mark.parametrize("engine, field", [
    ({"memory_fraction": 0}, "engine.memory_fraction"),
    ({"memory_fraction": 1.5}, "engine.memory_fraction"),
    ({"memory_fraction": "0.6"}, "engine.memory_fraction"),
    ({"memory_fraction": True}, "engine.memory_fraction"),
    ({"max_num_seqs": 0}, "engine.max_num_seqs"),
    ({"max_num_seqs": 2.5}, "engine.max_num_seqs"),
    ({"gpu_memory_utilization": 0.6}, "engine.gpu_memory_utilization"),
])
def test_a_bad_setting_is_one_error_naming_its_field(engine: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        job_from_dict(_job(engine))


def test_a_job_without_engine_settings_is_written_without_the_key() -> None:
    assert "engine" not in job_from_dict(_job(None)).model_dump(mode="json")
    written = job_from_dict(_job({"memory_fraction": 0.6})).model_dump(mode="json")
    assert written["engine"] == {"memory_fraction": 0.6, "max_num_seqs": None}
    assert job_from_dict(written).engine == job_from_dict(_job({"memory_fraction": 0.6})).engine
