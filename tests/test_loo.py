"""Leave-one-out fidelity of the published runs (workflows/loo.py): the fitter recovers known
factors from rows generated with them, a row's LOO prediction never uses the row, and the
honest (LOO) error is bounded."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from placer.cost.efficiency import Calibration, Efficiency
from workflows.loo import (
    ROW_FACTORS,
    SETTINGS,
    Fitter,
    LooReport,
    Rows,
    fit_group,
    golden_min,
    held_out_prediction,
    objective,
    stage_times,
    with_published,
)
from workflows.published import main, predict_decode, predict_row, predict_sync, published_rows


@pytest.fixture(scope="module")
def rows() -> Rows:
    return published_rows()


@pytest.fixture(scope="module")
def rep(published_loo: LooReport) -> LooReport:
    return published_loo  # tests/conftest.py: one computation shared with tests/test_band.py


def test_golden_section_finds_a_known_minimum() -> None:
    x = golden_min(lambda v: abs(math.log(v / 0.37)), 0.01, 10.0)
    assert x == pytest.approx(0.37, rel=1e-3)


def test_stage_times_are_what_the_full_row_prices(rows: Rows) -> None:
    # the fit prices the trainer and sync stages without the rollout: same numbers as predict_row
    for row in rows.step:
        full = predict_row(row, Calibration())
        got = stage_times(rows, row, Efficiency(), ("old_log_prob", "ref", "update", "sync"))
        for k, v in got.items():
            assert v == pytest.approx(full.stages[k].predicted_s, rel=1e-9), (row.name, k)


def _synthetic(rows: Rows, truth: Efficiency) -> Rows:
    """The published rows with every published figure replaced by the model's at `truth`."""
    calib = Calibration(truth)
    step = tuple(replace(r, stages={**r.stages, **stage_times(rows, r, truth, r.stages)})
                 for r in rows.step)
    sync = tuple(replace(s, published_s=predict_sync(s, calib).predicted_s) for s in rows.sync)
    decode = tuple(replace(d, published_s=predict_decode(d, calib).predicted_s)
                   for d in rows.decode)
    return rows.replaced(step, sync, decode, rows.serving)


def test_fit_recovers_the_factors_rows_were_generated_from(rows: Rows) -> None:
    # an independent check of the fitter: rows made from known factors (none at the shipped
    # value) give those factors back
    truth = Efficiency().override({"mfu_train": 0.70, "mfu_score": 0.45, "dispatch_gbs": 0.25,
                                   "sync_load_entry_s": 1.5e-6, "sync_sender_gbs": 15.0,
                                   "sync_local_gbs": 20.0, "step_overhead_s": 2.5e-3})
    fitted = Fitter(_synthetic(rows, truth)).fit()
    for f in ROW_FACTORS:
        assert getattr(fitted, f.name) == pytest.approx(getattr(truth, f.name), rel=0.03), f.name


def test_a_factor_no_datum_moves_keeps_its_start_value(rows: Rows) -> None:
    # `sync_local_gbs` prices colocated refreshes; without row r10 (its one datum, a sync stage)
    # every sync row is priced alike at its bounds, and a flat objective must not settle the
    # factor at the lower bound (3 GB/s) for the held-out row
    start = Efficiency()
    held = fit_group(rows.without("r10 GRPO 27B 8xH200 colocate"), "sync", start)
    assert held.sync_local_gbs == start.sync_local_gbs
    assert fit_group(rows, "sync", start).sync_local_gbs != start.sync_local_gbs  # r10 moves it


def test_first_call_stages_fit_nothing_and_later_stages_do(rows: Rows) -> None:
    # r10's reference and update stages hold the run's first calls (`Row.first_call_stages`):
    # scaling them moves no objective; its actor log-prob pass, run after them, is data of
    # `mfu_score` as any row's is
    name, eff = "r10 GRPO 27B 8xH200 colocate", Efficiency()
    (r10,) = [r for r in rows.step if r.name == name]
    assert r10.first_call_stages == ("ref", "update") and r10.first_step

    def scaled(stages: set[str]) -> Rows:
        step = [r if r.name != name else replace(
            r, stages={k: v * (1.5 if k in stages else 1.0) for k, v in r.stages.items()})
            for r in rows.step]
        return rows.replaced(step, rows.sync, rows.decode, rows.serving)
    for f in ROW_FACTORS:
        assert objective(scaled({"ref", "update"}), f, eff) == objective(rows, f, eff), f.name
    score = next(f for f in ROW_FACTORS if f.name == "mfu_score")
    assert objective(scaled({"old_log_prob"}), score, eff) != objective(rows, score, eff)
    assert name in {r.name for r in rows.of_kind("first_step")}
    assert name not in {r.name for r in rows.of_kind("step")}


@pytest.mark.parametrize("name", ["r02 DAPO 7B 64xH20 colocate", "verl 7B 4->4 H20",
                                  "vLLM Llama-3.1-8B TP1 H200 batch 8"])
def test_a_rows_loo_prediction_never_uses_the_row(rows: Rows, name: str) -> None:
    before = held_out_prediction(rows, name)
    moved = with_published(rows, name, 1.5)
    assert held_out_prediction(moved, name) == before
    # ...while the objective the in-sample fit minimises does see it (the check could fail)
    eff = Efficiency()
    assert any(objective(moved, f, eff) != objective(rows, f, eff) for f in ROW_FACTORS)


def test_factors_fitted_on_rows_are_not_operator_level_or_settings() -> None:
    names = {f.name for f in ROW_FACTORS}
    assert not names & {"mfu_prefill", "decode_bw_eff", "decode_tp_bw_loss", "tp_call_s"}
    assert not names & set(SETTINGS)
    assert all(f.name in Efficiency.__dataclass_fields__ and 0 < f.lo < f.hi for f in ROW_FACTORS)


def test_leave_one_out_error_is_bounded(rep: LooReport) -> None:
    # The honest figure: each row predicted by factors fitted without it. The goal: a
    # LOO median |error| <= 0.15 and max <= 0.30 over >= 14 rows. A ratchet: tighten when a
    # change lands; loosen only for a defect fixed, a change measured better elsewhere or new
    # rows, and say which in the commit. How each row moved, change by change, is in
    # docs/cost-model.md ("Accuracy and what it was fitted on"); the figures at the last bound
    # change are given here. First-step rows (Miles' r10, -57%: one-time costs
    # in its published times) are apart (test_first_step_row_is_reported_apart).
    step = rep.summary("step")
    assert len(rep.kind("step")) == 22
    # 9.5% LOO (10.4% in-sample), max 29.6% (r01, whose published mean spans a run whose steps
    # doubled in its second half; r11 -27% with verl's validation inside its step timer)
    assert step["loo_median_abs_error"] < 0.10, step
    earlier = [r for r in rep.kind("step") if r.name[:3] < "r15"]
    assert len(earlier) == 13 and max(abs(r.loo_error) for r in earlier) < 0.30, earlier
    # NeMo-RL's nine rows were added held out (no stage times, nothing fitted on them): +4% to
    # -25% (r19). None may be more than 5% slow: every fix they took was a defect in the code
    # they model, and the ones left (r17, r19, r23 ~-23%) are short, not long
    nemo = {r.name[:3]: r.loo_error for r in rep.kind("step") if r.name[:3] >= "r15"}
    assert max(abs(e) for e in nemo.values()) < 0.25 and max(nemo.values()) < 0.05, nemo
    # 20 rows, 8.0% median, max 20.4% (verl's H100 checkpoint-engine row: its sender rate
    # refitted without it). NeMo-RL's seven nccl_reshard rows -9% to +8%, with its per-misc
    # tensor and per-grouped-expert-call costs fitted on them (-51% / -63% / -21% without)
    sync = rep.summary("sync")
    assert len(rep.kind("sync")) == 20
    assert sync["loo_median_abs_error"] < 0.09 and sync["loo_max_abs_error"] < 0.21, sync
    reshard = [r for r in rep.kind("sync") if r.name.endswith("nccl-reshard")]
    assert len(reshard) == 7 and all(abs(r.loo_error) < 0.10 for r in reshard), reshard
    # 3.7% median, max 16.8% (Llama-3.1-8B TP1: `step_overhead_s` refits on the other four)
    decode = rep.summary("decode")
    assert decode["loo_median_abs_error"] < 0.04 and decode["loo_max_abs_error"] < 0.17, decode
    # the multi-node serving anchors: no factor is fitted on them (out-of-sample); -1% decode,
    # +19% prefill (two-batch overlap is not priced)
    serving = rep.summary("serving")
    assert len(rep.kind("serving")) == 2 and serving["loo_max_abs_error"] < 0.21, serving
    # every row of the headline kinds (the JSON headline; first-step rows apart): 49 rows,
    # 7.8% LOO (5.3% in-sample), max 29.6% (r01)
    every = rep.summary()
    assert len(rep.rows) == 50 and len(rep.kind("first_step")) == 1
    assert every["loo_median_abs_error"] < 0.085 and every["loo_max_abs_error"] < 0.30, every


def test_loo_json_adds_fields_and_keeps_the_plain_document(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["--loo", "--json"]) == 0
    loo = json.loads(capsys.readouterr().out)
    assert set(plain) < set(loo)
    assert {"loo_median_abs_error", "loo_max_abs_error", "in_sample_median_abs_error",
            "step_loo", "sync_loo", "decode_loo", "serving_loo"} <= set(loo)
    assert loo["rows_loo"] == len(loo["rows"]) + len(loo["sync"]) + len(loo["decode"]) + len(
        loo["serving"]) >= 14
    # the first-step rows apart, each with its evidence and its own summary
    assert [r["name"][:3] for r in loo["first_step"]] == ["r10"]
    assert "step 0" in loo["first_step"][0]["first_step"] and "loo_error" in loo["first_step"][0]
    assert set(loo["first_step_loo"]) >= {"loo_median_abs_error", "loo_max_abs_error"}
    for key in ("rows", "sync", "decode", "serving"):
        for p, q in zip(plain[key], loo[key], strict=True):
            assert {k: q[k] for k in p} == p and {"loo_error", "in_sample_error"} <= set(q)


def test_write_band_needs_loo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--write-band"]) == 2
    assert "--write-band" in capsys.readouterr().err
