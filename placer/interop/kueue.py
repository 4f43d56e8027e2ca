"""A fleet's allocation as Kueue queues and one KubeRay RayJob per job.

    placer fleet FLEET.yaml --export kueue DIR [--image IMAGE] [--namespace NS] [--steps N]

Written (Kueue API kueue.x-k8s.io/v1beta2, as in kubernetes-sigs/kueue
config/components/crd/bases at commit ff69552, v0.20.0-devel):
  resourceflavors.yaml  one ResourceFlavor per pool; its nodeLabels are the pool's nodes'
                        `placer.dev/device` (the label the RayJobs' pods select, see
                        `placer.interop.kuberay`) and `placer.dev/pool`;
  clusterqueues.yaml    one ClusterQueue per team: `cohortName`, and per pool it has a quota on,
                        nominalQuota and borrowingLimit (the fleet's nodes times the pool's
                        devices per node): `nvidia.com/gpu` for GPU pools in one resource group,
                        `cpu` and `memory` for CPU pools in another, so a GPU worker's pod set
                        takes a GPU flavor and a CPU worker's (and the Ray head's) a CPU flavor;
  localqueues.yaml      one LocalQueue per team in the namespace, pointing at its ClusterQueue;
  jobs/NAME-rayjob.yaml and jobs/NAME-plan-configmap.yaml
                        each job's RayJob (`placer.interop.kuberay`, its RayCluster sized by the
                        job's plan on its allocated nodes), labelled `kueue.x-k8s.io/queue-name`
                        with its team's LocalQueue and created suspended: Kueue unsuspends it when
                        it admits it;
  shared/POOL-engines-raycluster.yaml
                        per shared rollout pool (`placer.fleet.rolloutpool`), one suspended
                        RayCluster of the engines' nodes (its pool's worker group, the size the
                        allocation gave the group), labelled with the charged team's LocalQueue:
                        Kueue admits and counts the engines once, and the members' RayJobs leave
                        that group out. `placer execute` runs a job's rollout inside its own Ray
                        cluster, so the members cannot reach the shared engines yet: a warning
                        says so.
What Kueue cannot account is a warning: an LPU pool (no Kubernetes resource; its nodes are held by
the plan alone) and a team with jobs but no CPU quota (the Ray head's 2 CPUs need one).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from placer.fleet.result import FleetResult
from placer.fleet.spec import Fleet
from placer.interop.common import Export
from placer.interop.kuberay import (
    DEFAULT_IMAGE,
    DEVICE_LABEL,
    POOL_LABEL,
    dns_name,
    export_kuberay,
    label_value,
)
from placer.spec.catalog import resolve
from placer.spec.hardware import DeviceKind, DeviceType, Pool

API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MANAGED = {"app.kubernetes.io/managed-by": "placer"}


def _dump_all(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, width=100)


def _quantities(pool: Pool, dev: DeviceType, nodes: int) -> dict[str, str] | None:
    """The Kubernetes resources `nodes` nodes of the pool provide; None: none Kueue can count."""
    if dev.kind is DeviceKind.gpu:
        return {"nvidia.com/gpu": str(nodes * pool.devices_per_node)}
    if dev.kind is DeviceKind.cpu:
        return {"cpu": str(nodes * dev.cores * pool.devices_per_node),
                "memory": f"{int(nodes * dev.memory_gb * pool.devices_per_node)}Gi"}
    return None


def flavor_name(pool: Pool) -> str:
    return dns_name(pool.name, 63)


def name_clashes(fleet: Fleet, source: str) -> list[str]:
    """One line per team, pool or job whose Kubernetes name (a DNS-1123 label, cut as the
    export cuts it) is another's: in the export one would overwrite the other's file and
    object (`a_b` and `a.b` are both `a-b`). Checked before the fleet is planned."""
    kinds: list[tuple[str, list[str], Callable[[str], str]]] = [
        ("teams", list(fleet.teams), dns_name),
        ("cluster.pools", [p.name for p in fleet.cluster.pools], lambda n: dns_name(n, 50)),
        ("jobs", [j.name for j in fleet.jobs], lambda n: dns_name(f"placer-{n}", 40))]
    out = []
    for field, names, k8s in kinds:
        seen: dict[str, str] = {}
        for name in names:
            first = seen.setdefault(k8s(name), name)
            if first != name:
                out.append(f"{source}: {field}: {first!r} and {name!r} are both {k8s(name)!r} "
                           f"as Kubernetes names in the Kueue export; rename one (got {name!r})")
    return out


def export_kueue(fleet: Fleet, result: FleetResult, image: str = DEFAULT_IMAGE,
                 namespace: str = "default", steps: int = 5) -> Export:
    res = resolve(fleet.jobs[0].job)  # the fleet's cluster with its device types
    devices = {p.name: res.device_of(p) for p in res.cluster.pools}
    pools = {p.name: p for p in res.cluster.pools}
    warn = [f"pool {name}: {dev.kind.value} devices are no Kubernetes resource Kueue can "
            "count; its nodes are held by the plans alone" for name, dev in devices.items()
            if _quantities(pools[name], dev, 1) is None]
    flavors = [{"apiVersion": API, "kind": "ResourceFlavor",
                "metadata": {"name": flavor_name(p), "labels": MANAGED},
                "spec": {"nodeLabels": {DEVICE_LABEL: label_value(devices[p.name].name),
                                        POOL_LABEL: label_value(p.name)}}}
               for p in res.cluster.pools]
    queues, local = [], []
    for team in fleet.teams:
        cq, missing_cpu = _cluster_queue(fleet, team, pools, devices)
        queues.append(cq)
        if missing_cpu and any(j.team == team for j in fleet.jobs):
            warn.append(f"team {team}: no CPU pool quota; Kueue cannot admit its RayJobs' Ray "
                        "head (2 CPUs, 8Gi)")
        local.append({"apiVersion": API, "kind": "LocalQueue",
                      "metadata": {"name": dns_name(team), "namespace": namespace,
                                   "labels": MANAGED},
                      "spec": {"clusterQueue": dns_name(team)}})
    files = {"resourceflavors.yaml": _dump_all(flavors),
             "clusterqueues.yaml": _dump_all(queues), "localqueues.yaml": _dump_all(local)}
    engines: dict[str, dict[str, Any]] = {}
    for job in result.jobs:
        ray = export_kuberay(job.plan, image=image, steps=steps)
        warn += [w for w in ray.warnings if w not in warn]
        rayjob = yaml.safe_load(ray.files["rayjob.yaml"])
        if job.rollout_pool is not None:
            cluster = yaml.safe_load(ray.files["raycluster.yaml"])
            _leave_out_engines(rayjob, cluster, job.rollout_pool, engines)
        rayjob["metadata"]["namespace"] = namespace
        rayjob["metadata"]["labels"] = {**rayjob["metadata"]["labels"],
                                        QUEUE_LABEL: dns_name(job.team)}
        rayjob["spec"]["suspend"] = True
        cm = yaml.safe_load(ray.files["plan-configmap.yaml"])
        cm["metadata"]["namespace"] = namespace
        base = dns_name(job.name)
        files[f"jobs/{base}-rayjob.yaml"] = yaml.safe_dump(rayjob, sort_keys=False, width=100)
        files[f"jobs/{base}-plan-configmap.yaml"] = yaml.safe_dump(cm, sort_keys=False, width=100)
    for use in result.engines:
        files[f"shared/{dns_name(use.pool)}-engines-raycluster.yaml"] = yaml.safe_dump(
            _engines_cluster(engines[use.pool], use.pool, use.team, namespace), sort_keys=False,
            width=100)
        members = ", ".join(m.job for m in use.members)
        warn.append(f"shared rollout engines on pool {use.pool} ({members}): their "
                    "RayCluster is admitted and counted once; `placer execute` runs a job's "
                    "rollout in its own Ray cluster, so the members' RayJobs cannot reach the "
                    "shared engines: serve them with an engine that takes weights from several "
                    "trainers")
    command = ("kubectl apply -f resourceflavors.yaml -f clusterqueues.yaml -f localqueues.yaml "
               "&& kubectl apply -f jobs/" + (" -f shared/" if result.engines else ""))
    return Export("kueue", files, command, warn)


def _leave_out_engines(rayjob: dict[str, Any], cluster: dict[str, Any], pool: str,
                       engines: dict[str, dict[str, Any]]) -> None:
    """A shared rollout pool's member: its RayJob without the engines' worker group, which the
    pool's one RayCluster holds (kept from the first member's cluster in `engines`)."""
    name = dns_name(pool, 50)
    spec = rayjob["spec"]["rayClusterSpec"]
    spec["workerGroupSpecs"] = [g for g in spec["workerGroupSpecs"] if g["groupName"] != name]
    if pool not in engines:
        cluster["spec"]["workerGroupSpecs"] = [g for g in cluster["spec"]["workerGroupSpecs"]
                                               if g["groupName"] == name]
        engines[pool] = cluster


def _engines_cluster(cluster: dict[str, Any], pool: str, team: str, namespace: str
                     ) -> dict[str, Any]:
    """The shared engines' RayCluster, queued on the charged team's LocalQueue (suspended until
    Kueue admits it)."""
    return {"apiVersion": cluster["apiVersion"], "kind": "RayCluster",
            "metadata": {"name": dns_name(f"placer-shared-{pool}-engines"),
                         "namespace": namespace,
                         "labels": {**MANAGED, QUEUE_LABEL: dns_name(team)}},
            "spec": {**cluster["spec"], "suspend": True}}


def _cluster_queue(fleet: Fleet, team: str, pools: dict[str, Pool],
                   devices: dict[str, DeviceType]) -> tuple[dict[str, Any], bool]:
    """The team's ClusterQueue, and whether it lacks a CPU pool quota."""
    t = fleet.teams[team]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for name, q in t.quota.items():
        pool, dev = pools[name], devices[name]
        nominal = _quantities(pool, dev, q.nominal)
        if nominal is None:
            continue
        resources = []
        for res_name, value in nominal.items():
            r: dict[str, Any] = {"name": res_name, "nominalQuota": value}
            if t.cohort is not None and q.borrowing_limit is not None:
                limit = _quantities(pool, dev, q.borrowing_limit)
                assert limit is not None
                r["borrowingLimit"] = limit[res_name]
            resources.append(r)
        groups.setdefault(tuple(nominal), []).append({"name": flavor_name(pool),
                                                      "resources": resources})
    spec: dict[str, Any] = {"namespaceSelector": {},
                            "resourceGroups": [{"coveredResources": list(covered),
                                                "flavors": flavors}
                                               for covered, flavors in groups.items()]}
    if t.cohort is not None:
        spec["cohortName"] = dns_name(t.cohort)
    cq = {"apiVersion": API, "kind": "ClusterQueue",
          "metadata": {"name": dns_name(team), "labels": MANAGED}, "spec": spec}
    return cq, ("cpu", "memory") not in groups
