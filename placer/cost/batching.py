"""Continuous batching on one engine replica in closed form: the step arithmetic and KV budget.

Shared by the planner's engine (`placer.cost.admission.engine`, run by `placer.cost.rollout_tail` and
`placer.cost.toolqueue`) and the simulator's (`simulator.engine`, which drives the same loop), so
the two agree exactly with variance off.

Between two batch changes the batch B is fixed and its total KV context grows by B per step, so
step i costs f(i) = decode_step_time(B, C0 + B i) = max(m0 + k C, floor): a run of steps is at most
two arithmetic series, summed (and inverted, to stop at a tool call's return) in closed form from
the cost model's (m0, k, floor) per batch size (`costmodel.decode_step_line`, kept per batch size
in `StepTerms`). With identical sequences every wave starts and ends together and the result is
`rolloutcost.wave_time`'s lockstep waves exactly.

`KvBudget` is what a replica admits: its KV-cache tokens (whole pages of `kv_block_tokens`) and
`max_num_seqs` (`placer.cost.efficiency.Efficiency`).

A `StepTerms` is one replica layout's arithmetic and the memo of everything priced on it (step
lines, prefill lines, engine replays): a pricing context (`placer.cost.context`) keeps one per
(model, device, replica layout, efficiency), so the memo lives exactly as long as the problem.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

from placer.cost.efficiency import Efficiency
from placer.cost.generation import (
    decode_step_line,
    decode_step_time,
    kv_capacity_tokens,
    prefill_line,
)
from placer.cost.sharding import Parallel, state_tokens
from placer.cost.tail_samples import Rows
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceType


@dataclass(frozen=True)
class KvBudget:
    """What one engine replica admits: `tokens` of KV cache (whole blocks) shared by every
    sequence holding KV (running, or waiting on a tool call), at most `max_seqs` of them."""

    tokens: int
    max_seqs: int
    block: int = 1  # KV page, tokens (`kv_block_tokens`)
    seq: int = 0  # KV tokens' worth a sequence holds besides its context (a hybrid's GDN state)

    def first_wave(self, prompt: int, count: int) -> int:
        """Sequences of `count` identical ones (`prompt` tokens) an empty replica admits at once:
        each needs its prompt, the token its first step writes and its state (`admission`)."""
        return max(min(count, self.max_seqs, self.tokens // (max(prompt, 0) + 1 + self.seq)), 0)


def kv_budget(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> KvBudget:
    """The replica's KV capacity floored to whole `kv_block_tokens` pages, `max_num_seqs`, and
    a sequence's recurrent state in KV tokens (`sharding.state_tokens`, rounded up)."""
    block = max(int(eff.kv_block_tokens), 1)
    pages = int(kv_capacity_tokens(m, dev, par, eff) // block)
    # each data-parallel attention group schedules its own max_num_seqs (one engine core each)
    return KvBudget(pages * block, max(int(eff.max_num_seqs), 1) * par.attn_dp, block,
                    math.ceil(state_tokens(m, dev, par, eff)))


REPLAYS_KEPT = 4096  # engine replays kept per replica layout, least recently used dropped first
PARTS_KEPT = 4096  # split parts' estimates kept per replica layout, the same way
# What a replay keeps: a stage's seconds, the engine loop's (finish time, sequences), or the
# representative rows it replays (`placer.cost.rollout_tail`: a step's longest sample).
Replay = float | tuple[float, ...] | list[tuple[float, int]] | Rows
_R = TypeVar("_R", bound=Replay)


@dataclass
class StepTerms:
    """decode_step_time(B, C) of one replica as max(m0 + k C, flat), per batch size B, the
    replays of the engine loop on this replica (`remember`), and the estimates of a split
    role's parts with this replica layout (`part`)."""

    model: ModelArch
    dev: DeviceType
    par: Parallel  # one replica (dp = 1)
    eff: Efficiency
    terms: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    prefills: dict[float, tuple[float, float]] = field(default_factory=dict)
    replays: OrderedDict[Hashable, Replay] = field(default_factory=OrderedDict, repr=False)
    parts: OrderedDict[Hashable, object] = field(default_factory=OrderedDict, repr=False)
    _kv: KvBudget | None = None

    def remember(self, key: Hashable, compute: Callable[[], _R]) -> _R:
        """`compute()` kept by `key` (a replay's inputs, by value): a cost table's candidates
        with this replica layout replay the same samples at the same counts again and again.
        Each caller's keys have their own shape, so a key's value is what its `compute` gives."""
        hit = self.replays.get(key)
        if hit is not None:
            self.replays.move_to_end(key)
            return cast(_R, hit)
        out = compute()
        self.replays[key] = out
        if len(self.replays) > REPLAYS_KEPT:
            self.replays.popitem(last=False)
        return out

    def part(self, key: Hashable, compute: Callable[[], object]) -> object:
        """`compute()` kept by `key` (a split part's inputs, by value: `placer.cost.split.
        PartTimer`), None included: every allocation of a fleet's job, and every job of the
        same model and lengths, balances the same parts at the same sample counts."""
        if key in self.parts:
            self.parts.move_to_end(key)
            return self.parts[key]
        out = self.parts[key] = compute()
        if len(self.parts) > PARTS_KEPT:
            self.parts.popitem(last=False)
        return out

    @property
    def kv(self) -> KvBudget:
        """The replica's admission budget (a function of the same model, device, layout, eff)."""
        if self._kv is None:
            self._kv = kv_budget(self.model, self.dev, self.par, self.eff)
        return self._kv

    def step(self, batch: int, context: float) -> float:
        return decode_step_time(self.model, self.dev, self.par, batch, context, self.eff)

    def of(self, batch: int) -> tuple[float, float, float]:
        """(m0, k, flat) of a step of `batch` > 0 sequences (`costmodel.decode_step_line`)."""
        terms = self.terms.get(batch)
        if terms is None:
            terms = self.terms[batch] = decode_step_line(self.model, self.dev, self.par, batch,
                                                         self.eff)
        return terms

    def prefill(self, tokens: float, ctx: float) -> float:
        """`costmodel.prefill_time` of `tokens` new tokens at mean context `ctx`, from its
        line in ctx kept per token count (`costmodel.prefill_line`: the same prefill sizes
        recur across replays and candidates, at ever different contexts)."""
        line = self.prefills.get(tokens)
        if line is None:
            line = self.prefills[tokens] = prefill_line(self.model, self.dev, self.par, tokens,
                                                        self.eff)
        return line[0] + line[1] * ctx




def step_terms(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> StepTerms:
    """Fresh `StepTerms` of one replica of `par` (dp 1). A pricing context keeps one per
    layout (`placer.cost.context.PriceContext.step_terms`), so its memo is shared."""
    return StepTerms(m, dev, replace(par, dp=1), eff)


class Run:
    """Cumulative time T(k) of k decode steps of a fixed batch from total context c0."""

    __slots__ = ("j", "f0", "a", "b")

    def __init__(self, st: StepTerms, batch: int, c0: float, kmax: int) -> None:
        m0, k, flat = st.of(batch)
        u0, du = m0 + k * c0, k * batch
        self.f0 = max(u0, flat)
        if u0 >= flat:
            self.j = 0
        elif du <= 0:
            self.j = kmax
        else:
            self.j = min(max(math.ceil((flat - u0) / du), 0), kmax)
        self.a, self.b = u0 + du * self.j, du

    def time(self, k: int) -> float:
        if k <= self.j:
            return k * self.f0
        n = k - self.j
        return self.j * self.f0 + n * self.a + self.b * n * (n - 1) / 2

    def steps_to_reach(self, dt: float, kmax: int) -> int:
        """Smallest k in [1, kmax] with time(k) >= dt."""
        if dt <= 0:
            return 1
        if self.time(kmax) <= dt:
            return kmax
        if dt <= self.j * self.f0:
            k = math.ceil(dt / self.f0)
        elif self.b <= 0:
            k = self.j + math.ceil((dt - self.j * self.f0) / self.a)
        else:  # n a + b n (n - 1) / 2 = rest
            q = self.a - self.b / 2
            k = self.j + math.ceil((-q + math.sqrt(q * q + 2 * self.b * (dt - self.j * self.f0)))
                                   / self.b)
        k = min(max(k, 1), kmax)
        while k > 1 and self.time(k - 1) >= dt:  # float guard: make k the smallest
            k -= 1
        while k < kmax and self.time(k) < dt:
            k += 1
        return k
