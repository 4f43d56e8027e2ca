"""Property tests: random and mutated specs reach the loader; only SpecError or success comes out.

Mutations start from every example (as parsed YAML) and delete, rename, retype or replace keys and
values anywhere in the tree. Runs are derandomized (a fixed seed) and bounded, so the test is
repeatable and takes seconds.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specdata import EXAMPLES, base

from placer.base.errors import SpecError
from placer.base.inputs import SpecErrors
from placer.commands.validate import describe
from placer.cost.efficiency import Calibration
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.load import job_from_dict, read_structured

# A job with its own catalog entries, so that mutations reach device and model figures too.
WITH_CATALOG = base(
    models={"policy": "m", "reward": "rule"},
    catalog={"devices": [{"name": "g", "kind": "gpu", "memory_gb": 24, "bf16_tflops": 100,
                          "mem_bw_gbs": 1000, "intra_link_gbs": 32, "nic_gbs": 12.5,
                          "can_train": True},
                         {"name": "l", "kind": "lpu", "memory_gb": 0.23, "bf16_tflops": 188,
                          "mem_bw_gbs": 80000, "intra_link_gbs": 40, "nic_gbs": 12.5}],
             "models": [{"name": "m", "layers": 4, "hidden": 128, "heads": 4, "kv_heads": 2,
                         "mlp": 256, "vocab": 1000}]},
    cluster={"pools": [{"name": "g", "device": "g", "devices_per_node": 4, "nodes": 2},
                       {"name": "l", "device": "l", "devices_per_node": 8, "nodes": 1},
                       {"name": "c", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}]})
RAW = [yaml.safe_load(p.read_text()) for p in EXAMPLES] + [base(), WITH_CATALOG]
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

NAMES = sorted(shipped_devices()) + sorted(shipped_models()) + [
    "grpo", "ppo", "rloo", "rule", "sync", "async", "fixed", "normal", "lognormal", "empirical",
    "tool", "code", "none", "gpu", "cpu", "lpu", "time", "cost"]
KEYS = ["name", "algorithm", "models", "batch", "lengths", "environment", "pipeline", "cluster",
        "catalog", "pools", "prompts", "samples_per_prompt", "mini_batches", "kind", "value",
        "mean", "std", "median", "sigma", "cap", "min", "path", "field", "turns", "device",
        "nodes", "devices_per_node", "nvlink_domain", "policy", "reward", "critic", "reference"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-3, max_value=70),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=0, max_value=1e6),
    st.text(max_size=12), st.sampled_from(NAMES), st.sampled_from(KEYS))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=4)),
    max_leaves=12)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path (dict keys and list indices) in a parsed document."""
    out = [prefix]
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else []
    for k, v in items:
        out += _paths(v, prefix + (k,))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for k in path[:-1]:
        doc = doc[k]
    return doc


@st.composite
def mutated(draw) -> dict:
    doc = copy.deepcopy(draw(st.sampled_from(RAW)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(doc, path), path[-1]
        op = draw(st.sampled_from(["replace", "delete", "rename", "wrap", "add", "swap"]))
        if op == "replace":
            parent[key] = draw(values)
        elif op == "delete":
            del parent[key]
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(st.sampled_from(KEYS)) + draw(st.sampled_from(["", "s", "_"]))] = \
                parent.pop(key)
        elif op == "wrap":
            parent[key] = [parent[key]]
        elif op == "add" and isinstance(parent[key], dict):
            parent[key][draw(st.sampled_from(KEYS))] = draw(values)
        elif op == "swap":
            other = draw(st.sampled_from(paths))
            parent[key] = copy.deepcopy(_parent(doc, other)[other[-1]]) if other[:-1] != path \
                else parent[key]
    return doc


def _load(data: Any):
    """The loader's contract: a Job, or SpecError with one non-empty line per mistake (a
    `SpecErrors` holds several); nothing else."""
    try:
        return job_from_dict(data, "h.yaml")
    except SpecError as e:
        for msg in e.lines if isinstance(e, SpecErrors) else [str(e)]:
            assert msg.startswith("h.yaml: ") and "\n" not in msg and len(msg) > len("h.yaml: ")
        return None


@SETTINGS
@given(mutated())
def test_mutated_examples_load_or_fail_cleanly(doc: dict) -> None:
    job = _load(doc)
    if job is not None:  # what loads is usable: validate's description never crashes
        describe(resolve(job), Calibration())


@SETTINGS
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=8))
def test_random_mappings_fail_cleanly(doc: dict) -> None:
    _load(doc)


@SETTINGS
@given(values)
def test_random_values_fail_cleanly(doc: Any) -> None:
    _load(doc)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(st.text(max_size=200), st.sampled_from([".yaml", ".json"]))
def test_random_text_files_fail_cleanly(tmp_path_factory, text: str, suffix: str) -> None:
    path: Path = tmp_path_factory.mktemp("h") / f"job{suffix}"
    path.write_text(text)
    try:
        _load(read_structured(path))
    except SpecError as e:
        assert "\n" not in str(e)


def test_a_key_holding_a_newline_stays_on_its_line() -> None:
    """The case the mutation search found (agentic-code with `models: {"\\n": null}`): the
    unknown key's name is escaped in the loader's own lines, not only by the CLI."""
    doc = copy.deepcopy(RAW[0])
    doc["models"] = {"\n": None}
    assert _load(doc) is None
    try:
        job_from_dict(doc, "h.yaml")
    except SpecErrors as e:
        assert any(line.startswith("h.yaml: models.\\n: unknown key") for line in e.lines), e.lines
