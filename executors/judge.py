"""A generative judge as the executor runs it: a decoder that reads each sample and writes a verdict.

The job's `reward_model: {kind: generative}` (`placer.spec.judge`) makes the reward role a judge:
its own engine replicas (the plan's reward layout: one worker per data-parallel replica, on the
pool the planner chose, or in the rollout's slot when it colocates them) each take a contiguous
share of the step's samples, batched. For every sample a replica

  1. builds the judge's request: the sample's prompt and final answer as text, re-encoded with
     the judge's own tokenizer, then the rubric (`rubric_tokens` tokens of a fixed instruction),
     as the cost model prices it (a prefill of sample + rubric);
  2. decodes a verdict of the job's verdict length distribution: each sample's budget is drawn
     from `reward_model.verdict` with a generator of the job's seed and the sample's id (the
     same verdict on whichever replica or re-run judges it), the decode stops there or at EOS;
  3. reads the reward off the verdict (`verdict_reward`): a score the verdict states ("7/10",
     a final yes or no) when it states one, else the judge's probability of "y" against "n"
     after the verdict and a closing question (`VERDICT_CUE`): one forward pass.

Step 2 is one lockstep generation, traced as a `generate` event of the reward role (batch,
verdict tokens, decode steps, per-sample request lengths), which calibration prices with the
judge's model on its device type as it prices the rollout's; step 3 is a `reward` event (no
fitted factor prices it). The judge is random-initialised from the job's architecture (the
catalog entry `models.reward` names) with its own seed; frozen, it is never synced.

The cost model deals samples round-robin over replicas; contiguous shares have the same counts.
"""
from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from executors import rl
from executors.model import EOS, PAD, CharCodec, build_policy
from executors.roles import RunConfig, Worker, _timing
from executors.task import Target
from placer.spec.arch import ModelArch
from placer.spec.judge import RewardModel
from placer.spec.sampling import draw_lengths

RUBRIC = "judge: is the answer to the question right? think, then say y or n. "
VERDICT_CUE = " y/n?"
YES, NO = "y", "n"
JUDGE_SEED = 41  # the judge's weights: the job's seed plus this (the policy's is the seed)
# "7/10", "3 / 4", "0.5/1": a stated score over its scale (the last one counts)
_SCORE = re.compile(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")
_WORD = re.compile(r"[a-z]+")
_YES_WORDS = frozenset({"y", "yes", "right", "correct"})
_NO_WORDS = frozenset({"n", "no", "wrong", "incorrect"})


def sample_key(seed: int, sample_id: str) -> int:
    """A stable 63-bit key of (seed, sample id): the same in every process (Python's `hash` of
    a string is salted per process)."""
    h = hashlib.blake2b(f"{seed}/{sample_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % 2**63


def verdict_budgets(spec: RewardModel, seed: int, sample_ids: Sequence[str]) -> list[int]:
    """Each sample's verdict length budget, drawn from the job's verdict distribution with a
    generator of the job's seed and the sample's id."""
    assert spec.verdict is not None, "a generative judge has a verdict distribution"
    return [int(draw_lengths(spec.verdict, np.random.default_rng([sample_key(seed, i), 4]), 1)[0])
            for i in sample_ids]


def rubric_ids(codec: CharCodec, tokens: int) -> list[int]:
    """`tokens` ids of the rubric (its text repeated or cut to length)."""
    ids = codec.encode(RUBRIC)
    return (ids * (tokens // len(ids) + 1))[:tokens] if tokens else []


def parse_verdict(text: str) -> float | None:
    """The score a verdict states, in [0, 1]: its last "N/M" (N over M, M > 0), else its last
    word when that is a yes or a no; None when it states neither."""
    scores = [(float(a), float(b)) for a, b in _SCORE.findall(text) if float(b) > 0]
    if scores:
        a, b = scores[-1]
        return min(max(a / b, 0.0), 1.0)
    words = _WORD.findall(text.lower())
    if words and words[-1] in _YES_WORDS:
        return 1.0
    if words and words[-1] in _NO_WORDS:
        return 0.0
    return None


def yes_probability(logits: torch.Tensor, yes: int, no: int) -> torch.Tensor:
    """P(yes) / (P(yes) + P(no)) from next-token logits ([batch, vocab]) -> [batch]."""
    pair = torch.stack([logits[:, yes], logits[:, no]], -1).float()
    return F.softmax(pair, -1)[:, 0]


def verdict_reward(text: str, p_yes: float) -> float:
    """The reward of a verdict: the score it states, else the judge's probability of yes."""
    stated = parse_verdict(text)
    return stated if stated is not None else float(p_yes)


def left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of rows left-padded to the longest."""
    w = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (w - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (w - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


class Judge(Worker):
    """One replica of the generative judge (the reward role of a `generative` reward model)."""

    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "reward", rank)
        if cfg.reward_arch is None or cfg.judge is None:
            raise ValueError("a judge worker needs the reward model's architecture and the "
                             "job's reward_model section")
        self.arch = ModelArch(**cfg.reward_arch)
        self.spec = RewardModel(**cfg.judge)
        self.model = build_policy(self.arch, cfg.seed + JUDGE_SEED)
        self.model.requires_grad_(False)
        self.codec = CharCodec(self.arch.vocab)
        self.rubric = rubric_ids(self.codec, self.spec.rubric_tokens)
        self.cue = self.codec.encode(VERDICT_CUE)
        self.yes, self.no = self.codec.encode(YES)[0], self.codec.encode(NO)[0]

    def executed_layout(self, replicas: int) -> dict[str, int]:
        """One whole judge model per data-parallel replica."""
        return {"dp": replicas, "tp": 1, "pp": 1}

    def request(self, s: rl.Samples, i: int) -> list[int]:
        """Sample i's request to the judge: its prompt and answer as text in the judge's
        tokenizer, then the rubric."""
        policy = self.cfg.codec
        text = policy.decode(s.prompts[i]) + " " + policy.decode(s.answer(i))
        bos = [self.codec.bos] if self.codec.bos is not None else []
        return bos + self.codec.encode(text) + self.rubric

    @torch.no_grad()
    def score(self, s: rl.Samples, results: list[dict], targets: list[Target]
              ) -> tuple[list[float], dict[str, Any]]:
        t0 = time.time()
        delayed = self._straggle()
        requests = [self.request(s, i) for i in range(len(s.ids))]
        budgets = verdict_budgets(self.spec, self.cfg.seed, s.ids)
        seeds = [sample_key(self.cfg.seed + JUDGE_SEED, i) for i in s.ids]
        g0 = time.time()
        verdicts, _ = rl.generate(self.model, requests, max(budgets), seeds, 1.0, budgets,
                                  eos=EOS)
        g1 = time.time()
        rows = [q + v + self.cue for q, v in zip(requests, verdicts)]
        ids, mask = left_pad(rows)
        logits = self.model(input_ids=ids, attention_mask=mask,
                            position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[:, -1]
        p_yes = yes_probability(logits, self.yes, self.no).tolist()
        rewards = [verdict_reward(self.codec.decode(v), p) for v, p in zip(verdicts, p_yes)]
        g2 = time.time()
        made = sum(len(v) for v in verdicts)
        spans = [
            {"cat": "generate", "t0": g0, "dur": g1 - g0,
             "args": {"batch": len(s.ids), "tokens": made,
                      "steps": max((len(v) for v in verdicts), default=0),
                      "prompt_tokens": [float(len(q)) for q in requests],
                      "response_tokens": [float(len(v)) for v in verdicts]}},
            {"cat": "reward", "t0": g1, "dur": g2 - g1,
             "args": {"tokens": sum(len(r) for r in rows)}}]
        return rewards, _timing(t0, tokens=sum(len(q) for q in requests) + made,
                                sample_ids=list(s.ids), spans=spans, delayed_s=delayed)


def judge_calls(workers: Sequence[Any], s: rl.Samples, results: list[dict],
                targets: list[Target]) -> list[tuple[Any, str, tuple[object, ...]]]:
    """The judge's calls for a step: contiguous shares of the samples over its replicas, in
    sample order (so that the rewards concatenate back in order)."""
    n, k = len(s.ids), len(workers)
    out: list[tuple[Any, str, tuple[object, ...]]] = []
    for j, m in enumerate(workers):
        idx = list(range(j * n // k, (j + 1) * n // k))
        if idx:
            out.append((m, "score", (s.take(idx), [results[i] for i in idx],
                                     [targets[i] for i in idx])))
    return out


def spans_of(timing: dict[str, Any], cat: str) -> list[tuple[str, float, float, dict[str, Any]]]:
    """(category, start, seconds, args) of each trace event a scoring call's timing describes:
    its `spans` (a judge's), else the whole call as one `cat` event with its tokens (and a rule
    reward's reasons)."""
    if "spans" in timing:
        return [(sp["cat"], sp["t0"], sp["dur"], dict(sp["args"])) for sp in timing["spans"]]
    args: dict[str, Any] = {"tokens": timing.get("tokens", 0)}
    if "reasons" in timing:
        args["reasons"] = timing["reasons"]
    return [(cat, timing["t0"], timing["dur"], args)]
