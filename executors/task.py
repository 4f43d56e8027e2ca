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

A job with `data` (a JSONL or Parquet prompt set) runs the rule reward its `data.reward` names
instead, from the registry `DATA_TASKS`: `math` (`executors.mathtask`, answer equivalence) or
`code` (`executors.codetask`, unit tests run in the sandbox). `task_of` picks the task from the
run's config, for the driver and the reward worker alike. `judge` scores a batch and says why
each answer lost reward (the code task's reasons: a failing test, a timeout, a crash) and
whether it is exact; the reward worker records the reasons in the trace and hands the exact
verdicts back with its rewards, so the driver counts exact answers without judging again (the
code task would run every answer in the sandbox a second time).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # lazy below: a scoring worker loads neither pydantic nor numpy for them
    from placer.spec.localdata import Dataset

ARITHMETIC = set("0123456789+-*/%(). ")
Target = int | str  # the arithmetic task's sum, or a dataset's reference answer


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    target: Target


def make_prompts(seed: int, step: int, n: int) -> list[Prompt]:
    """`n` prompts for `step`, the same for the same (seed, step) wherever they are drawn."""
    from placer.spec.sampling import rng  # lazy: numpy, for the driver that draws prompts
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


@dataclass(frozen=True)
class Judged:
    """An answer's reward, why it is not 1 ("" when it is, or when the task cannot say), and
    whether it is exactly right (what the step's `exact` counts, from this one judgement)."""

    reward: float
    reason: str = ""
    exact: bool = False


class Task(Protocol):
    """Prompts for a step, and the rule reward of an answer (with its sandbox result)."""

    # whether the reward reads the environment's run of each final answer (the driver's
    # `verify` tool calls); the code task runs its own unit tests, so it skips them
    reads_results: bool

    def prompts(self, seed: int, step: int, n: int) -> list[Prompt]: ...

    def score(self, answer: str, result: dict, target: Target) -> float: ...

    def exact(self, answer: str, result: dict, target: Target) -> bool: ...

    def judge(self, answers: Sequence[str], results: Sequence[dict],
              targets: Sequence[Target]) -> list[Judged]: ...


class _EachScored:
    """`judge` as one `score` per answer (the tasks whose reward is cheap and says no reason)."""

    def score(self, answer: str, result: dict, target: Target) -> float:
        raise NotImplementedError

    def exact_of(self, answer: str, result: dict, target: Target, reward: float) -> bool:
        """Whether an answer that scored `reward` is exact."""
        raise NotImplementedError

    def judge(self, answers: Sequence[str], results: Sequence[dict],
              targets: Sequence[Target]) -> list[Judged]:
        out = []
        for a, r, t in zip(answers, results, targets):
            reward = self.score(a, r, t)
            out.append(Judged(reward, exact=self.exact_of(a, r, t, reward)))
        return out


class Arithmetic(_EachScored):
    """`a+b=`: the answer runs as code in the sandbox; its printed value is compared."""

    reads_results = True

    def prompts(self, seed: int, step: int, n: int) -> list[Prompt]:
        return make_prompts(seed, step, n)

    def score(self, answer: str, result: dict, target: Target) -> float:
        return score(answer, result, int(target))

    def exact(self, answer: str, result: dict, target: Target) -> bool:
        return exact(result, int(target))

    def exact_of(self, answer: str, result: dict, target: Target, reward: float) -> bool:
        return self.exact(answer, result, target)


class MathData(_EachScored):
    """A prompt set with reference answers, scored by sympy equivalence."""

    reads_results = True  # (it does not, but the run's verify tool calls are kept as planned)

    def __init__(self, data: Dataset, allow_weak: bool | None = None) -> None:
        from executors import mathtask  # lazy: sympy only for the math task
        self.m = mathtask
        self.rows = mathtask.load_rows(data.path, data.prompt, data.answer)

    def prompts(self, seed: int, step: int, n: int) -> list[Prompt]:
        return [Prompt(f"s{step}p{i}", self.rows[k].prompt, self.rows[k].answer)
                for i, k in enumerate(self.m.draw(self.rows, seed, step, n))]

    def score(self, answer: str, result: dict, target: Target) -> float:
        return self.m.math_score(answer, str(target))

    def exact(self, answer: str, result: dict, target: Target) -> bool:
        return self.score(answer, result, target) == 1.0

    def exact_of(self, answer: str, result: dict, target: Target, reward: float) -> bool:
        return reward == 1.0  # equivalent to the reference (no second sympy check)


class CodeData:
    """A prompt set with unit tests; an answer's code runs on them in the sandbox
    (`executors.codetask`), once: the reward worker's verdicts carry `exact` back to the driver
    with the rewards (`Judged`), and the same answer to the same row twice in one call (a GRPO
    group that agrees) runs once. Nothing is kept between calls: no flow asks twice about an
    answer, and on the tiny code set no answer repeated across steps (192 of 192 ran)."""

    reads_results = False  # the unit tests are the run: no separate verify call

    def __init__(self, data: Dataset, allow_weak: bool | None = None) -> None:
        from executors import codetask, mathtask  # lazy: the sandbox only for the code task
        self.c, self.m = codetask, mathtask
        self.rows = codetask.load_rows(data.path, data.prompt, data.answer)
        self.judge_ = codetask.CodeJudge(data.code, allow_weak)

    def prompts(self, seed: int, step: int, n: int) -> list[Prompt]:
        # the target is the row's index: the tests stay here, never travel with the samples
        return [Prompt(f"s{step}p{i}", self.rows[k].prompt, k)
                for i, k in enumerate(self.m.draw(self.rows, seed, step, n))]

    def _verdicts(self, answers: Sequence[str], targets: Sequence[Target]) -> list[Any]:
        keys = [(a, int(t)) for a, t in zip(answers, targets)]
        todo = list(dict.fromkeys(keys))
        made = self.judge_.judge_all([a for a, _ in todo], [self.rows[t].tests for _, t in todo])
        verdict = dict(zip(todo, made))
        return [verdict[k] for k in keys]

    def score(self, answer: str, result: dict, target: Target) -> float:
        return float(self._verdicts([answer], [target])[0].reward)

    def exact(self, answer: str, result: dict, target: Target) -> bool:
        return bool(self._verdicts([answer], [target])[0].exact)

    def judge(self, answers: Sequence[str], results: Sequence[dict],
              targets: Sequence[Target]) -> list[Judged]:
        return [Judged(v.reward, v.reason, v.exact) for v in self._verdicts(answers, targets)]


# The dataset tasks by `data.reward` (placer.spec.localdata.REWARDS names the same kinds).
DATA_TASKS: dict[str, Callable[[Dataset, bool | None], Task]] = {
    "math": MathData, "code": CodeData}


def task_of(data: dict[str, Any] | None, allow_weak: bool | None = None) -> Task:
    """The run's task: the arithmetic one, or the rule reward `data.reward` names over the job's
    `data`; `allow_weak`: the run's `--unsafe-sandbox` (for the tasks that run code)."""
    if data is None:
        return Arithmetic()
    from placer.spec.localdata import Dataset  # lazy: pydantic, for a run with a dataset
    ds = Dataset.model_validate(data)
    return DATA_TASKS[ds.reward](ds, allow_weak)
