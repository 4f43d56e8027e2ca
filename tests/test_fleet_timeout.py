"""`placer fleet` out of time is not "does not fit": the allocation search that runs out of time
before any allocation says so (exit 4, naming the limit to raise), the same fleet given time is
proven infeasible (exit 3), and a diagnosis whose checks run out of time names the jobs it could
not try instead of reading them as not fitting."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from placer.base.errors import EXIT_TIMED_OUT, TimedOut
from placer.cli import main
from placer.cost.calibration import load_calibration
from placer.fleet import planner as fleet_planner
from placer.fleet.alloc import (
    AllocJob,
    AllocProblem,
    NoAllocation,
    OutOfTime,
    TeamQuota,
    Unsolved,
    Vec,
    allocate,
)
from placer.fleet.planner import diagnose, plan_fleet
from placer.fleet.spec import fleet_from_dict

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _first_round_misleads() -> AllocProblem:
    """One pool of 4 nodes, one team, two jobs: j0 is placed only on all 4 nodes, j1 on any
    count. Their fair shares (2 nodes each) give no incumbent (j0 cannot run on 2), and the
    first round's optimistic times pick j0 on 3 nodes beside j1 on 1, which the job planner then
    cannot place. So a search stopped after that round has found nothing and proven nothing;
    the next round proves that no allocation exists (j0 needs every node)."""
    times: dict[tuple[int, Vec], float | None] = {(0, (4,)): 10.0}

    def time_of(j: int, a: Vec) -> float | None:
        return 10.0 if j == 1 else times.get((j, a))

    return AllocProblem(("gpu",), (4,), {"t": TeamQuota("t", None, (4,), (4,))},
                        [AllocJob("j0", "t", 1.0, 1, ((1,), (2,), (3,), (4,))),
                         AllocJob("j1", "t", 1.0, 1, ((1,), (2,), (4,)))],
                        "throughput", time_of)


def test_a_tiny_time_limit_times_out_rather_than_proving_infeasible() -> None:
    with pytest.raises(OutOfTime):
        allocate(_first_round_misleads(), time_limit_s=1e-9, workers=1)
    with pytest.raises(NoAllocation) as proven:
        allocate(_first_round_misleads(), workers=1)
    assert not isinstance(proven.value, (Unsolved, OutOfTime))


def _three_for_two() -> tuple[AllocProblem, Any]:
    """Three jobs that each need 2 nodes of one of two pools of 2 nodes: every pool and quota
    check passes (each job could do without either pool), yet only two fit; dropping any one
    lets the others fit. The planner is only asked for the pools' names."""
    grid = ((2, 0), (0, 2))
    pr = AllocProblem(("p", "q"), (2, 2), {"t": TeamQuota("t", None, (2, 2), (2, 2))},
                      [AllocJob(f"j{i}", "t", 1.0, 1, grid) for i in range(3)],
                      "throughput", lambda j, a: 10.0)
    return pr, SimpleNamespace(nodes_of=lambda a: dict(zip(pr.pools, a)))


def test_a_diagnosis_out_of_time_blames_no_job() -> None:
    pr, names = _three_for_two()
    with pytest.raises(NoAllocation) as e:
        allocate(pr, workers=1)
    assert not isinstance(e.value, (Unsolved, OutOfTime))
    told = diagnose(pr, names, str(e.value), limit_s=1e-9)
    assert told.startswith("no allocation of the fleet meets the quotas")
    assert "whether the others fit without job j0, job j1, job j2 was not settled" in told
    assert "does not fit beside the others" not in told
    given_time = diagnose(pr, names, str(e.value))
    assert given_time.startswith("job j0 (team t): does not fit beside the others")


def _tiny(tmp_path: Path) -> str:
    doc = {"name": "tiny", "cluster": {"pools": [
        {"name": "gpu", "device": "emu-gpu", "devices_per_node": 2, "nodes": 2},
        {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 2}]},
        "teams": {"a": {"quota": {"gpu": {"nominal": 2}, "cpu": {"nominal": 2}}}},
        "jobs": [{"name": "a1", "team": "a", "job": str(EXAMPLES / "tiny-cpu.yaml")}]}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_the_cli_says_timed_out_with_exit_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The search's OutOfTime reaches the user as a time-out, never as infeasible (a wiring
    check: the search is made to run out of time the way the test above shows it can)."""
    def out_of_time(pr: AllocProblem, **kw: Any) -> Any:
        raise OutOfTime("no allocation found within the time limit (1 s)")

    monkeypatch.setattr(fleet_planner, "allocate", out_of_time)
    assert main(["fleet", _tiny(tmp_path), "--time-limit", "0.001"]) == EXIT_TIMED_OUT == 4
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress lines
    assert err.startswith("placer: timed out: the allocation search found no allocation before "
                          "its time ran out")
    assert ("not proof that the fleet cannot fit: give it more time with --time-limit S (it "
            "had 0.001 s)") in err and "infeasible" not in err
    fleet = fleet_from_dict(yaml.safe_load(Path(_tiny(tmp_path)).read_text()), tmp_path, "t")
    with pytest.raises(TimedOut, match="more CP-SAT search workers"):  # the search's own round
        plan_fleet(fleet, load_calibration(None), time_limit_s=600, workers=1)
