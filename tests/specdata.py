"""Shared test data for the spec tests: a small valid job as a plain dict."""
from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def base(**changes: Any) -> dict[str, Any]:
    """A small valid GRPO job (tiny model, emulated GPU pool, CPU pool); `changes` replace
    top-level sections."""
    job: dict[str, Any] = {
        "name": "t", "algorithm": "grpo",
        "models": {"policy": "tiny-llama", "reward": "rule"},
        "batch": {"prompts": 4, "samples_per_prompt": 2},
        "lengths": {"prompt": {"kind": "fixed", "value": 10},
                    "response": {"kind": "fixed", "value": 6}},
        "cluster": {"pools": [{"name": "gpu", "device": "emu-gpu", "devices_per_node": 2,
                               "nodes": 1},
                              {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1,
                               "nodes": 1}]},
    }
    job.update(changes)
    return job


def h100_job(name: str, framework: str | None = None, algorithm: str = "grpo",
             policy: str = "Qwen2.5-7B", tokens: int = 128, **models: Any) -> dict[str, Any]:
    """A small job on one 8x H100 node (pool "h") and a CPU node (pool "cpu"): 8 prompts of 4
    samples, `tokens` fixed prompt and response tokens; `models` adds to the models section
    (`use_reference`, ...); no `framework` key unless one is given (the default target)."""
    job: dict[str, Any] = {
        "name": name, "algorithm": algorithm,
        "models": {"policy": policy, "reward": "rule", **models},
        "batch": {"prompts": 8, "samples_per_prompt": 4},
        "lengths": {"prompt": {"kind": "fixed", "value": tokens},
                    "response": {"kind": "fixed", "value": tokens}},
        "cluster": {"pools": [{"name": "h", "device": "H100-SXM", "devices_per_node": 8,
                               "nodes": 1},
                              {"name": "cpu", "device": "cpu-node", "devices_per_node": 1,
                               "nodes": 1}]},
    }
    if framework is not None:
        job["framework"] = framework
    return job


def vlm_job(prompt: float, images: int, framework: str | None = None) -> dict[str, Any]:
    """A small Qwen2.5-VL-7B GRPO job on one 8x H100 node: `prompt` fixed prompt tokens (images
    apart), `images` per prompt, 300 response tokens; no `framework` key unless one is given."""
    job: dict[str, Any] = {
        "name": "v", "algorithm": "grpo",
        "models": {"policy": "Qwen2.5-VL-7B", "reward": "rule"},
        "batch": {"prompts": 16, "samples_per_prompt": 4, "mini_batches": 2},
        "lengths": {"prompt": {"kind": "fixed", "value": prompt},
                    "response": {"kind": "fixed", "value": 300},
                    "images_per_prompt": images},
        "cluster": {"pools": [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8,
                               "nodes": 1},
                              {"name": "cpu", "device": "cpu-node", "devices_per_node": 1,
                               "nodes": 1}]}}
    if framework is not None:
        job["framework"] = framework
    return job
