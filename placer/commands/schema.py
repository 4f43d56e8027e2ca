"""`placer schema [--json | --markdown] [-o FILE]`: the job format, from the models that check it.

The job file is validated by the pydantic models of `placer/spec/job.py` (the job) and the modules its
sections live in (`placer/spec/sections.py`, `placer/spec/arch.py`, `placer/spec/hardware.py`,
`placer/spec/base.py`); their JSON Schema (draft 2020-12, as pydantic writes it) is the
machine-readable format: editors and CI validate a job against it (`placer schema --json >
job.schema.json`). `--markdown` renders the same schema as the
reference in docs/job-format.md: one table per section with each field's type (and bounds),
default, unit, meaning and an example. That file is generated, never edited by hand
(`placer schema --markdown -o docs/job-format.md`); tests/test_schema.py fails when it is stale.

Units are not in the schema (a number is a number to JSON Schema), so they come from the
project's naming convention (`_gb` GB, `_gbs` GB/s, `_s` seconds, `_us` microseconds, ...) and the
few explicit entries of `UNITS`. Examples come from `EXAMPLES`, one or more instances per section
that tests/test_schema.py validates against the models, so every example shown is valid input.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from placer.base.fileio import atomic_write_text
from placer.base.inputs import check_output
from placer.cli import emit_json
from placer.spec.job import Job

# (section, field) -> unit, where the field's name does not say it.
UNITS: dict[tuple[str, str], str] = {
    ("Job", "seed"): "-", ("Batch", "prompts"): "prompts per step",
    ("Batch", "samples_per_prompt"): "samples", ("Batch", "mini_batches"): "optimizer steps",
    ("Environment", "turns"): "turns per sample", ("Environment", "cpu_per_call"): "CPU cores",
    ("Pipeline", "max_staleness"): "policy versions", ("TailPolicy", "fraction"): "of the batch",
    ("TailPolicy", "token_budget"): "tokens per sample and step",
    ("MicroTokenBudget", "forward"): "tokens per device per micro-batch",
    ("MicroTokenBudget", "update"): "tokens per device per micro-batch",
    ("EngineSettings", "memory_fraction"): "share of device memory",
    ("Validation", "every"): "RL steps", ("Validation", "samples"): "sequences per validation",
    ("EngineSettings", "max_num_seqs"): "sequences per engine replica",
    ("Pool", "devices_per_node"): "devices (CPU pool: devices of `cores` cores)",
    ("Pool", "cores_per_node"): "CPU cores", ("Pool", "nodes"): "nodes",
    ("Pool", "nvlink_domain"): "devices", ("Pool", "nodes_per_rack"): "nodes",
    ("DeviceType", "bf16_tflops"): "TFLOP/s", ("DeviceType", "price_per_hour"): "USD/device-hour",
    ("DeviceType", "fp8_tflops"): "TFLOP/s", ("DeviceType", "matmul_tflops"): "TFLOP/s",
    ("DeviceType", "cores"): "CPU cores", ("DeviceType", "sm_count"): "SMs",
    ("DeviceType", "scaleup_devices"): "devices", ("DeviceType", "host_devices"): "devices",
    ("CurrentRole", "devices"): "devices",
    ("ModelArch", "params_b"): "billions of parameters", ("CodeReward", "memory_mb"): "MiB",
    ("Distribution", "value"): "of the field: tokens (lengths; response per turn) or s (latency)",
}
for _f in ("mean", "std", "median", "min", "cap"):
    UNITS[("Distribution", _f)] = UNITS[("Distribution", "value")]
ENUMS = ("Algorithm", "DeviceKind", "Network")  # referred to like sections, but a list of values
SUFFIX_UNITS = (("_gbs", "GB/s"), ("_gb", "GB"), ("_us", "µs"), ("_s", "s"), ("_tokens", "tokens"))

# (section, field) -> meaning, for fields whose model gives no description.
MEANINGS: dict[tuple[str, str], str] = {
    ("Job", "name"): "the job's name (plans, traces and reports carry it)",
    ("Job", "algorithm"): "the RL algorithm; it decides the roles (PPO adds a critic)",
    ("Job", "models"): "the models each role runs", ("Job", "batch"): "samples per step",
    ("Job", "lengths"): "prompt and response length distributions",
    ("Job", "environment"): "multi-turn tool use (none: single-turn)",
    ("Job", "pipeline"): "synchronous steps or asynchronous with bounded staleness",
    ("Job", "objective"): "what the planner minimises: step time or cost per sample",
    ("Job", "tail_policy"): "how a step stops waiting for its slowest samples",
    ("Job", "weight_sync"): "how the trainer's weights reach the rollout engines (the refit)",
    ("WeightSync", "transport"): "broadcast, nixl, nccl-p2p or nccl-reshard (section text)",
    ("Job", "cluster"): "the pools of nodes (or a file name holding this section)",
    ("Job", "catalog"): "device types and models added to (or overriding) the shipped catalogs",
    ("Job", "seed"): "seeds every random draw (lengths, latencies, simulation, execution)",
    ("Models", "policy"): "the trained model (catalog name, or `{path: DIR}`: a local "
                          "checkpoint folder); rollout engines serve it",
    ("Models", "use_reference"): "run a frozen reference model for the KL term",
    ("Batch", "prompts"): "prompts per step", ("Batch", "samples_per_prompt"):
        "responses generated per prompt (GRPO and RLOO compare them: >= 2)",
    ("Distribution", "kind"): "fixed, normal, lognormal or empirical (replayed from a trace)",
    ("Distribution", "value"): "fixed: the value", ("Distribution", "mean"): "normal: the mean",
    ("Distribution", "std"): "normal: the standard deviation",
    ("Distribution", "median"): "lognormal: the median",
    ("Distribution", "sigma"): "lognormal: the shape (log-space standard deviation)",
    ("Distribution", "min"): "every draw is at least this", ("Distribution", "cap"):
        "every draw is at most this (the longest response the engines allow)",
    ("Distribution", "path"): "empirical: JSONL workload trace (relative to the job file)",
    ("Distribution", "field"): "empirical: the trace's field to replay (e.g. response_tokens)",
    ("Environment", "kind"): "none, tool (a tool call between turns) or code (the sandbox runs "
                             "the model's code)",
    ("Environment", "turns"): "generation turns per sample; a tool call runs between two turns",
    ("Environment", "tool_latency_s"): "one tool call's latency", ("Environment", "cpu_per_call"):
        "CPU cores one tool call holds",
    ("Environment", "tool_output_tokens"): "tokens a tool call adds to the context",
    ("Pipeline", "mode"): "sync: generate then train; async: generation runs ahead",
    ("Pipeline", "max_staleness"): "async: how many versions behind the rollout policy may be",
    ("TailPolicy", "kind"): "none, overprovision, partial or reissue (section text)",
    ("TailPolicy", "fraction"): "overprovision: extra samples generated, as a share of the batch",
    ("TailPolicy", "token_budget"): "partial: response tokens a sample may generate in one step",
    ("TailPolicy", "deadline_s"): "reissue: a tool call running longer is issued again",
    ("Cluster", "pools"): "the pools of identical nodes", ("Cluster", "topology"):
        "how the pools are wired",
    ("Pool", "name"): "the pool's name (plans and --lost/--added name it)",
    ("Pool", "nodes"): "nodes in the pool", ("Pool", "nodes_per_rack"): "nodes under one leaf switch",
    ("Topology", "latency_us"): "one network hop's latency",
    ("Catalog", "devices"): "device types", ("Catalog", "models"): "model architectures",
    ("DeviceType", "name"): "the name pools use", ("DeviceType", "kind"): "gpu, cpu or lpu",
    ("DeviceType", "can_train"): "whether training roles may run on it",
    ("DeviceType", "price_per_hour"): "list price of one device for an hour",
    ("DeviceType", "source"): "where the figures come from",
    ("ModelArch", "name"): "the name models.* use", ("ModelArch", "qkv_bias"):
        "biases on the q, k and v projections (Qwen2.5)",
    ("ModelArch", "q_lora_rank"): "MLA: query compression rank [q_lora_rank]",
    ("ModelArch", "kv_lora_rank"): "MLA: key/value latent rank; set: latent attention",
    ("ModelArch", "qk_rope_head_dim"): "MLA: rotary part of a head [qk_rope_head_dim]",
    ("ModelArch", "qk_nope_head_dim"): "MLA: non-rotary part of a head [qk_nope_head_dim]",
    ("ModelArch", "v_head_dim"): "MLA: value head size [v_head_dim]",
    ("ModelArch", "source"): "where the figures come from",
    ("CurrentPlacement", "roles"): "each role's placement today, by role name",
    ("CurrentRole", "pool"): "the pool it runs on", ("CurrentRole", "devices"): "devices it holds",
    ("CurrentRole", "tp"): "tensor-parallel degree", ("CurrentRole", "pp"): "pipeline stages",
}

# Valid instances of each section (tests/test_schema.py validates them); a field's example is its
# value in the first instance that sets it to something other than its default.
EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "Job": [{"name": "grpo-qwen7b", "algorithm": "grpo", "objective": "cost", "seed": 7,
             "models": {}, "batch": {}, "lengths": {}, "cluster": {}, "environment": {},
             "pipeline": {}, "tail_policy": {}, "weight_sync": {}, "catalog": {}, "data": {}, "precision": {},
             "pin": {}, "framework": "verl", "rollout_sleep_level": 1, "kl": {},
             "sampling": {}}],
    "Precision": [{"rollout_weights": "fp8", "kv_cache": "fp8", "training": "bf16"}],
    "MicroTokenBudget": [{"forward": 8192, "update": 4096}],
    "Validation": [{"every": 10, "samples": 96}],
    "EngineSettings": [{"memory_fraction": 0.6, "max_num_seqs": 256}],
    "Models": [{"policy": "Qwen2.5-7B", "reference": "Qwen2.5-7B", "reward": "rule",
                "critic": "Qwen2.5-1.5B", "use_reference": False,
                "paths": {"policy": "/models/Qwen2.5-7B"}}],
    "Batch": [{"prompts": 256, "samples_per_prompt": 8, "mini_batches": 4}],
    "Lengths": [{"prompt": {"kind": "fixed", "value": 512},
                 "response": {"kind": "lognormal", "median": 700, "sigma": 0.6, "cap": 4096}}],
    "Distribution": [{"kind": "lognormal", "median": 700, "sigma": 0.6, "min": 16, "cap": 4096},
                     {"kind": "fixed", "value": 512}, {"kind": "normal", "mean": 300, "std": 40},
                     {"kind": "empirical", "path": "traces/workloads/longtail.jsonl",
                      "field": "response_tokens"}],
    "Environment": [{"kind": "code", "turns": 3, "tool_latency_s": {"kind": "fixed", "value": 2.0},
                     "cpu_per_call": 2, "tool_output_tokens": 64}],
    "Pipeline": [{"mode": "async", "max_staleness": 1}],
    "VisionEncoder": [{"layers": 32, "hidden": 1280, "mlp": 3420, "heads": 16, "patch_size": 14,
                       "temporal_patch_size": 2, "merge": 2, "out_hidden": 3584,
                       "tokens_per_image": 256}],
    "RewardModel": [{"kind": "generative", "rubric_tokens": 384,
                     "verdict": {"kind": "lognormal", "median": 160, "sigma": 0.5, "cap": 1024}}],
    "Agents": [{"members": {"solver": {"policy": "Qwen2.5-7B"},
                            "verifier": {"policy": "Qwen2.5-7B", "reward": "none"}},
                "turns": ["solver", "verifier", "solver"],
                "shared_engines": [{"agents": ["solver", "verifier"], "adapters": "lora",
                                    "adapter_rank": 64}]}],
    "Agent": [{"policy": "Qwen3-4B", "trained": False, "reward": "rule",
               "response": {"kind": "lognormal", "median": 192, "sigma": 0.5, "cap": 1024}}],
    "SharedEngines": [{"agents": ["solver", "verifier"], "adapters": "none"}],
    "TailPolicy": [{"kind": "overprovision", "fraction": 0.1},
                   {"kind": "partial", "token_budget": 2048},
                   {"kind": "reissue", "deadline_s": 10.0}],
    "KL": [{"coef": 0.001, "in": "loss", "estimator": "k3"},
           {"coef": 0.01, "in": "reward", "estimator": "k1"}],
    "Sampling": [{"temperature": 0.7}],
    "WeightSync": [{"transport": "nixl", "shard_experts": True},
                   {"transport": "nccl-p2p", "shard_experts": False}],
    "Cluster": [{"pools": [], "topology": {}, "storage_gbs": 20.0}],
    "Pool": [{"name": "h100", "device": "H100-SXM", "devices_per_node": 8, "nodes": 4,
              "nvlink_domain": 8, "nodes_per_rack": 16, "host_memory_gb": 2048},
             {"name": "cpu", "device": "cpu-node", "cores_per_node": 64, "nodes": 8}],
    "Topology": [{"spine_gbs": 800.0, "cross_pool_gbs": 25.0, "latency_us": 3.0}],
    "Catalog": [{"devices": [], "models": []}],
    "DeviceType": [{"name": "my-gpu", "kind": "gpu", "memory_gb": 96, "bf16_tflops": 400,
                    "matmul_tflops": 300, "fp8_tflops": 800, "mem_bw_gbs": 3000,
                    "intra_link_gbs": 450, "nic_gbs": 50, "network": "roce",
                    "can_train": True,
                    "price_per_hour": 2.0, "host_memory_gb": 1024, "sm_count": 132,
                    "scaleup_devices": 8, "host_devices": 8,
                    "source": "vendor datasheet"},
                   {"name": "my-cpu", "kind": "cpu", "memory_gb": 256, "bf16_tflops": 2,
                    "mem_bw_gbs": 200, "intra_link_gbs": 200, "nic_gbs": 12.5, "cores": 32}],
    "ModelArch": [{"name": "my-moe", "layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4,
                   "head_dim": 128, "mlp": 6144, "vocab": 151936, "tie_embeddings": True,
                   "qkv_bias": True, "qk_norm": True, "experts": 128, "experts_per_token": 8,
                   "shared_experts": 1, "expert_mlp": 768, "dense_layers": 1, "params_b": 30.5,
                   "source": "config.json"},
                  {"name": "my-mla", "layers": 61, "hidden": 7168, "heads": 128, "kv_heads": 128,
                   "mlp": 18432, "vocab": 129280, "q_lora_rank": 1536, "kv_lora_rank": 512,
                   "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128},
                  {"name": "my-hybrid", "layers": 64, "hidden": 5120, "heads": 24, "kv_heads": 4,
                   "head_dim": 256, "mlp": 17408, "vocab": 248320, "qk_norm": True,
                   "attn_output_gate": True,
                   "linear_attention": {"every": 4, "key_heads": 16, "value_heads": 48,
                                        "key_head_dim": 128, "value_head_dim": 128}}],
    "LinearAttention": [{"every": 4, "key_heads": 16, "value_heads": 48, "key_head_dim": 128,
                         "value_head_dim": 128, "conv_kernel": 4}],
    "Dataset": [{"path": "data/gsm8k.jsonl", "prompt": "question", "answer": "final"},
                {"path": "data/apps.parquet", "prompt": "problem", "answer": "tests",
                 "reward": "code", "code": {}}],
    "CodeReward": [{"wall_s": 10, "cpu_s": 4, "memory_mb": 1024, "scoring": "all"}],
    "CurrentPlacement": [{"source": "verl ppo_trainer.yaml", "colocate": [["actor", "rollout"]],
                          "roles": {"actor": {"pool": "h100", "devices": 8, "tp": 2}}}],
    "CurrentRole": [{"pool": "h100", "devices": 8, "tp": 2, "pp": 2, "offload": True}],
    "Pins": [{"actor": {"tp": 2, "dp": 2}, "rollout": {"pool": "h100", "tp": 1}}],
    "Pin": [{"pool": "h100", "devices": 8, "tp": 2, "pp": 1, "dp": 4, "cp": 1, "ep": 1, "shard": 2},
            {"sharded": False}, {"avoid": ["h20"]}],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="the JSON Schema (the default)")
    form.add_argument("--markdown", action="store_true",
                      help="the reference (docs/job-format.md) as Markdown")
    p.add_argument("-o", "--out", metavar="FILE", help="write to FILE instead of stdout")


def job_schema() -> dict[str, Any]:
    """The job file's JSON Schema, from `placer.spec.job.Job`."""
    schema = Job.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "placer job"
    return schema


def _ref(prop: dict[str, Any]) -> str | None:
    """The section a field refers to (`X`, `list[X]`, `X | None`), or None."""
    for p in (prop, prop.get("items") or {}, prop.get("additionalProperties") or {},
              *prop.get("anyOf", [])):
        if "$ref" in p:
            return str(p["$ref"]).rsplit("/", 1)[-1]
    return None


def sections(schema: dict[str, Any] | None = None) -> list[str]:
    """The job's sections top-down: the job, then each model section in the order the fields
    first refer to it (depth first), so a section added to the job's models appears by itself."""
    schema = schema or job_schema()
    defs = {**schema["$defs"], "Job": schema}
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order or "properties" not in defs.get(name, {}):
            return
        order.append(name)
        for prop in defs[name]["properties"].values():
            ref = _ref(prop)
            if ref:
                visit(ref)
    visit("Job")
    return order


def unit_of(section: str, field: str) -> str:
    if (section, field) in UNITS:
        return UNITS[(section, field)]
    return next((u for suffix, u in SUFFIX_UNITS if field.endswith(suffix)), "-")


def meaning(section: str, field: str, prop: dict[str, Any]) -> str:
    return prop.get("description") or MEANINGS.get((section, field), "")


def _type(prop: dict[str, Any]) -> str:
    """A field's type in words, with its bounds: `integer > 0, <= 1e9`, `Pool list`..."""
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in prop:
        parts = [_type(p) for p in prop["anyOf"] if p.get("type") != "null"]
        nullable = len(parts) < len(prop["anyOf"])
        return " or ".join(parts) + (" or null" if nullable else "")
    if "enum" in prop:
        return "one of " + ", ".join(f"`{v}`" for v in prop["enum"])
    if prop.get("type") == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if prop.get("type") == "object":
        return f"mapping to {_type(prop.get('additionalProperties') or {})}"
    out = str(prop.get("type", "any"))
    bounds = [f"{op} {_num(prop[k])}" for k, op in (("exclusiveMinimum", ">"), ("minimum", ">="),
                                                      ("exclusiveMaximum", "<"), ("maximum", "<="))
              if k in prop]
    if "minItems" in prop:
        bounds.append(f"at least {prop['minItems']}")
    return out + (" " + ", ".join(bounds) if bounds else "")


def _num(v: float) -> str:
    return f"{v:.0e}".replace("+", "") if abs(v) >= 1e6 else f"{v:g}"


def _value(v: Any) -> str:
    text = json.dumps(v)
    return "`" + (text if len(text) <= 60 else text[:57] + "...") + "`"


def _example(section: str, field: str, default: Any, prop: dict[str, Any]) -> str:
    name = _ref(prop)
    if name and name not in ENUMS:  # a section of its own: its table has the examples
        return f"see [{name}](#{name.lower()})"
    given = [i[field] for i in EXAMPLES.get(section, []) if i.get(field) is not None]
    for v in given:
        if v != default and v not in ({}, []):
            return _value(v)
    if given:
        return _value(given[0])
    return "-" if default in (None, {}, []) else _value(default)  # a field EXAMPLES lacks


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def markdown(schema: dict[str, Any] | None = None) -> str:
    """docs/job-format.md: the reference, generated from `job_schema()`."""
    schema = schema or job_schema()
    defs = {**schema["$defs"], "Job": schema}
    out = ["# Job format", "",
           "<!-- Generated by `placer schema --markdown -o docs/job-format.md` from the models of",
           "placer/spec/job.py and its section modules; do not edit. tests/test_schema.py fails "
           "when it is stale. -->", "",
           "A job is a YAML (or JSON) file: the sections below, top-down from the job itself. "
           "Every key is checked (an unknown key is an error, never ignored), and `placer "
           "validate JOB.yaml` reports every mistake at once, one line each. `placer schema` "
           "prints the JSON Schema. Lengths are tokens; a response length is per turn.", ""]
    order = sections(schema)
    out += ["Sections: " + ", ".join(f"[{s}](#{s.lower()})" for s in order), ""]
    for name in order:
        d = defs.get(name)
        if d is None:
            continue
        out += [f"## {name}", ""]
        if d.get("description"):
            out += [" ".join(d["description"].split()), ""]
        required = set(d.get("required", []))
        out += ["| field | type | default | unit | meaning | example |", "|---|---|---|---|---|---|"]
        for field, prop in d.get("properties", {}).items():
            default = prop.get("default")
            shown = "required" if field in required else (
                "see meaning" if "default" not in prop else _value(default))
            out.append(f"| `{field}` | {_cell(_type(prop))} | {_cell(shown)} | "
                       f"{_cell(unit_of(name, field))} | {_cell(meaning(name, field, prop))} | "
                       f"{_cell(_example(name, field, default, prop))} |")
        out.append("")
    enums = [n for n in defs if "enum" in defs[n]]
    for name in sorted(enums):
        out += [f"## {name}", "", "one of " + ", ".join(f"`{v}`" for v in defs[name]["enum"]), ""]
    return "\n".join(out).rstrip() + "\n"


def run(args: argparse.Namespace) -> int:
    check_output(args.out, "--out")
    text = markdown() if args.markdown else None
    if args.out:
        atomic_write_text(Path(args.out), text or json.dumps(job_schema(), indent=2) + "\n")
        return 0
    if text is not None:
        print(text, end="")
    else:
        emit_json(job_schema())
    return 0
