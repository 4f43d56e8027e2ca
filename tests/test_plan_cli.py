"""`placer plan`, `placer compare` and `placer replan`: tables, one JSON document, exit codes.

Also the heterogeneity check on examples/ppo-llama8b-hetero.yaml: training on the H100 pool,
frozen models off it, the environment on CPU.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from placer.cli import main
from placer.solve.planfile import load_plan

ROOT = Path(__file__).resolve().parent.parent
HETERO = str(ROOT / "examples" / "ppo-llama8b-hetero.yaml")
TINY = str(ROOT / "examples" / "tiny-cpu.yaml")


def one_document(text: str):
    doc, end = json.JSONDecoder().raw_decode(text.lstrip())
    assert text.lstrip()[end:].strip() == "", "more than one document on stdout"
    return doc


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def hetero_plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plans") / "hetero.json"
    assert main(["plan", HETERO, "-o", str(path), "--json"]) == 0
    return path


def _job(tmp_path: Path, **changes) -> str:
    data = yaml.safe_load(Path(HETERO).read_text())
    data.update(changes)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# --------------------------------------------------------------------------------------- plan
def test_plan_table(capsys) -> None:
    rc, out, _ = run(capsys, "plan", HETERO)
    assert rc == 0
    for word in ("solver: cp-sat optimal", "gap 0.00%", "predicted iteration", "actor", "critic",
                 "environment", "stages:"):
        assert word in out


def test_plan_json_is_the_contract(capsys, hetero_plan: Path) -> None:
    rc, out, _ = run(capsys, "plan", HETERO, "--json")
    assert rc == 0
    doc = one_document(out)
    assert doc["predicted_iteration_s"] > 0 and doc["mode"] == "sync"
    assert set(doc["solver"]) >= {"status", "objective", "bound", "gap", "solve_s"}
    assert doc["solver"]["status"] == "optimal" and doc["solver"]["gap"] == pytest.approx(0)
    assert doc["solver"]["objective"] == pytest.approx(doc["predicted_iteration_s"], rel=1e-5)
    for r in doc["roles"].values():
        assert set(r) >= {"pool", "devices", "tp", "pp", "dp", "slot"}
    assert doc["slots"] and doc["bundles"]
    assert load_plan(hetero_plan).roles.keys() == doc["roles"].keys()  # -o wrote a valid plan


def test_hetero_uses_pools_for_what_they_are_good_at(hetero_plan: Path) -> None:
    roles = load_plan(hetero_plan).roles
    assert roles["actor"].pool == "train" and roles["critic"].pool == "train"  # H100s train
    assert roles["environment"].pool == "cpu"
    frozen = {roles["reference"].pool, roles["reward"].pool}
    assert "cpu" not in frozen and frozen - {"train"}, frozen  # frozen models leave the H100s


@pytest.fixture(scope="module")
def explained() -> tuple[int, str]:
    """`placer plan HETERO --json --explain` run once (its exit code and stdout) for the JSON
    document's test and the text's, which renders the same explanation: each ran the solve and
    the explanation's re-solves (the CLI's text path with --explain: tests/test_pins.py and
    tests/test_robust.py)."""
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["plan", HETERO, "--json", "--explain", "--time-limit", "5"])
    return rc, buf.getvalue()


def test_explain_json(explained: tuple[int, str]) -> None:
    rc, out = explained
    doc = one_document(out)
    assert rc == 0 and set(doc) == {"plan", "explain"}
    ex = doc["explain"]
    assert set(ex["roles"]) == set(doc["plan"]["roles"])
    assert any("capacity binds" in b for b in ex["binding"])
    train = ex["marginal_node"]["train"]  # training is the bottleneck: one more H100 node helps
    assert train["delta_s"] < 0
    assert ex["marginal_node"]["cpu"]["delta_s"] <= 1e-9
    # what the gap is relative to: the plan's record, repeated by explain
    space = doc["plan"]["solver"]["search_space"]
    assert ex["search_space"] == space
    assert set(space) == {"roles", "layouts", "split_counts", "pruned_by_bound", "dominated",
                          "relative_to"}
    assert space["roles"] == len(doc["plan"]["roles"]) and space["layouts"] > 0
    # the cluster's GPU pools: H100 and L40S (the LPUs and CPUs do not pair for a split)
    assert space["split_counts"] >= space["pruned_by_bound"] + space["dominated"]
    assert "split" in space["relative_to"] and "bound" in space["relative_to"]


def test_explain_text_says_what_was_searched(explained: tuple[int, str]) -> None:
    from placer.solve.explain import Explanation, render
    rc, doc = explained[0], one_document(explained[1])
    assert rc == 0
    out = render(Explanation.from_dict(doc["explain"]))  # what `plan --explain` prints
    line = next(x for x in out.splitlines() if x.startswith("searched: "))
    assert "split pairs of layouts" in line and "pruned by the bound" in line
    assert "the gap is relative to every placement" in out


def test_sweep_is_a_frontier(capsys) -> None:
    rc, out, _ = run(capsys, "plan", HETERO, "--sweep", "--json", "--time-limit", "20")
    pts = one_document(out)["frontier"]
    assert rc == 0 and len(pts) >= 2
    times = [p["predicted_iteration_s"] for p in pts]
    costs = [p["cost_per_sample"] for p in pts]
    assert times == sorted(times) and costs == sorted(costs, reverse=True)
    assert len(set(costs)) == len(costs)


@pytest.mark.parametrize("argv,needle", [
    (["plan", "no/such/job.yaml"], "no such file"),
    (["plan", HETERO, "--time-limit", "0"], "--time-limit"),
    (["plan", HETERO, "--workers", "0"], "--workers"),
])
def test_plan_bad_input_exits_2(capsys, argv, needle) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and needle in err and out == ""


def test_plan_bad_job_file_exits_2(capsys, tmp_path) -> None:
    rc, _, err = run(capsys, "plan", _job(tmp_path, batch={"prompts": 0}))
    assert rc == 2 and "batch.prompts" in err


def test_infeasible_job_exits_3_with_the_smallest_change(capsys, tmp_path) -> None:
    job = _job(tmp_path, algorithm="grpo", models={"policy": "Llama-3-70B", "reward": "rule"},
               batch={"prompts": 8, "samples_per_prompt": 2}, environment={"kind": "none"},
               cluster={"pools": [{"name": "train", "device": "H100-SXM", "devices_per_node": 2,
                                   "nodes": 1},
                                  {"name": "cpu", "device": "cpu-node", "devices_per_node": 1,
                                   "nodes": 1}]})
    rc, out, err = run(capsys, "plan", job)
    assert rc == 3 and out == ""
    assert "actor (Llama-3-70B)" in err and "pool train, which has 2" in err
    assert "add 1 node(s) to pool train" in err


def test_no_pool_for_a_rule_reward_exits_3(capsys, tmp_path) -> None:
    job = _job(tmp_path, algorithm="grpo", models={"policy": "Llama-3-8B", "reward": "rule"},
               batch={"prompts": 8, "samples_per_prompt": 2}, environment={"kind": "none"},
               cluster={"pools": [{"name": "train", "device": "H100-SXM", "devices_per_node": 8,
                                   "nodes": 1}]})
    rc, _, err = run(capsys, "plan", job)
    assert rc == 3 and "reward cannot run on any pool" in err and "CPU pool" in err


def test_no_traceback_from_the_console_script(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: [grpo\n")
    proc = subprocess.run([sys.executable, "-m", "placer.cli", "plan", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_plan_plot_writes_the_placement_png(capsys, tmp_path) -> None:
    split = str(ROOT / "examples" / "hetero-split.yaml")  # a split role: parts on two pools
    png = tmp_path / "figs" / "placement.png"  # a missing folder is made
    rc, out, err = run(capsys, "plan", split, "--plot", str(png), "--json")
    assert rc == 0 and one_document(out)["roles"]  # stdout stays one JSON document
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in err
    assert [p.name for p in png.parent.iterdir()] == ["placement.png"]  # no temporary left


@pytest.mark.parametrize("plot,extra,needle", [
    ("{tmp}", (), "is a directory"),
    ("{tmp}/placement.svg", (), "must end in .png"),
    ("{tmp}/a.png", ("--sweep",), "not a --sweep frontier"),
    ("/proc/placement.png", (), "cannot write there"),
])
def test_plan_plot_bad_path_exits_2_naming_the_flag(capsys, tmp_path, plot, extra, needle) -> None:
    path = plot.format(tmp=tmp_path)
    rc, out, err = run(capsys, "plan", TINY, "--plot", path, *extra)
    assert rc == 2 and out == "" and err.startswith("placer: error: --plot: ") and needle in err
    assert list(tmp_path.iterdir()) == []  # refused before the solve: nothing written


# ------------------------------------------------------------------------------------ compare
def test_compare_table_and_json(capsys) -> None:
    # the table on the tiny job (rows that apply and rows that do not: hybridflow, standalone);
    # the JSON on the PPO example, where every baseline applies (its baselines take ~8 s)
    rc, out, _ = run(capsys, "compare", TINY)
    assert rc == 0
    for name in ("ilp", "colocated", "split", "enumerate", "x ILP time", "standalone"):
        assert name in out
    assert "n/a (does not apply to this job)" in out
    rc, out, _ = run(capsys, "compare", HETERO, "--json")
    doc = one_document(out)
    assert rc == 0 and doc["ranking"][0] == "ilp"
    for row in doc["plans"].values():
        assert row["applicable"]
        assert row["ratio_to_ilp"] >= 1 - 1e-9
        assert row["throughput_samples_s"] > 0 and row["cost_per_sample"] > 0
    assert doc["plans"]["colocated"]["ratio_to_ilp"] > 1.05  # heterogeneity is worth something


def test_compare_simulate(capsys) -> None:
    pytest.importorskip("simulator.api")
    rc, out, err = run(capsys, "compare", TINY, "--json", "--simulate", "--iterations", "1")
    assert rc == 0, err
    doc = one_document(out)
    assert doc["ranked_by"] == "simulated_iteration_s"
    rows = {n: r for n, r in doc["plans"].items() if r["applicable"]}
    assert all(r["simulation"]["iterations"] == 1 for r in rows.values())
    # the ranking is by the simulated time, not the predicted one
    ranked = [rows[n]["simulated_iteration_s"] for n in doc["ranking"] if n in rows]
    assert len(ranked) == len(rows) >= 2 and ranked == sorted(ranked)


def test_compare_simulate_without_the_simulator_exits_2(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "simulator.api", None)  # import fails as if it were absent
    rc, out, err = run(capsys, "compare", TINY, "--simulate")
    assert rc == 2 and "simulator is missing" in err and out == ""


# ------------------------------------------------------------------------------------- replan
def test_replan_reports_what_moved(capsys, hetero_plan: Path, tmp_path) -> None:
    new = tmp_path / "new.json"
    rc, out, _ = run(capsys, "replan", str(hetero_plan), "--lost", "lpu:20", "-o", str(new),
                     "--json")
    doc = one_document(out)
    assert rc == 0 and doc["nodes"]["lpu"] == 0
    assert "lpu" not in {r["pool"] for r in doc["plan"]["roles"].values()}
    old = load_plan(hetero_plan)
    assert {r for r, p in old.roles.items() if p.pool == "lpu"} <= set(doc["moved"])
    assert load_plan(new).predicted_iteration_s == pytest.approx(doc["plan"]["predicted_iteration_s"])


def test_replan_small_change_moves_nothing(capsys, hetero_plan: Path) -> None:
    rc, out, _ = run(capsys, "replan", str(hetero_plan), "--added", "cpu:1")
    assert rc == 0 and "nothing moved" in out


@pytest.mark.parametrize("argv,code,needle", [
    (["--lost", "lpu"], 2, "POOL:NODES"),
    (["--lost", "nope:1"], 2, "no pool 'nope'"),
    (["--lost", "lpu:x"], 2, "whole number"),
    (["--lost", "train:3"], 2, "would have -1 nodes"),
    ([], 2, "at least one"),
    (["--lost", "train:2"], 3, "training-capable GPU pool"),
])
def test_replan_bad_input_and_infeasible(capsys, hetero_plan: Path, argv, code, needle) -> None:
    rc, _, err = run(capsys, "replan", str(hetero_plan), *argv)
    assert rc == code and needle in err


def test_replan_movement_cost_decides_what_moves(capsys, hetero_plan: Path) -> None:
    """One more H100 node speeds training up; only a free move makes the solver take it."""
    rc, out, _ = run(capsys, "replan", str(hetero_plan), "--added", "train:1", "--json",
                     "--move-cost", "0")
    free = one_document(out)
    assert rc == 0 and "actor" in free["moved"]
    assert free["plan"]["predicted_iteration_s"] < free["old_iteration_s"]
    rc, out, _ = run(capsys, "replan", str(hetero_plan), "--added", "train:1", "--json",
                     "--move-cost", "1000")
    dear = one_document(out)
    assert rc == 0 and dear["moved"] == {}
    assert dear["plan"]["predicted_iteration_s"] == pytest.approx(dear["old_iteration_s"])
