"""`placer compare --simulate`: steady-state figures with intervals for every plan, plans that
place the roles alike simulated once, `--iterations N` still exact, bad targets exit 2."""
from __future__ import annotations

import json

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
