"""Golden metrics: re-simulating the stored plans under traces/golden/ gives the stored metrics.

A regression guard, not evidence: the stored metrics are this simulator's own output. What
checks the numbers against something independent: tests/test_operators.py (the cost model
against measured operator times), tests/test_loo.py (published runs, leave-one-out),
tests/test_ilp_oracle.py (the ILP against brute force) and tests/test_sim_agreement.py (the
simulator's event schedule against the planner's closed-form composition).

Regenerate after an intended model change with `python -m simulator.golden --write` (make golden)
and review the diff of traces/golden/*.metrics.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.golden import (
    GOLDEN,
    ROOT,
    check,
    diff,
    example_names,
    load_golden_plan,
    save_golden_plan,
)


@pytest.mark.parametrize("name", example_names())
def test_golden_metrics(name, golden_runs):
    problems = check(name, json.loads(golden_runs(name).metrics))
    assert not problems, "\n".join(problems[:20])


def test_diff_reports_a_moved_number():
    assert diff({"a": {"b": 1.0}}, {"a": {"b": 1.0 + 1e-9}}) == []
    assert diff({"a": {"b": 1.0}}, {"a": {"b": 1.1}}) == ["a.b: 1.0 -> 1.1"]
    assert diff({"a": 1}, {}) == ["a: missing"]


def test_golden_plans_name_local_files_relative_to_the_repository(tmp_path):
    """tiny-moe's plan names its checkpoint and dataset relative to the repository root (a clone
    anywhere writes the same file); reading anchors them at this clone's root."""
    stored = GOLDEN / "tiny-moe.plan.json"
    assert str(ROOT) not in stored.read_text()
    plan = load_golden_plan(stored)
    assert plan.spec.models.paths["policy"] == str(ROOT / "examples" / "tiny-moe" / "model")
    assert plan.spec.data is not None and Path(plan.spec.data.path).is_file()
    save_golden_plan(plan, tmp_path / "again.plan.json")
    assert (tmp_path / "again.plan.json").read_text() == stored.read_text()
