"""The published-runs fidelity command: one JSON document with finite numbers for every row
(planning only, no simulation)."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.estimate import budgeted, trained_context, trained_span
from placer.cost.model import train_time
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from workflows.published import (
    EXAMPLES,
    ROWS,
    PublishedReport,
    fidelity,
    main,
    predict_row,
    render,
)


@pytest.fixture(scope="module")
def doc() -> PublishedReport:
    return fidelity()


def test_every_row_has_a_job_file_that_loads() -> None:
    files = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert sorted(r.file for r in ROWS) == files
    for f in files:
        load_job(EXAMPLES / f)
    assert len(ROWS) >= 9


def test_document_shape_and_finite_numbers(doc: PublishedReport) -> None:
    # the first-step rows (r10: its times hold one-time costs) are reported apart
    assert len(doc.rows) + len(doc.first_step) == len(ROWS)
    assert [r.name for r in doc.first_step] == [r.name for r in ROWS if r.first_step]
    for row in doc.rows + doc.first_step:
        assert {"name", "published_s", "predicted_s", "error", "stages"} <= set(row.to_dict())
        for v in (row.published_s, row.predicted_s, row.error):
            assert math.isfinite(v), row.name
        assert row.predicted_s > 0
        for st in row.stages.values():
            assert all(math.isfinite(v) for v in (st.published_s, st.predicted_s, st.error))
    assert math.isfinite(doc.median_abs_error) and doc.median_abs_error >= 0
    assert doc.sync and all(math.isfinite(s.predicted_s) and s.predicted_s > 0 for s in doc.sync)


def test_json_flag_prints_one_document(capsys: pytest.CaptureFixture[str],
                                      doc: PublishedReport) -> None:
    assert main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"rows", "median_abs_error", "sync"}
    assert PublishedReport.from_dict(out) == doc  # the JSON form reads back to the report


def test_errors_do_not_grow_past_what_the_model_reaches_today(doc: PublishedReport) -> None:
    # A regression guard on the shipped defaults, not an accuracy claim: several defaults were
    # fitted on these rows (mfu_train, mfu_score, dispatch_gbs on the H20 rows:
    # docs/cost-model.md marks them in-sample), so these figures are in-sample. The honest,
    # leave-one-out bound is tests/test_loo.py::test_leave_one_out_error_is_bounded. Tighten
    # these as the model improves, never loosen them. Row r10 (-56%) is a first-step row,
    # reported apart (`Row.first_step`: its times hold one-time costs). 17.3% since mfu_prefill,
    # the decode read curve and the TP all-reduce were refitted on operator profiles (`python -m
    # workflows.operators --fit`; out-of-sample here, was 12.4% with them in-sample); the
    # run-level factors were not retuned to compensate. 15.2% over 22 rows with NeMo-RL's nine
    # held-out performance rows (r15-r23, added with their errors as found): the max is r16
    # (Qwen3-235B-A22B on 128 H100, +113%), bounded in test_nemo_rl_performance_rows_held_out.
    # 11.5% since the routed-expert read is priced from the fused-MoE grid's occupancy and an
    # eager engine's host time from its layers' launches (placer/cost/kernels.py), with verl's
    # Megatron CPU Adam at the one-thread host rate: the NeMo-RL MoE rows come within 33%, and
    # r11 (DeepSeek-V3 on verl's eager H20 engines) goes from -20% to -37%: its rollout stage,
    # which hid ~400 s of unpriced trainer-side time, is now -26% (docs/cost-model.md, "Forms of
    # the routed-expert read"). Loosened for that row alone; the median and every other bound
    # were tightened. 14.8% (max 41.9%, r19) once a pool inside one NVLink domain prices its
    # groups on NVLink and a pipelined forward each stage's own collectives: defects fixed by
    # the code they model, which had flattered NeMo-RL's rows. 14.2% (max 41.8%) with NCCL's
    # hierarchical latency across nodes and a pipelined pass at its slowest stage (r11 -33%).
    # 14.6% with r01-r03's trainer as their runs' scripts set it (HSDP shard groups of 2, the
    # actor parked; a row input fixed, not the model): r01 -25% -> -28%, r03 -10% -> -15%.
    # 11.9% with NeMo-RL's measured MoE routing cost in its log-prob passes (the nemo-rl
    # profile's moe_route_token_layer_s, from NVIDIA-NeMo/RL pull request 3295's B200 run, not
    # from any row): r15 -22% -> -11%, r19 -43% -> -24%, r20 -15% -> -12%, r23 -24% -> -22%.
    # 11.1% with mfu_score's default at mfu_train's (the bound on the H20 rows below says why).
    assert doc.median_abs_error < 0.115, doc.median_abs_error
    earlier = [r for r in doc.rows if r.name[:3] < "r15"]
    assert len(earlier) == 13 and max(abs(r.error) for r in earlier) < 0.34, earlier
    h20 = [r for r in doc.rows if "xH20 " in r.name and not r.name.startswith("r11")]
    # Loosened (0.29 -> 0.30) for r01 alone when mfu_score's default became mfu_train's (0.60
    # -> 0.86, the forward-only ceiling each run implies through its own update, where its
    # lengths cancel: workflows.passratio): r01 -26.8% -> -29.3% as its old_log_prob goes -1% ->
    # -19%; 0.60 had been set on r01-r03's pass levels, whose runs' lengths grew past the shared
    # assumption (docs/cost-model.md). r07 -7% -> -11%, r08 +16% -> +8%, r09b -9% -> -13%.
    assert len(h20) == 10 and all(abs(r.error) < 0.30 for r in h20), [
        (r.name, r.error) for r in h20]  # the goal: every row within 30%
    # sync: verl's unbucketed NCCL sync pays one call per tensor from one sender
    # (`timing.sync_calls`), a broadcast's receive is bound by one rank's NIC, Miles has its own
    # sender rate (sync_call_s and sync_sender_gbs were set on these rows: in-sample; the
    # NeMo-RL DeepSeek-V3 rows set sync_export_gbs, held out in tests/test_refit.py)
    assert doc.sync_median_abs_error < 0.14, doc.sync_median_abs_error
    reshard = [s for s in doc.sync if s.name.endswith("nccl-reshard")]
    assert all(abs(s.error) < 0.30 for s in doc.sync if s not in reshard), doc.sync  # the goal
    # NeMo-RL's nccl_reshard rows (docs/cost-model.md, Weight sync): the wire plus each misc
    # tensor's export and load and each grouped-expert call on an engine stream, whose two
    # costs are fitted on these seven rows (in-sample here; tests/test_loo.py bounds them held
    # out): -6% to +7% with the shipped defaults (-50%, -63%, -21% for the doc's three before
    # those costs were priced)
    assert len(reshard) == 7 and all(abs(s.error) < 0.10 for s in reshard), reshard
    verl = [s for s in doc.sync if s.name.startswith("verl")]
    assert len(verl) == 6  # the three per-tensor NCCL rows, the checkpoint engine's H100 and two GH200
    # the decode read curve and the TP all-reduce are fitted on operator profiles, out-of-sample
    # for these rows (the dense rows set the old defaults in-sample, within 10%): measured -13%
    # and +21%. The TP rows carry 2 L all-reduces of `tp_base_s` (33 us, NCCL kernels) per step:
    # SGLang's Qwen3-235B-A22B TP8 row +67% (94 layers), vLLM's Mixtral-8x7B TP2 +17%
    dense = [r for r in doc.decode if "Llama" in r.name]
    assert len(dense) == 2 and all(abs(r.error) < 0.22 for r in dense), dense
    # the hybrid row (Qwen3.8-27B, GDN state read and written every step) checks that pricing
    assert len(doc.decode) == 5 and all(abs(r.error) < 0.68 for r in doc.decode)
    hybrid = next(r for r in doc.decode if "hybrid" in r.name)
    assert abs(hybrid.error) < 0.05, hybrid


def test_fully_async_trainer_runs_no_old_log_prob_pass(doc: PublishedReport) -> None:
    # verl fully_async_policy takes old log-probs from the engine: r04 and r06 publish none, and
    # the trainer's slot holds only its update (and r06's reference)
    rows = {r.name[:3]: r for r in doc.rows}
    for key in ("r04", "r06"):
        assert "old_log_prob" not in rows[key].stages
    # r04's step is its busier slot (with HSDP the 64-GPU rollout, 185 s, outlasts the 142 s
    # update), never update + a 70 s log-prob pass (212 s)
    r04 = rows["r04"]
    assert r04.predicted_s == pytest.approx(r04.stages["update"].predicted_s, rel=0.35)
    assert r04.predicted_s < r04.stages["update"].predicted_s + 60


def _stage_median(doc: PublishedReport, stage: str) -> float:
    errs = sorted(abs(r.stages[stage].error) for r in doc.rows if stage in r.stages)
    return errs[len(errs) // 2] if len(errs) % 2 else sum(errs[len(errs) // 2 - 1:][:2]) / 2


def test_stage_errors_do_not_grow(doc: PublishedReport) -> None:
    # A ratchet per stage (tighten, never loosen). The rollout median is over rows 1-10, the rows
    # mfu_prefill was chosen on; the update and old log-prob medians are over the rows mfu_train,
    # mfu_score and dispatch_gbs were fitted on (all in-sample); the fully async rows run no
    # old log-prob pass and are not counted.
    assert _stage_median(doc, "update") < 0.26, _stage_median(doc, "update")
    # Loosened (0.08 -> 0.19) for a defect fixed in the rows' inputs: r09a at its script's
    # rollout.n 16 (was 12) and r09a / r09b at their scripts' TP 2 x PP 2 with micro-batches of 2
    # (was TP 2 x DP 8 / DP 6). The one_step_off doc's four runs' log-prob passes are then all
    # priced +36% to +50% (r07 +44%, r08 +50%, r09a +39%, r09b +36%; r09a's was -5%, its n 12
    # hiding the gap) where the fully_async doc's r01-r03 and r05 are within 2%: the median of
    # the eight sits between the two groups (docs/cost-model.md, "What is left on these rows").
    # Tightened (0.19 -> 0.13) with mfu_score's default at mfu_train's (0.60 -> 0.86: within each
    # run, where its lengths cancel, the pass over the update prices as published at a median
    # 0.86, workflows.passratio): r07 +10%, r08 +14%, r09a +5%, r09b +1%, r01-r03 -19% / -13% /
    # -11%, r05 -14%; median 11.8%
    assert _stage_median(doc, "old_log_prob") < 0.13, _stage_median(doc, "old_log_prob")
    passes = [st.error for r in doc.rows if "xH20 " in r.name
              for k, st in r.stages.items() if k in ("old_log_prob", "ref")]
    # Loosened (0.55 -> 0.65) for a defect fixed: causal attention priced at E[s^2] / E[s] of
    # the samples' lengths (placer/cost/attnspan.py), not their mean. The 30B-A3B rows, whose
    # attention is a large share of a token's FLOPs (3B active), move most: r05's reference
    # +33% -> +40%, r06's +52% -> +63%, while their updates go -41% -> -37% and -21% -> -15%
    # (their forward and update were already off in opposite directions at one factor each).
    # Tightened (0.65 -> 0.30) with mfu_score's default at mfu_train's (above): r06's reference
    # +63% -> +29%, r05's +40% -> +19%, the one_step_off rows' +36%..+50% -> +1%..+14%
    assert len(passes) == 10 and max(abs(e) for e in passes) < 0.30, passes
    first_ten = dataclasses.replace(doc, rows=[r for r in doc.rows
                                               if not r.name.startswith("r11")])
    # the rollout stage: no default is fitted on it any more (mfu_prefill and the decode curve
    # come from operator profiles), so this median is out-of-sample: 16.1% over rows 1-10,
    # where r01 (-46%) and r10 (-50%) are priced far fast (12% when mfu_prefill was chosen on
    # these rows)
    assert _stage_median(first_ten, "rollout") < 0.19, _stage_median(first_ten, "rollout")


def test_deepseek_v3_row_is_expressed_and_fits(doc: PublishedReport) -> None:
    # row 11: DeepSeek-V3 671B on 96 H20, trainer TP8 PP12 EP8 with optimizer offload, vLLM TP32
    # engines of 4 nodes. Its rollout is admitted by the KV in use, with preemption, as vLLM does
    # (`placer.cost.admission`), not by reserving every sequence's longest context (51
    # sequences per engine). The rest of its 1,700 s (650 s published outside the rollout) is
    # priced ~240 s (the update 151 s with its host-stepped Adam, against ~140 s by verl's MFU),
    # so the row as a whole is -37%. Its rollout is priced -26% (-20% with the reshard and
    # wake-up verl's gen timer holds): it was +7% when the routed-expert read's one-row half
    # width over-priced it and hid the rest (docs/cost-model.md, "What is left on these rows").
    # Regression guards on the errors found.
    r11 = next(r for r in doc.rows if r.name.startswith("r11"))
    assert r11.fits, r11.note
    assert abs(r11.error) < 0.38, r11.error
    assert abs(r11.stages["rollout"].error) < 0.27, r11.stages


def test_log_prob_passes_carry_the_drivers_fixed_dispatch(doc: PublishedReport) -> None:
    # verl's old_log_prob on 32 / 64 / 128 H20 (rows 1-3) fits a + b / GPUs with a = 36 s, the
    # driver's dispatch of 8,192 samples padded to 30,720 tokens (35.2 s priced; dispatch_gbs was
    # fitted on these rows: in-sample): with it every one of the three is within 25%
    rows = {r.name[:3]: r for r in doc.rows}
    for key in ("r01", "r02", "r03"):
        assert abs(rows[key].stages["old_log_prob"].error) < 0.25, rows[key].stages


def test_first_step_row_is_reported_apart_with_its_evidence(doc: PublishedReport) -> None:
    # r10's times are its run's step 0 (Miles' doc names no other; its reference pass, the
    # trainer's first forward, is 3x the identical actor pass after it): another quantity than
    # the model's steady-state step, so it is printed apart, with the reason, and kept out of
    # the step rows' median and max
    (r10,) = doc.first_step
    assert r10.name.startswith("r10") and "step 0" in r10.first_step
    assert all(not r.first_step for r in doc.rows)
    text = render(doc)
    assert "first-step rows" in text and r10.first_step in text
    out = doc.to_dict()
    assert [r["name"] for r in out["first_step"]] == [r10.name]
    assert r10.name not in {r["name"] for r in out["rows"]}


def test_nemo_rl_performance_rows_held_out(doc: PublishedReport) -> None:
    # NeMo-RL's published performance runs (docs/about/performance-summary.md @7ea279ab, v0.6:
    # H100 BF16 and FP8, GB200 BF16), priced with their own layouts and no refit (no stage
    # times: no factor is fitted on them). A regression guard on errors found, not an accuracy
    # claim. With the routed experts read at the fused-MoE grid's occupancy
    # (`kernels.expert_read_eff`, no factor), pools inside one NVLink domain priced on NVLink
    # and a pipelined forward's collectives per stage: r15 -19%, r16 -10%, r17 -30%, r18 -2%,
    # r19 -42%, r20 -15%, r21 -17%, r22 -8%, r23 -29%, every one short; they were -0% to +113%
    # at the one-row half width the occupancy replaced (docs/cost-model.md, "NeMo-RL's
    # performance rows"). With NCCL's hierarchical latency for TP all-reduces across nodes
    # (collectives.span_tree_steps_s: the in-node ring's steps and a network tree level per
    # call, not a network step per log2(rank)), r16 -4%, r17 -27%, r18 +2%, r21 -15%, r22 -2%,
    # r23 -27%: r18 no longer short, so the bound admits +3% (a defect fixed, not a refit).
    # With NCCL's algorithm and protocol bandwidths across nodes (collectives.span_all_reduce)
    # r16 +2%, r17 -23%, r18 +4%, r21 -7%, r22 +3%, r23 -24%: the bound admits +5%.
    # The 30B-A3B recipes run without activation recomputation (`Use.recompute`; NeMo-RL's
    # megatron_cfg.activation_checkpointing false), which the model had charged: r15 -22%, r19
    # -43.4% (was -41.8%), so the lower bound moves to -0.44 (a count fixed, not a refit).
    # With NeMo-RL's log-prob passes of an MoE model at the per-token routing cost its pull
    # request 3295 measured on B200 (`model.moe_route_time`; not fitted on these rows): r15
    # -11%, r16 +2%, r19 -24%, r20 -12%, r22 +3%, r23 -22% (DeepSeek-V3's rows move < 1%):
    # tightened to -0.25.
    rows = {r.name[:3]: r for r in doc.rows}
    nemo = ("r15", "r16", "r17", "r18", "r19", "r20", "r21", "r22", "r23")
    assert all(rows[k].fits and not rows[k].stages for k in nemo)
    assert all(-0.25 < rows[k].error < 0.05 for k in nemo), {k: rows[k].error for k in nemo}
    assert max(abs(rows[k].error) for k in ("r16", "r18", "r22")) < 0.11


def test_trainers_recompute_as_their_scripts_set() -> None:
    # Activation recomputation as each run's code sets it (`published_rows._NO_RECOMPUTE`):
    # verl's Megatron worker (rows r05, r06 @c711dd741; r09a, r09b @503ea75f5) leaves Megatron's
    # recompute_granularity None, NeMo-RL's 30B-A3B recipes (r15, r19) keep
    # activation_checkpointing false; verl's FSDP, EasyR1, Miles (r10), verl's DeepSeek-V3
    # script (r11) and NeMo-RL's 235B and DeepSeek-V3 recipes recompute every layer.
    without = {"r05", "r06", "r09a", "r09b", "r15", "r19"}
    assert {r.name.split()[0]: r.layout[Role.ACTOR].parallel().recompute for r in ROWS} == {
        r.name.split()[0]: r.name.split()[0] not in without for r in ROWS}
    # the flag reaches the update's price and nothing else: r09a priced with recomputation
    # differs from its row by train_time's recomputed forward alone
    row = next(r for r in ROWS if r.name.startswith("r09a"))
    use = row.layout[Role.ACTOR]
    recomputing = dataclasses.replace(row, layout={**row.layout, Role.ACTOR: dataclasses.replace(
        use, recompute=True)})
    calib = Calibration()
    got = predict_row(row, calib)
    more = predict_row(recomputing, calib)
    res = resolve(load_job(EXAMPLES / row.file), row.file)
    eff = calib.for_device(res.device_of(use.pool))
    ctx = trained_context(res)
    tokens, steps = res.job.batch.samples * ctx, res.job.batch.mini_batches
    m, dev = res.arch_of(Role.ACTOR), res.device_of(use.pool)
    par = budgeted(res, use.parallel(), "update")
    span = trained_span(res)  # the attention's length (placer.cost.attnspan)
    recompute = train_time(m, dev, dataclasses.replace(par, recompute=True), tokens, ctx, steps,
                           eff, attn_seq=span)
    plain = train_time(m, dev, par, tokens, ctx, steps, eff, attn_seq=span)
    assert recompute > 1.2 * plain  # 2 more passes of the layers over 6
    assert (more.stages["update"].predicted_s - got.stages["update"].predicted_s
            == pytest.approx(recompute - plain, rel=1e-9))
    assert more.stages["old_log_prob"].predicted_s == pytest.approx(
        got.stages["old_log_prob"].predicted_s, rel=1e-12)
