"""Hardware and model catalogs: the shipped YAML files plus a job's own `catalog:` entries.

Each shipped entry cites its source. A job may add device types and model architectures (or
override a shipped one by name) in its `catalog:` section; `Resolved` is the job with every name
looked up, which is what the cost model and the planner work from.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from placer.roles import Role
from placer.spec import Cluster, DeviceKind, DeviceType, Job, ModelArch, Pool, SpecError

_HERE = Path(__file__).parent


@lru_cache(maxsize=1)
def shipped_devices() -> dict[str, DeviceType]:
    data = yaml.safe_load((_HERE / "devices.yaml").read_text())
    return {d["name"]: DeviceType.model_validate(d) for d in data["devices"]}


@lru_cache(maxsize=1)
def shipped_models() -> dict[str, ModelArch]:
    data = yaml.safe_load((_HERE / "models.yaml").read_text())
    return {m["name"]: ModelArch.model_validate(m) for m in data["models"]}


@dataclass(frozen=True)
class Resolved:
    """A job with its device types and model architectures looked up."""

    job: Job
    devices: dict[str, DeviceType]
    models: dict[str, ModelArch]

    def device_of(self, pool: Pool | str) -> DeviceType:
        p = self.job.cluster.pool(pool) if isinstance(pool, str) else pool
        return self.devices[p.device]

    def model_of(self, role: str) -> ModelArch | None:
        """The architecture a role runs (None for rule rewards and environments)."""
        m = self.job.models
        names: dict[str, str | None] = {
            Role.ACTOR: m.policy, Role.ROLLOUT: m.policy, Role.REFERENCE: m.reference or m.policy,
            Role.REWARD: None if m.reward == "rule" else m.reward,
            Role.CRITIC: m.critic or (m.reward if m.reward != "rule" else m.policy)}
        name = names.get(role)
        return self.models[name] if name else None

    def arch_of(self, role: str) -> ModelArch:
        """`model_of` for a role that runs a model (not a rule reward nor the environment)."""
        m = self.model_of(role)
        assert m is not None, f"{role}: runs no model"
        return m

    @property
    def cluster(self) -> Cluster:
        return self.job.cluster


def resolve(job: Job, source: str = "job") -> Resolved:
    """Look up every name the job uses; SpecError naming the field on the first unknown one."""
    devices = {**shipped_devices(), **{d.name: d for d in job.catalog.devices}}
    models = {**shipped_models(), **{m.name: m for m in job.catalog.models}}
    for i, p in enumerate(job.cluster.pools):
        if p.device not in devices:
            raise SpecError(f"{source}: cluster.pools.{i}.device: unknown device type "
                            f"{p.device!r}; known: {', '.join(sorted(devices))} (or add it under "
                            "catalog.devices)")
        dom = p.nvlink_domain
        if dom is not None and dom % p.devices_per_node and p.devices_per_node % dom:
            raise SpecError(f"{source}: cluster.pools.{i}.nvlink_domain: {dom} does not align with "
                            f"devices_per_node {p.devices_per_node}")
    m = job.models
    for field in ("policy", "reference", "reward", "critic"):
        name = getattr(m, field)
        if name is None or (field == "reward" and name == "rule"):
            continue
        if name not in models:
            raise SpecError(f"{source}: models.{field}: unknown model {name!r}; known: "
                            f"{', '.join(sorted(models))} (or add it under catalog.models)")
    if m.critic is not None and job.algorithm.value != "ppo":
        raise SpecError(f"{source}: models.critic: only PPO has a critic (algorithm is "
                        f"{job.algorithm.value!r})")
    if job.algorithm.value in ("grpo", "rloo") and job.batch.samples_per_prompt < 2:
        raise SpecError(f"{source}: batch.samples_per_prompt: {job.algorithm.value} compares "
                        f"samples of one prompt and needs >= 2 (got "
                        f"{job.batch.samples_per_prompt})")
    if job.batch.samples % job.batch.mini_batches:
        raise SpecError(f"{source}: batch.mini_batches: {job.batch.mini_batches} does not divide "
                        f"the {job.batch.samples} samples (prompts x samples_per_prompt)")
    if job.environment.kind == "none" and job.environment.turns > 1:
        raise SpecError(f"{source}: environment.turns: {job.environment.turns} turns need an "
                        "environment between them; set environment.kind to 'tool' or 'code'")
    return Resolved(job, devices, models)


def pools_of_kind(res: Resolved, kind: DeviceKind) -> list[Pool]:
    return [p for p in res.cluster.pools if res.devices[p.device].kind is kind]
