"""workflows.passratio: the forward-only ceiling each published run implies through its own
update (the run's unpublished lengths cancel in the ratio)."""
from __future__ import annotations

import statistics

import pytest

from placer.cost.efficiency import Efficiency
from workflows.passratio import implied, pass_ratios
from workflows.published import published_rows


@pytest.fixture(scope="module")
def rows():
    return published_rows()


def test_implied_inverts_the_priced_ratio(rows) -> None:
    # at the priced ratio itself the bisection returns the factor it was priced at
    ratio = next(p for p in pass_ratios(rows, ("r09b",)))
    assert implied(rows, next(r for r in rows.step if r.name.startswith("r09b")),
                   "old_log_prob", ratio.priced) == pytest.approx(Efficiency().mfu_score, rel=1e-4)


def test_dense_runs_put_the_forward_pass_at_the_training_ceiling(rows) -> None:
    # verl's dense 7B runs whose ratios the model reaches: FSDP2 with recomputation (r01, r03)
    # and Megatron without (r09a, r09b) each imply mfu_score within 2% of mfu_train's default,
    # which mfu_score's default is set to (in-sample: the evidence it was set on)
    got = pass_ratios(rows, ("r01", "r03", "r09a", "r09b"))
    assert len(got) == 4 and {p.stage for p in got} == {"old_log_prob"}
    values = [p.implied_mfu_score for p in got]
    assert statistics.median(values) == pytest.approx(Efficiency().mfu_train, rel=0.02), values
    assert Efficiency().mfu_score == Efficiency().mfu_train
