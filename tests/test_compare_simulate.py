"""`placer compare --simulate`: steady-state figures with intervals for every plan, plans that
place the roles alike simulated once, `--iterations N` still exact, bad targets exit 2."""
from __future__ import annotations

import json
import re
import sys

from calibdata import hand_plan
from specdata import ROOT

from placer.cli import main
from placer.commands.compare import placement

TINY = ROOT / "examples" / "tiny-agent.yaml"


def _compare(capsys, *extra: str) -> dict:
    assert main(["compare", str(TINY), "--simulate", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_plan_has_a_steady_state_and_an_interval(capsys):
    doc = _compare(capsys)
    rows = {n: r for n, r in doc["plans"].items() if r["applicable"]}
    assert {"ilp", "colocated", "split"} <= set(rows)
    for name, r in rows.items():
        lo, hi = r["simulated_ci95_s"]
        assert lo <= r["simulated_iteration_s"] <= hi, name
        assert r["simulation"]["warmup_excluded"] and r["simulation"]["batches"] >= 2, name
        assert r["simulated_samples_per_s"] > 0 and isinstance(r["tied_with_ilp"], bool), name
        same = [o for o in rows.values() if o["placement"] == r["placement"]]
        assert all(o["simulated_iteration_s"] == r["simulated_iteration_s"] for o in same)
    sims = [rows[n]["simulated_iteration_s"] for n in doc["ranking"]]
    assert sims == sorted(sims)
    assert doc["plans"] == _compare(capsys)["plans"]  # deterministic from the seed


def test_a_terminal_sees_what_is_under_way(capsys, monkeypatch):
    """On a terminal, stderr names each phase (planning, then simulating plan k/n) in order;
    stdout is the same as into a pipe."""
    monkeypatch.delenv("PLACER_PROGRESS", raising=False)
    argv = ["compare", str(TINY), "--simulate", "--iterations", "1"]
    assert main(argv) == 0
    piped = capsys.readouterr()
    assert "compare:" not in piped.err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(argv) == 0
    shown = capsys.readouterr()
    sims = re.findall(r"compare: simulating plan (\d+)/(\d+) \((\w[\w-]*)\)", shown.err)
    n = int(sims[0][1])
    assert [int(k) for k, _, _ in dict.fromkeys(sims)] == list(range(1, n + 1)), shown.err
    assert sims[0][2] == "ilp"
    at = [shown.err.find(p) for p in ("compare: planning: the ILP",
                                      "compare: planning: the baselines",
                                      "compare: simulating plan 1/")]
    assert -1 not in at and at == sorted(at), shown.err
    assert shown.out == piped.out


def test_explicit_iterations_are_kept(capsys):
    doc = _compare(capsys, "--iterations", "3")
    assert all(r["simulation"]["iterations"] == 3 for r in doc["plans"].values()
               if r["applicable"])


def test_bad_ci_exits_2(capsys):
    assert main(["compare", str(TINY), "--simulate", "--ci", "2"]) == 2
    assert "--ci" in capsys.readouterr().err
    assert main(["compare", str(TINY), "--simulate", "--iterations", "0"]) == 2
    assert "--iterations: must be at least 1 (got 0)" in capsys.readouterr().err


def test_placement_names_cp_and_ep_where_above_one():
    plan = hand_plan()
    actor = plan.roles["actor"]
    wide = plan.model_copy(update={"roles": {**plan.roles, "actor": actor.model_copy(
        update={"cp": 2, "ep": 4, "etp": 2})}})
    assert placement(plan)["actor"] == f"trainx{actor.devices} tp1 pp1 dp8 [s0]"
    assert placement(wide)["actor"] == f"trainx{actor.devices} tp1 cp2 pp1 dp8 ep4 etp2 [s0]"
    assert placement(wide)["rollout"] == placement(plan)["rollout"]
