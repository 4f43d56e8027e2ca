"""Local model checkpoints and prompt datasets that a job names (nothing is ever downloaded).

  models.<field>: {path: DIR, name: NAME}   a Hugging Face checkpoint folder (config.json,
      weights, tokenizer; `name` optional, default the folder's name). The job loader reads its
      config.json into a catalog entry (`arch_from_config`), so the planner prices the real
      architecture, and records the folder in `models.paths`; the field then names the entry
      (a plan's job keeps both, so the plan reloads without the folder's config).
  data: {path: FILE, prompt: KEY, answer: KEY, reward: math|code}   prompts with their references
      (`Dataset`; the executor reads it): a JSONL file (one JSON object a line) or a Parquet file
      (`.parquet`, read with pyarrow; one column per key). `reward` picks the rule reward:
      `math` (the answer column holds the reference answer) or `code` (it holds the unit tests,
      verl's format: `{"inputs": [...], "outputs": [...], "fn_name"?, "assert_case"?}`, a JSON
      string or an object; `executors.codetask`). `read_rows` reads either format; a missing
      file or column, an unreadable file or a null cell is a SpecError naming the field.
Relative paths in a job file are relative to the job file's folder; elsewhere to the current one.

Architectures mapped: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k norms), Qwen3-MoE and
Mixtral (routed experts).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from placer.base.errors import SpecError
from placer.base.inputs import load_json, read_text
from placer.spec.base import Strict

MODEL_FIELDS = ("policy", "reference", "reward", "critic")
DENSE = {"llama", "mistral", "qwen2", "qwen3"}
MOE = {"qwen3_moe", "mixtral"}


RewardKind = Literal["math", "code"]  # the executor's rule rewards (executors.task.DATA_TASKS)
REWARDS: tuple[str, ...] = get_args(RewardKind)
PARQUET = (".parquet", ".pq")


class CodeReward(Strict):
    """Limits and scoring of the code reward: each answer runs once, over all its tests, in the
    sandbox (executors/sandbox.py); a run that crashes, times out or is refused scores 0."""

    wall_s: Annotated[float, Field(gt=0, le=120)] = Field(
        5.0, description="wall-clock limit of one answer's run over all its tests, seconds")
    cpu_s: Annotated[int, Field(strict=True, ge=1, le=120)] = Field(
        2, description="CPU-time limit of that run, seconds")
    memory_mb: Annotated[int, Field(strict=True, ge=64, le=65536)] = Field(
        512, description="address-space limit of that run, MiB")
    scoring: Literal["fraction", "all"] = Field(
        "fraction", description="fraction: the share of tests passed; all: 1 only when every "
                                "test passes, else 0")


class Dataset(Strict):
    """A prompt set: each row a prompt and its reference (an answer, or unit tests)."""

    path: str = Field(description="JSONL file (one object per line) or Parquet file (.parquet)")
    prompt: str = Field("prompt", description="key (column) of the prompt text")
    answer: str = Field("answer", description="key (column) of the reference: the answer (math: "
                                              "checked with sympy) or the unit tests (code; "
                                              "default key `tests` then)")
    reward: RewardKind = Field("math", description="the rule reward: math (answer "
                                            "equivalence) or code (unit tests in the sandbox)")
    code: CodeReward = Field(CodeReward(), description="limits and scoring of the code reward")

    @model_validator(mode="before")
    @classmethod
    def _tests_key(cls, data: Any) -> Any:
        """A code dataset's reference column is `tests` unless the job names another."""
        if isinstance(data, dict) and data.get("reward") == "code" and "answer" not in data:
            return {**data, "answer": "tests"}
        return data

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A math dataset's dump leaves out the code reward's settings (its plan files read as
        they did before the code reward existed)."""
        out: dict[str, Any] = handler(self)
        if self.reward == "math" and self.code == CodeReward():
            out.pop("reward", None)
            out.pop("code", None)
        return out


def read_rows(path: str, keys: dict[str, str]) -> list[dict[str, Any]]:
    """Every row of a JSONL or Parquet dataset as {field: value} for `keys` ({field: column},
    e.g. {"prompt": "question"}); SpecError naming `data.<field>` and the value or the row."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"data.path: no such file {path!r}" if not p.exists()
                        else f"data.path: {path!r} is not a file")
    rows = _parquet_rows(p, keys) if p.suffix.lower() in PARQUET else _jsonl_rows(p, keys)
    if not rows:
        raise SpecError(f"data.path: {path!r} has no rows")
    return rows


def _cell(value: Any, field: str, column: str, where: str) -> Any:
    if value is None:
        raise SpecError(f"data.{field}: {where}: column {column!r} is null")
    return value


def _jsonl_rows(p: Path, keys: dict[str, str]) -> list[dict[str, Any]]:
    try:  # streamed: a real dataset may be larger than the job files read_text is for
        with p.open(encoding="utf-8") as f:
            return [row for k, line in enumerate(f, 1) if line.strip()
                    for row in [_jsonl_row(p, k, line, keys)]]
    except OSError as e:
        raise SpecError(f"data.path: {str(p)!r}: cannot read: {e.strerror or type(e).__name__}"
                        ) from None
    except UnicodeDecodeError as e:
        raise SpecError(f"data.path: {str(p)!r} is not UTF-8 text (byte {e.start}); a Parquet "
                        f"file must end in .parquet") from None


def _jsonl_row(p: Path, k: int, line: str, keys: dict[str, str]) -> dict[str, Any]:
    """Row `k` (1-based line) of a JSONL file."""
    obj = load_json(line, f"data.path: {p}", k)
    if not isinstance(obj, dict):
        raise SpecError(f"data.path: {p}:{k}: expected a JSON object (got {type(obj).__name__})")
    for field, col in keys.items():
        if col not in obj:
            raise SpecError(f"data.{field}: {p}:{k}: no key {col!r} (keys: "
                            f"{', '.join(sorted(map(str, obj)))[:200]})")
    return {f: _cell(obj[c], f, c, f"{p}:{k}") for f, c in keys.items()}


def _parquet_rows(p: Path, keys: dict[str, str]) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # lazy: only Parquet datasets

    try:
        schema = pq.read_schema(p)
        missing = [(f, c) for f, c in keys.items() if c not in schema.names]
        if missing:
            f, c = missing[0]
            raise SpecError(f"data.{f}: column {c!r} not in {str(p)!r} (columns: "
                            f"{', '.join(schema.names)[:200]})")
        table = pq.read_table(p, columns=sorted(set(keys.values())))
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow raises its own types (ArrowInvalid, OSError)
        raise SpecError(f"data.path: {str(p)!r} is not a readable Parquet file "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
                        ) from None
    cols = {f: table.column(c).to_pylist() for f, c in keys.items()}
    return [{f: _cell(cols[f][i], f, keys[f], f"{p} row {i + 1}") for f in keys}
            for i in range(table.num_rows)]


def arch_from_config(cfg: dict[str, Any], name: str, where: str) -> dict[str, str | int | bool]:
    """A catalog entry (ModelArch fields) from a Hugging Face config.json."""
    kind = cfg.get("model_type")
    if kind not in DENSE | MOE:
        raise SpecError(f"{where}: model_type {kind!r} is not supported (supported: "
                        f"{', '.join(sorted(DENSE | MOE))})")
    try:
        heads = int(cfg["num_attention_heads"])
        arch: dict[str, str | int | bool] = {
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


def _relative(v: object) -> bool:
    return isinstance(v, dict) and isinstance(v.get("path"), str) and not Path(v["path"]).is_absolute()


def expand_model_dirs(data: Any, source: str = "job") -> Any:
    """`models.<field>: {path: DIR}` -> the entry's name, `models.paths` and a catalog entry."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        return data
    if not any(isinstance(data["models"].get(f), dict) for f in MODEL_FIELDS):
        return data  # nothing to expand: the job's validation reports any other shape
    cat = data.get("catalog")
    for key, value, want in (("models.paths", data["models"].get("paths"), dict),
                             ("catalog", cat, dict),
                             ("catalog.models", cat.get("models") if isinstance(cat, dict) else None,
                              list)):
        if value is not None and not isinstance(value, want):
            raise SpecError(f"{source}: {key}: expected a {'mapping' if want is dict else 'list'},"
                            f" got {value!r}")
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
