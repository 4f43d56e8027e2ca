"""A plan as a Kubernetes cluster: a KubeRay RayCluster, and a RayJob that runs `placer execute`.

One worker group per pool, `nodes` replicas of one pod per node. Each pod's Ray node advertises
what the plan's placement-group bundles ask for (`placer.solve.mapping.device_resources` plus the
`pool_<name>` key; `executors.cluster.node_resources` is the same table for an embedded run):
  GPU pools  `num-gpus`, `nvidia.com/gpu` limits, a toleration for the NVIDIA taint and a node
             selector on the GPU's product label (NVIDIA GPU feature discovery) where the catalog
             device has a known one;
  LPU pools  the `LPU` custom resource (no device plugin is assumed);
  CPU pools  `num-cpus` and CPU/memory requests of the node's allocatable share;
  GPU pods also request CPU and the host memory the plan keeps on the node (parked and offloaded
  state, pinned buffers, Ray's object store, fixed with `object-store-memory`): every request fits
  the node's allocatable resources, not its capacity (`placer.interop.noderesources`).
Every pod also carries the node label `placer.dev/device` in its node selector (the catalog
device name: label your nodes with it), the pod label `placer.dev/pool` and the annotation
`placer.dev/slots` (the plan's slots on the pool and their devices there). A role split over
pools (`roles.NAME.parts`) needs nothing more: each part's bundles ask for its own pool's key, so
Ray places them on that pool's worker group, and each part's pool's group says so.

The RayJob mounts the plan from a ConfigMap and runs `placer execute plan.json --address auto`:
the image must have placer installed (`--image`). Written for KubeRay `KUBERAY_VERSION` (its
ray.io/v1 CRDs) and Ray `RAY_VERSION`; every file says so.
"""
from __future__ import annotations

import json
import re
from typing import Any

import yaml

from placer.base.errors import SpecError
from placer.interop.common import Export, refuse_park
from placer.interop.noderesources import PodRequest, cpu_pod, gpu_pods
from placer.solve.mapping import device_resources
from placer.solve.planfile import Plan
from placer.spec.hardware import DeviceKind, DeviceType, Pool

RAY_VERSION = "2.52.0"  # the oldest Ray with token authentication (pyproject: ray>=2.52)
KUBERAY_VERSION = "1.7.0"  # the CRDs the objects are written for (tests/data/kuberay)
DEFAULT_IMAGE = f"rayproject/ray:{RAY_VERSION}-py311-gpu"
DEVICE_LABEL = "placer.dev/device"
POOL_LABEL = "placer.dev/pool"
USES_ANNOTATION = "placer.dev/slots"  # what the plan runs on a group's pool (`pool_uses`)
CONFIGMAP_LIMIT = 1 << 20  # bytes a ConfigMap holds
# NVIDIA GPU feature discovery's `nvidia.com/gpu.product` values for the catalog's GPUs
GPU_PRODUCT = {"A100-80G": "NVIDIA-A100-SXM4-80GB", "H100-SXM": "NVIDIA-H100-80GB-HBM3",
               "H200": "NVIDIA-H200", "H20": "NVIDIA-H20", "B200": "NVIDIA-B200",
               "L40S": "NVIDIA-L40S"}


def dns_name(text: str, limit: int = 63) -> str:
    """`text` as a DNS-1123 label (lowercase letters, digits, '-'; starts and ends with one)."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return s or "x"


# A container image reference, by the grammar of distribution/reference (reference.go lines
# 4-26, v0.5.0, commit 4894124): name [":" tag] ["@" digest], the name an optional domain (with
# port) and lowercase path components; a name of at most 255 characters (NameTotalLengthMax).
_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_DOMAIN = (r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
           r"(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?")
_IMAGE = re.compile(rf"(?P<name>(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*)"
                    r"(?::[\w][\w.-]{0,127})?"
                    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def check_image(image: str | None, flag: str = "--image") -> None:
    """SpecError unless `image` (None: the default) is a container image reference, which the
    RayJobs' and RayCluster's YAML carry as it is."""
    m = _IMAGE.fullmatch(image) if image is not None else None
    if image is not None and (m is None or len(m.group("name")) > 255):
        raise SpecError(f"{flag}: not a container image reference, [REGISTRY/]NAME[:TAG]"
                        f"[@DIGEST] with a lowercase NAME (got {image!r})")


def label_value(text: str) -> str:
    """`text` as a Kubernetes label value (63 characters of [A-Za-z0-9-_.], alphanumeric ends)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("-_.")
    return s or "x"


def ray_resources(pool: Pool, dev: DeviceType) -> dict[str, float]:
    """What one node of `pool` advertises to Ray: its devices and its pool key."""
    return {**device_resources(dev, pool.devices_per_node),
            f"pool_{pool.name}": float(pool.devices_per_node)}


def _start_params(pool: Pool, dev: DeviceType, req: PodRequest | None) -> dict[str, str]:
    have = ray_resources(pool, dev)
    params = {}
    if "GPU" in have:
        params["num-gpus"] = str(int(have.pop("GPU")))
    if "CPU" in have:
        params["num-cpus"] = str(int(have.pop("CPU")))
    elif req is not None:  # a GPU pod: the cores it requests, for its worker processes
        params["num-cpus"] = str(req.cpu_milli // 1000)
    if req is not None and req.object_store_bytes:  # the store the plan's host memory assumed
        params["object-store-memory"] = str(req.object_store_bytes)
    # KubeRay passes `resources` through to `ray start --resources`: a quoted JSON object
    params["resources"] = '"' + json.dumps({k: v for k, v in have.items()}).replace('"', '\\"') + '"'
    return params


def _container(name: str, image: str, pool: Pool | None, dev: DeviceType | None,
               req: PodRequest | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": image}
    if pool is None or dev is None:  # the head: schedules nothing, runs the driver
        c["resources"] = {"requests": {"cpu": "2", "memory": "8Gi"},
                          "limits": {"cpu": "2", "memory": "8Gi"}}
        c["ports"] = [{"containerPort": 6379, "name": "gcs-server"},
                      {"containerPort": 8265, "name": "dashboard"},
                      {"containerPort": 10001, "name": "client"}]
        return c
    asks = req.quantities() if req is not None else {}
    if dev.kind is DeviceKind.gpu:
        n = str(pool.devices_per_node)
        asks["nvidia.com/gpu"] = n
    if asks:
        c["resources"] = {"requests": dict(asks), "limits": dict(asks)}
    return c


def _pod(container: dict[str, Any], pool: Pool | None, dev: DeviceType | None,
         job: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "placer", "placer.dev/job": label_value(job)}
    spec: dict[str, Any] = {"containers": [container]}
    if pool is not None and dev is not None:
        labels[POOL_LABEL] = label_value(pool.name)
        selector = {DEVICE_LABEL: label_value(dev.name)}
        if dev.kind is DeviceKind.gpu and dev.name in GPU_PRODUCT:
            selector["nvidia.com/gpu.product"] = GPU_PRODUCT[dev.name]
        spec["nodeSelector"] = selector
        if dev.kind is DeviceKind.gpu:
            spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists",
                                    "effect": "NoSchedule"}]
    return {"metadata": {"labels": labels}, "spec": spec}


def pool_uses(plan: Plan) -> dict[str, str]:
    """Per pool, the plan's slots on it and their devices there, e.g. "actor: 8; rollout: 8
    (part of rollout, 64% of samples)": a split role's slot appears in each part's pool's group."""
    out: dict[str, list[str]] = {}
    for s in plan.slots:
        split = next((r for name, r in plan.roles.items() if name in s.roles and r.parts), None)
        for pool, n in s.pool_devices():
            what = f"{s.name}: {n}"
            if split is not None:
                share = sum(p.share for p in split.parts if p.pool == pool)
                what += f" (part of {', '.join(s.roles)}, {share:.0%} of samples)"
            out.setdefault(pool, []).append(what)
    return {pool: "; ".join(w) for pool, w in out.items()}


def cluster_spec(plan: Plan, image: str, warn: list[str]) -> dict[str, Any]:
    """The RayCluster `spec`: a CPU-only head and one worker group per pool."""
    res = plan.resolved()
    job = plan.spec.name
    uses = pool_uses(plan)
    groups = []
    gpu = gpu_pods(plan, warn)
    for pool in res.cluster.pools:
        dev = res.device_of(pool)
        req = cpu_pod(pool, dev) if dev.kind is DeviceKind.cpu else gpu.get(pool.name)
        template = _pod(_container("ray-worker", image, pool, dev, req), pool, dev, job)
        template["metadata"]["annotations"] = {USES_ANNOTATION: uses.get(pool.name, "idle")}
        groups.append({
            "groupName": dns_name(pool.name, 50),
            "replicas": pool.nodes, "minReplicas": pool.nodes, "maxReplicas": pool.nodes,
            "rayStartParams": _start_params(pool, dev, req),
            "template": template})
    head = {"rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
            "template": _pod(_container("ray-head", image, None, None), None, None, job)}
    return {"rayVersion": RAY_VERSION, "headGroupSpec": head, "workerGroupSpecs": groups}


def _with_plan_mount(spec: dict[str, Any], configmap: str) -> dict[str, Any]:
    """`spec` with the plan's ConfigMap mounted at /placer in the head pod (the driver's)."""
    head = json.loads(json.dumps(spec["headGroupSpec"]))
    pod = head["template"]["spec"]
    pod["volumes"] = [{"name": "plan", "configMap": {"name": configmap}}]
    pod["containers"][0]["volumeMounts"] = [{"name": "plan", "mountPath": "/placer",
                                             "readOnly": True}]
    return {**spec, "headGroupSpec": head}


def export_kuberay(plan: Plan, image: str = DEFAULT_IMAGE, steps: int = 5) -> Export:
    refuse_park(plan, "placer execute", "export verl or nemo-rl (optimizer_offload)")
    name = dns_name(f"placer-{plan.spec.name}", 40)
    warn: list[str] = []
    spec = cluster_spec(plan, image, warn)
    meta = {"name": name, "labels": {"app.kubernetes.io/managed-by": "placer"}}
    raycluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta, "spec": spec}
    plan_json = plan.to_json()
    if len(plan_json.encode()) > CONFIGMAP_LIMIT:
        warn.append(f"plan: {len(plan_json.encode()):,} bytes exceed a ConfigMap's 1 MiB; "
                    "mount the plan another way (a volume or the image)")
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": f"{name}-plan", "labels": meta["labels"]},
                 "data": {"plan.json": plan_json}}
    entry = (f"placer execute /placer/plan.json --address auto --steps {steps} "
             "--out /tmp/placer-run")
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob",
              "metadata": {**meta, "name": f"{name}-job"},
              "spec": {"entrypoint": entry, "shutdownAfterJobFinishes": True,
                       "rayClusterSpec": _with_plan_mount(spec, f"{name}-plan")}}
    if image == DEFAULT_IMAGE:
        warn.append(f"image: {image} has no placer installed; the RayJob's `placer execute` "
                    "needs an image with it (--image)")

    def dump(doc: dict[str, Any]) -> str:
        return (f"# written for KubeRay {KUBERAY_VERSION} (ray.io/v1) and Ray {RAY_VERSION} "
                "(placer export kuberay)\n" + yaml.safe_dump(doc, sort_keys=False, width=100))

    files = {"raycluster.yaml": dump(raycluster), "rayjob.yaml": dump(rayjob),
             "plan-configmap.yaml": dump(configmap)}
    command = ("kubectl apply -f raycluster.yaml   # or: kubectl apply -f plan-configmap.yaml "
               "-f rayjob.yaml")
    return Export("kuberay", files, command, warn,
                  version=f"KubeRay {KUBERAY_VERSION}, Ray {RAY_VERSION}")
