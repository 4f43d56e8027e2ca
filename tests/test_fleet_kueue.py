"""`placer fleet --export kueue`: Kueue's ResourceFlavors, ClusterQueues and LocalQueues against
Kueue's own CRD schemas (tests/data/kueue, SOURCE.md), each RayJob against KubeRay's, each plan
ConfigMap against Kubernetes' (kubernetes-validate), and the quotas, queues and sizes they carry."""
from __future__ import annotations

import gzip
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from frameworks import _strict, crd_errors, k8s_errors
from test_fleet import _tiny_fleet, _write

from placer.cli import main

DATA = Path(__file__).resolve().parent / "data" / "kueue"


@cache
def kueue_schema(plural: str) -> dict[str, Any]:
    crd = yaml.safe_load(gzip.decompress(
        (DATA / f"kueue.x-k8s.io_{plural}.yaml.gz").read_bytes()))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta2")
    return _strict(version["schema"]["openAPIV3Schema"])


def kueue_errors(doc: dict[str, Any]) -> list[str]:
    plural = {"ClusterQueue": "clusterqueues", "ResourceFlavor": "resourceflavors",
              "LocalQueue": "localqueues"}[doc["kind"]]
    v = jsonschema.Draft7Validator(kueue_schema(plural))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("kueue")
    out = tmp / "k8s"
    fleet = _write(tmp, _tiny_fleet())
    assert main(["fleet", fleet, "--export", "kueue", str(out), "--workers", "1",
                 "--namespace", "rl", "--image", "example.com/placer:1"]) == 0
    return out


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_kueue_objects_pass_the_crd_schemas(exported: Path) -> None:
    for name in ("resourceflavors.yaml", "clusterqueues.yaml", "localqueues.yaml"):
        for doc in _docs(exported / name):
            assert kueue_errors(doc) == [], (name, doc["metadata"]["name"])
            if doc["kind"] == "ClusterQueue" and "cohortName" not in doc["spec"]:
                # the CEL rule "borrowingLimit must be nil when cohort is empty"
                assert "borrowingLimit" not in str(doc["spec"])


def test_the_schema_check_is_not_vacuous(exported: Path) -> None:
    cq = _docs(exported / "clusterqueues.yaml")[0]
    cq["spec"]["cohort"] = "lab"  # v1beta1's field name: not in v1beta2
    assert kueue_errors(cq)


def test_quotas_and_cohorts(exported: Path) -> None:
    queues = {d["metadata"]["name"]: d["spec"] for d in _docs(exported / "clusterqueues.yaml")}
    assert set(queues) == {"a", "b"} and all(q["cohortName"] == "lab" for q in queues.values())
    gpu_b = next(g for g in queues["b"]["resourceGroups"]
                 if g["coveredResources"] == ["nvidia.com/gpu"])["flavors"][0]["resources"][0]
    # team b: 2 nominal nodes and 1 borrowable of a pool of 2 emulated GPUs per node
    assert (gpu_b["nominalQuota"], gpu_b["borrowingLimit"]) == ("4", "2")
    flavors = {d["metadata"]["name"]: d["spec"]["nodeLabels"]
               for d in _docs(exported / "resourceflavors.yaml")}
    assert flavors["gpu"] == {"placer.dev/device": "emu-gpu", "placer.dev/pool": "gpu"}
    for q in queues.values():  # every flavor a queue names exists
        for g in q["resourceGroups"]:
            assert {f["name"] for f in g["flavors"]} <= set(flavors)
    local = {d["metadata"]["name"]: d for d in _docs(exported / "localqueues.yaml")}
    assert {n: d["spec"]["clusterQueue"] for n, d in local.items()} == {"a": "a", "b": "b"}
    assert all(d["metadata"]["namespace"] == "rl" for d in local.values())


def test_rayjobs_are_queued_and_placed_by_their_plans(exported: Path) -> None:
    jobs = sorted((exported / "jobs").glob("*-rayjob.yaml"))
    assert [p.name for p in jobs] == ["a1-rayjob.yaml", "b1-rayjob.yaml", "b2-rayjob.yaml"]
    for path in jobs:
        job = yaml.safe_load(path.read_text())
        assert crd_errors(job, "rayjobs") == [], path.name
        assert job["spec"]["suspend"] is True
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] in ("a", "b")
        assert job["metadata"]["namespace"] == "rl"
        cm = yaml.safe_load((exported / "jobs" / path.name.replace(
            "-rayjob.yaml", "-plan-configmap.yaml")).read_text())
        assert k8s_errors(cm) == []
        plan = yaml.safe_load(cm["data"]["plan.json"])
        nodes = {p["name"]: p["nodes"] for p in plan["job"]["cluster"]["pools"]}
        groups = {g["groupName"]: g["replicas"]
                  for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
        assert groups == nodes  # the RayCluster holds exactly the job's allocation


def test_export_flags_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = _write(tmp_path, _tiny_fleet())
    assert main(["fleet", fleet, "--export", "volcano", str(tmp_path / "o")]) == 2
    assert main(["fleet", fleet, "--image", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--export: the one target is kueue (got 'volcano')" in err[0]
    assert "--image: applies to --export only" in err[1]
