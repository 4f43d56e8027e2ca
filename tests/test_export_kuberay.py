"""`placer export kuberay`: every example's plan as a RayCluster and a RayJob, validated against
KubeRay's CRD schemas and Kubernetes' own (tests/frameworks.py), each worker pod's requests
within its node's allocatable share. verl, OpenRLHF and the CLI: tests/test_export.py."""
from __future__ import annotations

import json

import pytest
import yaml
from exportplans import PLANS
from frameworks import crd_errors, k8s_errors, pod_template

from placer.interop.kuberay import export_kuberay
from placer.interop.noderesources import allocatable_cpu, allocatable_memory_gib
from placer.solve.hostmem import host_capacity_gb
from placer.solve.planfile import Plan, calibration_of


@pytest.mark.parametrize("name", sorted(PLANS))
def test_kuberay_objects_match_the_crd_schemas(name: str) -> None:
    plan = PLANS[name]
    e = export_kuberay(plan, image="example.com/placer:0.1", steps=3)
    cluster = yaml.safe_load(e.files["raycluster.yaml"])
    job = yaml.safe_load(e.files["rayjob.yaml"])
    assert crd_errors(cluster, "rayclusters") == []
    assert crd_errors(job, "rayjobs") == []
    groups = {g["template"]["metadata"]["labels"]["placer.dev/pool"]: g
              for g in cluster["spec"]["workerGroupSpecs"]}
    res = plan.resolved()
    for pool in res.cluster.pools:
        g = groups[pool.name]
        assert g["replicas"] == pool.nodes
        have = json.loads(g["rayStartParams"]["resources"][1:-1].replace('\\"', '"'))
        for b in plan.bundles:  # every bundle of the pool fits one of its nodes
            if b.pool == pool.name:
                for k, v in b.resources.items():
                    if k == "GPU":
                        assert int(g["rayStartParams"]["num-gpus"]) >= v
                    elif k == "CPU":
                        assert int(g["rayStartParams"]["num-cpus"]) >= v
                    else:
                        assert have[k] >= v, (pool.name, k)
    cm = yaml.safe_load(e.files["plan-configmap.yaml"])
    assert k8s_errors(cm) == []
    for spec in (cluster["spec"], job["spec"]["rayClusterSpec"]):
        for t in [spec["headGroupSpec"]["template"]] + [
                g["template"] for g in spec["workerGroupSpecs"]]:
            assert k8s_errors(pod_template(t)) == []
    assert Plan.model_validate_json(cm["data"]["plan.json"]) == plan
    assert job["spec"]["entrypoint"].startswith("placer execute /placer/plan.json --address auto")


def test_kuberay_schema_check_can_fail() -> None:
    cluster = yaml.safe_load(export_kuberay(PLANS["tiny-cpu"]).files["raycluster.yaml"])
    cluster["spec"]["workerGroupSpecs"][0]["replica"] = 2  # a typo
    cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
        "limits"] = {"nvidia.com/gpu": [1]}
    errors = crd_errors(cluster, "rayclusters")
    assert any("'replica' was unexpected" in e for e in errors)
    assert any("limits" in e for e in errors)
    pod = cluster["spec"]["workerGroupSpecs"][0]["template"]
    pod["spec"]["nodeSelektor"] = {}
    assert k8s_errors(pod_template(pod))


def test_kuberay_gpu_lpu_and_cpu_pools() -> None:
    e = export_kuberay(PLANS["ppo-llama8b-hetero"], image="example.com/placer:0.1")
    assert e.warnings == []
    groups = {g["groupName"]: g for g in
              yaml.safe_load(e.files["raycluster.yaml"])["spec"]["workerGroupSpecs"]}
    gpu = groups["train"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert gpu["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert gpu["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert '\\"LPU\\": 8' in groups["lpu"]["rayStartParams"]["resources"]
    assert groups["lpu"]["template"]["spec"]["nodeSelector"] == {"placer.dev/device": "groq-lpu"}
    assert "requests" in groups["cpu"]["template"]["spec"]["containers"][0]["resources"]


def quantity(text: str) -> float:
    """A Kubernetes quantity as cores or GiB (the forms the export writes: 500m, 12, 460Gi)."""
    if text.endswith("m"):
        return int(text[:-1]) / 1000
    return float(text.removesuffix("Gi"))


@pytest.mark.parametrize("name", sorted(PLANS))
def test_kuberay_requests_fit_each_nodes_allocatable_resources(name: str) -> None:
    """Every worker pod's requests fit its node's allocatable share (capacity less the
    kubelet's reserve); GPU pods request CPU and the host memory the plan keeps there, with
    Ray's object store at the size the plan assumed."""
    from placer.cost.pricer import Pricer
    from placer.solve.hostmem import busiest_per_pool, plan_nodes
    plan = PLANS[name]
    res = plan.resolved()
    cluster = yaml.safe_load(export_kuberay(plan).files["raycluster.yaml"])
    groups = {g["template"]["metadata"]["labels"]["placer.dev/pool"]: g
              for g in cluster["spec"]["workerGroupSpecs"]}
    busiest = busiest_per_pool(plan_nodes(plan, Pricer(res, calibration_of(plan))))
    for pool in res.cluster.pools:
        dev, g = res.device_of(pool), groups[pool.name]
        req = g["template"]["spec"]["containers"][0].get("resources", {}).get("requests", {})
        if dev.kind == "cpu":
            cores, mem_gb = dev.cores * pool.devices_per_node, dev.memory_gb * pool.devices_per_node
        elif dev.kind == "gpu" and host_capacity_gb(res, pool):
            cores, mem_gb = 8 * pool.devices_per_node + 8, host_capacity_gb(res, pool)
            node = busiest.get(pool.name)
            if node is not None:
                assert quantity(req["memory"]) * 2**30 >= min(
                    node.total_gb * 1e9, allocatable_memory_gib(mem_gb) * 2**30 - 2**30)
                store = int(g["rayStartParams"]["object-store-memory"])
                assert store == pytest.approx(node.parts["object_store"] * 1e9, rel=1e-6)
            assert quantity(req["cpu"]) >= 1
        else:
            continue
        assert quantity(req["memory"]) <= allocatable_memory_gib(mem_gb) < mem_gb * 1e9 / 2**30
        assert quantity(req["cpu"]) <= allocatable_cpu(cores) < cores


def test_kuberay_cpu_node_leaves_the_system_its_reserve() -> None:
    """The issue's case: a 64-core, 512 GB CPU node may not be asked for 64 cores and 512Gi."""
    plan = PLANS["agentic-code"]
    cluster = yaml.safe_load(export_kuberay(plan).files["raycluster.yaml"])
    cpu = next(g for g in cluster["spec"]["workerGroupSpecs"]
               if g["template"]["spec"]["nodeSelector"]["placer.dev/device"] == "cpu-node")
    req = cpu["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert quantity(req["cpu"]) < 64 and quantity(req["memory"]) < 512e9 / 2**30
