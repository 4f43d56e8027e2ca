"""Bad fleet files found by an adversarial sweep of `placer fleet`: each exits 2 before any
planning, with one line naming the field and the value.

Each case pins one mistake that used to pass: a weight near the float range (the allocation's
objective scaling overflowed into a NaN and a traceback), a YAML `true` or `"2"` read as a
number, an unbounded iteration count, a shared CPU pool on a GPU pool, a shared rollout pool on
CPU nodes, a preemption of more nodes than its pool has (each planned, or refused as
infeasible, instead).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from placer.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FLEETS = EXAMPLES / "fleets"


def _fleet(name: str) -> dict[str, Any]:
    """An example fleet file with its job paths made absolute (so it can be written anywhere)."""
    doc = yaml.safe_load((FLEETS / name).read_text())
    for j in doc["jobs"]:
        if isinstance(j["job"], str):
            j["job"] = str((FLEETS / j["job"]).resolve())
    return doc


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    *keys, last = path.split(".")
    cur: Any = out
    for k in keys:
        cur = cur[int(k)] if isinstance(cur, list) else cur[k]
    if isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return out


def _one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict[str, Any]) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["fleet", str(path), "--time-limit", "5"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("placer: error: "), lines
    return lines[0]


CPU = "shared-cpu-tiny.yaml"


@pytest.mark.parametrize("base, path, value, needles", [
    (CPU, "jobs.0.weight", 1e308, ["jobs.0.weight", "1e+308"]),
    (CPU, "jobs.0.weight", True, ["jobs.0.weight", "True"]),
    (CPU, "jobs.0.weight", "2", ["jobs.0.weight", "'2'"]),
    (CPU, "jobs.0.iterations", 10**30, ["jobs.0.iterations", str(10**30)]),
    (CPU, "jobs.0.iterations", True, ["jobs.0.iterations", "True"]),
    (CPU, "jobs.0.min_iterations_per_hour", "20", ["jobs.0.min_iterations_per_hour", "'20'"]),
    (CPU, "jobs.0.deadline", {"iterations": 10, "hours": True}, ["jobs.0.deadline.hours"]),
    (CPU, "teams.agents.quota.gpu.nominal", True, ["teams.agents.quota.gpu.nominal", "True"]),
    (CPU, "teams.agents.quota.gpu.nominal", "2", ["teams.agents.quota.gpu.nominal", "'2'"]),
    (CPU, "shared.cpu_pools.0.pool", "gpu",
     ["shared.cpu_pools.0.pool", "pool of CPU nodes", "'gpu'"]),
    ("shared-rollout-tiny.yaml", "shared.rollout_pools.0.pool", "cpu",
     ["shared.rollout_pools.0.pool", "GPUs or LPUs", "'cpu'"]),
    ("mixed.yaml", "contention.preemptions.0.nodes", 99,
     ["contention.preemptions.0.nodes", "pool h100 has 5 nodes", "99"]),
    ("mixed.yaml", "contention.preemptions.0.nodes", True,
     ["contention.preemptions.0.nodes", "True"]),
    ("mixed.yaml", "contention.spine_gbs", "25", ["contention.spine_gbs", "'25'"]),
    (CPU, "shared.cpu_pools.0.choose", "yes", ["shared.cpu_pools.0.choose", "'yes'"]),
    ("shared-rollout-tiny.yaml", "shared.rollout_pools.0.choose", 1,
     ["shared.rollout_pools.0.choose", "(got 1)"]),
    # a job's name is its folder under --execute's --out: "/etc" was that folder itself
    ("mixed.yaml", "jobs.5.name", "../escape", ["jobs.5 (../escape): name", "'../escape'"]),
    ("mixed.yaml", "jobs.5.name", "/etc", ["jobs.5 (/etc): name", "(got '/etc')"]),
    ("mixed.yaml", "jobs.5.name", "..", ["jobs.5 (..): name", "(got '..')"]),
    # lines that named the value only in passing, or a whole-object check as "(top level)"
    (CPU, "teams.agents.quota.tpu", {"nominal": 1}, ["teams.agents.quota.tpu", "(got 'tpu')"]),
    (CPU, "cluster.pools.1.name", "gpu", ["fleet.yaml: cluster: pool names must be unique",
                                          "'gpu'"]),
])
def test_bad_fleet_value_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     base: str, path: str, value: Any,
                                     needles: list[str]) -> None:
    line = _one_line(tmp_path, capsys, _set(_fleet(base), path, value))
    for n in needles:
        assert n in line, (n, line)


def test_largest_weight_still_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bound on a weight is one a fleet can use: a million against 1 plans (exit 0)."""
    doc = _set(_fleet(CPU), "jobs.0.weight", 1e6)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["fleet", str(path), "--time-limit", "5", "--json"]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("image, shown", [("", "''"), ("a\nb", r"'a\nb'"),
                                          ("Ubuntu:22.04", "'Ubuntu:22.04'"),
                                          ("ray with space", "'ray with space'")])
def test_export_image_must_be_a_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          image: str, shown: str) -> None:
    """`--image` goes into the RayJobs' YAML as it is: an empty one (silently the default
    before) or one with a newline or a capital is refused before planning, naming it."""
    out = tmp_path / "kueue"
    assert main(["fleet", str(FLEETS / CPU), "--export", "kueue", str(out),
                 "--image", image]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placer: error: --image: "), lines
    assert f"(got {shown})" in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("path, value, needle", [
    ("jobs.1.name", "agent.a", "jobs: 'agent-a' and 'agent.a' are both 'placer-agent-a'"),
    ("jobs.1.name", "Agent-A", "jobs: 'agent-a' and 'Agent-A' are both 'placer-agent-a'"),
])
def test_kueue_export_names_must_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        path: str, value: str, needle: str) -> None:
    """Two jobs (or teams, or pools) of one Kubernetes name: one's RayJob file overwrote the
    other's in the export. Refused before planning; nothing written."""
    doc = _set(_fleet(CPU), path, value)
    doc["shared"]["cpu_pools"][0]["jobs"] = ["agent-a", value]
    fleet, out = tmp_path / "fleet.yaml", tmp_path / "kueue"
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["fleet", str(fleet), "--export", "kueue", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and f"(got {value!r})" in lines[0], lines
    assert not out.exists()


def test_kueue_export_teams_must_differ(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    doc = _fleet(CPU)
    doc["teams"]["Agents"] = {"quota": {"gpu": {"nominal": 0}}}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["fleet", str(fleet), "--export", "kueue", str(tmp_path / "k")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "teams: 'agents' and 'Agents' are both 'agents'" in lines[0]
