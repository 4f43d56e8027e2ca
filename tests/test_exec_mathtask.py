"""The math task: JSONL or Parquet prompts with answers, and the rule reward (sympy equivalence
of the answer's final expression, parsed without eval; shaped for a random-init policy)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from exec_util import ROOT

from executors.checkpoints import write_math_data
from executors.mathtask import load_rows, math_score, parse_answer
from executors.task import Arithmetic, MathData, task_of
from placer.base.errors import SpecError
from placer.cli import main


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


def test_bad_rows_name_the_field_and_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    with pytest.raises(SpecError, match=r"^data.answer: .*bad.jsonl:1: no key 'answer' \(keys: "
                                        r"prompt\)$"):
        load_rows(str(p), "prompt", "answer")
    p.write_text(json.dumps({"prompt": "1+1=", "answer": None}) + "\n")
    with pytest.raises(SpecError, match=r"^data.answer: .*bad.jsonl:1: column 'answer' is null$"):
        load_rows(str(p), "prompt", "answer")


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_parquet_loads_like_jsonl(tmp_path: Path) -> None:
    """Same rows, same column options, whatever the format; extra columns are ignored."""
    src = [json.loads(line) for line in write_math_data(tmp_path / "m.jsonl", n=20, seed=5)
           .read_text().splitlines()]
    renamed = [{"question": r["prompt"], "final": r["answer"], "level": k}
               for k, r in enumerate(src)]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in renamed))
    _parquet(tmp_path / "r.parquet", renamed)
    from_jsonl = load_rows(str(tmp_path / "r.jsonl"), "question", "final")
    from_parquet = load_rows(str(tmp_path / "r.parquet"), "question", "final")
    assert from_parquet == from_jsonl and len(from_parquet) == 20
    assert from_parquet == load_rows(str(tmp_path / "m.jsonl"), "prompt", "answer")
    task = task_of({"path": str(tmp_path / "r.parquet"), "prompt": "question", "answer": "final"})
    assert isinstance(task, MathData) and task.prompts(0, 1, 4) == task_of(
        {"path": str(tmp_path / "r.jsonl"), "prompt": "question", "answer": "final"}).prompts(0, 1, 4)


def test_bad_parquet_names_the_field_and_the_value(tmp_path: Path) -> None:
    p = _parquet(tmp_path / "q.parquet", [{"question": "1+1=", "final": "2"},
                                           {"question": "2+2=", "final": None}])
    with pytest.raises(SpecError, match=r"^data.answer: column 'answer' not in .*q.parquet' "
                                        r"\(columns: question, final\)$"):
        load_rows(str(p), "question", "answer")
    with pytest.raises(SpecError, match=r"^data.answer: .*q.parquet row 2: column 'final' is null$"):
        load_rows(str(p), "question", "final")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1 not really")
    with pytest.raises(SpecError, match=r"^data.path: .*junk.parquet' is not a readable Parquet file"):
        load_rows(str(junk), "question", "final")
    with pytest.raises(SpecError, match=r"^data.path: no such file .*none.parquet'$"):
        load_rows(str(tmp_path / "none.parquet"), "question", "final")


def test_execute_refuses_a_bad_dataset_before_starting(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A missing column: exit 2, one line naming the field and the column, nothing built."""
    _parquet(tmp_path / "q.parquet", [{"question": "1+1=", "final": "2"}])
    job = (ROOT / "examples" / "tiny-cpu.yaml").read_text()
    (tmp_path / "job.yaml").write_text(job + "data: {path: q.parquet, prompt: text, answer: final}\n")
    out = tmp_path / "run"
    assert main(["execute", str(tmp_path / "job.yaml"), "--steps", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("placer: error: data.prompt: column "
                                                         "'text' not in"), err
    assert not (out / "model-v0").exists()
