"""Hardware and model catalogs: shipped figures, parameter counts, a job's own entries."""
from __future__ import annotations

import pytest

from placer.catalog import pools_of_kind, resolve, shipped_devices, shipped_models
from placer.spec import DeviceKind, SpecError, job_from_dict
from specdata import base

MODELS = shipped_models()
PUBLISHED = [m for m in MODELS.values() if m.params_b is not None]


def test_catalogs_hold_the_required_entries() -> None:
    for name in ("A100-80G", "H100-SXM", "H200", "H20", "B200", "L40S", "groq-lpu", "cpu-node"):
        assert name in shipped_devices()
    assert len(PUBLISHED) >= 8
    for name in ("Llama-2-7B", "Llama-2-13B", "Llama-2-70B", "Llama-3-8B", "Llama-3-70B",
                 "Qwen2.5-7B", "Qwen2.5-32B", "Qwen2.5-72B", "tiny-llama"):
        assert name in MODELS


def test_every_entry_cites_a_source() -> None:
    for entry in [*shipped_devices().values(), *MODELS.values()]:
        assert entry.source.strip(), entry.name


@pytest.mark.parametrize("model", PUBLISHED, ids=lambda m: m.name)
def test_parameter_count_matches_published_within_2_percent(model) -> None:
    assert model.params() / 1e9 == pytest.approx(model.params_b, rel=0.02)


def test_parameter_count_by_hand() -> None:
    # Llama-3-8B: embeddings 2*V*h, per layer q,o (h*h each) + k,v (h*1024 each) + 3*h*mlp
    # + 2 norms, one final norm.
    h, kv, mlp, V, L = 4096, 8 * 128, 14336, 128256, 32
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * mlp + 2 * h
    assert MODELS["Llama-3-8B"].params() == L * per_layer + 2 * V * h + h == 8_030_261_248


def test_lpu_is_inference_only_and_gpus_train() -> None:
    devs = shipped_devices()
    assert devs["groq-lpu"].kind is DeviceKind.lpu and not devs["groq-lpu"].can_train
    assert devs["groq-lpu"].memory_gb == pytest.approx(0.23)
    assert all(devs[n].can_train for n in ("A100-80G", "H100-SXM", "H200", "B200"))


MY_GPU = {"name": "my-gpu", "kind": "gpu", "memory_gb": 24, "bf16_tflops": 100,
          "mem_bw_gbs": 1000, "intra_link_gbs": 32, "nic_gbs": 12.5, "can_train": True}
MY_MODEL = {"name": "my-model", "layers": 4, "hidden": 128, "heads": 4, "kv_heads": 2,
            "mlp": 256, "vocab": 1000}


def test_job_catalog_adds_devices_and_models() -> None:
    data = base(catalog={"devices": [MY_GPU], "models": [MY_MODEL]},
                models={"policy": "my-model"})
    data["cluster"]["pools"][0]["device"] = "my-gpu"
    res = resolve(job_from_dict(data))
    assert res.device_of("gpu").memory_gb == 24
    assert res.model_of("actor").name == "my-model"
    assert "H100-SXM" in res.devices and "Llama-3-8B" in res.models  # shipped ones remain
    assert [p.name for p in pools_of_kind(res, DeviceKind.gpu)] == ["gpu"]


def test_job_catalog_overrides_a_shipped_entry_by_name() -> None:
    h100 = {**MY_GPU, "name": "H100-SXM", "memory_gb": 94}
    tiny = {**MY_MODEL, "name": "tiny-llama", "layers": 8}
    data = base(catalog={"devices": [h100], "models": [tiny]})
    data["cluster"]["pools"][0]["device"] = "H100-SXM"
    res = resolve(job_from_dict(data))
    assert res.device_of("gpu").memory_gb == 94
    assert res.model_of("rollout").layers == 8
    assert shipped_devices()["H100-SXM"].memory_gb == 80  # the shipped catalog is untouched
    assert shipped_models()["tiny-llama"].layers == 2


def test_unknown_names_are_reported_with_their_field() -> None:
    data = base()
    data["cluster"]["pools"][1]["device"] = "TPU-v9"
    with pytest.raises(SpecError, match=r"cluster\.pools\.1\.device: unknown device type 'TPU-v9'"):
        job_from_dict(data)
    with pytest.raises(SpecError, match=r"models\.reward: unknown model 'RM-9'"):
        job_from_dict(base(models={"policy": "tiny-llama", "reward": "RM-9"}))


def test_user_model_must_have_consistent_heads() -> None:
    bad = {**MY_MODEL, "kv_heads": 3}
    with pytest.raises(SpecError,
                       match=r"catalog\.models\.0: heads 4 is not divisible by kv_heads 3"):
        job_from_dict(base(catalog={"models": [bad]}))
