"""Catalog names as people write them (`placer.spec.names`): the importers' matching of a
Hugging Face path to a catalog entry and a job file's suggestions for an unknown name."""
from __future__ import annotations

import pytest
from specdata import base

from placer.base.errors import SpecError
from placer.interop.importers import model_name
from placer.spec.catalog import shipped_devices, shipped_models
from placer.spec.load import job_from_dict
from placer.spec.names import (
    catalog_model,
    device_key,
    did_you_mean,
    read_model_name,
    suggest_device,
    suggest_model,
)

SOURCES = {name: m.source for name, m in shipped_models().items()}
DEVICES = list(shipped_devices())


def test_a_name_reads_as_base_releases_and_quantisation() -> None:
    assert read_model_name("Qwen/Qwen3-30B-A3B-Instruct-2507") == read_model_name(
        "qwen3-30b-a3b-instruct-2507")
    got = read_model_name("Qwen/Qwen3-30B-A3B-Thinking-2507-FP8")
    assert (got.base, got.releases, got.quantisation) == (
        "qwen3-30b-a3b", ("thinking", "2507"), ("fp8",))
    assert read_model_name("meta-llama/Llama-2-7b-hf").base == "llama-2-7b"
    assert read_model_name("Qwen2.5-7B-Instruct-GPTQ-Int4").quantisation == ("gptq", "int4")
    # sizes, versions and the first token are the name, not a variant
    assert read_model_name("Llama-3.1-8B").base == "llama-3.1-8b"
    assert read_model_name("Mistral-7B-Instruct-v0.3").base == "mistral-7b-instruct-v0.3"
    assert read_model_name("Base").base == "base"


@pytest.mark.parametrize("path, entry", [
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B"),             # matched before: instruct
    ("meta-llama/Meta-Llama-3-8B-Instruct", "Llama-3-8B"),  # by the repository's name
    ("/models/Qwen/Qwen2.5-7B", "Qwen2.5-7B"),              # a local copy
    ("meta-llama/Llama-2-7b-chat-hf", "Llama-2-7B"),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B"),  # a dated release
    ("deepseek-ai/DeepSeek-V3-0324", "DeepSeek-V3"),
    ("deepseek-ai/DeepSeek-V3-Base", "DeepSeek-V3"),
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", "Qwen3-Next-80B-A3B"),
])
def test_the_importers_match_release_variants(path: str, entry: str) -> None:
    assert catalog_model(SOURCES, path) == entry
    assert model_name(path, "--model") == entry


@pytest.mark.parametrize("path, near", [
    ("Qwen/Qwen3-8B-FP8", "'Qwen3-8B' with precision.rollout_weights: fp8"),  # other bytes
    ("Qwen/Qwen2.5-7B-Instruct-AWQ", "'Qwen2.5-7B'"),
    ("Qwen/Qwen2-7B-Instruct", "'Qwen2.5-7B'"),  # another model: refused, the closest shown
])
def test_the_importers_refuse_other_weights_and_suggest(path: str, near: str) -> None:
    assert catalog_model(SOURCES, path) is None
    with pytest.raises(SpecError, match="is not in the catalog") as e:
        model_name(path, "--model")
    assert f"(did you mean {near}" in str(e.value)


@pytest.mark.parametrize("name, want", [
    ("Qwen3-30B-A3B-Instruct-2507", ["Qwen3-30B-A3B"]),
    ("Qwen/Qwen3-30B-A3B-Thinking-2507-FP8", ["Qwen3-30B-A3B"]),
    ("qwen3-8b", ["Qwen3-8B"]),                     # case
    ("Meta-Llama-3-8B-Instruct", ["Llama-3-8B"]),   # the repository's spelling
    ("DeepSeek-R1-0528", ["DeepSeek-V3"]),          # close by spelling (and R1 is V3's shape)
    ("Qwen3-7B", ["Qwen3-8B", "Qwen3-4B", "Qwen3.5-27B"]),
    ("gpt-oss-120b", []),                           # nothing close: no suggestion
])
def test_model_suggestions(name: str, want: list[str]) -> None:
    assert suggest_model(name, SOURCES) == want


@pytest.mark.parametrize("name, want", [
    ("H100", ["H100-SXM"]), ("h20", ["H20"]), ("NVIDIA-H100-80GB-HBM3", ["H100-SXM"]),
    ("H100 PCIe", ["H100-SXM"]), ("A100", ["A100-80G"]), ("h200-141gb", ["H200"]),
    ("GB200", ["B200", "H200"]), ("cpu", ["cpu-node"]), ("groq", ["groq-lpu"]),
    ("TPU-v9", []), ("MI300X", []),
])
def test_device_suggestions(name: str, want: list[str]) -> None:
    assert suggest_device(name, DEVICES) == want


def test_device_keys_set_aside_vendor_form_factor_and_memory() -> None:
    assert {device_key(n) for n in ("H100-SXM", "h100", "NVIDIA H100 SXM5 80GB")} == {"h100"}
    assert device_key("A100-80G") == "a100" and device_key("cpu-node") == "cpunode"


def test_did_you_mean_text() -> None:
    assert did_you_mean([]) == ""
    assert did_you_mean(["A", "B"], " with x") == " (did you mean 'A' or 'B' with x?)"


def test_a_job_file_names_entries_exactly() -> None:
    """A job is an explicit spec: a variant's name is an error with the base entry suggested,
    never the base entry taken in its place."""
    data = base(models={"policy": "tiny-llama-Instruct-2507", "reward": "rule"})
    data["cluster"]["pools"][0]["device"] = "EMU-GPU"
    with pytest.raises(SpecError) as e:
        job_from_dict(data)
    lines = str(e.value).splitlines()
    assert len(lines) == 2, lines
    assert "cluster.pools.0.device: unknown device type 'EMU-GPU' (did you mean " \
           "'emu-gpu'?); known: " in lines[0]
    assert "models.policy: unknown model 'tiny-llama-Instruct-2507' (did you mean " \
           "'tiny-llama'?); known: " in lines[1]


def test_the_jobs_own_entries_are_suggested() -> None:
    mine = {"name": "my-gpu", "kind": "gpu", "memory_gb": 24, "bf16_tflops": 100,
            "mem_bw_gbs": 1000, "intra_link_gbs": 50, "nic_gbs": 10, "can_train": True}
    data = base(catalog={"devices": [mine]})
    data["cluster"]["pools"][0]["device"] = "My-GPU"
    with pytest.raises(SpecError, match=r"'My-GPU' \(did you mean 'my-gpu'\?\)"):
        job_from_dict(data)
