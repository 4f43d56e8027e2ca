"""The math task: JSONL prompts with answers, and the rule reward (sympy equivalence of the
answer's final expression, parsed without eval; shaped for a random-init policy)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from executors.checkpoints import write_math_data
from executors.mathtask import load_rows, math_score, parse_answer
from executors.task import Arithmetic, MathData, task_of


def test_equivalent_answers_score_one() -> None:
    for answer, ref in [("7", "7"), ("3+4", "7"), ("x=14/2", "7"), ("6/4", "3/2"), ("1.5", "3/2"),
                        (r"so \boxed{-4}", "-4"), ("2^3", "8"), ("-(2-5)", "3")]:
        assert math_score(answer, ref) == 1.0, (answer, ref)


def test_shaping_orders_wrong_answers() -> None:
    close, far, junk = math_score("8", "7"), math_score("40", "7"), math_score("abc", "7")
    assert 1.0 > close > far >= 0.4 > math_score("1+", "7") > junk == 0.0
    assert math_score("", "7") == 0.0


def test_answers_are_never_evaluated_as_code() -> None:
    for hostile in ["__import__('os').system('true')", "().__class__", "9^9^9^9", "1/0", "((((1"]:
        assert parse_answer(hostile) is None, hostile


def test_dataset_prompts_are_drawn_from_the_seed(tmp_path: Path) -> None:
    path = write_math_data(tmp_path / "m.jsonl", n=50, seed=3)
    rows = load_rows(str(path), "prompt", "answer")
    assert len(rows) == 50 and all(math_score(r.answer, r.answer) == 1.0 for r in rows)
    task = task_of({"path": str(path), "prompt": "prompt", "answer": "answer"})
    assert isinstance(task, MathData) and isinstance(task_of(None), Arithmetic)
    a, b = task.prompts(0, 2, 8), task.prompts(0, 2, 8)
    assert a == b and a != task.prompts(0, 3, 8) and [p.id for p in a] == [f"s2p{i}" for i in range(8)]
    first = a[0]
    assert task.exact(first.target, {}, first.target) and not task.exact("x", {}, first.target)


def test_bad_rows_name_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected an object with 'prompt' and 'answer'"):
        load_rows(str(p), "prompt", "answer")
