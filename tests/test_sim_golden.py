"""Golden metrics: re-simulating the stored plans under traces/golden/ gives the stored metrics.

Regenerate after an intended model change with `python -m simulator.golden --write` (make golden)
and review the diff of traces/golden/*.metrics.json."""
from __future__ import annotations

import pytest

from simulator.golden import check, diff, example_names


@pytest.mark.parametrize("name", example_names())
def test_golden_metrics(name):
    problems = check(name)
    assert not problems, "\n".join(problems[:20])


def test_diff_reports_a_moved_number():
    assert diff({"a": {"b": 1.0}}, {"a": {"b": 1.0 + 1e-9}}) == []
    assert diff({"a": {"b": 1.0}}, {"a": {"b": 1.1}}) == ["a.b: 1.0 -> 1.1"]
    assert diff({"a": 1}, {}) == ["a: missing"]
