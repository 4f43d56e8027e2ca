"""`placer fleet --execute`: a fleet whose two tiny GRPO jobs (two seeds: two sets of weights)
time-share one emulated GPU node of rollout engines (`executors.fleetrun`), run on Ray.

The Ray run (2 jobs x 2 steps, async mode) checks that every rollout on the shared engines
starts with the serving job's own trainer weights (digests read after each turn's sync): async
mode keeps a job's version between two of its turns (step s+1's rollout uses version s), so a
skipped swap would leave the other job's weights in the engines and fail the check; that the
turns alternate in the plan's order, each switch a swap; that each job's trainer ranks, reward
and environment run where its own plan puts them and the engines where the first job's plan
does; and that both ledgers balance. Without Ray: the gate's turns and the swap's forgetting of
the engines' versions, and a fleet whose shared pool cannot run exiting 2 with one line."""
from __future__ import annotations

import copy
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from executors.engineturns import EngineGate
from placer.cost.calibration import load_calibration
from placer.fleet.planner import plan_fleet
from placer.fleet.result import FleetResult
from placer.fleet.spec import Fleet, fleet_from_dict, load_fleet

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fleets" / "shared-rollout-tiny.yaml"


def _async_doc() -> dict:
    """The example fleet with both jobs in async mode (staleness 1), inline."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    tiny = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    tiny.pop("cluster")
    for fj, seed in zip(doc["jobs"], (0, 1)):
        job = copy.deepcopy(tiny)
        job.update(name=fj["name"], seed=seed, pipeline={"mode": "async", "max_staleness": 1})
        fj["job"] = job
    return doc


def _plan(doc: dict) -> tuple[Fleet, FleetResult]:
    fleet = fleet_from_dict(doc, EXAMPLE.parent, "t")
    return fleet, plan_fleet(fleet, load_calibration(None), time_limit_s=10,
                             job_time_limit_s=5, workers=1, seed=0)


@pytest.mark.ray
@pytest.mark.slow  # ~2.5 min on a loaded 2-core machine: Ray, two jobs' actors, 4 steps
def test_shared_engines_serve_each_job_with_its_own_weights(tmp_path: Path) -> None:
    from executors.fleetrun import execute_fleet

    fleet, result = _plan(_async_doc())
    assert [m.job for m in result.engines[0].members] == ["tiny-a", "tiny-b"]
    ran = execute_fleet(fleet, result, 2, tmp_path, check_weights=True)
    turns = ran.turns[0]
    assert [(t.job, t.step) for t in turns] == [("tiny-a", 0), ("tiny-b", 0), ("tiny-a", 1),
                                                ("tiny-b", 1)]
    assert [t.swapped for t in turns] == [False, True, True, True]
    assert all(t.weights_match for t in turns), [t.to_dict() for t in turns]
    assert ran.ledger_ok, ran.ledger_problems
    assert {n: len(s) for n, s in ran.jobs.items()} == {"tiny-a": 2, "tiny-b": 2}
    doc = ran.summary()
    assert doc["shared_rollout"][0]["swaps"] == 3
    assert doc["shared_rollout"][0]["measured_swap_s"] > 0
    for j in result.jobs:  # each job's actors on its plan's nodes; the engines are tiny-a's
        rows = ran.placement[j.name]
        assert rows and all(r["on_plan_node"] and r["in_bundle"] for r in rows)
        want = {(role, p.pool) for role, p in j.plan.roles.items()
                if role != "rollout" or j.name == "tiny-a"}
        assert {(r["role"], r["pool"]) for r in rows} == want, (j.name, rows)
        actor = j.plan.roles["actor"]
        assert sum(r["role"] == "actor" for r in rows) == actor.dp * actor.tp * actor.pp
        assert j.plan.roles["rollout"].pool == result.engines[0].pool
    trace = ran.trace
    assert [e.name for e in trace.events] == [
        "sync tiny-a", "rollout tiny-a", "swap tiny-b", "rollout tiny-b", "swap tiny-a",
        "rollout tiny-a", "swap tiny-b", "rollout tiny-b"]


@dataclass
class _Member:
    rank: int


@dataclass
class _Ctx:
    """What a turn reads of a job's loop context: its engines and the versions it believes
    they hold."""

    known: dict[int, int | None] = field(default_factory=dict)

    @property
    def by_role(self) -> dict[str, list[_Member]]:
        return {"rollout": [_Member(0), _Member(1)]}


def test_a_turn_after_another_jobs_forgets_what_the_engines_held() -> None:
    gate = EngineGate("eng", ["a", "b"], holder="a")
    ca, cb = _Ctx({0: 3, 1: 3}), _Ctx({0: 2, 1: 2})
    a, b = gate.turn_of("a", ca), gate.turn_of("b", cb)  # type: ignore[arg-type]
    a.take(3)
    assert ca.known == {0: 3, 1: 3}  # the engines hold a's weights: nothing to swap
    a.synced(3)
    a.done(3)
    b.take(2)
    assert cb.known == {0: None, 1: None}  # a's weights in them: b's loop re-sends
    b.synced(2)
    b.done(2)
    a.take(4)
    assert ca.known == {0: None, 1: None}
    a.synced(4)
    a.done(4)
    assert [(r.job, r.step, r.swapped) for r in gate.records] == [("a", 3, False), ("b", 2, True),
                                                                 ("a", 4, True)]


def test_turns_go_round_in_order_and_skip_a_job_that_left() -> None:
    gate = EngineGate("eng", ["a", "b", "c"], holder="a")
    turns = {n: gate.turn_of(n, _Ctx()) for n in "abc"}  # type: ignore[arg-type]
    order: list[str] = []

    def job(name: str, steps: int) -> None:
        for s in range(steps):
            turns[name].take(s)
            order.append(name)
            turns[name].synced(s)
            turns[name].done(s)
        turns[name].leave()

    threads = [threading.Thread(target=job, args=(n, k)) for n, k in (("c", 3), ("b", 1),
                                                                       ("a", 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert order == ["a", "b", "c", "a", "c", "a", "c"]


def test_a_shared_pool_whose_jobs_sample_differently_exits_2(tmp_path: Path,
                                                             placer_cmd: list[str]) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["jobs"][0]["job"] = str(ROOT / "examples" / "tiny-cpu.yaml")
    doc["jobs"][1]["job"]["lengths"]["response"]["value"] = 16
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert load_fleet(str(path)).jobs[1].job.lengths.response.value == 16
    out = subprocess.run([*placer_cmd, "fleet", str(path), "--execute", "--steps", "1",
                          "--out", str(tmp_path / "out"), "--time-limit", "10"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if not ln.startswith("fleet:")]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("placer: error: shared.rollout_pools.0.jobs: job 'tiny-b' "
                               "samples with max_new_tokens 16"), lines[0]
    assert "(got 'tiny-b')" in lines[0]
    assert not (tmp_path / "out").exists()  # refused before any job's model was written


def test_execute_flags_apply_to_execute_only(tmp_path: Path, placer_cmd: list[str]) -> None:
    out = subprocess.run([*placer_cmd, "fleet", str(EXAMPLE), "--trace", str(tmp_path / "t.json")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith(
        f"--trace: applies to --execute only (got '{tmp_path / 't.json'}')")
