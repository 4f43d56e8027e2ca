"""`placer sweep`: the what-if grid on a user's own job (workflows.whatif.grid)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from placer.base.errors import SpecError
from placer.cli import main
from placer.spec.load import load_job
from workflows import plots, whatif

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "tiny-cpu.yaml")
GRID = ["--vary", "lpu.nodes=0..1", "--vary", "batch.prompts=4,8", "--time-limit", "1"]


def test_parse_vary_ranges_and_lists():
    assert whatif.parse_vary("gen.nodes=1..4") == whatif.Vary("gen.nodes", (1, 2, 3, 4))
    assert whatif.parse_vary("lengths.response.cap=2048,4096.5,x").values == (2048, 4096.5, "x")
    for bad, what in (("gen.nodes", "PATH=LO"), ("gen.nodes=4..1", "upwards"),
                      ("gen.nodes=1..x", "whole numbers"), ("a=1,,2", "empty value")):
        with pytest.raises(SpecError, match=what):
            whatif.parse_vary(bad)


def test_set_path_edits_pools_and_fields():
    job = load_job(TINY)
    assert [p.name for p in whatif.set_path(job, "lpu.nodes", 0).cluster.pools] == ["gpu", "cpu"]
    assert whatif.set_path(job, "lpu.nodes", 3).cluster.pool("lpu").nodes == 3
    assert whatif.set_path(job, "batch.prompts", 2).batch.prompts == 2
    assert whatif.set_path(job, "lengths.response.cap", 16).lengths.response.cap == 16


def test_sweep_table_has_a_row_per_point(capsys):
    assert main(["sweep", TINY, *GRID]) == 0
    out = capsys.readouterr().out.splitlines()
    head, rows = out[0], out[1:-1]
    for col in ("lpu.nodes", "batch.prompts", "time s", "USD/h used", "USD/h booked",
                "USD/sample", "booked/sample", "best plan"):
        assert col in head
    assert [r.split()[:2] for r in rows] == [["0", "4"], ["0", "8"], ["1", "4"], ["1", "8"]]
    assert all("@gpu" in r for r in rows)
    assert sum("*" in r for r in rows) >= 1  # the Pareto frontier is marked


def test_sweep_json_points_and_booking(capsys):
    assert main(["sweep", TINY, *GRID, "--json"]) == 0
    captured = capsys.readouterr()
    assert "sweep" not in captured.err  # no progress bar under --json
    doc = json.loads(captured.out)
    pts = doc["points"]
    assert [p["point"] for p in pts] == [{"lpu.nodes": a, "batch.prompts": b}
                                         for a in (0, 1) for b in (4, 8)]
    for p in pts:
        assert p["booked_usd_per_hour"] >= p["usd_per_hour"] > 0
        assert p["best_plan"]["actor"]["pool"] == "gpu"
        assert p["booked_cost_per_sample"] == pytest.approx(
            p["booked_usd_per_hour"] / 3600 / p["samples_per_s"], rel=1e-3)
    # the LPU node adds 4 x 0.05 USD/h to the booking whether or not the plan uses it
    assert pts[2]["booked_usd_per_hour"] == pytest.approx(pts[0]["booked_usd_per_hour"] + 0.2)
    assert any(p["pareto"] for p in pts)


def test_sweep_simulates_and_plots_every_point_labelled(tmp_path, capsys):
    assert main(["sweep", TINY, "--vary", "batch.prompts=4,8", "--simulate", "--iterations", "1",
                 "--plots", str(tmp_path), "--time-limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "sim s" in out.splitlines()[0]
    assert (tmp_path / "pareto.png").stat().st_size > 0 and (tmp_path / "sweep.png").exists()


def test_pareto_figure_labels_every_point():
    pts = [{"cost_per_sample": c, "samples_per_s": t, "label": f"gen.nodes={i}, cap=2048"}
           for i, (c, t) in enumerate([(1, 5), (2, 6), (3, 4), (1.5, 3), (2, 6)])]
    fig = plots.pareto(pts)
    ax = fig.axes[0]
    marks = [t.get_text() for t in ax.texts if t.get_text() and "\n" not in t.get_text()
             and ":" not in t.get_text()]
    key = [t.get_text() for t in ax.texts if "gen.nodes=" in t.get_text()]
    numbers = {n for m in marks for n in m.split(",")}
    assert numbers == {"1", "2", "3", "4", "5"}  # every point, the two identical ones share
    assert all(f"gen.nodes={i}" in key[0] for i in range(5))
    short = plots.pareto([{"cost_per_sample": 1, "samples_per_s": 1, "label": "a"},
                          {"cost_per_sample": 2, "samples_per_s": 3, "label": "b"}])
    assert sorted(t.get_text() for t in short.axes[0].texts) == ["a", "b"]


@pytest.mark.parametrize("vary, named", [
    ("gpu.nodez=1", "gpu.nodez"), ("lengths.response.capp=3", "lengths.response.capp"),
    ("batch.prompts=-2", "batch.prompts"), ("nosuch.field=1", "nosuch"),
    ("gpu.nodes=x", "gpu.nodes"), ("gpu.nodes=1..", "gpu.nodes")])
def test_bad_vary_exits_2_naming_it(capsys, vary, named):
    assert main(["sweep", TINY, "--vary", vary]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placer: error: --vary") and named in err and len(err.splitlines()) == 1


def test_progress_on_a_terminal_only(capsys, monkeypatch):
    """placer.progress's bar: on a terminal it counts the points (its last frame shows them
    all done) and names what is under way, point by point; into a pipe nothing is written;
    stdout is the same either way."""
    monkeypatch.delenv("PLACER_PROGRESS", raising=False)
    argv = ["sweep", TINY, "--vary", "batch.prompts=4,8", "--time-limit", "1", "--simulate",
            "--iterations", "1"]
    assert main(argv) == 0
    piped = capsys.readouterr()
    assert "sweep" not in piped.err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(argv) == 0
    shown = capsys.readouterr()
    assert "sweep" in shown.err and "2/2" in shown.err and "points" in shown.err
    phases = ["checking the 2 points' jobs", "planning point 1/2 (batch.prompts=4)",
              "simulating point 1/2 (batch.prompts=4)", "planning point 2/2 (batch.prompts=8)",
              "simulating point 2/2 (batch.prompts=8)"]
    at = [shown.err.find(f"sweep: {p}") for p in phases]
    assert -1 not in at and at == sorted(at), shown.err
    assert shown.out == piped.out


def test_sizes_and_seeds_are_checked_before_any_solve(capsys):
    assert main(["sweep", TINY, "--vary", "batch.prompts=4,100000", "--simulate",
                 "--iterations", "100"]) == 2
    assert "sample-turns" in capsys.readouterr().err
    assert main(["sweep", TINY, "--vary", "batch.prompts=4", "--simulate", "--sim-seed",
                 "-1"]) == 2
    assert "--sim-seed" in capsys.readouterr().err
    assert main(["sweep", TINY, "--vary", "batch.prompts=4", "--vary",
                 "batch.prompts=8"]) == 2
    assert "given twice" in capsys.readouterr().err


def test_solver_flags_reach_every_point(capsys):
    assert main(["sweep", TINY, "--vary", "batch.prompts=4,8", "--objective", "cost", "--json",
                 "--time-limit", "1"]) == 0
    pts = json.loads(capsys.readouterr().out)["points"]
    assert all(p["best_plan"] for p in pts)
    # the cost objective picks the cheapest placement: never dearer per sample than time's
    assert main(["sweep", TINY, "--vary", "batch.prompts=4,8", "--json", "--time-limit", "1"]) == 0
    fast = json.loads(capsys.readouterr().out)["points"]
    for c, t in zip(pts, fast):
        assert c["cost_per_sample"] <= t["cost_per_sample"] * (1 + 1e-6)
