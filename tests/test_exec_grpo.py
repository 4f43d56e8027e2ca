"""GRPO on Ray (embedded, emulated GPU/LPU pools): the reward rises, versions are in sync,
every step/role/batch/transfer/tool call is a trace event, the ledger balances, checkpoints exist.
The run goes through the Python API (`placer.execute`), which starts the embedded Ray and must
stop it again (a notebook's kernel outlives the run); it is the suite's shared GRPO run
(tests/conftest.py `grpo_api_run`), which tests/test_execute_cli.py then resumes through the CLI.

Measured (tiny-llama, seed 0, lr 1e-2, 8 prompts x 4 samples, 10 steps): mean reward
0.069 0.063 0.075 0.099 0.102 0.129 0.150 0.163 0.181 0.187 -- the same as the one-process run
(per-sample seeds, data-parallel gradients that sum to the batch gradient).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from exec_util import GRPO_STEPS, curve

from executors.ckptindex import read_latest
from traces.schema import read_trace

STEPS = GRPO_STEPS
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def api_run(grpo_api_run):
    """The run, the steps `on_step` saw, whether Ray was still up after the call, and the
    set-up phases `on_phase` was told."""
    a = grpo_api_run
    return a.result, a.seen, a.ray_up, a.phases


@pytest.fixture(scope="module")
def result(api_run):
    return api_run[0]


def test_execute_stops_the_ray_it_started(api_run) -> None:
    """Killed with a notebook's kernel, a Ray left running prints SIGTERM stack traces."""
    r, seen, ray_up, _ = api_run
    assert [s.step for s in seen] == list(range(STEPS)) and r.ledger_ok
    assert not ray_up


def test_reward_rises(result) -> None:
    c = curve(result)
    assert len(c) == STEPS
    first, last = sum(c[:3]) / 3, sum(c[-3:]) / 3
    assert last > first + 0.04, c


def test_sync_mode_versions_equal_step(result) -> None:
    for s in result.stats:
        assert s.versions == [s.step]


def test_ledger_balances(result) -> None:
    assert result.ledger_ok, result.ledger_problems


def test_trace_has_every_kind_of_event(result, tmp_path) -> None:
    path = tmp_path / "trace.json"
    result.trace.write(path)
    tr = read_trace(path)
    assert tr.metadata["source"] == "execute"
    assert set(tr.metadata["emulated_pools"]) == {"gpu", "lpu"}
    cats = {e.cat for e in tr.events}
    assert {"step", "stage", "generate", "transfer", "tool", "reward", "forward", "train",
            "checkpoint", "collective"} <= cats  # the dp-2 trainers' collective probe
    samples = 8 * 4
    assert len(tr.of("tool")) == samples * STEPS  # one event per tool call
    for e in tr.events:
        assert "step" in e.args and "policy_version" in e.args, e
        if e.cat not in ("step", "stage", "checkpoint"):
            assert e.args["role"] in ("actor", "rollout", "reference", "reward", "environment")
    gen = tr.of("generate")
    assert sum(len(e.args["sample_ids"]) for e in gen) == samples * STEPS
    assert all(e.args["tokens"] > 0 for e in gen)
    assert all(e.args["bytes"] > 0 for e in tr.of("transfer"))
    assert {e.pid for e in tr.of("train")} == {"gpu:0"}
    assert {e.pid for e in tr.of("generate")} == {"lpu:0"}


def test_checkpoints_written(result) -> None:
    out = Path(result.out_dir)
    stored = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert stored["actor"] == f"checkpoints/actor-{STEPS - 1:06d}.pt"  # relative to the folder
    latest = read_latest(out)
    assert latest["step"] == STEPS - 1
    # the dp 2 trainer's checkpoint: a folder of each rank's own shards (executors.shardckpt)
    ranks = sorted(p.name for p in Path(latest["actor"]).iterdir())
    assert ranks == ["rank-00000.pt", "rank-00001.pt"]


# The set-up of a Ray run, phase by phase: what `placer execute` shows before its step bar.
RAY_SETUP = ["checking the plan", "preparing the initial model", "starting Ray",
             "reserving placement groups", "starting actors, loading models", "checking placement",
             "forming the trainers' process group"]


def test_setup_phases_are_named_in_order_and_add_up(api_run) -> None:
    r, _, _, phases = api_run
    assert phases == [*RAY_SETUP, None]  # None: the set-up is over, the first step begins
    assert [p for p, _ in r.setup_phases] == RAY_SETUP
    assert r.setup_s == pytest.approx(sum(t for _, t in r.setup_phases))
    doc = r.summary()
    assert [p["phase"] for p in doc["setup_phases"]] == RAY_SETUP


def test_role_times_per_step_add_up(result) -> None:
    """Per role, the wall time within a step never exceeds the step and the rank-seconds are
    never below it; both read against the trace's own events (the trainers' two ranks: their
    `train` events summed are the rank-seconds, their union the wall time)."""
    tr = result.trace
    for st in result.stats:
        assert set(st.role_wall_s) == set(st.role_rank_s) >= {"actor", "rollout", "reward"}
        for role, wall in st.role_wall_s.items():
            assert 0 < wall <= st.step_s, (st.step, role, wall, st.step_s)
            assert st.role_rank_s[role] >= wall - 1e-9, (st.step, role)
        train = [e for e in tr.of("train") if e.args["step"] == st.step
                 and e.args["role"] == "actor"]
        assert len(train) == 2  # data-parallel 2: one event per rank
        assert st.role_rank_s["actor"] == pytest.approx(sum(e.dur_s for e in train), abs=1e-3)
        lo, hi = min(e.ts_s for e in train), max(e.ts_s + e.dur_s for e in train)
        assert st.role_wall_s["actor"] <= hi - lo + 1e-3
        # the two ranks train at once: their sum is well above the wall time they took
        assert st.role_rank_s["actor"] > 1.5 * st.role_wall_s["actor"]
        # every role of GRPO_LAYOUT runs one device per rank (dp only, TP 1)
        assert st.role_device_s == pytest.approx(st.role_rank_s)
    means = result.summary()["mean_per_step"]
    assert all(means["role_wall_s"][r] <= means["step_s"] for r in means["role_wall_s"])
