"""Hardware and model catalogs: the shipped YAML files plus a job's own `catalog:` entries.

Each shipped entry cites its source. A job may add device types and model architectures (or
override a shipped one by name) in its `catalog:` section; `Resolved` is the job with every name
looked up, which is what the cost model and the planner work from.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from placer.base.errors import Infeasible, SpecError
from placer.base.inputs import SpecErrors
from placer.base.roles import Role
from placer.spec.agents import model_names
from placer.spec.arch import ModelArch
from placer.spec.hardware import Cluster, DeviceKind, DeviceType, Pool, check_cluster_size
from placer.spec.job import Job
from placer.spec.localdata import MODEL_FIELDS
from placer.spec.names import did_you_mean, model_hint, suggest_device, suggest_model
from placer.spec.vision import with_image_tokens

_HERE = Path(__file__).parent


@lru_cache(maxsize=1)
def shipped_devices() -> dict[str, DeviceType]:
    data = yaml.safe_load((_HERE / "devices.yaml").read_text())
    return {d["name"]: DeviceType.model_validate(d) for d in data["devices"]}


@lru_cache(maxsize=1)
def shipped_models() -> dict[str, ModelArch]:
    data = yaml.safe_load((_HERE / "models.yaml").read_text())
    return {m["name"]: ModelArch.model_validate(m) for m in data["models"]}


def pool_scaleup(pool: Pool) -> int | None:
    """The devices a collective group on `pool` may span and stay on NVLink
    (`DeviceType.scaleup_devices`), where the pool declares its `nvlink_domain`: the domain
    when the whole pool fits one (a GB200 NVL72 rack of 72, the pool 64 of them: every group of
    every layout is inside it, whatever the rank order), else one node. Over several domains
    a group wider than a node may cross from one to another, because the frameworks order
    ranks by node, not by rack: NeMo-RL v0.6.0 sorts its placement group's bundles by Ray
    node ID, then GPU (nemo_rl/distributed/virtual_cluster.py `_get_sorted_bundle_indices`,
    commit 5fb588932bf835506a8a5bac01de4f8c7ab0a065), a random ID, and Megatron-Core lays its
    groups over that rank order; a synchronous step waits for its slowest group, and among
    many groups some straddle two racks. None where the pool declares no domain."""
    dom = pool.nvlink_domain
    if dom is None:
        return None
    return dom if pool.devices_per_node * pool.nodes <= dom else pool.devices_per_node


def pool_host(pool: Pool) -> int | None:
    """The devices of one host of `pool` (`DeviceType.host_devices`) where the pool declares an
    NVLink domain wider than a host (a GB200 NVL72 rack of 4-GPU compute trays): the scale-up
    link reaches past the host, but what needs one host (vLLM's custom all-reduce: its IPC
    buffers) does not. None where the pool declares no domain (a node is both)."""
    return pool.devices_per_node if pool.nvlink_domain is not None else None


@lru_cache(maxsize=256)
def _with_scaleup(dev: DeviceType, scaleup: int | None, host: int | None = None) -> DeviceType:
    """`dev` with a pool's `scaleup_devices` and `host_devices` (one object per triple, so that
    the pricing caches that key on a device's identity keep hitting); the device type itself
    where the pool declares no NVLink domain."""
    if (scaleup is None or scaleup == dev.scaleup_devices) and (
            host is None or host == dev.host_devices):
        return dev
    update: dict[str, int] = {}
    if scaleup is not None:
        update["scaleup_devices"] = scaleup
    if host is not None:
        update["host_devices"] = host
    return dev.model_copy(update=update)


@dataclass(frozen=True)
class Resolved:
    """A job with its device types and model architectures looked up."""

    job: Job
    devices: dict[str, DeviceType]
    models: dict[str, ModelArch]

    def device_of(self, pool: Pool | str) -> DeviceType:
        """The pool's device type, with the devices its collectives reach on NVLink where the
        pool declares an NVLink domain (`pool_scaleup`), and the devices of one of its hosts
        (`pool_host`)."""
        p = self.job.cluster.pool(pool) if isinstance(pool, str) else pool
        return _with_scaleup(self.devices[p.device], pool_scaleup(p), pool_host(p))

    def model_of(self, role: str) -> ModelArch | None:
        """The architecture a role runs (None for rule rewards and environments); an agent's
        role (`AGENT.ROLE`) runs its agent's."""
        agents = self.job.agents
        if agents is not None and "." in role:
            return self._agent_model(role)
        m = self.job.models
        names: dict[str, str | None] = {
            Role.ACTOR: m.policy, Role.ROLLOUT: m.policy, Role.REFERENCE: m.reference or m.policy,
            Role.REWARD: None if m.reward == "rule" else m.reward,
            Role.CRITIC: m.critic or (m.reward if m.reward != "rule" else m.policy)}
        name = names.get(role)
        return self.models[name] if name else None

    def _agent_model(self, role: str) -> ModelArch | None:
        agent, _, base = role.partition(".")
        assert self.job.agents is not None
        a = self.job.agents.members[agent]
        names = {Role.ACTOR: a.policy, Role.ROLLOUT: a.policy,
                 Role.REFERENCE: a.reference or a.policy,
                 Role.REWARD: None if a.reward in ("rule", "none") else a.reward}
        name = names.get(Role(base))
        return self.models[name] if name else None

    def arch_of(self, role: str) -> ModelArch:
        """`model_of` for a role that runs a model (not a rule reward nor the environment)."""
        m = self.model_of(role)
        assert m is not None, f"{role}: runs no model"
        return m

    @property
    def cluster(self) -> Cluster:
        return self.job.cluster

    def with_samples(self, n: int) -> Resolved:
        """The job with a batch of `n` samples (one per prompt): what one part of a role split
        over pools generates (`placer.cost.split`)."""
        batch = self.job.batch.model_copy(update={"prompts": n, "samples_per_prompt": 1})
        return replace(self, job=self.job.model_copy(update={"batch": batch}))


def devices_of(job: Job) -> dict[str, DeviceType]:
    """The device types a job may name: the shipped ones, overridden or extended by its own."""
    return {**shipped_devices(), **{d.name: d for d in job.catalog.devices}}


def unknown_names(devices_used: list[tuple[str, str]], models_used: list[tuple[str, str]],
                  devices: Collection[str], models: Mapping[str, str], source: str) -> list[str]:
    """One line per name the catalog lacks, naming its field and value with the closest entries
    (`placer.spec.names`). `devices_used` and `models_used` are (field path, name) pairs;
    `devices` the device type names a job may use, `models` its model entries (name -> source,
    for the Hugging Face repository a name may be spelt as)."""
    known = sorted(devices)
    bad = [f"{source}: {where}: unknown device type {name!r}"
           f"{did_you_mean(suggest_device(name, known))}; known: {', '.join(known)} (or add it "
           "under catalog.devices)" for where, name in devices_used if name not in devices]
    bad += [f"{source}: {where}: unknown model {name!r}"
            f"{did_you_mean(suggest_model(name, models), model_hint(name))}; known: "
            f"{', '.join(sorted(models))} (or add it under catalog.models)"
            for where, name in models_used if name not in models]
    return bad


def names_used(job: Job) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(field path, name) of every device type and model a job names."""
    devices = [(f"cluster.pools.{i}.device", p.device) for i, p in enumerate(job.cluster.pools)]
    models = [(f"models.{field}", name) for field in MODEL_FIELDS
              if (name := getattr(job.models, field)) is not None
              and not (field == "reward" and name == "rule")]
    if job.agents is not None:  # `models` repeats the first agent's: its own fields name it
        models = model_names(job.agents) + [m for m in models if m[0] == "models.critic"]
    return devices, models


def _entries(data: Any, key: str) -> list[Any]:
    """`data[key]` when data is a mapping holding a list there, else []."""
    found = data.get(key) if isinstance(data, dict) else None
    return found if isinstance(found, list) else []


def unknown_names_in(data: object, source: str, reported: Collection[str]) -> list[str]:
    """`unknown_names` for a job whose fields failed validation, read from its raw mapping, so
    an unknown name is reported in the same pass as the schema's errors. Only names written as
    text are looked up (another value is the schema's error), none at a field path in `reported`
    (the schema's own lines); the job's catalog entries count by their names, whatever else is
    wrong with them."""
    if not isinstance(data, dict):  # not a mapping at all: the schema's one line says so
        return []
    pools = _entries(data.get("cluster"), "pools")
    devices_used = [(f"cluster.pools.{i}.device", p["device"]) for i, p in enumerate(pools)
                    if isinstance(p, dict) and isinstance(p.get("device"), str)]
    given = data.get("models")
    models_used = [(f"models.{field}", given[field]) for field in MODEL_FIELDS
                   if isinstance(given, dict) and isinstance(given.get(field), str)
                   and not (field == "reward" and given[field] == "rule")]
    catalog = data.get("catalog")
    own_devices = {d["name"] for d in _entries(catalog, "devices")
                   if isinstance(d, dict) and isinstance(d.get("name"), str)}
    own_models = {m["name"]: str(m.get("source") or "") for m in _entries(catalog, "models")
                  if isinstance(m, dict) and isinstance(m.get("name"), str)}
    models = {**{n: m.source for n, m in shipped_models().items()}, **own_models}
    return unknown_names([u for u in devices_used if u[0] not in reported],
                         [u for u in models_used if u[0] not in reported],
                         {*shipped_devices(), *own_devices}, models, source)


def resolve(job: Job, source: str = "job") -> Resolved:
    """Look up every name the job uses; one SpecErrors with a line per unknown name or
    inconsistent choice (all of them, not only the first)."""
    devices = devices_of(job)
    models = {**shipped_models(), **{m.name: m for m in job.catalog.models}}
    bad = unknown_names(*names_used(job), devices,
                        {name: m.source for name, m in models.items()}, source)
    for i, p in enumerate(job.cluster.pools):
        dom = p.nvlink_domain
        if dom is not None and dom % p.devices_per_node and p.devices_per_node % dom:
            bad.append(f"{source}: cluster.pools.{i}.nvlink_domain: {dom} does not align with "
                       f"devices_per_node {p.devices_per_node}")
    m = job.models
    if m.critic is not None and job.algorithm.value != "ppo":
        bad.append(f"{source}: models.critic: only PPO has a critic (algorithm is "
                   f"{job.algorithm.value!r})")
    if job.algorithm.value in ("grpo", "rloo") and job.batch.samples_per_prompt < 2:
        bad.append(f"{source}: batch.samples_per_prompt: {job.algorithm.value} compares "
                   f"samples of one prompt and needs >= 2 (got "
                   f"{job.batch.samples_per_prompt})")
    if job.batch.samples % job.batch.mini_batches:
        bad.append(f"{source}: batch.mini_batches: {job.batch.mini_batches} does not divide "
                   f"the {job.batch.samples} samples (prompts x samples_per_prompt)")
    if job.environment.kind == "none" and job.environment.turns > 1:
        bad.append(f"{source}: environment.turns: {job.environment.turns} turns need an "
                   "environment between them; set environment.kind to 'tool' or 'code'")
    policy = models.get(m.policy)
    if job.lengths.images_per_prompt and policy is not None and policy.vision is None:
        bad.append(f"{source}: lengths.images_per_prompt: {job.lengths.images_per_prompt} "
                   f"images need a vision-language policy; {m.policy!r} has no vision encoder")
    if bad:
        raise SpecErrors(bad)
    if policy is not None:  # the prompts' image tokens counted in their length
        lengths = with_image_tokens(job.lengths, policy.vision)
        job = job if lengths is job.lengths else job.model_copy(update={"lengths": lengths})
    return Resolved(job, devices, models)


# A CPU node beyond this many cores is a unit mistake (devices_per_node given as cores), not a
# machine: the largest two-socket servers have 384 cores (768 hardware threads).
MAX_CPU_NODE_CORES = 1024
# devices_per_node equal to the device's own core count reads as cores when that count is this
# large (64 devices of 64 cores); two 2-core devices per node is a plain small node.
CORES_READ_AS_COUNT = 8


def cpu_pools(job: Job, devices: dict[str, DeviceType], source: str) -> tuple[Job, list[str]]:
    """A CPU pool's unit made explicit. Its device is a whole CPU (the device type's `cores`
    cores, e.g. cpu-node: one 64-core node), so `devices_per_node` counts those, not cores; a
    pool may give `cores_per_node` instead (devices_per_node = cores_per_node / cores) or both
    (they must agree). A count that reads as cores (equal to the device's own `cores` of at least
    CORES_READ_AS_COUNT, or a node beyond MAX_CPU_NODE_CORES cores) is refused unless
    `cores_per_node` confirms it. Returns the
    job with each CPU pool's devices_per_node derived, and one line per mistake."""
    out: list[str] = []
    pools = []
    for i, p in enumerate(job.cluster.pools):
        dev, where = devices.get(p.device), f"{source}: cluster.pools.{i}"
        if dev is None:  # an unknown device: `resolve` names it
            pools.append(p)
            continue
        if dev.kind is not DeviceKind.cpu:
            if p.cores_per_node is not None:
                out.append(f"{where}.cores_per_node: applies to CPU pools only ({p.device} is "
                           f"a {dev.kind.value}; give devices_per_node) (got {p.cores_per_node})")
            pools.append(p)
            continue
        if p.cores_per_node is not None:
            n, rest = divmod(p.cores_per_node, dev.cores)
            if rest or n == 0:
                out.append(f"{where}.cores_per_node: not a whole number of {p.device} devices "
                           f"({dev.cores} cores each); add a device type with these cores "
                           f"under catalog.devices (got {p.cores_per_node})")
            elif p.devices_given and n != p.devices_per_node:
                out.append(f"{where}.devices_per_node: {p.devices_per_node} {p.device} devices "
                           f"of {dev.cores} cores are {p.devices_per_node * dev.cores} cores, "
                           f"not cores_per_node {p.cores_per_node} (give one of the two)")
            else:
                p = p.model_copy(update={"devices_per_node": n})
        elif p.devices_per_node > 1 and (
                p.devices_per_node == dev.cores >= CORES_READ_AS_COUNT
                or p.devices_per_node * dev.cores > MAX_CPU_NODE_CORES):
            out.append(f"{where}.devices_per_node: a CPU pool counts whole {p.device} devices of "
                       f"{dev.cores} cores each, so this is {p.devices_per_node * dev.cores:,} "
                       f"cores per node; to give cores write cores_per_node: "
                       f"{p.devices_per_node} (or devices_per_node: 1 for one {dev.cores}-core "
                       f"device per node) (got {p.devices_per_node})")
        pools.append(p)
    if out or all(a is b for a, b in zip(pools, job.cluster.pools)):
        return job, out
    try:  # the derived counts, bounded like given ones (the cluster checked placeholders)
        check_cluster_size({p.name: (p.nodes, p.devices_per_node) for p in pools})
    except ValueError as e:
        return job, [f"{source}: cluster: {e}"]
    cluster = job.cluster.model_copy(update={"pools": pools})
    return job.model_copy(update={"cluster": cluster}), []


def pools_of_kind(res: Resolved, kind: DeviceKind) -> list[Pool]:
    return [p for p in res.cluster.pools if res.devices[p.device].kind is kind]


def with_nodes(job: Job, nodes: dict[str, int], source: str = "job") -> Resolved:
    """The job on a changed cluster: `nodes` gives the new node count of some pools (0: gone)."""
    names = {p.name for p in job.cluster.pools}
    for name, n in nodes.items():
        if name not in names:
            raise SpecError(f"{source}: no pool {name!r} in the cluster (pools: "
                            f"{', '.join(sorted(names))})")
        if n < 0:
            raise SpecError(f"{source}: pool {name} would have {n} nodes (it has "
                            f"{job.cluster.pool(name).nodes})")
    # a pool that lost every node is gone; roles that only it could host make the job infeasible
    pools = [p.model_copy(update={"nodes": nodes.get(p.name, p.nodes)}) for p in job.cluster.pools
             if nodes.get(p.name, p.nodes) > 0]
    if not pools:
        raise Infeasible("the cluster has no nodes left")
    cluster = job.cluster.model_copy(update={"pools": pools})
    return resolve(job.model_copy(update={"cluster": cluster}), source)
