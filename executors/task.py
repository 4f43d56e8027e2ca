"""A verifiable arithmetic task: the policy writes an expression, the sandbox runs it.

Each prompt is `a+b=` (single digits, drawn from the job's seed and the step). The policy's answer
is untrusted code: the environment evaluates it in the sandbox (`Sandbox.run_batch`, one forked
child per answer) and the rule reward compares the value it printed with `a+b`.

The reward is shaped so that a randomly initialised policy gets a signal from its first step:
  * an answer that does not run scores 0.2 x the fraction of its characters that are arithmetic
    (digits and operators): the policy first learns to write arithmetic;
  * an answer that runs and gives a number scores 0.4 + 0.6 x closeness, where closeness falls
    linearly from 1 (exact) to 0 (off by 10 or more): then it learns to get close, then exact.
An exact answer scores 1.0.

A job with `data` (a JSONL prompt set) runs the math task instead (`executors.mathtask`):
`task_of` picks the task from the run's config, for the driver and the reward worker alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from placer.sampling import rng

ARITHMETIC = set("0123456789+-*/%(). ")
Target = int | str  # the arithmetic task's sum, or a dataset's reference answer


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    target: Target


def make_prompts(seed: int, step: int, n: int) -> list[Prompt]:
    """`n` prompts for `step`, the same for the same (seed, step) wherever they are drawn."""
    g = rng(seed, 7, step)
    ab = g.integers(0, 10, size=(n, 2))
    return [Prompt(f"s{step}p{i}", f"{a}+{b}=", int(a + b)) for i, (a, b) in enumerate(ab)]


def _number(value: str) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if v == v and abs(v) != float("inf") else None


def score(answer: str, result: dict, target: int) -> float:
    """Reward of one answer given the sandbox's result for it (`status`, `value`)."""
    if result.get("status") == "ok":
        v = _number(result.get("value", ""))
        if v is not None:
            closeness = max(0.0, 1.0 - abs(v - target) / 10.0)
            return 0.4 + 0.6 * closeness
    if not answer:
        return 0.0
    return 0.2 * sum(c in ARITHMETIC for c in answer) / len(answer)


def exact(result: dict, target: int) -> bool:
    v = _number(result.get("value", "")) if result.get("status") == "ok" else None
    return v is not None and v == target


class Task(Protocol):
    """Prompts for a step, and the rule reward of an answer (with its sandbox result)."""

    def prompts(self, seed: int, step: int, n: int) -> list[Prompt]: ...

    def score(self, answer: str, result: dict, target: Target) -> float: ...

    def exact(self, answer: str, result: dict, target: Target) -> bool: ...


class Arithmetic:
    """`a+b=`: the answer runs as code in the sandbox; its printed value is compared."""

    def prompts(self, seed: int, step: int, n: int) -> list[Prompt]:
        return make_prompts(seed, step, n)

    def score(self, answer: str, result: dict, target: Target) -> float:
        return score(answer, result, int(target))

    def exact(self, answer: str, result: dict, target: Target) -> bool:
        return exact(result, int(target))


class MathData:
    """A JSONL prompt set with reference answers, scored by sympy equivalence."""

    def __init__(self, path: str, prompt: str = "prompt", answer: str = "answer") -> None:
        from executors import mathtask  # lazy: sympy only for the math task
        self.m = mathtask
        self.rows = mathtask.load_rows(path, prompt, answer)

    def prompts(self, seed: int, step: int, n: int) -> list[Prompt]:
        return [Prompt(f"s{step}p{i}", self.rows[k].prompt, self.rows[k].answer)
                for i, k in enumerate(self.m.draw(self.rows, seed, step, n))]

    def score(self, answer: str, result: dict, target: Target) -> float:
        return self.m.math_score(answer, str(target))

    def exact(self, answer: str, result: dict, target: Target) -> bool:
        return self.score(answer, result, target) == 1.0


def task_of(data: dict[str, Any] | None) -> Task:
    """The run's task: the arithmetic one, or the math task over the job's `data`."""
    return Arithmetic() if data is None else MathData(**data)
