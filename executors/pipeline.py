"""Pipeline stages of the trainer (the plan's `pp`), with `torch.distributed.pipelining`.

A trainer with layout `dp x tp x pp` has `pp` stages; stage `p` holds a contiguous, near-equal
run of the decoder layers (`stage_bounds`), the first stage also the token embedding, the last
the final norm and the LM head (`Stage`; the other layers are dropped from that rank's copy).
Within a stage, TP and FSDP2 shard the layers over the stage's ("dp", "tp") mesh as without
PP (`executors.sharding.shard`). Ranks are `(p * dp + d) * tp + t`: the mesh is
("pp", "dp", "tp"), and the `pp` ranks of one (d, t) coordinate form one pipeline.

One optimizer step (a mini-batch) is one schedule step whose micro-batches are the DP rank's
`accumulate` micro-batches (`executors.training.partition`): they are packed into one batch
with common padding and equal rows (a short micro-batch is filled with its first sample at
weight 0: the schedule cuts the batch into equal chunks and every stage's receive buffers have
one shape), run by GPipe (or 1F1B when there are at least as many micro-batches as stages).
Activations between stages are the hidden states; the attention mask goes to every stage as a
keyword argument, so each stage builds its own causal mask and rotary positions.

The loss lives on the last stage (`PolicyLoss`): it turns the logits into each response token's
log-prob and applies the RL objective (`executors.rl.policy_loss`) with the targets the
schedule cuts per micro-batch (token ids, mask, advantages, proximal, reference and behaviour
log-probs, the micro-batch's loss scale), so the summed micro-batch losses are the one-process
loss and their gradients the one-process gradients (`scale_grads=False`). The proximal ("old")
log-probs are a forward-only pass of the same pipeline before the step's first optimizer step.

Under context parallelism (`executors.cpattn`, the mesh ("pp", "dp", "cp", "tp")) each
pipeline is one (dp, cp, tp) coordinate's: every stage runs the CP rank's columns of the
packed batch (Megatron's 2 * cp load-balanced chunks), so stage s's CP rank c sends the hidden
states of its slice to stage s + 1's CP rank c and receives their gradients back; the mask of
the whole batch goes to every stage, each layer's attention gathering the CP group's keys. The
last stage scores the response tokens its columns predict, the loss is this rank's positions'
and its value and statistics the CP group's sums; the old log-probs are summed over the group.

Tied input and output embeddings would put one weight on the first and the last stage; the
executor refuses PP for such models (`executors.sharding.check_layout`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from executors import rl
from executors.cpattn import (
    CP_MESH_ATTR,
    CPRank,
    cp_inputs,
    cp_piece,
    cp_rank_of,
    cp_sum,
    cp_sum_info,
    own_only,
    response_columns,
    spread,
)
from executors.precision import autocast, compute_dtype
from executors.vocab import is_vocab_sharded, parallel_logprobs

# target columns of a packed mini-batch (one float per response position)
TOKEN, MASK, ADV, OLD, REF, BEHAVIOUR, SCALE = range(7)


def stage_bounds(layers: int, pp: int, p: int) -> tuple[int, int]:
    """The decoder layers [lo, hi) of stage `p` of `pp`: contiguous and near-equal."""
    return p * layers // pp, (p + 1) * layers // pp


def _mask_kinds(config: Any, idx: range) -> dict[str, str]:
    """Each layer's attention pattern, as the HF model picks it: the config's `layer_types`
    (Qwen2, Qwen3), else sliding when the config has a window (Mistral, Mixtral, Qwen3-MoE)."""
    types = getattr(config, "layer_types", None)
    if types:
        return {str(i): types[i] for i in idx}
    kind = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    return {str(i): kind for i in idx}


class Stage(nn.Module):
    """Decoder layers [lo, hi) of a Hugging Face causal LM: the embedding on the first stage,
    the final norm and LM head on the last. `forward(x, attention_mask)`: token ids (first
    stage) or hidden states in; hidden states, or the logits on the last stage, out."""

    def __init__(self, model: Any, p: int, pp: int) -> None:
        super().__init__()
        base: Any = getattr(model, "model", model)
        n = len(base.layers)
        if model.lm_head.weight is base.embed_tokens.weight:  # check_layout refuses it first
            raise ValueError("pipeline stages: tied input and output embeddings are not split")
        lo, hi = stage_bounds(n, pp, p)
        self.first, self.last = p == 0, p == pp - 1
        self.config: Any = model.config
        names = {id(m): name for name, m in model.named_modules()}
        self.embed: nn.Module | None = base.embed_tokens if self.first else None
        self.layers = nn.ModuleDict({str(i): base.layers[i] for i in range(lo, hi)})
        self.rotary: nn.Module = base.rotary_emb
        self.norm: nn.Module | None = base.norm if self.last else None
        self.head: nn.Module | None = model.lm_head if self.last else None
        self.kinds = _mask_kinds(self.config, range(lo, hi))
        # the CP mesh the whole model's attention gathers over, kept for `read_layout`; the
        # rank's place in it (`CPRank`) is set by the `Pipeline` that runs the stage
        setattr(self, CP_MESH_ATTR, getattr(model, CP_MESH_ATTR, None))
        self.cp: CPRank | None = None
        # this module's parameter names -> the whole model's (checkpoints, weight sync)
        self._prefix = {mine: names[id(m)] for mine, m in (
            ("embed", self.embed), ("layers", base.layers), ("norm", self.norm),
            ("head", self.head)) if m is not None}

    def full_name(self, key: str) -> str:
        """The whole model's name of this stage's parameter `key`."""
        head, _, rest = key.partition(".")
        return f"{self._prefix[head]}.{rest}"

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Under context parallelism (`cp` set) `x` is this rank's columns of the batch and
        `attention_mask` the whole padded batch's: each layer's attention gathers the keys of
        the CP group's columns (`executors.cpattn`), so no mask is built here."""
        from transformers.masking_utils import (  # lazy: transformers only where used
            create_causal_mask,
            create_sliding_window_causal_mask,
        )
        makers = {"full_attention": create_causal_mask,
                  "sliding_attention": create_sliding_window_causal_mask}
        pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # as rl._positions (left padding)
        h = self.embed(x) if self.embed is not None else x
        extra: dict[str, Any] = {}
        if self.cp is not None:  # this rank's columns, the whole batch's keys
            piece = cp_piece(self.cp, attention_mask)
            pos, extra = pos[:, piece.queries.to(pos.device)], {"cp_slice": piece}
            masks: dict[str, Any] = dict.fromkeys(self.kinds.values())
        else:
            masks = {k: makers[k](config=self.config, inputs_embeds=h,
                                  attention_mask=attention_mask, cache=None, position_ids=pos)
                     for k in set(self.kinds.values())}
        pe = self.rotary(h, position_ids=pos)
        for name, layer in self.layers.items():
            h = layer(h, attention_mask=masks[self.kinds[name]], position_embeddings=pe,
                      position_ids=pos, **extra)
        if self.head is None or self.norm is None:
            return h
        logits = self.head(self.norm(h))
        # split by vocabulary under TP (`executors.vocab`): the stage sends its own shard
        return logits.to_local() if is_vocab_sharded(logits) else logits


@dataclass
class Packed:
    """A DP rank's part of one mini-batch, packed for the schedule: `micro` micro-batches of
    `rows` rows each, one after another."""

    ids: torch.Tensor  # [micro * rows, seq]
    mask: torch.Tensor  # attention mask, same shape
    target: torch.Tensor  # [micro * rows, response width, 7] (the columns above)
    micro: int
    rows: int


def pack(micros: list[tuple[rl.Samples, list[list[float]], list[list[float]] | None, float]]
         ) -> Packed:
    """The micro-batches as one batch of equal micro-batches (fill rows at weight 0)."""
    rows = max(len(s.ids) for s, *_ in micros)
    parts, adv, ref, weight, scale = [], [], [], [], []
    for s, a, r, sc in micros:
        fill = rows - len(s.ids)
        idx = list(range(len(s.ids))) + [0] * fill
        parts.append(s.take(idx))
        adv += [a[i] for i in idx]
        ref += [r[i] for i in idx] if r is not None else [[] for _ in idx]
        weight += [1.0] * len(s.ids) + [0.0] * fill
        scale += [sc] * rows
    s = rl.Samples.concat(parts)
    ids, mask, rmask = rl.pack(s)
    w = rmask.shape[1]
    t = torch.zeros(rows * len(micros), w, 7)
    t[..., TOKEN] = ids[:, -w:].float()
    t[..., MASK] = rmask * torch.tensor(weight)[:, None]
    t[..., ADV] = rl.to_padded(adv, w)
    t[..., REF] = rl.to_padded(ref, w)
    if s.logprobs:
        t[..., BEHAVIOUR] = rl.to_padded(s.logprobs, w)
    t[..., SCALE] = torch.tensor(scale)[:, None]
    return Packed(ids, mask, t, len(micros), rows)


def token_logprobs(logits: torch.Tensor, target: torch.Tensor, temperature: float = 1.0,
                   entropy: bool = False, shard: tuple[torch.Tensor, int, Any] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each response token's log-prob at `temperature` and, with `entropy`, each position's
    entropy (masked), from the logits over the whole sequence (`rl.scaled_logprobs`), or
    from this TP rank's vocabulary shard of them (`shard`: the logits, first row, group)."""
    w = target.shape[1]
    tokens, mask = target[..., TOKEN].long(), target[..., MASK].cpu()
    if shard is None:
        return rl.scaled_logprobs(logits[:, -w - 1:-1], tokens, mask, temperature, entropy)
    z, start, group = shard
    lp, ent = parallel_logprobs(logits, tokens, temperature, entropy,
                                (z[:, -w - 1:-1], start, group))
    return lp.cpu() * mask, None if ent is None else ent.cpu() * mask


def cp_token_logprobs(logits: torch.Tensor, target: torch.Tensor, temperature: float,
                      entropy: bool, cp: tuple[torch.Tensor, int, Any],
                      shard: tuple[torch.Tensor, int, Any] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """`token_logprobs` from this CP rank's columns' logits (`cp`: its columns, the packed
    width, the CP group): its share of the response positions, zeros elsewhere, and the mask
    of its own positions (`executors.cpattn.spread`)."""
    cols, width, _ = cp
    rmask = target[..., MASK].cpu()
    resp, mine = response_columns(cols, target.shape[1], width)
    tokens, mask = target[..., TOKEN].long()[:, resp], rmask[:, resp] * mine[None].float()
    if shard is None:
        lp, ent = rl.scaled_logprobs(logits, tokens, mask, temperature, entropy)
    else:
        lp, ent = parallel_logprobs(logits, tokens, temperature, entropy, shard)
        lp, ent = lp.cpu() * mask, None if ent is None else ent.cpu() * mask
    return spread(lp, ent, resp, mine, rmask)


class PolicyLoss:
    """The last stage's loss: one micro-batch's summed token loss times its scale (1 / the
    mini-batch's tokens, 0 for a stand-in), as the one-process trainer's; records each call's
    (loss, per-token statistics, scale)."""

    def __init__(self, kl: rl.KLTerm, temperature: float, has_ref: bool,
                 has_behaviour: bool) -> None:
        self.kl, self.temperature = kl, temperature
        self.has_ref, self.has_behaviour = has_ref, has_behaviour
        self.calls: list[tuple[float, dict, float]] = []
        self.vocab: tuple[int, Any] | None = None  # (TP rank, group): logits are a vocab shard
        self.cp: tuple[torch.Tensor, int, Any] | None = None  # (columns, width, group) under CP

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        t = target.cpu()
        shard = None if self.vocab is None else (
            logits, self.vocab[0] * logits.shape[-1], self.vocab[1])
        mask, old = t[..., MASK], t[..., OLD]
        ref = t[..., REF] if self.has_ref else None
        behaviour = t[..., BEHAVIOUR] if self.has_behaviour else None
        if self.cp is None:
            logp, ent = token_logprobs(logits, t, self.temperature, entropy=True, shard=shard)
        else:  # this CP rank's positions; the others' at ratio 1, KL 0 (masked out)
            logp, ent, mask = cp_token_logprobs(logits, t, self.temperature, True, self.cp, shard)
            old = own_only(old, mask, logp)
            ref = own_only(ref, mask, logp) if ref is not None else None
            behaviour = own_only(behaviour, mask, logp) if behaviour is not None else None
        loss, info = rl.policy_loss(
            logp, old, t[..., ADV], mask, ref, self.kl.loss_coef, denom=1.0,
            behaviour=behaviour, kl_estimator=self.kl.estimator, entropy=ent)
        info["loss"] = float(loss.detach())
        if self.cp is not None:  # the CP group's sums (its gradient stays this rank's share)
            info = cp_sum_info(info, self.cp[2])
        scale = float(t[0, 0, SCALE])
        self.calls.append((info.pop("loss"), info, scale))
        return (loss * scale).to(logits.device)


class Pipeline:
    """This rank's stage of one pipeline and the schedules that run it."""

    def __init__(self, stage: Stage, p: int, pp: int, group: Any, device: torch.device,
                 precision: str = "fp32") -> None:
        self.stage, self.p, self.pp, self.group, self.device = stage, p, pp, group, device
        self.precision = precision
        self.vocab: tuple[int, int, Any] | None = None  # TP's vocabulary split: `split_vocab`
        stage.cp = self.cp = cp_rank_of(stage)  # each stage runs this rank's columns under CP

    def split_vocab(self, tp_mesh: Any) -> None:
        """The last stage's logits are this TP rank's vocabulary shard (`executors.vocab`)."""
        self.vocab = (tp_mesh.size(), tp_mesh.get_local_rank(), tp_mesh.get_group())

    def _vocab_shard(self, logits: torch.Tensor) -> tuple[torch.Tensor, int, Any] | None:
        if self.vocab is None:
            return None
        return logits, self.vocab[1] * logits.shape[-1], self.vocab[2]

    def _schedule(self, pk: Packed, loss: PolicyLoss | None) -> Any:
        """A fresh stage and schedule for this packed shape (static shapes: no inference)."""
        from torch.distributed.pipelining import (  # lazy: distributed only
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
        )
        train = loss is not None
        cfg = self.stage.config
        # what crosses a stage boundary: FSDP2's BF16 parameters make BF16 activations
        dtype = compute_dtype(self.precision)
        seq = self._inputs(pk)[0].shape[1]  # this rank's columns under CP

        def meta(*shape: int, dt: torch.dtype = dtype, grad: bool = train) -> torch.Tensor:
            return torch.empty(pk.rows, *shape, dtype=dt, device="meta", requires_grad=grad)
        hidden = meta(seq, cfg.hidden_size)
        inp = meta(seq, dt=torch.long, grad=False) if self.stage.first else hidden
        vocab = cfg.vocab_size // (self.vocab[0] if self.vocab else 1)
        out = meta(seq, vocab) if self.stage.last else hidden
        st = PipelineStage(self.stage, self.p, self.pp, self.device, input_args=inp,
                           output_args=out, group=self.group)
        kind = Schedule1F1B if train and pk.micro >= self.pp else ScheduleGPipe
        return kind(st, pk.micro, loss_fn=loss, scale_grads=False)

    def _inputs(self, pk: Packed) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, attention mask) the stages run: under CP this rank's columns of the
        ids and the whole padded batch's mask (`executors.cpattn.cp_inputs`)."""
        if self.cp is None:
            return pk.ids, pk.mask
        return cp_inputs(pk.ids, pk.mask, self.cp)[:2]

    def _cp_targets(self, pk: Packed) -> tuple[torch.Tensor, int, Any] | None:
        """(this rank's columns, the packed width, the CP group) under CP, else None."""
        if self.cp is None:
            return None
        return cp_inputs(pk.ids, pk.mask, self.cp)[2], pk.ids.shape[1], self.cp.group

    def _step(self, sched: Any, pk: Packed, **kw: Any) -> Any:
        ids, mask = self._inputs(pk)
        args = (ids.to(self.device),) if self.stage.first else ()
        with autocast(self.precision):
            return sched.step(*args, attention_mask=mask.to(self.device), **kw)

    @torch.no_grad()
    def logprobs(self, pk: Packed, temperature: float = 1.0) -> torch.Tensor | None:
        """The packed batch's response log-probs (last stage; None elsewhere): forward only."""
        logits = self._step(self._schedule(pk, None), pk)
        if not self.stage.last:
            return None
        cp = self._cp_targets(pk)
        if cp is None:
            return token_logprobs(logits, pk.target, temperature,
                                  shard=self._vocab_shard(logits))[0]
        part = cp_token_logprobs(logits, pk.target, temperature, False, cp,
                                 self._vocab_shard(logits))[0]
        return cp_sum(part, cp[2])  # the whole batch's, on every CP rank

    def train(self, pk: Packed, old: torch.Tensor | None, loss: PolicyLoss
              ) -> list[tuple[float, dict, float]]:
        """Forward and backward of every micro-batch; gradients accumulate in the stage's
        parameters (FSDP reduce-scatters them after the last). The loss records (last stage)."""
        if old is not None:
            pk.target[..., OLD] = old
        target = pk.target.to(self.device) if self.stage.last else None
        loss.calls.clear()
        loss.vocab = None if self.vocab is None else (self.vocab[1], self.vocab[2])
        loss.cp = self._cp_targets(pk)
        self._step(self._schedule(pk, loss), pk, target=target, losses=[] if target is not None
                   else None, return_outputs=False)
        return list(loss.calls)
