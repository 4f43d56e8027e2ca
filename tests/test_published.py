"""The published-runs fidelity command: one JSON document with finite numbers for every row
(planning only, no simulation)."""
from __future__ import annotations

import json
import math

import pytest

from placer.spec import load_job
from workflows.published import EXAMPLES, ROWS, fidelity, main


@pytest.fixture(scope="module")
def doc() -> dict:
    return fidelity()


def test_every_row_has_a_job_file_that_loads() -> None:
    files = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert sorted(r.file for r in ROWS) == files
    for f in files:
        load_job(EXAMPLES / f)
    assert len(ROWS) >= 9


def test_document_shape_and_finite_numbers(doc: dict) -> None:
    assert len(doc["rows"]) == len(ROWS)
    for row in doc["rows"]:
        assert {"name", "published_s", "predicted_s", "error", "stages"} <= set(row)
        for k in ("published_s", "predicted_s", "error"):
            assert math.isfinite(row[k]), (row["name"], k)
        assert row["predicted_s"] > 0
        for st in row["stages"].values():
            assert all(math.isfinite(v) for v in st.values())
    assert math.isfinite(doc["median_abs_error"]) and doc["median_abs_error"] >= 0
    assert doc["sync"] and all(math.isfinite(s["predicted_s"]) and s["predicted_s"] > 0
                               for s in doc["sync"])


def test_json_flag_prints_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"rows", "median_abs_error", "sync"}


def test_errors_do_not_grow_past_what_the_model_reaches_today(doc: dict) -> None:
    # A ratchet, not the goal (median |error| <= 15%): 60% with generation priced at mean
    # lengths, 34% with the tail-aware rollout and device-balanced training efficiency. Tighten
    # these bounds as the model improves; never loosen them.
    assert doc["median_abs_error"] < 0.40, doc["median_abs_error"]
    # sync: 53% with one bandwidth term; 22.5% with verl's unbucketed NCCL sync paying one call
    # per tensor from one sender (`timing.sync_calls`)
    assert doc["sync_median_abs_error"] < 0.25, doc["sync_median_abs_error"]
    verl = [s for s in doc["sync"] if s["name"].startswith("verl")]
    assert len(verl) == 4 and all(abs(s["error"]) < 0.30 for s in verl), verl
    # the vLLM decode rows set the decode defaults, so they must stay close
    assert all(abs(r["error"]) < 0.10 for r in doc["decode"]), doc["decode"]


def _stage_median(doc: dict, stage: str) -> float:
    errs = sorted(abs(r["stages"][stage]["error"]) for r in doc["rows"] if stage in r["stages"])
    return errs[len(errs) // 2] if len(errs) % 2 else sum(errs[len(errs) // 2 - 1:][:2]) / 2


def test_stage_errors_do_not_grow(doc: dict) -> None:
    # A ratchet per stage: rollout median |error| 65% at mean lengths, 27% tail-aware; the update
    # median |error| was 62% before the device-balanced training efficiency, old log-prob 34%.
    assert _stage_median(doc, "update") < 0.30, _stage_median(doc, "update")
    assert _stage_median(doc, "old_log_prob") < 0.32, _stage_median(doc, "old_log_prob")
    assert _stage_median(doc, "rollout") < 0.35, _stage_median(doc, "rollout")
