"""What a KubeRay pod may request on one node: the node's allocatable resources, not its capacity.

Kubernetes schedules a pod only where its requests fit the node's *allocatable* resources:
capacity less what the kubelet reserves for the system and itself (`kube-reserved`,
`system-reserved`) and the hard eviction threshold. A pod asking for a whole node's cores or RAM
never schedules. Providers size the reserve differently; the one used here is GKE's published
formula (cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes, "Memory and CPU
reservations"), which is also close to EKS's:

  memory  25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112,
          2% above 128 GiB; plus a 100 MiB eviction threshold
  CPU     6% of the first core, 1% of the next, 0.5% of the next 2, 0.25% above 4 cores

and every node keeps `DAEMONSET_CPU` and `DAEMONSET_GIB` more for the DaemonSets a GPU cluster
runs on each node (device plugin, GPU feature discovery, DCGM exporter, CNI, log agent), an
assumption to adjust to your cluster.

What a pod asks for:
  CPU pools  the node's allocatable CPU and memory (the whole node is the pool's device);
  GPU pools  the GPUs; host memory for what the plan keeps there (`placer.solve.hostmem`: the
             optimizer state it offloads, the state colocated roles park between phases, pinned
             transfer buffers, and Ray's object store, which `object-store-memory` fixes at the
             size the plan assumed) plus `PROCESS_GB_PER_DEVICE` per GPU for the worker
             processes themselves (CUDA context, Python, PyTorch); and `CPUS_PER_GPU` cores per
             GPU for them. A need above the node's allocatable memory is capped there and warned.
  LPU pools  no host figures in the catalog: nothing beyond the LPU resource.
Catalog sizes are in GB (1e9 bytes); Kubernetes quantities here in GiB (`Gi`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from placer.cost.pricer import Pricer
from placer.solve.hostmem import busiest_per_pool, host_capacity_gb, plan_nodes
from placer.solve.planfile import Plan, calibration_of
from placer.spec.hardware import DeviceKind, DeviceType, Pool

GIB = 2**30
GB = 1e9
DAEMONSET_CPU = 1.0  # cores kept for per-node DaemonSets (assumption)
DAEMONSET_GIB = 2.0
# DGX A100 / H100 / H200 / B200 have 112-128 host cores for 8 GPUs (NVIDIA datasheets): 8 per GPU
# leaves room for the system, DaemonSets and the node's other users
CPUS_PER_GPU = 8
PROCESS_GB_PER_DEVICE = 8.0  # a GPU worker process's own host memory (CUDA context, PyTorch)
# (upper end of a band in GiB, share of it reserved): GKE's memory reservation
MEMORY_BANDS = ((4.0, 0.25), (8.0, 0.20), (16.0, 0.10), (128.0, 0.06), (math.inf, 0.02))
EVICTION_GIB = 100 / 1024
CPU_BANDS = ((1.0, 0.06), (2.0, 0.01), (4.0, 0.005), (math.inf, 0.0025))


def _reserved(total: float, bands: tuple[tuple[float, float], ...]) -> float:
    out, low = 0.0, 0.0
    for high, share in bands:
        if total > low:
            out += (min(total, high) - low) * share
        low = high
    return out


def allocatable_memory_gib(capacity_gb: float) -> float:
    """A node's memory pods may request (GiB): capacity less the kubelet's reserve, the eviction
    threshold and the DaemonSets' share."""
    cap = capacity_gb * GB / GIB
    return cap - _reserved(cap, MEMORY_BANDS) - EVICTION_GIB - DAEMONSET_GIB


def allocatable_cpu(cores: float) -> float:
    """A node's CPU pods may request (cores)."""
    return cores - _reserved(cores, CPU_BANDS) - DAEMONSET_CPU


@dataclass
class PodRequest:
    """What one worker pod requests (and is limited to): cores, memory in GiB, and the object
    store Ray keeps in it (bytes; 0: Ray's own default)."""

    cpu_milli: int
    memory_gib: int
    object_store_bytes: int = 0

    def quantities(self) -> dict[str, str]:
        return {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_gib}Gi"}


def cpu_pod(pool: Pool, dev: DeviceType) -> PodRequest:
    """A CPU pool's node: all of its allocatable cores and memory."""
    cores = dev.cores * pool.devices_per_node
    return PodRequest(int(allocatable_cpu(cores) * 1000),
                      int(allocatable_memory_gib(dev.memory_gb * pool.devices_per_node)))


def gpu_pods(plan: Plan, warn: list[str]) -> dict[str, PodRequest]:
    """Per GPU pool with a known host memory: the pod request of its busiest node (every node
    of a pool gets the same pod template)."""
    res = plan.resolved()
    px = Pricer(res, calibration_of(plan))
    busiest = busiest_per_pool(plan_nodes(plan, px))
    out = {}
    for pool in res.cluster.pools:
        dev = res.device_of(pool)
        cap = host_capacity_gb(res, pool)
        if dev.kind is not DeviceKind.gpu or cap is None:
            continue
        per = pool.devices_per_node
        node = busiest.get(pool.name)
        store_gb = node.parts["object_store"] if node else 0.0
        need_gb = (node.total_gb if node else 0.0) + PROCESS_GB_PER_DEVICE * per
        room = allocatable_memory_gib(cap)
        need = math.ceil(need_gb * GB / GIB)
        if need > room:
            warn.append(f"cluster.pools.{pool.name}: a node needs {need} GiB of host memory "
                        f"({node.describe() if node else 'worker processes'}, plus "
                        f"{PROCESS_GB_PER_DEVICE:g} GB per GPU for its processes), more than "
                        f"its {room:.0f} GiB allocatable; the pod requests {int(room)} GiB")
            need = int(room)
        out[pool.name] = PodRequest(CPUS_PER_GPU * per * 1000, need, int(store_gb * GB))
    return out
