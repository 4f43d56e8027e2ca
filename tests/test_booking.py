"""Booked against used cost, and the advice to release idle nodes (`placer plan`, `--explain`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.cli import main
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.booking import releases
from placer.solve.planner import plan_job
from placer.solve.pricing import booked_per_hour
from placer.spec.catalog import resolve, with_nodes
from placer.spec.load import load_job

ROOT = Path(__file__).resolve().parent.parent
HETERO = str(ROOT / "examples" / "ppo-llama8b-hetero.yaml")


@pytest.fixture(scope="module")
def hetero():
    res = resolve(load_job(HETERO))
    return res, plan_job(Pricer(res, Calibration()), time_limit_s=10)


def test_plan_json_carries_booked_and_used_cost(capsys):
    assert main(["plan", HETERO, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # every node of every pool: 16 H100 x 2.5 + 16 L40S x 1.0 + 160 LPU x 0.6 + 4 CPU x 2.0
    assert doc["booked_usd_per_hour"] == pytest.approx(16 * 2.5 + 16 * 1.0 + 160 * 0.6 + 4 * 2.0)
    slots = sum(s["devices"] * {"train": 2.5, "gen": 1.0, "lpu": 0.6, "cpu": 2.0}[s["pool"]]
                for s in doc["slots"])
    assert doc["used_usd_per_hour"] == pytest.approx(slots)
    assert doc["used_usd_per_hour"] < doc["booked_usd_per_hour"]
    per = doc["predicted_iteration_s"] / 3600 / (256 * 2)
    assert doc["cost_per_sample"] == pytest.approx(doc["used_usd_per_hour"] * per)
    assert doc["booked_cost_per_sample"] == pytest.approx(doc["booked_usd_per_hour"] * per)


def test_idle_nodes_get_a_release_line_that_keeps_the_time(hetero):
    res, plan = hetero
    used = {(b.pool, b.node) for b in plan.bundles}
    got = {r.pool: r for r in releases(plan, Pricer(res, Calibration()))}
    for p in res.cluster.pools:
        idle = p.nodes - sum(1 for pool, _ in used if pool == p.name)
        assert (p.name in got) == (idle > 0)
        if idle:
            r = got[p.name]
            assert r.nodes == idle
            assert r.usd_per_hour == pytest.approx(
                idle * p.devices_per_node * res.device_of(p).price_per_hour)
            assert r.line() == (f"release {idle} node{'s' if idle > 1 else ''} of {p.name}: "
                                f"same time, {r.usd_per_hour:.2f} USD/h less")
    assert got, "the example leaves some nodes idle"
    # re-solved on the released cluster the ILP finds the same time and the smaller booking
    small = with_nodes(res.job, {r.pool: r.keep for r in got.values()})
    again = plan_job(Pricer(small, Calibration()), time_limit_s=10)
    assert again.predicted_iteration_s == pytest.approx(plan.predicted_iteration_s, rel=1e-6)
    assert again.booked_usd_per_hour == pytest.approx(
        plan.booked_usd_per_hour - sum(r.usd_per_hour for r in got.values()))
    assert booked_per_hour(small) == pytest.approx(again.booked_usd_per_hour)


def test_summary_and_explain_print_booking_and_release(capsys):
    assert main(["plan", HETERO]) == 0
    out = capsys.readouterr().out
    assert "booked 160.00 USD/h for the whole cluster" in out
    assert "  release " in out and ": same time, " in out
    assert main(["plan", HETERO, "--explain", "--json"]) == 0
    ex = json.loads(capsys.readouterr().out)["explain"]
    assert ex["booking"]["booked_usd_per_hour"] == pytest.approx(160.0)
    assert [r["pool"] for r in ex["booking"]["release"]]
    assert "train" in ex["host_memory"]  # the GPU pool the plan uses, with its host rows


def test_release_counts_whole_idle_nodes_only(tmp_path, capsys):
    # tiny-cpu with its reference pinned to one of its LPU node's four chips: a busy node is
    # never offered
    text = (ROOT / "examples" / "tiny-cpu.yaml").read_text() + "pin: {reference: {pool: lpu}}\n"
    tiny = tmp_path / "tiny1.yaml"
    tiny.write_text(text)
    assert main(["plan", str(tiny)]) == 0
    assert "release" not in capsys.readouterr().out
    job = tmp_path / "tiny.yaml"
    job.write_text(text.replace(
        "{name: lpu, device: emu-lpu, devices_per_node: 4, nodes: 1}",
        "{name: lpu, device: emu-lpu, devices_per_node: 4, nodes: 3}"))
    assert main(["plan", str(job)]) == 0
    out = capsys.readouterr().out
    assert "  release 2 nodes of lpu: same time, 0.40 USD/h less" in out  # 2 x 4 x 0.05
    assert out.count("release") == 1
