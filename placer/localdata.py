"""Local model checkpoints and prompt datasets that a job names (nothing is ever downloaded).

  models.<field>: {path: DIR, name: NAME}   a Hugging Face checkpoint folder (config.json,
      weights, tokenizer; `name` optional, default the folder's name). The job loader reads its
      config.json into a catalog entry (`arch_from_config`), so the planner prices the real
      architecture, and records the folder in `models.paths`; the field then names the entry
      (a plan's job keeps both, so the plan reloads without the folder's config).
  data: {path: FILE.jsonl, prompt: KEY, answer: KEY}   prompts with reference answers, one JSON
      object a line (`Dataset`; the executor reads it).
Relative paths in a job file are relative to the job file's folder; elsewhere to the current one.

Architectures mapped: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k norms), Qwen3-MoE and
Mixtral (routed experts).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from placer.inputs import load_json, read_text
from placer.specbase import SpecError, Strict

MODEL_FIELDS = ("policy", "reference", "reward", "critic")
DENSE = {"llama", "mistral", "qwen2", "qwen3"}
MOE = {"qwen3_moe", "mixtral"}


class Dataset(Strict):
    """A JSONL prompt set: each line an object with a prompt and its reference answer."""

    path: str = Field(description="JSONL file, one object per line")
    prompt: str = Field("prompt", description="key of the prompt text")
    answer: str = Field("answer", description="key of the reference answer (math: checked with "
                                              "sympy)")


def arch_from_config(cfg: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    """A catalog entry (ModelArch fields) from a Hugging Face config.json."""
    kind = cfg.get("model_type")
    if kind not in DENSE | MOE:
        raise SpecError(f"{where}: model_type {kind!r} is not supported (supported: "
                        f"{', '.join(sorted(DENSE | MOE))})")
    try:
        heads = int(cfg["num_attention_heads"])
        arch: dict[str, Any] = {
            "name": name, "layers": int(cfg["num_hidden_layers"]),
            "hidden": int(cfg["hidden_size"]), "heads": heads,
            "kv_heads": int(cfg.get("num_key_value_heads") or heads),
            "mlp": int(cfg["intermediate_size"]), "vocab": int(cfg["vocab_size"]),
            "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
            "qkv_bias": kind == "qwen2" or bool(cfg.get("attention_bias", False)),
            "qk_norm": kind in ("qwen3", "qwen3_moe"), "source": f"local checkpoint {where}"}
        if cfg.get("head_dim"):
            arch["head_dim"] = int(cfg["head_dim"])
        if kind in MOE:  # transformers 5 writes num_local_experts for both
            arch.update(experts=int(cfg.get("num_local_experts") or cfg["num_experts"]),
                        experts_per_token=int(cfg["num_experts_per_tok"]),
                        expert_mlp=int(cfg["moe_intermediate_size"] if kind == "qwen3_moe"
                                       else cfg["intermediate_size"]))
    except (KeyError, TypeError, ValueError) as e:
        raise SpecError(f"{where}: config.json lacks a usable {e} ({type(e).__name__})") from None
    return arch


def _config(path: str, where: str) -> dict[str, Any]:
    """config.json of a checkpoint folder, read through the guarded input reader."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise SpecError(f"{where}: no readable config.json in {path!r} (a local Hugging Face "
                        f"checkpoint folder)")
    data = load_json(read_text(f, "config.json"), f"{where}: {f}")
    if not isinstance(data, dict):
        raise SpecError(f"{where}: {str(f)!r} is not a JSON object")
    return data


def anchor(data: Any, base: Path) -> Any:
    """A job file's relative checkpoint and dataset paths, made relative to its folder."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    models = out.get("models")
    if isinstance(models, dict):
        out["models"] = {k: ({**v, "path": str(base / v["path"])} if _relative(v) else v)
                         for k, v in models.items()}
    if _relative(out.get("data")):
        out["data"] = {**out["data"], "path": str(base / out["data"]["path"])}
    return out


def _relative(v: Any) -> bool:
    return isinstance(v, dict) and isinstance(v.get("path"), str) and not Path(v["path"]).is_absolute()


def expand_model_dirs(data: Any, source: str = "job") -> Any:
    """`models.<field>: {path: DIR}` -> the entry's name, `models.paths` and a catalog entry."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        return data
    models, paths = dict(data["models"]), dict(data["models"].get("paths") or {})
    catalog = dict(data.get("catalog") or {})
    entries = list(catalog.get("models") or [])
    for field in MODEL_FIELDS:
        v = models.get(field)
        if not isinstance(v, dict):
            continue
        where = f"{source}: models.{field}"
        if set(v) - {"path", "name"} or not isinstance(v.get("path"), str):
            raise SpecError(f"{where}: expected a model name or {{path: DIR, name: NAME}} "
                            f"(got keys {sorted(v)})")
        path = str(Path(v["path"]).resolve())
        name = str(v.get("name") or Path(path).name)
        arch = arch_from_config(_config(path, f"{where}.path"), name, f"{where}.path")
        if not any(isinstance(e, dict) and e.get("name") == name for e in entries):
            entries.append(arch)
        models[field], paths[field] = name, path
    if paths:
        models["paths"] = paths
        catalog["models"] = entries
        return {**data, "models": models, "catalog": catalog}
    return data
