"""Job and cluster specifications: what the user writes in YAML, validated.

An RL post-training *job* names an algorithm (GRPO, PPO, RLOO), the models it trains and serves, the
batch, the length distributions of prompts and responses, an optional multi-turn environment, the
pipeline mode and the objective. A *cluster* is a set of *pools* of identical nodes plus the network
that joins them. Every model here is strict (unknown keys are errors) so that a typo never silently
falls back to a default; `load_job` turns validation failures into one `SpecError` that names the
field path and the bad value.

The *roles* an algorithm runs are derived here, not written by the user: see `Job.roles()`.
"""
from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, Field, StrictBool, ValidationError, model_validator

from placer.distributions import Distribution  # noqa: F401  (re-exported)
from placer.specbase import (MAX_CONTEXT_TOKENS, PosFloat, PosInt, SpecError,  # noqa: F401
                             Strict)


# ----------------------------------------------------------------------------------- hardware
class DeviceKind(str, Enum):
    gpu = "gpu"
    cpu = "cpu"
    lpu = "lpu"


class DeviceType(Strict):
    """One accelerator (or one CPU node for kind=cpu). Units: GB, TFLOP/s, GB/s, USD/hour."""

    name: str
    kind: DeviceKind
    memory_gb: PosFloat = Field(description="HBM, SRAM (lpu) or host RAM (cpu) per device")
    bf16_tflops: PosFloat = Field(description="peak dense BF16 (FP16 for LPUs)")
    mem_bw_gbs: PosFloat = Field(description="memory bandwidth per device")
    intra_link_gbs: PosFloat = Field(description="scale-up link per device, one direction")
    nic_gbs: PosFloat = Field(description="network bandwidth per device, one direction")
    can_train: StrictBool = False
    price_per_hour: Annotated[float, Field(strict=True, ge=0)] = 0.0
    cores: PosInt = Field(1, description="CPU cores per device (cpu kind)")
    source: str = ""

    @model_validator(mode="after")
    def _inference_only_lpu(self) -> "DeviceType":
        if self.kind is DeviceKind.lpu and self.can_train:
            raise ValueError("an lpu is inference-only: can_train must be false")
        return self


class ModelArch(Strict):
    """A decoder-only transformer (Llama/Qwen family: GQA attention, SwiGLU MLP, RMSNorm)."""

    name: str
    layers: PosInt
    hidden: PosInt
    heads: PosInt
    kv_heads: PosInt
    mlp: PosInt = Field(description="MLP intermediate size (SwiGLU: three matrices)")
    vocab: PosInt
    tie_embeddings: StrictBool = False
    qkv_bias: StrictBool = False
    params_b: float | None = Field(None, description="published parameter count, billions")
    source: str = ""

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelArch":
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        """Parameter count from the shape: embeddings, attention (GQA), SwiGLU MLP, norms."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * h * self.mlp
        per_layer = attn + mlp + 2 * h
        embed = self.vocab * h * (1 if self.tie_embeddings else 2)
        return self.layers * per_layer + embed + h


class Pool(Strict):
    """A named set of identical nodes."""

    name: str
    device: str = Field(description="device type name (catalog or job's own)")
    devices_per_node: PosInt
    nodes: PosInt
    nvlink_domain: PosInt | None = Field(
        None, description="devices sharing the scale-up link; default: one node")
    nodes_per_rack: PosInt = 32


class Topology(Strict):
    """How pools are wired: racks under a spine; pools meet at the spine."""

    spine_gbs: PosFloat = Field(400.0, description="bisection per rack uplink, GB/s")
    cross_pool_gbs: PosFloat | None = Field(
        None, description="per-node bandwidth between two pools; default: the slower NIC side")
    latency_us: PosFloat = 5.0


class Cluster(Strict):
    pools: list[Pool] = Field(min_length=1)
    topology: Topology = Topology()

    @model_validator(mode="after")
    def _unique_pools(self) -> "Cluster":
        names = [p.name for p in self.pools]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"pool names must be unique, repeated: {sorted(dup)}")
        return self

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


# ------------------------------------------------------------------------------------ the job
class Algorithm(str, Enum):
    grpo = "grpo"
    ppo = "ppo"
    rloo = "rloo"


class Models(Strict):
    policy: str
    reference: str | None = Field(None, description="frozen KL model; default: same as policy")
    reward: str = Field("rule", description="a model name, or 'rule' for a verifier on CPU")
    critic: str | None = Field(None, description="PPO only; default: same shape as reward/policy")
    use_reference: StrictBool = True


class Batch(Strict):
    prompts: PosInt
    samples_per_prompt: PosInt = 1
    mini_batches: PosInt = Field(1, description="optimizer steps per iteration")

    @property
    def samples(self) -> int:
        return self.prompts * self.samples_per_prompt


class Lengths(Strict):
    prompt: Distribution
    response: Distribution


class Environment(Strict):
    """Multi-turn tool use: after each turn but the last a tool call runs on a CPU pool."""

    kind: Literal["none", "tool", "code"] = "none"
    turns: Annotated[int, Field(strict=True, gt=0, le=10_000)] = 1  # estimates walk turns
    tool_latency_s: Distribution = Distribution(kind="fixed", value=1.0)
    cpu_per_call: PosFloat = 1.0
    tool_output_tokens: Annotated[int, Field(strict=True, ge=0, le=1_000_000_000)] = 0


class Pipeline(Strict):
    mode: Literal["sync", "async"] = "sync"
    max_staleness: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] = 0

    @model_validator(mode="after")
    def _staleness(self) -> "Pipeline":
        if self.mode == "async" and self.max_staleness < 1:
            raise ValueError("async mode needs max_staleness >= 1")
        return self


class TailPolicy(Strict):
    """How a step stops waiting on its slowest samples (issue 7); the simulator models each.

    none           wait for every sample and every tool call
    overprovision  generate ceil(n * (1 + fraction)) samples, keep the first n to finish and
                   abort the rest (the kept samples lean short: a known bias of the method)
    partial        cut a sample once it generated `token_budget` response tokens in this step;
                   the rest of it resumes next step (its context prefilled again) and counts there
    reissue        a tool call still running `deadline_s` after it started is issued again on
                   another core; the first copy to finish wins and frees both cores
    """

    kind: Literal["none", "overprovision", "partial", "reissue"] = "none"
    fraction: Annotated[float, Field(strict=True, gt=0, le=4)] | None = None
    token_budget: PosInt | None = None
    deadline_s: PosFloat | None = None

    @model_validator(mode="after")
    def _fields_match_kind(self) -> "TailPolicy":
        need = {"none": None, "overprovision": "fraction", "partial": "token_budget",
                "reissue": "deadline_s"}[self.kind]
        for name in ("fraction", "token_budget", "deadline_s"):
            given = getattr(self, name) is not None
            if name == need and not given:
                raise ValueError(f"a {self.kind} tail policy needs {name}")
            if name != need and given:
                raise ValueError(f"{name} does not apply to a {self.kind} tail policy")
        return self


class Catalog(Strict):
    devices: list[DeviceType] = []
    models: list[ModelArch] = []


class Job(Strict):
    name: str = "job"
    algorithm: Algorithm
    models: Models
    batch: Batch
    lengths: Lengths
    environment: Environment = Environment()
    pipeline: Pipeline = Pipeline()
    objective: Literal["time", "cost"] = "time"
    tail_policy: TailPolicy = TailPolicy()
    cluster: Cluster
    catalog: Catalog = Catalog()
    seed: Annotated[int, Field(strict=True, ge=0, le=2**63)] = 0

    def roles(self) -> list[str]:
        """Roles the algorithm runs, in a stable order."""
        out = ["actor", "rollout"]
        if self.models.use_reference:
            out.append("reference")
        out.append("reward")
        if self.algorithm is Algorithm.ppo:
            out.append("critic")
        if self.environment.kind != "none":
            out.append("environment")
        return out

    def max_context_float(self) -> float:
        """Longest context a sample reaches: prompt + all turns' responses and tool outputs."""
        env = self.environment
        return (self.lengths.prompt.max_value() + env.turns * self.lengths.response.max_value()
                + (env.turns - 1) * env.tool_output_tokens)

    @property
    def max_context(self) -> int:
        """`max_context_float` in whole tokens (finite: checked when the job is loaded)."""
        return int(self.max_context_float())


# ------------------------------------------------------------------------------------ loading
def read_structured(path: str | Path) -> dict[str, Any]:
    """YAML or JSON file to a dict, or SpecError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such file")
    kind = "JSON" if p.suffix == ".json" else "YAML"
    try:
        text = p.read_text()
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: not valid {kind}: {_parse_problem(e)}") from None
    except (OSError, RecursionError) as e:  # unreadable file; absurdly deep nesting
        raise SpecError(f"{p}: cannot read: {_first_line(e)}") from None
    if data is None:
        raise SpecError(f"{p}: the file is empty (expected a mapping of keys)")
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _parse_problem(e: Exception) -> str:
    """Where and what, in one line: `line 3, column 9: expected ',' or ']', but got '}'`."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        what = " ".join(str(e.problem or e.context).split())
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    if isinstance(e, json.JSONDecodeError):
        return f"line {e.lineno}, column {e.colno}: {e.msg}"
    return _first_line(e)


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _model_in(ann: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `X`, `list[X]` or `X | None`."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in get_args(ann):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _keys_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the model at `loc` (below `root`) accepts; [] when the path leaves the models."""
    cls: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue  # a list index: the element type is already `cls`
        field = cls.model_fields.get(part) if cls is not None else None
        cls = _model_in(field.annotation) if field is not None else None
        if cls is None:
            return []
    return list(cls.model_fields)


def format_validation_error(err: ValidationError, prefix: str = "",
                            root: type[BaseModel] | None = None) -> str:
    """The first error as `field.path: message (got value)`; `root` lists keys for a typo."""
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
    msg = " ".join(e["msg"].removeprefix("Value error, ").split())  # always one line
    got = e.get("input")
    # A missing key or a whole-object check has the enclosing mapping as its input: not a value.
    hide = got is None or (isinstance(got, dict) and e["type"] in ("missing", "value_error"))
    shown = "" if hide else f" (got {_shown(got)})"
    if e["type"] == "extra_forbidden":
        keys = _keys_at(root, e["loc"][:-1]) if root is not None else []
        msg, shown = "unknown key" + (f"; expected one of {', '.join(keys)}" if keys else ""), ""
    more = f" [+{len(err.errors()) - 1} more]" if len(err.errors()) > 1 else ""
    return f"{prefix}{loc}: {msg}{shown}{more}"


def distributions(job: Job) -> list[tuple[str, Distribution]]:
    """Every distribution of a job with its field path."""
    return [("lengths.prompt", job.lengths.prompt), ("lengths.response", job.lengths.response),
            ("environment.tool_latency_s", job.environment.tool_latency_s)]


def _check_job(job: Job, source: str) -> None:
    """Checks that need more than one field: replayed traces readable, contexts finite."""
    for where, dist in distributions(job):
        if dist.kind != "empirical":
            continue
        try:
            dist.samples()
        except SpecError as e:
            raise SpecError(f"{source}: {where}.path: {e}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(f"{source}: {where}.path: cannot read {dist.path!r}: "
                            f"{_first_line(e)}") from None
    check_tail_policy(job, source)
    ctx = job.max_context_float()
    if not ctx <= MAX_CONTEXT_TOKENS:
        raise SpecError(f"{source}: lengths: the longest context, prompt + turns x response + "
                        f"tool outputs, is {ctx:.3g} tokens, beyond {MAX_CONTEXT_TOKENS:,}")


def check_tail_policy(job: Job, source: str) -> None:
    """Budgets and deadlines below the mean would cut (or re-issue) the typical sample, not the
    tail: carried-over work would then grow every step (partial) or every call would run twice
    (reissue). Such a setting is an error, which also keeps the no-variance model unchanged."""
    tp, env = job.tail_policy, job.environment
    if tp.kind == "partial":
        # whole tokens per turn, as the simulator rounds a no-variance response
        mean = env.turns * math.ceil(job.lengths.response.mean_value())
        if tp.token_budget < mean:
            raise SpecError(f"{source}: tail_policy.token_budget: below the mean response of a "
                            f"sample ({mean:.0f} tokens over {env.turns} turn(s)); carried-over "
                            f"work would grow every step (got {tp.token_budget})")
    if tp.kind == "reissue":
        if env.kind == "none" or env.turns < 2:
            raise SpecError(f"{source}: tail_policy.kind: reissue needs tool calls (an "
                            f"environment with turns >= 2) (got {tp.kind!r})")
        mean = env.tool_latency_s.mean_value()
        if tp.deadline_s < mean:
            raise SpecError(f"{source}: tail_policy.deadline_s: below the mean tool latency "
                            f"({mean:.3g} s); most calls would run twice (got {tp.deadline_s})")


def job_from_dict(data: dict[str, Any], source: str = "job") -> Job:
    try:
        job = Job.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, f"{source}: ", root=Job)) from None
    _check_job(job, source)
    from placer.catalog import resolve  # checks names against the catalogs
    resolve(job, source)
    return job


_DIST_PATHS = (("lengths", "prompt"), ("lengths", "response"), ("environment", "tool_latency_s"))


def _anchor_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Empirical distributions' relative paths, made relative to the job file's folder."""
    out = dict(data)
    for section, key in _DIST_PATHS:
        sec = out.get(section)
        dist = sec.get(key) if isinstance(sec, dict) else None
        if (isinstance(dist, dict) and dist.get("kind") == "empirical"
                and isinstance(dist.get("path"), str) and not Path(dist["path"]).is_absolute()):
            out[section] = {**sec, key: {**dist, "path": str(base / dist["path"])}}
    return out


def load_job(path: str | Path) -> Job:
    """Read and validate a job file (YAML or JSON); `cluster` may name a separate file."""
    data = _anchor_paths(read_structured(path), Path(path).parent)
    if isinstance(data.get("cluster"), str):
        cpath = Path(path).parent / data["cluster"]
        try:
            cluster = read_structured(cpath)
        except SpecError as e:
            raise SpecError(f"{path}: cluster: {e}") from None
        data = {**data, "cluster": cluster}
    return job_from_dict(data, str(path))


def dump_job(job: Job) -> dict[str, Any]:
    return job.model_dump(mode="json", exclude_defaults=False)


def save_job(job: Job, path: str | Path) -> None:
    """Write a job as YAML, or JSON when the name ends in .json (atomically)."""
    from placer.plan import atomic_write_text  # deferred: placer.plan imports this module
    data = dump_job(job)
    text = (json.dumps(data, indent=2) + "\n" if Path(path).suffix == ".json"
            else yaml.safe_dump(data, sort_keys=False))
    atomic_write_text(path, text)
