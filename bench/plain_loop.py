"""A plain torch GRPO loop: the baseline the executor's overhead is measured against.

Written apart from the executor on purpose: it shares the model class (`build_policy`, the same
Llama-shaped network and initial weights for a seed) and nothing of the executor's loop, roles,
sampling, losses or runtime. One process, one model that both samples and trains (so no weight
sync), a frozen copy as the reference, no Ray, no sandbox. Each step: prompts of the job's
length, `samples_per_prompt` samples each, sampled with a KV cache up to `max_new` tokens
(stopping at EOS); a rule reward on the tokens; the reference's and the proximal log-probs
(no-grad forwards); group-normalised advantages; one clipped-surrogate step per mini-batch with
Adam and gradient clipping at 1.0 (the executor's optimizer and clip). As the executor trains
what the plan prices, so can this loop: `bf16` runs the log-prob and training forwards under
BF16 autocast over FP32 weights and Adam (sampling too, as the executor's torch engine samples),
and `micro_batches` accumulates each mini-batch's gradient over that many micro-batches, each
loss scaled by the mini-batch's response tokens. Every draw is from the seed. Returns per-step
wall times and the time each phase took.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from executors.model import EOS, build_policy
from placer.spec.arch import ModelArch


@dataclass
class PlainRun:
    """Per-step wall time (s), per phase its seconds in each step, and the trained model."""

    step_s: list[float] = field(default_factory=list)
    phase_s: dict[str, list[float]] = field(default_factory=dict)
    model: torch.nn.Module | None = None


def _past_kw(model: torch.nn.Module) -> str:
    """The KV-cache keyword of this transformers version (`cache` from 5 on)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def _sample(model: torch.nn.Module, prompts: torch.Tensor, max_new: int,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences, response mask): multinomial sampling with a KV cache; a row's mask covers
    its tokens up to and including its first EOS."""
    kw = _past_kw(model)
    out = model(input_ids=prompts, use_cache=True)
    past = getattr(out, "cache", None) or out.past_key_values
    rows, toks = prompts.shape[0], []
    alive = torch.ones(rows, dtype=torch.bool)
    mask = []
    for _ in range(max_new):
        probs = F.softmax(out.logits[:, -1].float(), -1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        toks.append(nxt)
        mask.append(alive.float())
        alive = alive & (nxt != EOS)
        if not bool(alive.any()):
            break
        out = model(input_ids=nxt[:, None], use_cache=True, **{kw: past})
        past = getattr(out, "cache", None) or out.past_key_values
    return torch.cat([prompts, torch.stack(toks, 1)], 1), torch.stack(mask, 1)


def _token_logprobs(model: torch.nn.Module, seqs: torch.Tensor, width: int) -> torch.Tensor:
    logits = model(input_ids=seqs).logits[:, -width - 1:-1].float()
    return F.log_softmax(logits, -1).gather(-1, seqs[:, -width:, None]).squeeze(-1)


def _rule_reward(resp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A cheap verifiable rule: the share of even token ids among a response's tokens."""
    out = []
    for row, m in zip(resp.tolist(), mask.tolist()):
        kept = [t for t, k in zip(row, m) if k]
        out.append(sum(t % 2 == 0 for t in kept) / max(len(kept), 1))
    return torch.tensor(out)


def run(arch: ModelArch, seed: int, prompts: int, samples_per_prompt: int, prompt_len: int,
        max_new: int, steps: int, lr: float, mini_batches: int = 1, clip: float = 0.2,
        threads: int = 1, bf16: bool = False, micro_batches: int = 1) -> PlainRun:
    """`steps` GRPO steps of the plain loop (see the module docstring)."""
    torch.set_num_threads(threads)

    def cast() -> contextlib.AbstractContextManager[None]:
        return (torch.autocast(device_type="cpu", dtype=torch.bfloat16) if bf16
                else contextlib.nullcontext())
    model = build_policy(arch, seed)
    model.train()
    ref = copy.deepcopy(model).eval()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    out = PlainRun(model=model)
    n = prompts * samples_per_prompt

    def phase(name: str, t0: float) -> float:
        now = time.perf_counter()
        out.phase_s.setdefault(name, []).append(now - t0)
        return now
    for _ in range(steps):
        t0 = t = time.perf_counter()
        base = torch.randint(4, arch.vocab, (prompts, prompt_len), generator=gen)
        with cast():
            seqs, rmask = _sample(model, base.repeat_interleave(samples_per_prompt, 0), max_new,
                                  gen)
        t = phase("generate", t)
        w = rmask.shape[1]
        reward = _rule_reward(seqs[:, -w:], rmask).view(prompts, samples_per_prompt)
        adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-4))
        adv = adv.reshape(n, 1)
        with torch.no_grad(), cast():
            _token_logprobs(ref, seqs, w)  # the reference's log-probs (the KL term's input)
            old = _token_logprobs(model, seqs, w).float()
        t = phase("reference and old log-probs", t)
        for k in range(mini_batches):
            lo, hi = k * n // mini_batches, (k + 1) * n // mini_batches
            tokens = rmask[lo:hi].sum().clamp(min=1)
            opt.zero_grad()
            for j in range(micro_batches):
                a, b = lo + j * (hi - lo) // micro_batches, lo + (j + 1) * (hi - lo) // micro_batches
                if a == b:
                    continue
                with cast():
                    logp = _token_logprobs(model, seqs[a:b], w).float()
                ratio = (logp - old[a:b]).exp()
                surr = torch.min(ratio * adv[a:b], ratio.clamp(1 - clip, 1 + clip) * adv[a:b])
                (-(surr * rmask[a:b]).sum() / tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        phase("train", t)
        out.step_s.append(time.perf_counter() - t0)
    return out
