"""The math task: prompts with reference answers from a dataset; a rule reward by equivalence.

Data (`placer.spec.localdata.Dataset`, `reward: math`): a JSONL or Parquet file with a prompt and an
answer column.
Each step draws `n` prompts from the file with the job's seed and the step (the same prompts
wherever they are drawn).

Reward: the policy's final answer is its text after the last `=` (or a `\\boxed{...}` when
present). It is parsed by a small recursive-descent parser (numbers, + - * / ^, parentheses,
unary minus) straight into sympy objects, never through `eval` (sympy's own `parse_expr`
evaluates Python, and answers are untrusted), and compared with the reference by
`sympy.simplify(answer - reference) == 0`: `6/4`, `3/2` and `1.5` are the same answer.
Shaped so that a randomly initialised policy gets a signal from its first step (as the
arithmetic task does): an equivalent answer scores 1.0; a parsable answer 0.4 + 0.6 x
closeness (falls linearly to 0 at a distance of 10); anything else 0.2 x the fraction of its
characters that can appear in arithmetic.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

from placer.spec.localdata import read_rows
from placer.spec.sampling import rng

ARITHMETIC = set("0123456789+-*/^(). ")
TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|(.))")
MAX_ANSWER = 64  # characters parsed (an answer is short; bounds the parser's work)


@dataclass(frozen=True)
class Row:
    prompt: str
    answer: str


@functools.lru_cache(maxsize=4)
def load_rows(path: str, prompt_key: str, answer_key: str) -> tuple[Row, ...]:
    """Every row of the JSONL or Parquet file; SpecError naming the field and the row of a bad
    one (`placer.spec.localdata.read_rows`)."""
    rows = read_rows(path, {"prompt": prompt_key, "answer": answer_key})
    return tuple(Row(str(r["prompt"]), str(r["answer"])) for r in rows)


class _Parser:
    """expr := term (('+'|'-') term)*; term := unary (('*'|'/') unary)*;
    unary := '-' unary | power; power := atom ('^' unary)?; atom := number | '(' expr ')'."""

    def __init__(self, text: str) -> None:
        self.toks = [m.group(1) or m.group(2) for m in TOKEN.finditer(text[:MAX_ANSWER])
                     if (m.group(1) or m.group(2) or "").strip()]
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        t = self.peek()
        if t is None:
            raise ValueError("unexpected end")
        self.i += 1
        return t

    def parse(self) -> Any:
        e = self.expr()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r}")
        return e

    def expr(self) -> Any:
        e = self.term()
        while self.peek() in ("+", "-"):
            e = e + self.term() if self.take() == "+" else e - self.term()
        return e

    def term(self) -> Any:
        e = self.unary()
        while self.peek() in ("*", "/"):
            e = e * self.unary() if self.take() == "*" else e / self.unary()
        return e

    def unary(self) -> Any:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        return self.power()

    def power(self) -> Any:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            exp = self.unary()
            if abs(float(exp)) > 16:  # 9^9^9 would hang sympy
                raise ValueError("exponent too large")
            return base ** exp
        return base

    def atom(self) -> Any:
        import sympy  # type: ignore[import-untyped]  # lazy: sympy only where answers are scored
        t = self.take()
        if t == "(":
            e = self.expr()
            if self.take() != ")":
                raise ValueError("unbalanced parenthesis")
            return e
        if t[0].isdigit() or t[0] == ".":
            return sympy.Rational(t)
        raise ValueError(f"unexpected {t!r}")


def parse_answer(text: str) -> Any | None:
    """The sympy value of an answer's final expression, or None when it does not parse."""
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    final = boxed[-1] if boxed else text.rsplit("=", 1)[-1]
    try:
        value = _Parser(final.strip()).parse()
    except (ValueError, ZeroDivisionError, TypeError, OverflowError):
        return None
    return value if value.is_finite else None  # 1/0 is sympy's complex infinity


def equivalent(answer: Any, reference: Any) -> bool:
    import sympy  # lazy: only where answers are scored
    try:
        return bool(sympy.simplify(answer - reference) == 0)
    except (TypeError, ValueError):
        return False


def math_score(answer: str, reference: str) -> float:
    """The shaped rule reward of one answer (see the module docstring)."""
    ref, got = parse_answer(reference), parse_answer(answer)
    if got is not None and ref is not None:
        if equivalent(got, ref):
            return 1.0
        try:
            dist = abs(float(got) - float(ref))
        except (TypeError, ValueError):
            dist = 10.0
        return 0.4 + 0.6 * max(0.0, 1.0 - dist / 10.0)
    if not answer:
        return 0.0
    return 0.2 * sum(c in ARITHMETIC for c in answer) / len(answer)


def draw(rows: Sized, seed: int, step: int, n: int) -> list[int]:
    """Row indices of step `step`'s `n` prompts (any dataset's rows: the code task's too)."""
    return [int(i) for i in rng(seed, 11, step).integers(0, len(rows), size=n)]
