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
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PosFloat = Annotated[float, Field(gt=0)]
PosInt = Annotated[int, Field(gt=0)]


class SpecError(ValueError):
    """A bad job, cluster or plan file. `str()` is one line naming the field and the value."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    can_train: bool = False
    price_per_hour: Annotated[float, Field(ge=0)] = 0.0
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
    tie_embeddings: bool = False
    qkv_bias: bool = False
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


# ------------------------------------------------------------------------------ distributions
class Distribution(Strict):
    """A length or latency distribution.

    fixed: always `value`. normal: `mean`, `std`, clipped to [min, cap]. lognormal: median
    `median` and shape `sigma`, capped at `cap` (the long tail). empirical: replay values from a
    JSONL workload trace (`path`, `field`).
    """

    kind: Literal["fixed", "normal", "lognormal", "empirical"] = "fixed"
    value: PosFloat | None = None
    mean: PosFloat | None = None
    std: Annotated[float, Field(ge=0)] | None = None
    median: PosFloat | None = None
    sigma: Annotated[float, Field(ge=0)] | None = None
    min: Annotated[float, Field(ge=0)] = 0.0
    cap: PosFloat | None = None
    path: str | None = None
    field: str | None = None

    @model_validator(mode="after")
    def _params_present(self) -> "Distribution":
        need = {"fixed": ("value",), "normal": ("mean", "std"), "lognormal": ("median", "sigma"),
                "empirical": ("path", "field")}[self.kind]
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            raise ValueError(f"a {self.kind} distribution needs {', '.join(missing)}")
        return self

    def mean_value(self) -> float:
        """Expected value (a capped lognormal's mean is computed from the truncated integral)."""
        if self.kind == "fixed":
            return float(self.value)
        if self.kind == "normal":
            return float(min(max(self.mean, self.min), self.cap or math.inf))
        if self.kind == "lognormal":
            return _capped_lognormal_mean(self.median, self.sigma, self.cap)
        return float(sum(self.samples()) / len(self.samples()))

    def max_value(self) -> float:
        """The largest value a draw can take (cap, or a far quantile when uncapped)."""
        if self.kind == "fixed":
            return float(self.value)
        if self.cap is not None:
            return float(self.cap)
        if self.kind == "normal":
            return self.mean + 4 * self.std
        if self.kind == "lognormal":
            return self.median * math.exp(4 * self.sigma)
        return float(max(self.samples()))

    def samples(self) -> list[float]:
        """Values of an empirical distribution, read from its JSONL file."""
        from traces.workload import read_field  # deferred: placer.spec stays import-light
        return read_field(self.path, self.field)


def _capped_lognormal_mean(median: float, sigma: float, cap: float | None) -> float:
    if sigma == 0:
        return float(min(median, cap or math.inf))
    mu = math.log(median)
    mean = math.exp(mu + sigma**2 / 2)
    if cap is None:
        return mean
    z = (math.log(cap) - mu) / sigma
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    return mean * phi(z - sigma) + cap * (1 - phi(z))


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
    use_reference: bool = True


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
    turns: PosInt = 1
    tool_latency_s: Distribution = Distribution(kind="fixed", value=1.0)
    cpu_per_call: PosFloat = 1.0
    tool_output_tokens: Annotated[int, Field(ge=0)] = 0


class Pipeline(Strict):
    mode: Literal["sync", "async"] = "sync"
    max_staleness: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _staleness(self) -> "Pipeline":
        if self.mode == "async" and self.max_staleness < 1:
            raise ValueError("async mode needs max_staleness >= 1")
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
    cluster: Cluster
    catalog: Catalog = Catalog()
    seed: int = 0

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

    @property
    def max_context(self) -> int:
        """Longest context a sample reaches: prompt + all turns' responses and tool outputs."""
        env = self.environment
        return int(self.lengths.prompt.max_value() + env.turns * self.lengths.response.max_value()
                   + (env.turns - 1) * env.tool_output_tokens)


# ------------------------------------------------------------------------------------ loading
def read_structured(path: str | Path) -> dict[str, Any]:
    """YAML or JSON file to a dict, or SpecError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such file")
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: "
                        f"{str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """The first error as `field.path: message (got value)`."""
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
    if e["type"] == "extra_forbidden":
        msg, shown = "unknown key", ""
    more = f" [+{len(err.errors()) - 1} more]" if len(err.errors()) > 1 else ""
    return f"{prefix}{loc}: {msg}{shown}{more}"


def job_from_dict(data: dict[str, Any], source: str = "job") -> Job:
    try:
        job = Job.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, f"{source}: ")) from None
    from placer.catalog import resolve  # checks names against the catalogs
    resolve(job, source)
    return job


def load_job(path: str | Path) -> Job:
    """Read and validate a job file (YAML or JSON); `cluster` may name a separate file."""
    data = read_structured(path)
    if isinstance(data.get("cluster"), str):
        cpath = Path(path).parent / data["cluster"]
        data = {**data, "cluster": read_structured(cpath)}
    return job_from_dict(data, str(path))


def dump_job(job: Job) -> dict[str, Any]:
    return job.model_dump(mode="json", exclude_defaults=False)
