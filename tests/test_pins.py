"""Layout pins (`pin:` in a job, placer/spec/pins.py): the planner keeps to them, `--explain` says so,
a bad pin exits 2 naming the field and the value, and a pin nothing keeps to exits 3 naming the
role, the pin and why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from placer.cli import main
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.job import pinned_layouts
from placer.spec.load import job_from_dict
from placer.spec.localdata import anchor
from placer.spec.pins import Pin

ROOT = Path(__file__).resolve().parent.parent
MOE = ROOT / "examples" / "tiny-moe.yaml"
QWEN30B = ROOT / "examples" / "grpo-qwen3-30b-a3b.yaml"


def job_data(path: Path, pin: Any) -> dict[str, Any]:
    """The example as a dict (local paths anchored) with `pin` in place of its own."""
    data = anchor(yaml.safe_load(path.read_text()), path.parent)
    data.pop("pin", None)
    if pin is not None:
        data["pin"] = pin
    return data


def write_job(tmp_path: Path, path: Path, pin: Any) -> str:
    out = tmp_path / "job.yaml"
    out.write_text(yaml.safe_dump(job_data(path, pin)))
    return str(out)


def plan_of(data: dict[str, Any]):
    return plan_job(Pricer(resolve(job_from_dict(data)), Calibration()), time_limit_s=10)


def layout(plan, role: str) -> tuple[str, int, int, int, int, int]:
    r = plan.roles[role]
    return r.pool, r.devices, r.tp, r.pp, r.dp, r.par.ep


@pytest.mark.parametrize("pin, want", [
    ({"actor": {"tp": 2, "dp": 2, "ep": 1}}, {"actor": ("gpu", 4, 2, 1, 2, 1)}),
    ({"actor": {"tp": 4}}, {"actor": ("gpu", 4, 4, 1, 1, None)}),
    ({"actor": {"devices": 2}, "rollout": {"pool": "lpu", "dp": 1}},
     {"actor": ("gpu", 2, None, 1, None, None), "rollout": ("lpu", None, 1, 1, 1, None)}),
    ({"rollout": {"avoid": ["gpu", "cpu"]}}, {"rollout": ("lpu", None, None, None, None, None)}),
])
def test_a_pinned_plan_has_the_pinned_layout(pin, want) -> None:
    plan = plan_of(job_data(MOE, pin))
    for role, w in want.items():
        got = layout(plan, role)
        assert all(x is None or x == y for x, y in zip(w, got)), (role, got)


def test_the_pin_survives_pruning() -> None:
    """Unpinned, the ILP picks the actor's fastest 4-device layout; dominance pruning keeps one
    layout per device count, so the pin must filter before it, or dp 2 x tp 2 would be gone."""
    free = plan_of(job_data(MOE, None))
    pinned = plan_of(job_data(MOE, {"actor": {"tp": 2, "dp": 2}}))
    assert (pinned.roles["actor"].tp, pinned.roles["actor"].dp) == (2, 2)
    if (free.roles["actor"].tp, free.roles["actor"].dp) != (2, 2):  # the pin changed the plan
        assert pinned.predicted_iteration_s >= free.predicted_iteration_s * (1 - 1e-9)


def test_pinned_layouts_filters_by_every_key() -> None:
    pars = [Parallel(tp=t, dp=d, ep=e) for t in (1, 2, 4) for d in (1, 2) for e in (1, 2)]
    job = job_from_dict(job_data(MOE, {"actor": {"tp": 2, "devices": 4, "ep": 2}}))
    kept = pinned_layouts(job, "actor", "gpu", pars)
    assert kept == [Parallel(tp=2, dp=2, ep=2)]
    assert pinned_layouts(job, "actor", "lpu", pars) == kept  # no pool pinned: any pool
    pooled = job_from_dict(job_data(MOE, {"actor": {"pool": "gpu", "tp": 4}}))
    assert pinned_layouts(pooled, "actor", "lpu", pars) == []
    assert [p.tp for p in pinned_layouts(pooled, "actor", "gpu", pars)] == [4] * 4
    assert pinned_layouts(job, "rollout", "gpu", pars) == pars  # an unpinned role is free
    assert not Pin(pool="lpu").allows("gpu", Parallel())
    assert Pin(pool="gpu", cp=1).describe() == "pool gpu, cp 1"
    assert not Pin(avoid=["gpu", "lpu"]).allows("lpu", Parallel())
    assert Pin(avoid=["gpu"]).allows("lpu", Parallel())
    assert Pin(avoid=["gpu", "lpu"], tp=2).describe() == "avoid gpu/lpu, tp 2"


def test_explain_says_a_role_was_pinned(tmp_path, capsys) -> None:
    job = write_job(tmp_path, MOE, {"actor": {"tp": 2, "dp": 2}})
    assert main(["plan", job, "--explain", "--time-limit", "5"]) == 0
    out = capsys.readouterr().out
    actor = next(line for line in out.splitlines() if line.strip().startswith("actor ")
                 and "pinned" in line)
    assert "pinned by the job (tp 2, dp 2)" in actor
    assert not any("pinned" in line for line in out.splitlines()
                   if line.strip().startswith("rollout "))


@pytest.mark.parametrize("pin, needle", [
    ({"actor": {"tpp": 2}}, "pin.actor.tpp: unknown key; expected one of pool, avoid, devices, tp, pp, dp, "
                            "cp, ep"),
    ({"actr": {"tp": 2}}, "pin.actr: unknown key; expected one of actor, rollout, reference"),
    ({"actor": {"tp": 0}}, "pin.actor.tp: Input should be greater than 0 (got 0)"),
    ({"actor": {"tp": "2"}}, "pin.actor.tp: Input should be a valid integer (got '2')"),
    ({"actor": {}}, "pin.actor: a pin fixes at least one of pool, avoid, devices"),
    ({"actor": {"devices": 3, "tp": 2}}, "pin.actor: devices 3 is not a multiple of tp = 2"),
    ({"critic": {"tp": 1}}, "pin.critic: the job runs no critic (its roles: actor, rollout, "
                            "reward) (got 'tp 1')"),
    ({"actor": {"pool": "gpux"}}, "pin.actor.pool: no pool 'gpux' in the cluster (pools: gpu, "
                                  "lpu, cpu) (got 'gpux')"),
    ({"rollout": {"avoid": ["gpux"]}}, "pin.rollout.avoid: no pool 'gpux' in the cluster "
                                       "(pools: gpu, lpu, cpu) (got 'gpux')"),
    ({"rollout": {"avoid": []}}, "pin.rollout.avoid: List should have at least 1 item"),
    ([1], "pin: Input should be a valid dictionary"),
])
def test_a_bad_pin_exits_2_naming_the_field(tmp_path, capsys, pin, needle) -> None:
    job = write_job(tmp_path, MOE, pin)
    rc = main(["plan", job])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("path, pin, needles", [
    (MOE, {"actor": {"tp": 3}},
     ["actor (tiny-qwen3-moe) is pinned to tp 3 and no candidate keeps to the pin",
      "pool gpu offers no such layout", "tp 1, 2, 4", "change or drop pin.actor"]),
    (MOE, {"actor": {"pool": "cpu"}},
     ["actor (tiny-qwen3-moe) is pinned to pool cpu", "pool cpu cannot host actor"]),
    (MOE, {"reward": {"tp": 2}}, ["reward is pinned to tp 2", "pool cpu offers no such layout"]),
    (QWEN30B, {"actor": {"devices": 1}},
     ["actor (Qwen3-30B-A3B) is pinned to devices 1", "on pool h100 the pinned layout does not "
      "fit even with the optimizer offloaded (needs", "H100-SXM has 80 GB"]),
])
def test_a_pin_nothing_keeps_to_exits_3(tmp_path, capsys, path, pin, needles) -> None:
    job = write_job(tmp_path, path, pin)
    rc = main(["plan", job])
    err = capsys.readouterr().err
    assert rc == 3 and "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_the_pin_travels_with_the_plan(tmp_path) -> None:
    """The plan file's job keeps the pin, so a re-plan from it keeps to it too."""
    from placer.solve.planfile import load_plan

    out = tmp_path / "plan.json"
    assert main(["plan", write_job(tmp_path, MOE, {"actor": {"tp": 2, "dp": 2}}), "-o",
                 str(out)]) == 0
    pins = load_plan(out).spec.pin
    assert pins is not None and pins.actor == Pin(tp=2, dp=2)
