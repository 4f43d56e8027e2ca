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
