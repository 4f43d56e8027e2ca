"""The code task: prompts with unit tests; a rule reward by running the answer's code on them.

Data (`placer.spec.localdata.Dataset`, `reward: code`): each row a prompt and its tests in verl's
format (what its `prime_code` and `sandbox_fusion` scorers read for APPS, TACO, CodeContests and
Codeforces rows), a JSON string or an object:
  {"inputs": [...], "outputs": [...]}              a program: test i feeds inputs[i] on stdin and
                                                     expects outputs[i] on stdout;
  {"inputs": [...], "outputs": [...], "fn_name": F}  a function: inputs[i] holds F's arguments
                                                     (one JSON value a line, or a JSON list) and
                                                     outputs[i] its return value (JSON);
  ... "assert_case": [...]                          test i also runs assert_case[i] (Python, e.g.
                                                     `assert f(2) == 4`) after the code; an empty
                                                     outputs[i] is then not compared.

Reward: the code is the last ```python fenced block of the answer (or any fenced block, or the
whole text). All of an answer's tests run in ONE sandbox (`executors.sandbox`, kernel isolation,
seccomp, rlimits, a memory cgroup; never outside it) under the job's `data.code` limits (wall
clock, CPU seconds, memory), graded outside the graded process (`Sandbox.run_tests`): the
solution runs in a process of its own, once per test as a fresh `__main__` on the test's stdin,
and a harness in another process calls it over a pipe, runs the assert statements with the
solution's return values as plain data, and reports per test whether it ran through, its
stdout (or return value; an output over 16 KiB as a digest of its tokens) or its error. The
expected outputs never enter the sandbox (the comparison is made here) and the assert
statements never enter the solution's process: frame inspection, monkeypatching or printing
there cannot change a verdict.

The score is the fraction of tests passed (`scoring: fraction`, verl's continuous score) or 1
only when all pass (`scoring: all`). A run that does not end normally (timeout, cpu, memory or
output limit, a crash, a sandbox refusal) scores 0, whatever tests had passed before it; the
verdict's `reason` says why (the sandbox's status, or the first failing test).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executors.sandbox import Limits, Sandbox, SandboxUnavailable, clean_text
from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.spec.localdata import CodeReward, read_rows

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
MAX_STDOUT = 16 * 1024  # characters of one test's output sent back whole (longer: a digest)
OUTPUT_BYTES = 2 * 2**20  # all the run's output (frames included): more ends the run, reward 0
FLOAT_TOL = 1e-6  # numbers in an output compare within this (relative or absolute)
MAX_WORKERS = 4  # sandboxes run at once when a batch is scored (each is its own process tree)


@dataclass(frozen=True)
class Tests:
    """One row's unit tests, parsed and checked."""

    inputs: tuple[Any, ...]  # stdin text per test, or the function's argument list
    outputs: tuple[Any, ...]  # expected stdout text, or return value (JSON), per test
    fn_name: str | None = None
    asserts: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class Verdict:
    reward: float
    passed: int
    total: int
    reason: str  # "" when every test passed

    @property
    def exact(self) -> bool:
        return self.total > 0 and self.passed == self.total


@dataclass(frozen=True)
class Row:
    prompt: str
    tests: Tests


# ------------------------------------------------------------------------------- the data

def _text(v: Any) -> str:
    """A stdin/stdout cell: text, or a list of lines (some APPS rows)."""
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "\n".join(v)
    if isinstance(v, str):
        return v
    raise ValueError(f"expected text, got {type(v).__name__}")


def _args(v: Any) -> list[Any]:
    """A function test's arguments: a JSON list, or one JSON value a line (verl's form)."""
    if isinstance(v, list):
        return v
    if isinstance(v, str):
        return [json.loads(line) for line in v.split("\n") if line.strip()]
    raise ValueError(f"expected arguments, got {type(v).__name__}")


def _expected(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def parse_tests(cell: Any) -> Tests:
    """A tests cell (JSON text or an object) -> Tests; ValueError saying what is wrong."""
    obj = json.loads(cell) if isinstance(cell, str) else cell
    if not isinstance(obj, dict):
        raise ValueError(f"expected an object with inputs and outputs, got {type(obj).__name__}")
    ins, outs = obj.get("inputs"), obj.get("outputs")
    if not isinstance(ins, list) or not isinstance(outs, list) or not ins:
        raise ValueError("inputs and outputs must be non-empty lists")
    if len(ins) != len(outs):
        raise ValueError(f"{len(ins)} inputs but {len(outs)} outputs")
    fn = obj.get("fn_name")
    if fn is not None and (not isinstance(fn, str) or not fn.isidentifier()):
        raise ValueError(f"fn_name must be a Python name (got {fn!r:.40})")
    asserts = obj.get("assert_case")
    if asserts is not None and (not isinstance(asserts, list) or len(asserts) != len(ins)
                                or not all(isinstance(a, str) for a in asserts)):
        raise ValueError("assert_case must be a list of strings, one per input")
    if fn is None:
        return Tests(tuple(map(_text, ins)), tuple(map(_text, outs)), None,
                     tuple(asserts) if asserts else None)
    return Tests(tuple(map(_args, ins)), tuple(map(_expected, outs)), fn,
                 tuple(asserts) if asserts else None)


@functools.lru_cache(maxsize=4)
def load_rows(path: str, prompt_key: str, tests_key: str) -> tuple[Row, ...]:
    """Every row of a JSONL or Parquet code dataset; SpecError naming the field and the row."""
    out = []
    for i, r in enumerate(read_rows(path, {"prompt": prompt_key, "answer": tests_key}), 1):
        try:
            out.append(Row(str(r["prompt"]), parse_tests(r["answer"])))
        except (ValueError, TypeError) as e:
            raise SpecError(f"data.answer: {path} row {i}: column {tests_key!r} is not unit "
                            f"tests ({str(e).splitlines()[0][:160]})") from None
    return tuple(out)


# ------------------------------------------------------------------------------- the code

def extract_code(answer: str) -> str:
    """The last ```python block of an answer, else its last fenced block, else the whole text."""
    blocks = FENCE.findall(answer)
    py = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    if py or blocks:
        return (py or [code for _, code in blocks])[-1]
    return answer


def harness_spec(tests: Tests) -> dict[str, Any]:
    """What the sandbox's harness runs (`Sandbox.run_tests`): every test's input (stdin text or
    the function's arguments), the function's name, the assert statements. Expected outputs are
    not in it."""
    return {"fn": tests.fn_name, "inputs": list(tests.inputs),
            "asserts": list(tests.asserts) if tests.asserts else None, "max_stdout": MAX_STDOUT}


def _tokens_match(got: str, want: str) -> bool:
    """Outputs equal up to whitespace, numbers within FLOAT_TOL."""
    a, b = got.split(), want.split()
    if a == b:
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not math.isclose(fx, fy, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL):
            return False
    return True


def _passed(f: dict[str, Any] | None, tests: Tests, i: int) -> tuple[bool, str]:
    """Whether test i passed, and why not."""
    if f is None:
        return False, f"test {i}: no result"
    if not f.get("ok"):
        return False, f"test {i}: {f.get('error', 'failed')}"
    want = tests.outputs[i]
    if tests.fn_name:
        try:
            got = json.loads(str(f.get("ret")))
        except ValueError:
            return False, f"test {i}: unreadable return value"
        if got == want or (isinstance(want, list) and len(want) == 1 and got == want[0]):
            return True, ""
        return False, f"test {i}: returned {str(f.get('ret'))[:60]}"
    if tests.asserts and want == "":
        return True, ""
    if "sha" in f:  # a long output: exact tokens only
        ok = f["sha"] == hashlib.sha256(" ".join(str(want).split()).encode()).hexdigest()
    else:
        ok = _tokens_match(str(f.get("stdout", "")), str(want))
    return ok, "" if ok else f"test {i}: wrong output"


class CodeJudge:
    """Runs answers on their tests in the sandbox and scores them (`data.code` settings)."""

    def __init__(self, settings: CodeReward | None = None, allow_weak: bool | None = None) -> None:
        self.settings = s = settings or CodeReward()
        self.sandbox = Sandbox(Limits(wall_s=s.wall_s, cpu_s=s.cpu_s,
                                      memory_bytes=s.memory_mb * 2**20,
                                      output_bytes=OUTPUT_BYTES, keep_bytes=OUTPUT_BYTES),
                               allow_weak=allow_weak)

    def judge(self, answer: str, tests: Tests) -> Verdict:
        try:
            res = self.sandbox.run_tests(extract_code(answer), harness_spec(tests))
        except SandboxUnavailable as e:
            return Verdict(0.0, 0, len(tests), clean_text(f"sandbox refused: {e}"))
        got = {f["test"]: f for f in res.values or []}
        checks = [_passed(got.get(i), tests, i) for i in range(len(tests))]
        passed = sum(ok for ok, _ in checks)
        if res.status != "ok":  # the run as a whole failed: nothing it printed counts
            return Verdict(0.0, passed, len(tests), f"run {res.status}")
        reason = clean_text(next((why for ok, why in checks if not ok), ""))
        frac = passed / len(tests)
        reward = frac if self.settings.scoring == "fraction" else float(passed == len(tests))
        return Verdict(reward, passed, len(tests), reason)

    def judge_all(self, answers: Sequence[str], tests: Sequence[Tests]) -> list[Verdict]:
        """Verdicts of many answers, a few sandboxes at a time (same verdicts in any order)."""
        if len(answers) <= 1:
            return [self.judge(a, t) for a, t in zip(answers, tests)]
        with ThreadPoolExecutor(min(MAX_WORKERS, len(answers))) as pool:
            return list(pool.map(self.judge, answers, tests))


# ------------------------------------------------------------------------------- shipped data

PROBLEMS: list[tuple[str, dict[str, Any]]] = [
    ("Read two integers a and b on one line and print a + b.",
     {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]}),
    ("Read a line of text and print it reversed.",
     {"inputs": ["abc\n", "racecar\n", "ab cd\n"], "outputs": ["cba\n", "racecar\n", "dc ba\n"]}),
    ("Read n, then n integers on the next line; print their maximum.",
     {"inputs": ["3\n1 5 2\n", "1\n-4\n", "4\n7 7 1 0\n"], "outputs": ["5\n", "-4\n", "7\n"]}),
    ("Write a function square(x) that returns x * x.",
     {"inputs": ["2", "-3", "0"], "outputs": ["4", "9", "0"], "fn_name": "square"}),
    ("Write a function fizz(n) returning 'Fizz' if n is divisible by 3, else str(n).",
     {"inputs": ["3", "4", "9"], "outputs": ['"Fizz"', '"4"', '"Fizz"'], "fn_name": "fizz"}),
    ("Write a function is_even(n) returning True when n is even.",
     {"inputs": ["", "", ""], "outputs": ["", "", ""],
      "assert_case": ["assert is_even(2)", "assert not is_even(3)", "assert is_even(0)"]}),
]


def write_code_data(path: str | Path) -> Path:
    """The small code dataset that ships under examples/ (JSONL, or Parquet by its suffix):
    a few stdin/stdout, function and assert problems, tests as verl's JSON text."""
    rows = [{"prompt": p, "tests": json.dumps(t)} for p, t in PROBLEMS]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix != ".parquet":
        atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
        return out
    import pyarrow as pa  # type: ignore[import-untyped]  # lazy: only for Parquet
    import pyarrow.parquet as pq  # type: ignore[import-untyped]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, out)  # never half a file under the final name
    return out
