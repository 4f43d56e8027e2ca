"""The RL math, free of Ray: sampling, log-probs, GRPO and PPO losses, GAE.

Role actors (`executors.roles`) and the one-process baseline (`executors.local`) call these same
functions, so the benchmark compares orchestration, not different math.

Layout of a scored batch: each sample is its prompt, left-padded to the batch's longest prompt,
followed by its response, right-padded; `resp_mask` marks response tokens up to and including EOS.
Log-probs and values are per response position (the prediction of token t from tokens < t).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.nn.functional as F

from executors.model import EOS, PAD

T = TypeVar("T")


@dataclass
class Samples:
    """What rollout produces and every later role reads (plain lists: cheap to ship).

    `version` is the policy version of the weights that generated the batch's newest tokens (the
    oldest of them across shards). A sample may span versions (partial rollouts): `started`
    holds the version of each sample's first token. A multi-turn sample's response holds its
    turns with the tool outputs between them; `gen_mask` is 1 on the tokens the policy generated
    and 0 on tool output (context, never trained on). Empty lists: every token generated, every
    sample started at `version`.
    """

    ids: list[str]
    prompts: list[list[int]]
    responses: list[list[int]]
    logprobs: list[list[float]]
    version: int
    group: list[str] = field(default_factory=list)  # prompt id of each sample (GRPO groups)
    started: list[int] = field(default_factory=list)  # version of each sample's first token
    gen_mask: list[list[int]] = field(default_factory=list)  # 1: generated, 0: tool output

    def take(self, idx: list[int]) -> Samples:
        def pick(xs: list[T]) -> list[T]:
            return [xs[i] for i in idx] if xs else []
        return Samples(pick(self.ids), pick(self.prompts), pick(self.responses),
                       pick(self.logprobs), self.version, pick(self.group), pick(self.started),
                       pick(self.gen_mask))

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        out = Samples([], [], [], [], min(p.version for p in parts), [])
        spans = any(p.started or p.gen_mask for p in parts)
        for p in parts:
            out.ids += p.ids
            out.prompts += p.prompts
            out.responses += p.responses
            out.logprobs += p.logprobs
            out.group += p.group
            if spans:
                out.started += p.started or [p.version] * len(p.ids)
                out.gen_mask += p.gen_mask or [[1] * len(r) for r in p.responses]
        return out

    def tokens(self) -> int:
        return sum(len(p) + len(r) for p, r in zip(self.prompts, self.responses))

    def generated_tokens(self) -> int:
        """Response tokens the policy generated (what the loss averages over)."""
        if not self.gen_mask:
            return sum(len(r) for r in self.responses)
        return sum(sum(m) for m in self.gen_mask)

    def answer(self, i: int) -> list[int]:
        """Sample i's final turn: the tokens after its last tool output."""
        mask = self.gen_mask[i] if self.gen_mask else []
        start = max((k + 1 for k, g in enumerate(mask) if not g), default=0)
        return self.responses[i][start:]


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _cache_kw(model) -> str:
    """transformers 5 renamed `past_key_values` to `cache` (the old name warns, then goes)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.no_grad()
def generate(model, prompts: list[list[int]], max_new: int, seeds: list[int],
             temperature: float = 1.0, limits: list[int] | None = None
             ) -> tuple[list[list[int]], list[list[float]]]:
    """Sample up to `max_new` tokens per prompt (stopping at EOS) with a KV cache.

    Each sample draws from its own generator (`seeds[i]`, Gumbel-max sampling), so a sample is
    the same whichever worker, shard or re-run produces it. `limits[i]` (<= max_new) stops row i
    earlier: a partial rollout's token budget for this step.
    """
    limits = [max_new] * len(prompts) if limits is None else limits
    max_new = max(limits, default=0)
    if max_new <= 0:
        return [[] for _ in prompts], [[] for _ in prompts]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=True)
    kw = _cache_kw(model)
    past = _cache_of(out)
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    done = torch.zeros(len(prompts), dtype=torch.bool)
    limit = torch.tensor(limits)
    toks, lps = [], []
    logits = out.logits[:, -1]
    for k in range(max_new):
        logp = F.log_softmax(logits.float() / temperature, -1)
        u = torch.stack([torch.rand(logp.shape[-1], generator=g) for g in gens])
        nxt = (logp - torch.log(-torch.log(u.clamp(1e-10, 1.0)))).argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
        toks.append(nxt)
        lps.append(logp.gather(-1, nxt[:, None]).squeeze(-1))
        done = done | (nxt == EOS) | (limit <= k + 1)
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)  # finished rows are cut later
        pos = _positions(mask)[:, -1:]
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos,
                    use_cache=True, **{kw: past})
        past, logits = _cache_of(out), out.logits[:, -1]
    t = torch.stack(toks, 1).tolist()
    lp = torch.stack(lps, 1).tolist()
    resp, resp_lp = [], []
    for row, lrow, cap in zip(t, lp, limits):
        row, lrow = row[:cap], lrow[:cap]
        n = row.index(EOS) + 1 if EOS in row else len(row)
        resp.append(row[:n])
        resp_lp.append(lrow[:n])
    return resp, resp_lp


def resume_seed(seed: int, generated: int) -> int:
    """The sampling seed of a sample resumed after `generated` tokens: a function of the
    sample's own seed and how far it got, so any worker continues it the same way."""
    return (seed * 1_000_003 + generated * 7_919) % 2**63 if generated else seed


def pack(s: Samples) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, response mask) for a batch of samples; the response mask is 0 on
    tool output (`gen_mask`): attended to, not trained on."""
    pw = max(len(p) for p in s.prompts)
    rw = max(max((len(r) for r in s.responses), default=1), 1)
    ids, mask, rmask = [], [], []
    gens = s.gen_mask or [[1] * len(r) for r in s.responses]
    for p, r, g in zip(s.prompts, s.responses, gens):
        ids.append([PAD] * (pw - len(p)) + p + r + [PAD] * (rw - len(r)))
        mask.append([0] * (pw - len(p)) + [1] * (len(p) + len(r)) + [0] * (rw - len(r)))
        rmask.append(list(g) + [0] * (rw - len(r)))
    return torch.tensor(ids), torch.tensor(mask), torch.tensor(rmask, dtype=torch.float32)


def response_logprobs(model, s: Samples) -> torch.Tensor:
    """Log-prob of every response token under `model` ([batch, response width])."""
    ids, mask, rmask = pack(s)
    rw = rmask.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits
    logits = logits[:, -rw - 1:-1].float()
    tgt = ids[:, -rw:]
    return F.log_softmax(logits, -1).gather(-1, tgt[..., None]).squeeze(-1) * rmask


def response_values(vmodel, s: Samples) -> torch.Tensor:
    """Critic value at every response position ([batch, response width])."""
    ids, mask, rmask = pack(s)
    rw = rmask.shape[1]
    return vmodel(ids, mask)[:, -rw - 1:-1] * rmask


def sequence_scores(vmodel, s: Samples) -> list[float]:
    """A reward model's score: its head at each sample's last token."""
    ids, mask, _ = pack(s)
    v = vmodel(ids, mask)
    pw = max(len(p) for p in s.prompts)
    idx = torch.tensor([pw + len(r) - 1 for r in s.responses]).clamp(max=v.shape[1] - 1)
    return v.gather(-1, idx[:, None]).squeeze(-1).tolist()


def to_padded(rows: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([r + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32)


def grpo_advantages(rewards: list[float], groups: list[str]) -> list[float]:
    """Reward minus its group's mean, over the group's standard deviation (GRPO)."""
    by: dict[str, list[float]] = {}
    for r, g in zip(rewards, groups):
        by.setdefault(g, []).append(r)
    stats = {g: (sum(v) / len(v), torch.tensor(v).std(unbiased=False).item()) for g, v in by.items()}
    return [(r - stats[g][0]) / (stats[g][1] + 1e-4) for r, g in zip(rewards, groups)]


def gae(rewards: torch.Tensor, values: torch.Tensor, rmask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the generated tokens; (advantages, returns).

    Masked positions (tool output inside a multi-turn response, padding after it) are skipped:
    the next generated token's value and the running advantage carry across them unchanged."""
    adv = torch.zeros_like(values)
    last = torch.zeros(values.shape[0])
    nxt = torch.zeros(values.shape[0])
    for t in reversed(range(values.shape[1])):
        m = rmask[:, t]
        delta = rewards[:, t] + gamma * nxt - values[:, t]
        cur = delta + gamma * lam * last
        adv[:, t] = cur * m
        last = torch.where(m > 0, cur, last)
        nxt = torch.where(m > 0, values[:, t], nxt)
    return adv, adv + values * rmask


def policy_loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, rmask: torch.Tensor,
                ref: torch.Tensor | None, kl_coef: float, clip: float = 0.2,
                denom: float | None = None) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate plus a k3 KL penalty to the reference, averaged over response tokens.

    `denom`: the token count of the whole batch when this is one data-parallel shard, so that
    summing the shards' gradients gives exactly the gradient of the whole batch."""
    ratio = (logp - old).exp()
    surr = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    per_tok = -surr
    kl = torch.zeros_like(logp)
    if ref is not None and kl_coef > 0:
        d = ref - logp
        kl = d.exp() - d - 1
        per_tok = per_tok + kl_coef * kl
    n = rmask.sum().clamp(min=1) if denom is None else torch.tensor(float(max(denom, 1)))
    loss = (per_tok * rmask).sum() / n
    return loss, {"kl": float((kl * rmask).sum() / n)}


def value_loss(values: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, rmask: torch.Tensor,
               clip: float = 0.2) -> torch.Tensor:
    clipped = old + (values - old).clamp(-clip, clip)
    err = torch.max((values - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * (err * rmask).sum() / rmask.sum().clamp(min=1)
