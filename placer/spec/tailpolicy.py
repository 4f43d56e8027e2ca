"""Long-tail policies: the job's `tail_policy` section and what each policy does, in one place.

The cost model, the simulator and the executor all ask a policy the same few questions through
its mechanism (`TailPolicy.mechanism`), never by its name:

  generated(n)      samples the rollout generates for a step that trains n
  keeps_first       the stage ends once n of them are done (the rest are aborted)
  token_budget      a sample's response tokens per step before it is cut and carried
  carries_over      unfinished samples resume next step (a steady state needs one step more)
  tool_deadline_s   a tool call still running this long after it started is issued again
  check(...)        settings that would cut the typical sample, not the tail (exit 2)
  option(...)       the policy at defaults read off a job's draws (`placer simulate
                    --compare-policies`), and `explain(...)` of what it did there

Adding a policy is one class here with its `kind` in `TailKind` and `POLICIES`; nothing else in
the project compares a policy's name.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from placer.base.errors import SpecError
from placer.spec.base import PosFloat, PosInt, Strict
from placer.spec.sections import Environment, Lengths

TailKind = Literal["none", "overprovision", "partial", "reissue"]


class TailPolicy(Strict):
    """How a step stops waiting on its slowest samples; the simulator models each.

    none           wait for every sample and every tool call
    overprovision  generate ceil(n * (1 + fraction)) samples, keep the first n to finish and
                   abort the rest (the kept samples lean short: a known bias of the method)
    partial        cut a sample once it generated `token_budget` response tokens in this step;
                   the rest of it resumes next step (its context prefilled again) and counts there
    reissue        a tool call still running `deadline_s` after it started is issued again on
                   another core; the first copy to finish wins and frees both cores
    """

    kind: TailKind = "none"
    fraction: Annotated[float, Field(strict=True, gt=0, le=4)] | None = None
    token_budget: PosInt | None = None
    deadline_s: PosFloat | None = None

    @model_validator(mode="after")
    def _fields_match_kind(self) -> TailPolicy:
        need = POLICIES[self.kind].param
        for name in ("fraction", "token_budget", "deadline_s"):
            given = getattr(self, name) is not None
            if name == need and not given:
                raise ValueError(f"a {self.kind} tail policy needs {name}")
            if name != need and given:
                raise ValueError(f"{name} does not apply to a {self.kind} tail policy")
        return self

    @property
    def mechanism(self) -> TailMechanism:
        """What this policy does (`POLICIES`)."""
        return POLICIES[self.kind](self)


# A simulated run's figures by name (`simulator.policies` rows: iteration_s, long_tail_s,
# queueing_s, generated, committed, carried_tokens, reissued_calls, reissue_saved_s); `explain`
# reads only these numbers from a row.
Metrics = Mapping[str, float]


@dataclass(frozen=True)
class Draws:
    """What a job's drawn samples say, for a policy's defaults (`TailMechanism.option`)."""

    response_totals: Sequence[float]  # a sample's response tokens over its turns
    tool_latencies_s: Sequence[float]  # every drawn tool call
    response_floor: int  # turns x the mean response, rounded up per turn
    mean_tool_s: float
    has_tools: bool


class TailMechanism:
    """A long-tail policy's behaviour; the base is the `none` policy: wait for everything."""

    kind: ClassVar[str] = "none"
    param: ClassVar[str | None] = None  # the `TailPolicy` field the policy needs

    def __init__(self, policy: TailPolicy) -> None:
        self.policy = policy

    def generated(self, n: int) -> int:
        """Samples generated for a step that trains `n`."""
        return n

    @property
    def keeps_first(self) -> bool:
        """The rollout stage ends once the step's n samples are done; the rest are aborted."""
        return False

    @property
    def token_budget(self) -> int | None:
        """Response tokens a sample generates per step before it is cut (None: uncut)."""
        return None

    @property
    def carries_over(self) -> bool:
        """Cut samples resume next step, so a step's work depends on the one before."""
        return False

    @property
    def tool_deadline_s(self) -> float | None:
        """Seconds after which a running tool call is issued again (None: never)."""
        return None

    def carry_steps(self, max_tokens: int) -> int:
        """Steps a sample may wait beyond its own before it is done (its group held back)."""
        return 0

    def check(self, lengths: Lengths, env: Environment, source: str) -> None:
        """SpecError when the setting would cut (or re-issue) the typical sample, not the tail:
        carried-over work would then grow every step, or every call would run twice."""

    @classmethod
    def option(cls, draws: Draws) -> TailPolicy | None:
        """This policy at defaults read off the job's draws (None: it does not apply)."""
        return TailPolicy()

    def explain(self, row: Metrics, base: Metrics, train_samples: int) -> str:
        """One line on what the policy did in a simulated comparison against `none`."""
        return (f"baseline: every step waits for its slowest sample ({row['long_tail_s']:.1f} s "
                f"after 90% were done)")


def _step(row: Metrics, base: Metrics) -> tuple[str, str]:
    return (f"step {base['iteration_s']:.1f} -> {row['iteration_s']:.1f} s",
            f"long tail {base['long_tail_s']:.1f} -> {row['long_tail_s']:.1f} s")


class Overprovision(TailMechanism):
    """Generate ceil(n (1 + fraction)) samples, keep the first n to finish."""

    kind = "overprovision"
    param = "fraction"
    DEFAULT_FRACTION: ClassVar[float] = 0.1

    def generated(self, n: int) -> int:
        f = self.policy.fraction or 0.0
        # the tolerance keeps a product that float rounding lifts past a whole count whole
        return math.ceil(n * (1 + f) - 1e-9)

    @property
    def keeps_first(self) -> bool:
        return True

    @classmethod
    def option(cls, draws: Draws) -> TailPolicy:
        return TailPolicy(kind="overprovision", fraction=cls.DEFAULT_FRACTION)

    def explain(self, row: Metrics, base: Metrics, train_samples: int) -> str:
        step, tail = _step(row, base)
        return (f"generates {row['generated']:.0f} samples to keep the first "
                f"{row['committed']:.0f}: {step}, {tail}; pays {self.policy.fraction:.0%} more "
                "generation and keeps a sample set biased to short responses")


class Partial(TailMechanism):
    """Cut a sample at `token_budget` response tokens per step; the rest resumes next step."""

    kind = "partial"
    param = "token_budget"
    BUDGET_QUANTILE: ClassVar[int] = 90  # default budget: this percentile of a sample's tokens

    @property
    def token_budget(self) -> int:
        assert self.policy.token_budget is not None, "a partial tail policy has token_budget"
        return self.policy.token_budget

    @property
    def carries_over(self) -> bool:
        return True

    def carry_steps(self, max_tokens: int) -> int:
        """A carried sample gains at least `token_budget` tokens per step until it is done (at
        most `max_tokens`: turns x per-turn cap), so it is done within ceil(max / budget) steps."""
        return max(math.ceil(max_tokens / self.token_budget) - 1, 0)

    def check(self, lengths: Lengths, env: Environment, source: str) -> None:
        # whole tokens per turn, as the simulator rounds a no-variance response
        mean = env.turns * math.ceil(lengths.response.mean_value())
        if self.token_budget < mean:
            raise SpecError(f"{source}: tail_policy.token_budget: below the mean response of a "
                            f"sample ({mean:.0f} tokens over {env.turns} turn(s)); carried-over "
                            f"work would grow every step (got {self.token_budget})")

    @classmethod
    def option(cls, draws: Draws) -> TailPolicy:
        budget = np.percentile(np.asarray(draws.response_totals), cls.BUDGET_QUANTILE)
        return TailPolicy(kind="partial", token_budget=max(int(budget), draws.response_floor))

    def explain(self, row: Metrics, base: Metrics, train_samples: int) -> str:
        step, tail = _step(row, base)
        return (f"cuts rows at {self.token_budget} tokens, carrying {row['carried_tokens']:.0f} "
                f"tokens per step (prefilled again next step): {step}, {tail}; trains "
                f"{row['committed']:.0f} of {train_samples} samples per step")


class Reissue(TailMechanism):
    """Issue a tool call again once it ran `deadline_s`; the first copy to finish wins."""

    kind = "reissue"
    param = "deadline_s"
    DEADLINE_QUANTILE: ClassVar[int] = 95  # default deadline: this percentile of tool latency

    @property
    def tool_deadline_s(self) -> float:
        assert self.policy.deadline_s is not None, "a reissue tail policy has deadline_s"
        return self.policy.deadline_s

    def check(self, lengths: Lengths, env: Environment, source: str) -> None:
        if env.kind == "none" or env.turns < 2:
            raise SpecError(f"{source}: tail_policy.kind: reissue needs tool calls (an "
                            f"environment with turns >= 2) (got {self.kind!r})")
        mean_s = env.tool_latency_s.mean_value()
        if self.tool_deadline_s < mean_s:
            raise SpecError(f"{source}: tail_policy.deadline_s: below the mean tool latency "
                            f"({mean_s:.3g} s); most calls would run twice "
                            f"(got {self.tool_deadline_s})")

    @classmethod
    def option(cls, draws: Draws) -> TailPolicy | None:
        if not draws.has_tools:
            return None
        deadline = float(np.percentile(np.asarray(draws.tool_latencies_s), cls.DEADLINE_QUANTILE))
        return TailPolicy(kind="reissue", deadline_s=max(deadline, draws.mean_tool_s))

    def explain(self, row: Metrics, base: Metrics, train_samples: int) -> str:
        step, _ = _step(row, base)
        off = abs(row["iteration_s"] - base["iteration_s"]) < 0.01 * base["iteration_s"]
        return (f"re-issued {row['reissued_calls']} slow tool calls past "
                f"{self.tool_deadline_s:.2f} s, {row['reissue_saved_s']:.1f} s of call time "
                f"saved: tool queueing {base['queueing_s']:.2f} -> {row['queueing_s']:.2f} "
                f"s/sample, {step}"
                + ("; tool calls are off the critical path here (steps wait on generation)"
                   if off else ""))


POLICIES: dict[str, type[TailMechanism]] = {
    c.kind: c for c in (TailMechanism, Overprovision, Partial, Reissue)}
