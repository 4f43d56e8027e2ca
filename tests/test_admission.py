"""Engine admission by KV tokens with preemption by recompute (`placer.cost.admission`), by hand:
sequences are admitted while their prompts fit (not the longest context), `max_num_seqs` caps
them, the newest running sequence is preempted when the batch's KV outgrows the replica and its
whole context is prefilled again when readmitted; and the simulator runs the same loop."""
from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
from simplans import small_job, small_plan

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.admission import Hooks, engine, run_replica
from placer.cost.batching import KvBudget, StepTerms, kv_budget, step_terms
from placer.cost.calibration import calibration_from_dict
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.generation import decode_step_time, max_concurrency, prefill_time
from placer.cost.pricer import Pricer
from placer.cost.rollout_tail import Replicas, fits_lockstep, makespan
from placer.cost.rolloutcost import rollout_shape
from placer.cost.sharding import Parallel
from placer.cost.tail_samples import at_means
from placer.solve.assemble import reprice
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from simulator.api import simulate_plan
from simulator.config import SimConfig

EFF = Efficiency()
PAR = Parallel(tp=1)
BIG = 10**12  # KV tokens: only max_num_seqs bounds admission


def _model():
    res = resolve(job_from_dict(small_job()))
    m, dev = res.arch_of(Role.ROLLOUT), res.device_of("h100")
    return m, dev, StepTerms(m, dev, PAR, EFF)


def _steps(m, dev, batch: int, ctx: int, n: int) -> float:
    """n decode steps of `batch` sequences from total KV context `ctx`."""
    return sum(decode_step_time(m, dev, PAR, batch, ctx + batch * i, EFF) for i in range(n))


def test_kv_for_three_mean_sequences_admits_three() -> None:
    """Prompts of 100, responses of 50, KV for 450 tokens: 3 mean sequences fit (one whose
    context could reach 400 tokens would have reserved the whole replica before); all three run
    as one batch: one prefill of 300 tokens, 50 steps at batch 3."""
    m, dev, st = _model()
    kv = KvBudget(450, 8)
    assert kv.first_wave(100, 3) == 3 and 450 // 400 == 1
    done = run_replica(st, [100] * 3, [[50]] * 3, [[]] * 3, [1] * 3, 0, kv)
    want = prefill_time(m, dev, PAR, 300, 100, EFF) + _steps(m, dev, 3, 300, 50)
    assert done == [(pytest.approx(want, rel=1e-9), 1)] * 3


def test_prefill_attention_weighs_sequences_by_their_tokens() -> None:
    """Prompts of 100 and 300 prefilled together: causal attention costs 100^2 + 300^2 key-query
    pairs (x 1/2), the span of one sequence of (100^2 + 300^2) / 400 = 250 tokens per token, not
    of the sequences' mean prompt, 200 (a closed form, not the loop's own formula)."""
    m, dev, st = _model()
    seen: list[tuple[int, float]] = []
    hooks = Hooks(lambda *_: [], lambda *_: None,
                  prefill=lambda _t, _d, _s, toks, _c, span: seen.append((toks, span)))
    loop = engine(st, KvBudget(BIG, 8), [100, 300], [[1], [1]], [1, 1], 0, hooks, 0.0)
    with contextlib.suppress(StopIteration):
        wake = next(loop)[0]
        while True:
            wake = loop.send(wake)[0]
    assert seen[0] == (400, pytest.approx(250.0))
    done = run_replica(st, [100, 300], [[1], [1]], [[], []], [1, 1], 0, KvBudget(BIG, 8))
    assert done[0][0] == pytest.approx(prefill_time(m, dev, PAR, 400, 250.0, EFF)
                                       + _steps(m, dev, 2, 400, 1), rel=1e-9)


def test_max_num_seqs_caps_admission() -> None:
    """KV for all, max_num_seqs 2: two sequences run together, the third after them."""
    m, dev, st = _model()
    done = run_replica(st, [100] * 3, [[50]] * 3, [[]] * 3, [1] * 3, 0, KvBudget(BIG, 2))
    two = prefill_time(m, dev, PAR, 200, 100, EFF) + _steps(m, dev, 2, 200, 50)
    one = prefill_time(m, dev, PAR, 100, 100, EFF) + _steps(m, dev, 1, 100, 50)
    assert [t for t, _ in done] == pytest.approx([two, two, two + one], rel=1e-9)


def test_newest_sequence_is_preempted_and_recomputed() -> None:
    """Two sequences (prompt 10, response 30) in 60 KV tokens: both are admitted (22 tokens),
    decode 20 steps to 60 tokens, then the next step does not fit: the newer one (B) is
    preempted at context 30 with 10 tokens to go; A finishes its 10 steps alone, then B is
    readmitted: a prefill of its 30 tokens again (the recompute), and its last 10 steps."""
    m, dev, st = _model()
    done = run_replica(st, [10, 10], [[30], [30]], [[], []], [1, 1], 0, KvBudget(60, 8))
    both = prefill_time(m, dev, PAR, 20, 10, EFF) + _steps(m, dev, 2, 20, 20)
    a_end = both + _steps(m, dev, 1, 30, 10)
    b_end = a_end + prefill_time(m, dev, PAR, 30, 30, EFF) + _steps(m, dev, 1, 30, 10)
    assert [t for t, _ in done] == pytest.approx([a_end, b_end], rel=1e-9)
    # with room for both to the end nothing is preempted: B ends with A
    ample = run_replica(st, [10, 10], [[30], [30]], [[], []], [1, 1], 0, KvBudget(80, 8))
    end = prefill_time(m, dev, PAR, 20, 10, EFF) + _steps(m, dev, 2, 20, 30)
    assert [t for t, _ in ample] == pytest.approx([end, end], rel=1e-9)


def test_a_tool_call_keeps_its_kv() -> None:
    """A (prompt 10, turns of 20 and 5, a 1 s tool call, 4 tokens back) and B (prompt 30) in 40
    KV tokens: B does not fit beside A's prompt (11 + 31 > 40), nor while A waits on its tool
    holding 30 tokens, nor after (34 + 1 + 31 > 40): it starts when A is done."""
    m, dev, st = _model()
    done = run_replica(st, [10, 30], [[20, 5], [10]], [[1.0], []], [1, 1], 4, KvBudget(40, 8))
    # (A's second prefill: 4 new tokens after 30 cached see 30 + 2 keys each on average,
    # the keys of a causal sequence of 2 * 34 - 4: `chunk_seq`.)
    a_end = (prefill_time(m, dev, PAR, 10, 10, EFF) + _steps(m, dev, 1, 10, 20) + 1.0
             + prefill_time(m, dev, PAR, 4, 2 * 34 - 4, EFF) + _steps(m, dev, 1, 34, 5))
    b_end = a_end + prefill_time(m, dev, PAR, 30, 30, EFF) + _steps(m, dev, 1, 30, 10)
    assert [t for t, _ in done] == pytest.approx([a_end, b_end], rel=1e-9)


def _preemptions(st: StepTerms, kv: KvBudget) -> list[tuple[int, int]]:
    """(sequences, context) of each preemption of one row of 6 (prompt 10, response 40)."""
    got: list[tuple[int, int]] = []
    hooks = Hooks(lambda t, i, c, w: [(t, w)], lambda t, i, w: None,
                  preempt=lambda t, x, c: got.append((x, c)))
    loop = engine(st, kv, [10], [[40]], [6], 0, hooks, 0.0)
    wake = next(loop)[0]
    with contextlib.suppress(StopIteration):
        while True:
            wake = loop.send(wake)[0]
    return got


def test_preemption_frees_a_block_of_steps() -> None:
    """Six sequences (prompt 10, response 40) in 200 KV tokens are admitted together (6 x 11 <=
    200) and decode 23 steps to 198 tokens (full: (200 - 60) // 6); the 24th lacks 4.
    Pages of 1 token: one preemption (33 tokens + its step free 34 >= 4), then 5 run 7 steps
    to 200 and the next lacks 5: one more at context 40; 4 finish. Pages of 16: the shortfall
    is met for 16 steps, 4 + 6 x 15 = 94 tokens, two sequences at once (2 x 49 >= 94); the 4
    left reach their end (132 + 4 x 17 = 200) without another."""
    _, _, st = _model()
    assert _preemptions(st, KvBudget(200, 8, 1)) == [(1, 33), (1, 40)]
    assert _preemptions(st, KvBudget(200, 8, 16)) == [(2, 33)]


def test_rows_split_as_single_sequences() -> None:
    """A row of weight w under KV pressure runs as w single sequences do (split on
    admission and preemption)."""
    _, _, st = _model()
    kv = KvBudget(700, 16, 16)
    rows = run_replica(st, [50, 80], [[200, 30], [120, 90]], [[0.2], [0.1]], [5, 3], 8, kv)
    singles = run_replica(st, [50] * 5 + [80] * 3, [[200, 30]] * 5 + [[120, 90]] * 3,
                          [[0.2]] * 5 + [[0.1]] * 3, [1] * 8, 8, kv)

    def expand(done):
        return sorted(t for t, w in done for _ in range(w))

    assert expand(rows) == pytest.approx(expand(singles), rel=1e-12)


def test_first_wave_is_prompts_not_longest_context() -> None:
    """The rollout's concurrency is what an empty replica admits (KV for mean prompts, capped
    by max_num_seqs and its samples), not KV / longest context."""
    res = resolve(job_from_dict(small_job(batch__prompts=512)))
    m, dev, par = res.arch_of(Role.ROLLOUT), res.device_of("h100"), Parallel(dp=2)
    shape = rollout_shape(Pricer(res), dev, par, EFF)
    kv = kv_budget(m, dev, Parallel(), EFF)
    assert shape.concurrency == min(shape.per_replica, int(EFF.max_num_seqs), kv.tokens // 257)
    assert shape.concurrency > max_concurrency(m, dev, par, res.job.max_context, EFF)


def test_simulator_runs_the_planners_preemptions() -> None:
    """Variance off, long responses: a wave outgrows the KV (preemption), and the simulator's
    rollout stage is the planner's to float precision."""
    plan = small_plan(lengths__response={"kind": "fixed", "value": 6000}, batch__prompts=96)
    res = resolve(at_means(plan.spec))
    r = plan.roles["rollout"]
    st = StepTerms(res.arch_of(Role.ROLLOUT), res.device_of(r.pool), Parallel(r.tp, r.pp), EFF)
    shape = rollout_shape(Pricer(res), res.device_of(r.pool), Parallel(r.tp, r.pp, r.dp), EFF)
    assert not fits_lockstep(res.job, st.kv, shape.concurrency)  # the preempting path
    pred = reprice(plan, at_means(plan.spec), Calibration()).stage_s["rollout"]
    sim = simulate_plan(plan, iterations=1, seed=0, config=SimConfig.no_variance())
    assert sim.metrics.stage_s.rollout == pytest.approx(pred, rel=1e-6)


@pytest.mark.parametrize("field, value", [("max_num_seqs", 0), ("kv_block_tokens", 2.5)])
def test_admission_settings_are_whole_counts(field: str, value: float) -> None:
    with pytest.raises(SpecError, match=f"default.{field}: a count.*{value}"):
        calibration_from_dict({"default": {field: value}})
    eff = calibration_from_dict({"default": {field: 8}}).default
    assert getattr(eff, field) == 8


def test_cached_spans_follow_the_admission_settings() -> None:
    """The planner's cached runs are keyed by the replica's step terms, which carry the
    efficiency factors: a smaller max_num_seqs is priced anew (slower), the default again from
    the cache (the same number)."""
    res = resolve(job_from_dict(small_job()))
    m, dev, par = res.arch_of(Role.ROLLOUT), res.device_of("h100"), Parallel(dp=2)

    def span(eff: Efficiency) -> float:
        shape = rollout_shape(Pricer(res), dev, par, eff)
        return makespan(res.job, step_terms(m, dev, par, eff), eff, Replicas(
            shape.replicas, shape.per_replica, shape.steady, shape.generated, shape.kept))

    first = span(EFF)
    assert span(replace(EFF, max_num_seqs=4)) > 1.5 * first
    assert span(EFF) == first
