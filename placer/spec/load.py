"""Reading, checking and writing job files.

`load_job` reads YAML or JSON (bounded and hostile-proof: `placer.base.inputs`), validates it as a
`Job`, then runs the checks that span sections (replayed traces readable, contexts finite, tail
policy budgets, pins, the catalog's names). Every mistake found is one line of one `SpecErrors`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.base.inputs import SpecErrors, load_json, load_yaml, read_text
from placer.spec.agents import check_agents
from placer.spec.base import MAX_CONTEXT_TOKENS
from placer.spec.catalog import cpu_pools, devices_of, resolve, unknown_names_in
from placer.spec.errorlines import validation_lines
from placer.spec.job import Job, distributions
from placer.spec.judge import check_judge
from placer.spec.localdata import anchor, expand_model_dirs


def check_pins(job: Job, source: str) -> list[str]:
    """What the pin model alone cannot check: every pinned role is one the job runs, every
    pinned pool is in the cluster. One line per mistake, naming the field and the value."""
    if job.pin is None:
        return []
    out = []
    runs = job.roles()
    pools = [p.name for p in job.cluster.pools]
    for role, pin in job.pin.items():
        if role not in runs:
            out.append(f"{source}: pin.{role}: the job runs no {role} (its roles: "
                       f"{', '.join(runs)}) (got {pin.describe()!r})")
        if pin.pool is not None and pin.pool not in pools:
            out.append(f"{source}: pin.{role}.pool: no pool {pin.pool!r} in the cluster "
                       f"(pools: {', '.join(pools)}) (got {pin.pool!r})")
        for name in pin.avoid or []:
            if name not in pools:
                out.append(f"{source}: pin.{role}.avoid: no pool {name!r} in the cluster "
                           f"(pools: {', '.join(pools)}) (got {name!r})")
    return out


# ------------------------------------------------------------------------------------ loading
def read_structured(path: str | Path) -> dict[str, Any]:
    """YAML or JSON file to a dict, or SpecError naming the file (bounded and hostile-proof:
    `placer.base.inputs`)."""
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


def _check_job(job: Job, source: str) -> list[str]:
    """Checks that need more than one field: replayed traces readable, contexts finite, tail
    policy budgets, a KL term with its reference. Every failing check gives one line; [] when
    all pass."""
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
    if job.kl.coef > 0 and job.agents is None and not job.models.use_reference:
        out.append(f"{source}: kl.coef: a KL penalty is to the reference model, which "
                   f"models.use_reference: false leaves out (set kl.coef: 0 or drop "
                   f"use_reference: false) (got {job.kl.coef})")
    return out + check_judge(job.models.reward, job.reward_model, ctx, source)


def check_agent_job(job: Job, source: str) -> list[str]:
    """A multi-agent job's graph (`placer.spec.agents.check_agents`) and what it cannot combine
    with yet: between its turns the agents read each other, not a tool, and its rewards are
    each agent's own. [] for a single-policy job."""
    if job.agents is None:
        return []
    out = check_agents(job.agents, source)
    first = job.agents.members.get(job.agents.first())
    if first is not None and job.models.policy != first.policy:
        out.append(f"{source}: models.policy: {job.models.policy!r} is not the first turn's "
                   f"agent's policy ({job.agents.first()!r} runs {first.policy!r}); a "
                   "multi-agent job may leave models out")
    if job.environment.kind != "none" or job.environment.turns != 1:
        out.append(f"{source}: environment.kind: a multi-agent job's turns are its agents' "
                   f"(agents.turns), not tool calls (got kind {job.environment.kind!r}, turns "
                   f"{job.environment.turns})")
    if job.reward_model is not None:
        out.append(f"{source}: reward_model: a multi-agent job names each agent's reward "
                   "(agents.members.NAME.reward); drop reward_model")
    if job.algorithm.value == "ppo":
        out.append(f"{source}: algorithm: a multi-agent job trains its agents with grpo or rloo "
                   "(no per-agent critic), got 'ppo'")
    tails = job.tail_policy.mechanism
    if tails.carries_over or tails.tool_deadline_s is not None:
        out.append(f"{source}: tail_policy.kind: a multi-agent job cuts its long tail by "
                   f"over-provisioning or not at all (got {job.tail_policy.kind!r}): a partial "
                   "rollout or a re-issued call would cut one agent's turns mid-episode")
    if job.pin is not None:
        out.append(f"{source}: pin: a multi-agent job's roles are pinned by AGENT.ROLE, which "
                   "pins do not name yet; drop pin")
    if job.current is not None or job.framework is not None:
        field = "current" if job.current is not None else "framework"
        out.append(f"{source}: {field}: a multi-agent job is planned for placer's own runner; "
                   f"drop {field}")
    return out


def check_tail_policy(job: Job, source: str) -> None:
    """Budgets and deadlines below the mean would cut (or re-issue) the typical sample, not the
    tail: carried-over work would then grow every step (partial) or every call would run twice
    (reissue). Such a setting is an error, which also keeps the no-variance model unchanged
    (each policy's `check`, `placer.spec.tailpolicy`)."""
    job.tail_policy.mechanism.check(job.lengths, job.environment, source)


def job_from_dict(data: dict[str, Any], source: str = "job") -> Job:
    """Validate a job; every mistake found is one line of one `SpecErrors` (field checks first,
    the catalog's names with them; when the fields are sound, the checks across fields)."""
    data = expand_model_dirs(data, source)  # models.<field>: {path: DIR} -> a catalog entry
    try:
        job = Job.model_validate(data)
    except ValidationError as e:  # the names too: every mistake in one pass
        reported = {".".join(str(x) for x in err["loc"]) for err in e.errors()}
        raise SpecErrors(validation_lines(e, f"{source}: ", root=Job)
                         + unknown_names_in(data, source, reported)) from None
    problems = (check_agent_job(job, source) or _check_job(job, source)) + check_pins(job, source)
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


# Optional fields written only when set, so that jobs without them dump (and plan) as before:
# (key, value it is left out at), wherever the key appears in the job's document.
_OMIT_AT_DEFAULT = (("reward_model", None), ("vision", None), ("images_per_prompt", 0),
                    ("offset", 0.0))


def dump_job(job: Job) -> dict[str, Any]:
    data: dict[str, Any] = _omit_defaults(job.model_dump(mode="json", exclude_defaults=False))
    return data


def _omit_defaults(doc: Any) -> Any:
    if isinstance(doc, list):
        return [_omit_defaults(x) for x in doc]
    if not isinstance(doc, dict):
        return doc
    return {k: _omit_defaults(v) for k, v in doc.items()
            if not any(k == key and v == at and type(v) is type(at)
                       for key, at in _OMIT_AT_DEFAULT)}


def save_job(job: Job, path: str | Path) -> None:
    """Write a job as YAML, or JSON when the name ends in .json (atomically)."""
    data = dump_job(job)
    text = (json.dumps(data, indent=2) + "\n" if Path(path).suffix == ".json"
            else yaml.safe_dump(data, sort_keys=False))
    atomic_write_text(path, text)
