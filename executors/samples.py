"""`Samples`: a batch of rollouts as plain lists, what rollout produces and every later role reads.

Apart from the losses (`executors.rl`, which re-exports it) and free of torch: it travels to the
rule reward and the environment workers, which then unpickle it without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

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

