"""The vocabulary split's collectives in the cost model (`placer.cost.vocabcomm`): under TP a
training step, a log-prob pass, an engine's prefill and a decode step each grow by exactly the
embedding's and LM head's collectives the executor (executors/vocab.py) and vLLM run, counted
call by call with the TP all-reduce's own price; at TP 1 by nothing; a critic's or reward
model's scalar head by the embedding's alone. Pure functions."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from placer.base.roles import Role
from placer.cost import generation, model, vocabcomm
from placer.cost.collectives import all_gather, all_reduce
from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import MICRO_TOKENS, decode_tp_link, tp_all_reduce, tp_link
from placer.cost.sharding import BYTES, Parallel
from placer.cost.vocabcomm import Head, head_of
from placer.spec.catalog import shipped_devices, shipped_models

H100 = shipped_devices()["H100-SXM"]
M = shipped_models()["Qwen2.5-7B"]
EFF = Efficiency()
TOKENS = 3.5 * MICRO_TOKENS  # per dp rank: 4 micro-batches, the last a half


def _without(monkeypatch: pytest.MonkeyPatch, where: Any, name: str,
             price: Callable[[], float]) -> float:
    """`price()` with the vocabulary term `name` of module `where` priced at zero."""
    with monkeypatch.context() as mp:
        mp.setattr(where, name, lambda *a, **k: 0.0)
        return price()


def _per_token_calls(tp: int, hidden: int, scalars: tuple[int, ...]) -> float:
    """Hand count: per micro-batch `hidden` all-reduces of the hidden states and one of b bytes
    per token for each b in `scalars`, over the tp ranks; as many micro-batches as TOKENS fill."""
    rows = MICRO_TOKENS
    one = (hidden * tp_all_reduce(rows * M.hidden * BYTES, tp, H100, EFF)
           + sum(tp_all_reduce(rows * b, tp, H100, EFF) for b in scalars))
    return one * TOKENS / MICRO_TOKENS


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_training_and_log_prob_passes_grow_by_the_vocabulary_collectives(
        tp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    par = Parallel(dp=2, tp=tp)
    tokens = TOKENS * par.dp
    # training: forward (embedding, log-prob's 3 FP32 reduces, entropy's 2) and backward (the
    # LM head's input gradient), once per step's pass whatever the recompute
    for recompute in (False, True):
        p = Parallel(dp=2, tp=tp, recompute=recompute)

        def train(p: Parallel = p) -> float:
            return model.train_time(M, H100, p, tokens, 2048, 1, EFF)
        grown = train() - _without(monkeypatch, model, "train_vocab_comm", train)
        want = _per_token_calls(tp, 2, (4, 4, 4, 4, 8)) if tp > 1 else 0.0
        assert grown == pytest.approx(want, rel=1e-9, abs=0.0)

    def score() -> float:
        return model.score_time(M, H100, par, tokens, 2048, EFF)
    grown = score() - _without(monkeypatch, model, "score_vocab_comm", score)
    assert grown == pytest.approx(_per_token_calls(tp, 1, (4, 4, 4)) if tp > 1 else 0.0,
                                  rel=1e-9, abs=0.0)
    if tp > 1:  # the embedding's all-reduce of a micro-batch's hidden states dominates
        assert _per_token_calls(tp, 1, ()) > 0.5 * grown


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_engine_prefill_and_decode_grow_by_the_vocabulary_collectives(
        tp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    par = Parallel(tp=tp)

    def prefill() -> float:
        return generation.forward_time(M, H100, par, TOKENS, 0.0, EFF)
    grown = prefill() - _without(monkeypatch, generation, "prefill_vocab_comm", prefill)
    assert grown == pytest.approx(_per_token_calls(tp, 1, ()) if tp > 1 else 0.0,
                                  rel=1e-9, abs=0.0)
    batch = 64

    def step() -> float:
        return generation.decode_step_time(M, H100, par, batch, 64 * 1024, EFF)
    grown = step() - _without(monkeypatch, generation, "decode_vocab_comm", step)
    # vLLM: the embedding's all-reduce on the engine's decode link, the logits' all-gather
    want = (all_reduce(batch * M.hidden * BYTES, tp, decode_tp_link(H100, EFF, tp))
            + all_gather(batch * M.vocab * BYTES, tp, tp_link(H100, EFF, tp)))
    assert grown == pytest.approx(want if tp > 1 else 0.0, rel=1e-9, abs=0.0)
    if tp > 1:  # 64 x 152k BF16 logits: the gather is most of it
        assert all_gather(batch * M.vocab * BYTES, tp, tp_link(H100, EFF, tp)) > 0.5 * want


@pytest.mark.parametrize("tp", [2, 4])
def test_a_scalar_head_runs_no_log_prob_entropy_or_lm_head_collectives(tp: int) -> None:
    """A critic's values and a reward model's scores come from a scalar head: their passes have
    the embedding's all-reduce alone, while an actor's and a reference's also have the
    log-softmax's 3, and in training the entropy's 2 and the LM head's backward all-reduce."""
    par = Parallel(dp=2, tp=tp)
    tokens = TOKENS * par.dp
    assert [head_of(r) for r in (Role.ACTOR, Role.REFERENCE, Role.CRITIC, Role.REWARD,
                                 "solver.critic")] == [Head.LOGPROB, Head.LOGPROB, Head.SCALAR,
                                                       Head.SCALAR, Head.SCALAR]
    embedding = _per_token_calls(tp, 1, ())
    for role, train, score in ((Role.CRITIC, embedding, embedding),
                               (Role.ACTOR, _per_token_calls(tp, 2, (4, 4, 4, 4, 8)),
                                _per_token_calls(tp, 1, (4, 4, 4)))):
        head = head_of(role)
        assert vocabcomm.train_vocab_comm(M, H100, par, TOKENS, EFF, head=head) == \
            pytest.approx(train, rel=1e-9)
        assert vocabcomm.score_vocab_comm(M, H100, par, TOKENS, EFF, head=head) == \
            pytest.approx(score, rel=1e-9)
    # through the pass prices: the critic's are cheaper by exactly the difference
    for price, full, scalar in ((lambda h: model.train_time(M, H100, par, tokens, 2048, 1, EFF, h),
                                 _per_token_calls(tp, 2, (4, 4, 4, 4, 8)), embedding),
                                (lambda h: model.score_time(M, H100, par, tokens, 2048, EFF, h),
                                 _per_token_calls(tp, 1, (4, 4, 4)), embedding)):
        assert price(Head.LOGPROB) - price(Head.SCALAR) == pytest.approx(full - scalar, rel=1e-6)
