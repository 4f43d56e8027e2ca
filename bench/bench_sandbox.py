"""Sandbox throughput: answers per second through the code judge and through the environment's batch.

1. The code judge (`executors.codetask.CodeJudge.judge_all`) on the shipped tiny code problems
   (examples/tiny-code: stdin, function and assert tests): a right and a wrong answer to each of
   the six, twelve answers a round, each in its own sandbox, a few sandboxes at once.
2. The environment's batch (`Sandbox.run_batch`, what a tool call or a verify runs on an
   environment worker): 32 short expressions in one sandbox, each answer in its own process.

Median answers per second over `--rounds` rounds after one warm-up round (which pays lazy imports
and the first interpreter start). The machine's other load moves these figures; compare runs made
back to back. Usage: python -m bench.bench_sandbox [--rounds N] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "examples" / "tiny-code" / "problems.jsonl"
# A right and a wrong answer to each shipped problem, in the shipped order.
ANSWERS = [
    ("a, b = map(int, input().split())\nprint(a + b)", "print(3)"),
    ("print(input()[::-1])", "print(input())"),
    ("input()\nprint(max(map(int, input().split())))", "input()\nprint(min(map(int, input().split())))"),
    ("def square(x):\n    return x * x", "def square(x):\n    return x + x"),
    ("def fizz(n):\n    return 'Fizz' if n % 3 == 0 else str(n)", "def fizz(n):\n    return str(n)"),
    ("def is_even(n):\n    return n % 2 == 0", "def is_even(n):\n    return True"),
]
BATCH = 32


def _rate(n: int, fn) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def measure(rounds: int) -> dict:
    from executors.codetask import CodeJudge, load_rows
    from executors.sandbox import Limits, Sandbox
    from placer.spec.localdata import CodeReward

    rows = load_rows(str(PROBLEMS), "prompt", "tests")
    answers = [a for pair in ANSWERS for a in pair]
    tests = [r.tests for r in rows for _ in range(2)]
    judge = CodeJudge(CodeReward(wall_s=5.0, cpu_s=2, memory_mb=256))
    sb = Sandbox(Limits(wall_s=5.0, cpu_s=2, per_item_s=1.0))
    exprs = [f"{i % 10}+{i % 7}" for i in range(BATCH)]
    rewards = [v.reward for v in judge.judge_all(answers, tests)]  # warm-up, and a sanity check
    assert rewards[0::2] == [1.0] * len(ANSWERS) and max(rewards[1::2]) < 1.0, rewards
    assert sb.run_batch(exprs).ok
    judged = [_rate(len(answers), lambda: judge.judge_all(answers, tests)) for _ in range(rounds)]
    batched = [_rate(BATCH, lambda: sb.run_batch(exprs)) for _ in range(rounds)]
    return {"judge_answers_per_s": statistics.median(judged), "judge_rounds": judged,
            "batch_answers_per_s": statistics.median(batched), "batch_rounds": batched,
            "answers_per_round": len(answers), "batch_size": BATCH}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = measure(max(a.rounds, 1))
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"sandbox throughput, median of {a.rounds} rounds after a warm-up")
    print(f"  {'path':<44} {'answers/s':>10}")
    print(f"  {'code judge, tiny-code (12 answers a round)':<44} "
          f"{res['judge_answers_per_s']:>10.1f}")
    print(f"  {f'environment batch ({BATCH} expressions)':<44} {res['batch_answers_per_s']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
