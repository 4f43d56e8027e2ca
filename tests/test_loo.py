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
    # The honest figure: each row predicted by factors fitted without it. The goal is a
    # LOO median |error| <= 0.15 and max <= 0.30 over >= 14 rows. Row r10 (Miles' hybrid 27B
    # on H200, -57.5%) is a first-step row, apart (test_first_step_row_is_reported_apart): its
    # published times hold one-time costs, and its reference and update stages no longer fit
    # `mfu_score` / `mfu_train`. The 13 steady-state rows before NeMo-RL's reach a median of
    # 11.3% and a max of 29.5% (r01, -29%). NeMo-RL's nine performance rows (r15-r23, H100
    # and GB200) were added held out with the errors found (no stage times: nothing is fitted
    # on them): -2%, +113%, +74%, +48%, -5%, +66%, +71%, +111%, +5% (the MoE rows on TP 8-32
    # engines; docs/cost-model.md, "NeMo-RL's performance rows"), so over 22 rows the median
    # was 13.5% and the max 113%; with NeMo-RL's colocated CUDA-IPC refit priced by its code
    # (DeepSeek-V3's from 54 s to 31 s) they are +2%, +113%, +50%, +48%, -2%, +66%, +41%,
    # +111%, +5%: 13.3% median, max 113%. With the routed experts read at the fused-MoE grid's
    # occupancy and eager host time by launches (placer/cost/kernels.py; no factor) and verl's
    # Megatron CPU Adam at the one-thread host rate: -21%, +2%, -25%, -2%, -9%, +9%, -14%, -1%,
    # -33%, and the step rows 10.0% median, max 37.1%: r11 (DeepSeek-V3, verl's eager H20
    # engines) from -20% to -37%, its rollout stage no longer hiding ~400 s of unpriced
    # trainer-side time. Then two defects fixed by the code they model, not by the rows: a pool
    # inside one NVLink domain (GB200 NVL72) prices its groups on NVLink, and a pipelined
    # forward pass each stage's own layers' collectives. Both flattered NeMo-RL's rows: -21%,
    # -10%, -30%, -2%, -42% (r19, 30B-A3B on 16 GB200), -17%, -18%, -9%, -29%, every one now
    # short (docs/cost-model.md, "What is left on these rows"); the step rows 14.2%, max 42.3%.
    # Loosened for those fixes; the earlier rows' bound for r11 alone. A ratchet: tighten,
    # loosen only for a change measured better elsewhere, a defect fixed, or new rows, and say
    # which. Loosened for a defect fixed (FLOPs counted as the code runs them): the LM head is
    # not recomputed, verl's Megatron runs (r05, r06, r09a, r09b) and NeMo-RL's 30B-A3B recipes
    # (r15, r19) do not recompute at all, and the DAPO 7B FSDP2 rows cut micro-batches at
    # their scripts' token budgets. mfu_train then fits at 0.859 on all rows (was 0.9999, at
    # its bound); the step rows 13.0% -> 14.5% LOO, max 41.7% -> 43.6% (r19), r09a -23% ->
    # -33% (the 8/6 count had hidden its gap), r09b -5% -> -13%.
    # Loosened for a defect fixed in the rows' inputs: r01-r03's trainer as their runs' scripts
    # set it (HSDP shard groups of 2, the actor parked between phases; it was ZeRO-3 over every
    # device): r01 -29% -> -32%, r02 +7% -> +5%, r03 -10% -> -15% alone (the step rows 13.0% ->
    # 15.1%, r03 crossing the median). Both defects fixed together, with EasyR1's host image
    # preparation, NCCL's bandwidths across nodes, the every-step switches and the NeMo-RL
    # recipes' own settings: the step rows 16.4%, max 43.5% (r19); r08 +37% (in-sample +15%:
    # mfu_train refitted without r08's update falls, the dense FSDP2 updates priced slow and
    # the 30B-A3B MoE ones fast at one factor, workflows/moe_mfu.py). Loosened for the defects
    # fixed; the median target of the issue (<= 15%) no longer holds, and is reported so.
    # Tightened: NeMo-RL's log-prob passes of an MoE model priced with the per-token routing
    # cost its pull request 3295 measured (Qwen3-30B-A3B on 2 x 8 B200; the nemo-rl profile's
    # moe_route_token_layer_s, fitted on no row) take the step rows from 16.4% to 14.0% LOO,
    # max 43.5% (r19) -> 37.3% (r08): r15 -22% -> -11%, r19 -43% -> -24%, r20 -17% -> -14%,
    # r23 -24% -> -22%, r16 and r22 +1%/+2% -> +2%/+3%.
    step = rep.summary("step")
    assert len(rep.kind("step")) == 22
    # Tightened (0.165 -> 0.13): the r09a / r09b trainers at their scripts' settings (r09a's
    # rollout.n 16, TP 2 x PP 2 with micro-batches of 2 for both) and attention priced at
    # E[s^2] / E[s]: the step rows 16.4% -> 12.5% LOO; r09a -26% -> -4%, r08 +37% -> +7%,
    # r07 +3% -> -12%, r01 -27% -> -31% (mfu_score and mfu_train refit to 0.93 and 0.90)
    # Tightened (0.13 -> 0.11, the earlier rows' max 0.38 -> 0.33): with gradients reduced at
    # each framework's precision, a vLLM engine spanning hosts priced without the custom
    # all-reduce (r20 -14% -> -9%) and r11's host step paced by its heaviest pipeline stage,
    # the step rows are 10.0% LOO, max 31.5% (r11), r01 -29.8%
    # Tightened (the earlier rows' max 0.33 -> 0.30, r11's own bound folded in): verl's
    # validation inside its step timer priced where the runs' docs give test_freq
    # (`Job.validation`, placer/cost/validation.py; r01-r03, r05 every 20 steps, r11 every 10):
    # r11 -31.5% -> -27.1%, r05 -6.9% -> -4.0%, r01 -29.8% -> -29.6%, r03 -10.7% -> -10.0%,
    # r02 +7.5% -> +8.1%; the step rows 9.6% LOO, max 29.6% (r01)
    assert step["loo_median_abs_error"] < 0.11, step
    earlier = [r for r in rep.kind("step") if r.name[:3] < "r15"]
    assert len(earlier) == 13 and max(abs(r.loo_error) for r in earlier) < 0.30, earlier
    nemo = {r.name[:3]: r.loo_error for r in rep.kind("step") if r.name[:3] >= "r15"}
    # NCCL's hierarchical latency for TP all-reduces across nodes (collectives.
    # span_tree_steps_s) moved r16 -10% -> -5%, r17 -30% -> -28%, r18 -2% -> +2%, r21 -18%
    # -> -16%, r22 -9% -> -2%, r23 -29% -> -27% (LOO); the step rows 13.4%, max 42.3% (r19).
    # r18 is no longer short: the sign bound admits +3% for that defect fixed. A pipelined pass
    # at its slowest stage's pace (placer/cost/stages.py: r11's last stage holds the LM head
    # and 6 of 61 layers) and a token budget's micro-batch count for its bubble: r11 -36% ->
    # -34%, r16 -5% -> -4%; the step rows 13.1%, max 42.2% (r19). NCCL's algorithm and
    # protocol bandwidths across nodes (collectives.span_all_reduce: LL's capped rate at mid
    # sizes, the two-node tree) price the engines' TP 16/32 all-reduces slower: r11 -34% ->
    # -32%, r16 -4% -> +2%, r17 -27% -> -24%, r18 +2% -> +4%, r21 -15% -> -8%, r22 -1% -> +2%,
    # r23 -27% -> -24%; the step rows 10.7%, max 42.2% (r19). The sign bound admits +5% for it.
    # r19 (30B-A3B, no recomputation: NeMo-RL's activation_checkpointing false) -42% -> -44%.
    # With the measured routing cost (above) the worst is r19, -24%: tightened to 0.25.
    assert max(abs(e) for e in nemo.values()) < 0.25 and max(nemo.values()) < 0.05, nemo
    # 20 rows, 8.0% median, max 20.4% (verl's H100 checkpoint-engine row, -20%: its sender rate
    # refitted without it on verl's two GH200 single-sender rows and NeMo-RL's two NCCL-pair
    # rows, 10.7 GB/s achieved against its 8.7; 17 rows, 8.3% and max 29.2% when the README was
    # the one verl datum of that rate and NeMo-RL's NCCL pairs alone refitted it); the three
    # rows added with that change (NeMo-RL's synchronous NCCL column, verl's GH200 27B and
    # 30B-A3B) were +11%, +30% and +33% at the old shipped rate before any refit, -7%, +7% and
    # +19% leave-one-out; verl's three per-tensor NCCL rows -5% /
    # +10% / -8% (each tensor one engine loader walk: `sync_load_entry_s`). NeMo-RL's seven
    # nccl_reshard rows (the doc's three and pull request 2971's four more 30B layouts) are
    # -9% to +8%: each misc tensor's export and load (`reshard_misc_tensor_s`, ~0.48 ms) and
    # each grouped-expert call on an engine stream (`reshard_grouped_call_s`, ~4.0 ms), fitted
    # on those rows (docs/cost-model.md, Weight sync). Tightened from 13 rows, 15.3% and max 63%
    # when those two costs were priced (-51% / -63% / -21% without them); the NeMo-RL
    # DeepSeek-V3 NCCL row's held-out error went back from +24% to +12%
    sync = rep.summary("sync")
    assert len(rep.kind("sync")) == 20
    assert sync["loo_median_abs_error"] < 0.09 and sync["loo_max_abs_error"] < 0.21, sync
    reshard = [r for r in rep.kind("sync") if r.name.endswith("nccl-reshard")]
    assert len(reshard) == 7 and all(abs(r.loo_error) < 0.10 for r in reshard), reshard
    # 6.5% median, max 19.8% (Llama-3.1-8B TP1: held out, `step_overhead_s` refits from 1.38
    # to 0.57 ms on the other four anchors, Mixtral's +6% pulling it down; the attention
    # kernels' fixed time per layer, fitted on A100 kernels, is what the deep rows (70B, 235B)
    # carry instead; 4.6% / 9.9% before that floor was priced, which left the attention
    # operators at 41.8%; docs/cost-model.md, "Operator-level fidelity")
    # 3.7% median, max 16.8% once the B200 anchor's fused-MoE read is priced from the grid's
    # occupancy rather than carrying a half width of its own (+4% leave-one-out)
    decode = rep.summary("decode")
    assert decode["loo_median_abs_error"] < 0.04 and decode["loo_max_abs_error"] < 0.17, decode
    # the multi-node serving anchors: no factor is fitted on them (out-of-sample); -1% decode,
    # +19% prefill (two-batch overlap is not priced)
    serving = rep.summary("serving")
    assert len(rep.kind("serving")) == 2 and serving["loo_max_abs_error"] < 0.21, serving
    # every row of the headline kinds (the JSON headline; first-step rows apart): 49 rows,
    # 8.9%, max 113% (r16; 46 rows, 9.3% before the three sync rows above (NeMo-RL's
    # synchronous NCCL column, verl's GH200 27B and 30B-A3B) and the colocated IPC refit;
    # 37 rows, 8.3%, max 29.5% before NeMo-RL's nine held-out rows; 38
    # rows, 8.5%, max 57.5% with r10 counted; 34 rows, 11.1%, max 63.1% before the
    # nccl_reshard per-item costs and pull request 2971's four rows, above); EasyR1's two
    # Qwen2.5-VL rows are -24% (r13, 7B) and -5% (r14, 32B) at their job files' micro-batch
    # budgets (8,192 forward, 4,096 update tokens; -26% and -8% at verl's 16,384), -19% and
    # -3% once EasyR1's host image preparation is priced (median and max unmoved)
    # 8.3%, max 37.1% (r11) with the occupancy read and launch-counted eager host time above;
    # 8.9%, max 42.3% (r19) with the NVLink-domain and pipelined-forward fixes; 8.3%, max
    # 42.2% with NCCL's hierarchical latency across nodes and the slowest pipeline stage;
    # 8.9%, max 43.6% (r19) with training FLOPs counted as the runs' code runs them (above)
    every = rep.summary()
    assert len(rep.rows) == 50 and len(rep.kind("first_step")) == 1
    # 7.7%, max 31.5% (r11) after this round's changes (step rows above); 7.8%, max 29.6% (r01)
    # with verl's validation priced (step rows above): the max tightened 0.33 -> 0.30
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
