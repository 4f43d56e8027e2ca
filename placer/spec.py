"""Job and cluster specifications: what the user writes in YAML, validated.

An RL post-training *job* names an algorithm (GRPO, PPO, RLOO), the models it trains and serves, the
batch, the length distributions of prompts and responses, an optional multi-turn environment, the
pipeline mode and the objective. A *cluster* is a set of *pools* of identical nodes plus the network
that joins them. Every model here is strict (unknown keys are errors) so that a typo never silently
falls back to a default; `load_job` turns validation failures into one `SpecError` that names the
field path and the bad value.

The *roles* an algorithm runs are derived here, not written by the user: see `Job.roles()`.

This module is the job model's public surface: `Job` and its `Catalog`, reading, checking across
sections and writing a job. The parts live in their own modules and are re-exported from here, so
callers import every name from `placer.spec`:
  placer.hardware     device types, pools, topology, the cluster and its size bounds
  placer.arch         `ModelArch`: a model's shape and its parameter, KV-cache and state counts
  placer.jobsections  algorithm, models, batch, lengths, environment, pipeline, tail policy,
                      precision
  placer.specerrors   pydantic errors as one line per mistake
  placer.specbase     the strict base model, bounded number types and `SpecError`
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError

from placer.arch import ModelArch, NonNegInt
from placer.current import CurrentPlacement
from placer.distributions import Distribution
from placer.fileio import atomic_write_text
from placer.hardware import (
    DEFAULT_STORAGE_GBS,
    MAX_CLUSTER_DEVICES,
    MAX_CLUSTER_NODES,
    Cluster,
    DeviceKind,
    DeviceType,
    Pool,
    Topology,
    check_cluster_size,
)
from placer.inputs import SpecErrors, load_json, load_yaml, read_text
from placer.jobsections import (
    Algorithm,
    Batch,
    Environment,
    Lengths,
    Models,
    Pipeline,
    Precision,
    TailPolicy,
)
from placer.linear_attention import LinearAttention
from placer.localdata import Dataset, anchor, expand_model_dirs
from placer.pins import Pins, check_pins
from placer.roles import Role
from placer.specbase import MAX_CONTEXT_TOKENS, PosFloat, PosInt, SpecError, Strict
from placer.specerrors import format_validation_error, validation_lines

__all__ = [
    # this module
    "Catalog", "Job", "check_tail_policy", "distributions", "dump_job", "job_from_dict",
    "load_job", "read_structured", "save_job",
    # placer.hardware
    "DEFAULT_STORAGE_GBS", "MAX_CLUSTER_DEVICES", "MAX_CLUSTER_NODES", "Cluster", "DeviceKind",
    "DeviceType", "Pool", "Topology", "check_cluster_size",
    # placer.arch
    "ModelArch", "NonNegInt",
    # placer.jobsections
    "Algorithm", "Batch", "Environment", "Lengths", "Models", "Pipeline", "Precision",
    "TailPolicy",
    # placer.specerrors
    "format_validation_error", "validation_lines",
    # the pieces the sections are made of
    "MAX_CONTEXT_TOKENS", "Distribution", "LinearAttention", "PosFloat", "PosInt", "SpecError",
    "Strict",
]


# ------------------------------------------------------------------------------------ the job
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
    precision: Precision = Field(Precision(), description="optional FP8 formats (Precision)")
    cluster: Cluster
    catalog: Catalog = Catalog()
    seed: Annotated[int, Field(strict=True, ge=0, le=2**63)] = 0
    data: Dataset | None = Field(None, description="JSONL or Parquet prompts with answers or "
                                 "unit tests (the executor's math or code reward; "
                                 "placer/localdata.py)")
    current: CurrentPlacement | None = Field(
        None, description="the placement the job runs today (placer import); placer compare "
                          "prices it as the baseline `current`")
    pin: Pins | None = Field(
        None, description="per-role layout pins the planner keeps to, e.g. {actor: {tp: 2, "
                          "dp: 2}} (placer/pins.py)")

    def roles(self) -> list[Role]:
        """Roles the algorithm runs, in a stable order."""
        out = [Role.ACTOR, Role.ROLLOUT]
        if self.models.use_reference:
            out.append(Role.REFERENCE)
        out.append(Role.REWARD)
        if self.algorithm is Algorithm.ppo:
            out.append(Role.CRITIC)
        if self.environment.kind != "none":
            out.append(Role.ENVIRONMENT)
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
    """YAML or JSON file to a dict, or SpecError naming the file (bounded and hostile-proof:
    `placer.inputs`)."""
    p = Path(path)
    text = read_text(p)
    data = load_json(text, str(p)) if p.suffix == ".json" else load_yaml(text, str(p))
    if data is None:
        raise SpecError(f"{p}: the file is empty (expected a mapping of keys)")
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def distributions(job: Job) -> list[tuple[str, Distribution]]:
    """Every distribution of a job with its field path."""
    return [("lengths.prompt", job.lengths.prompt), ("lengths.response", job.lengths.response),
            ("environment.tool_latency_s", job.environment.tool_latency_s)]


def _check_job(job: Job, source: str) -> list[str]:
    """Checks that need more than one field: replayed traces readable, contexts finite, tail
    policy budgets. Every failing check gives one line; [] when all pass."""
    out: list[str] = []
    for where, dist in distributions(job):
        if dist.kind != "empirical":
            continue
        try:
            dist.samples()
        except SpecError as e:
            out.append(f"{source}: {where}.path: {e}")
        except (OSError, UnicodeDecodeError) as e:
            out.append(f"{source}: {where}.path: cannot read {dist.path!r}: {_first_line(e)}")
    if out:  # the checks below draw on the distributions
        return out
    try:
        check_tail_policy(job, source)
    except SpecError as e:
        out.append(str(e))
    ctx = job.max_context_float()
    if not ctx <= MAX_CONTEXT_TOKENS:
        out.append(f"{source}: lengths: the longest context, prompt + turns x response + "
                   f"tool outputs, is {ctx:.3g} tokens, beyond {MAX_CONTEXT_TOKENS:,}")
    return out


def check_tail_policy(job: Job, source: str) -> None:
    """Budgets and deadlines below the mean would cut (or re-issue) the typical sample, not the
    tail: carried-over work would then grow every step (partial) or every call would run twice
    (reissue). Such a setting is an error, which also keeps the no-variance model unchanged."""
    tp, env = job.tail_policy, job.environment
    if tp.kind == "partial":
        # whole tokens per turn, as the simulator rounds a no-variance response
        mean = env.turns * math.ceil(job.lengths.response.mean_value())
        assert tp.token_budget is not None, "a partial tail policy has token_budget (validated)"
        if tp.token_budget < mean:
            raise SpecError(f"{source}: tail_policy.token_budget: below the mean response of a "
                            f"sample ({mean:.0f} tokens over {env.turns} turn(s)); carried-over "
                            f"work would grow every step (got {tp.token_budget})")
    if tp.kind == "reissue":
        if env.kind == "none" or env.turns < 2:
            raise SpecError(f"{source}: tail_policy.kind: reissue needs tool calls (an "
                            f"environment with turns >= 2) (got {tp.kind!r})")
        mean_s = env.tool_latency_s.mean_value()
        assert tp.deadline_s is not None, "a reissue tail policy has deadline_s (validated)"
        if tp.deadline_s < mean_s:
            raise SpecError(f"{source}: tail_policy.deadline_s: below the mean tool latency "
                            f"({mean_s:.3g} s); most calls would run twice (got {tp.deadline_s})")


def job_from_dict(data: dict[str, Any], source: str = "job") -> Job:
    """Validate a job; every mistake found is one line of one `SpecErrors` (field checks first,
    then, when the fields are sound, the checks across fields and the catalog's names)."""
    data = expand_model_dirs(data, source)  # models.<field>: {path: DIR} -> a catalog entry
    try:
        job = Job.model_validate(data)
    except ValidationError as e:
        raise SpecErrors(validation_lines(e, f"{source}: ", root=Job)) from None
    problems = _check_job(job, source) + check_pins(job, source)
    from placer.catalog import cpu_pools, devices_of, resolve  # lazy: the catalogs import this module
    try:
        resolve(job, source)  # checks the names
    except SpecErrors as e:
        problems += e.lines
    except SpecError as e:
        problems.append(str(e))
    job, more = cpu_pools(job, devices_of(job), source)
    problems += more
    if problems:
        raise SpecErrors(problems)
    return job


_DIST_PATHS = (("lengths", "prompt"), ("lengths", "response"), ("environment", "tool_latency_s"))


def _anchor_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Empirical distributions' relative paths, made relative to the job file's folder."""
    out = dict(data)
    for section, key in _DIST_PATHS:
        sec = out.get(section)
        if not isinstance(sec, dict):
            continue
        dist = sec.get(key)
        if (isinstance(dist, dict) and dist.get("kind") == "empirical"
                and isinstance(dist.get("path"), str) and not Path(dist["path"]).is_absolute()):
            out[section] = {**sec, key: {**dist, "path": str(base / dist["path"])}}
    return out


def load_job(path: str | Path) -> Job:
    """Read and validate a job file (YAML or JSON); `cluster` may name a separate file."""
    raw = read_structured(path)
    if isinstance(raw, dict) and {"roles", "slots", "job"} <= raw.keys():
        raise SpecError(f"{path}: this is a plan, not a job file: pass the job it was made from "
                        f"(the plan's `job` section), or use a command that reads plans")
    data = anchor(_anchor_paths(raw, Path(path).parent), Path(path).parent)
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
    data = dump_job(job)
    text = (json.dumps(data, indent=2) + "\n" if Path(path).suffix == ".json"
            else yaml.safe_dump(data, sort_keys=False))
    atomic_write_text(path, text)
