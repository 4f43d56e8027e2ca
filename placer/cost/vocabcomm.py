"""The collectives of the vocabulary split under TP: the token embedding and the LM head cut by
vocabulary rows over the TP ranks, priced with `placer.cost.collectives` on the TP group's own
link (`layercomm.tp_link`, or an engine's decode link), on top of the layers' all-reduces.

  train_vocab_comm    a training pass, forward and backward, as the executor's trainer runs it
                      (executors/vocab.py) and Megatron-Core does: the embedding's all-reduce of
                      the hidden states (`VocabParallelEmbedding`, forward only: the ids need no
                      gradient), the LM head's all-reduce of its input's gradient in the backward
                      (a column-parallel linear), and the log-prob from the logits' shards: 3
                      FP32 all-reduces per token (max, sum of exponentials, the target's logit;
                      NVIDIA/Megatron-LM megatron/core/tensor_parallel/cross_entropy.py @ d98e8a6,
                      `vocab_parallel_cross_entropy`), plus the entropy's 2 (max; sum and
                      weighted sum stacked);
  score_vocab_comm    a forward-only pass of a trained role (old log-probs, reference): the
                      embedding's all-reduce and the log-prob's 3;
  prefill_vocab_comm  an engine's prefill: the embedding's all-reduce (the logits of the one
                      position a sequence samples are gathered as a decode step's are; a prefill's
                      price does not know its sequences, so that gather is left out);
  decode_vocab_comm   an engine's decode step: the embedding's all-reduce of the batch's hidden
                      states (vLLM `VocabParallelEmbedding`: vllm-project/vllm
                      vllm/model_executor/layers/vocab_parallel_embedding.py) and the batch's
                      logits all-gathered (`LogitsProcessor._gather_logits`,
                      vllm/model_executor/layers/logits_processor.py: an all-gather where
                      `Platform.use_all_gather()`, which vllm/platforms/interface.py makes true
                      under the V1 engine).

What a training framework's pass computes at the top is its role's `Head` (`head_of`): log-probs
over the vocabulary (actor, reference), or a scalar per token (a critic's value head, a reward
model's score head: `nn.Linear(hidden, 1)`, replicated over TP, as verl's and OpenRLHF's critics
and Megatron-Core's `output_layer` of a value model hold it). A scalar head runs no vocabulary-
parallel LM head, log-softmax or entropy, so its pass has the embedding's all-reduce alone.

Calls are counted per micro-batch as `layercomm.layer_comm` counts the layers'; with data-parallel
attention each attention group runs its own over its share of the tokens. TP 1: nothing.
"""
from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from placer.base.roles import Role, base_role
from placer.cost.collectives import all_gather, all_reduce
from placer.cost.layercomm import MICRO_TOKENS, decode_tp_link, tp_all_reduce, tp_link
from placer.cost.sharding import BYTES, Parallel
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceType

if TYPE_CHECKING:
    from placer.cost.efficiency import Efficiency

FP32 = 4
# bytes per token of the vocabulary-parallel log-prob's all-reduces (executors/vocab.py
# `VocabLogprob`: the max, the sum of exponentials, the target's logit) and of the entropy's
# (the max; the sum and the weighted sum stacked in one call)
LOGPROB_REDUCES = (FP32, FP32, FP32)
ENTROPY_REDUCES = (FP32, 2 * FP32)


class Head(StrEnum):
    """What a training framework's pass computes at the top of the model."""
    LOGPROB = "logprob"  # the LM head over the vocabulary, then log-probs (and entropy)
    SCALAR = "scalar"  # a value or score head: one number per token, no vocabulary


def head_of(role: str) -> Head:
    """The head a role's passes run: a critic's values and a reward model's scores are scalar,
    every other model role (actor, reference) computes log-probs."""
    return Head.SCALAR if base_role(role) in (Role.CRITIC, Role.REWARD) else Head.LOGPROB


def _per_micro(par: Parallel, tokens: float, micro: float) -> tuple[float, float]:
    """(tokens of one micro-batch over the dp rank's attention groups, the tokens each device
    of one TP group holds in it), as `layer_comm` cuts a pass."""
    chunk = min(tokens / par.attn_dp, micro) * par.attn_dp
    return chunk, chunk / par.attn_dp / par.cp


def _pass(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float, eff: Efficiency,
          micro: float, hidden_calls: int, scalars: tuple[int, ...]) -> float:
    """`hidden_calls` all-reduces of the hidden states and one of `b` bytes per token for each
    b in `scalars`, per micro-batch, over the TP group."""
    tp = par.attn_tp
    if tp <= 1 or tokens <= 0:
        return 0.0
    chunk, rows = _per_micro(par, tokens, micro)
    out = hidden_calls * tp_all_reduce(rows * m.hidden * BYTES, tp, dev, eff)
    out += sum(tp_all_reduce(rows * b, tp, dev, eff) for b in scalars)
    return out * tokens / chunk


def train_vocab_comm(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
                     eff: Efficiency, micro: float = MICRO_TOKENS,
                     head: Head = Head.LOGPROB) -> float:
    """A training pass's (forward and backward) vocabulary collectives over `tokens` tokens per
    dp rank. Activation recomputation re-runs the decoder layers only, so it adds none. A scalar
    head: the embedding's forward all-reduce alone (no LM head to back-propagate through)."""
    if head is Head.SCALAR:
        return _pass(m, dev, par, tokens, eff, micro, 1, ())
    return _pass(m, dev, par, tokens, eff, micro, 2, LOGPROB_REDUCES + ENTROPY_REDUCES)


def score_vocab_comm(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
                     eff: Efficiency, micro: float = MICRO_TOKENS,
                     head: Head = Head.LOGPROB) -> float:
    """A forward-only pass's vocabulary collectives over `tokens` tokens per dp rank: the
    embedding's all-reduce, and for log-probs the log-softmax's 3."""
    return _pass(m, dev, par, tokens, eff, micro, 1,
                 LOGPROB_REDUCES if head is Head.LOGPROB else ())


def prefill_vocab_comm(m: ModelArch, dev: DeviceType, par: Parallel, tokens: float,
                       eff: Efficiency) -> float:
    """An engine prefill's over `tokens` tokens per dp rank: the embedding's all-reduce per
    micro-batch."""
    return _pass(m, dev, par, tokens, eff, MICRO_TOKENS, 1, ())


def decode_vocab_comm(m: ModelArch, dev: DeviceType, par: Parallel, batch: int,
                      eff: Efficiency) -> float:
    """One decode step's: the embedding's all-reduce of batch * h * b bytes on the engine's
    decode link (its custom all-reduce inside a node) and the logits' all-gather of
    batch * V * b bytes (NCCL), within each attention group over its own sequences."""
    tp = par.attn_tp
    if tp <= 1 or batch <= 0:
        return 0.0
    rows = batch / par.attn_dp
    return (all_reduce(rows * m.hidden * BYTES, tp, decode_tp_link(dev, eff, tp))
            + all_gather(rows * m.vocab * BYTES, tp, tp_link(dev, eff, tp)))
