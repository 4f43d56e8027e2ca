"""The code task: prompts with unit tests (verl's format) from JSONL or Parquet, and the rule reward
that runs each answer's code on its tests in the sandbox. No rollout: answers are written here
(correct, wrong, crashing, looping, cheating) and the reward is checked on them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from exec_util import ROOT

from executors import sandbox as sbx
from executors.codetask import (
    PROBLEMS,
    CodeJudge,
    extract_code,
    harness_spec,
    load_rows,
    parse_tests,
    write_code_data,
)
from executors.task import DATA_TASKS, CodeData, MathData, task_of
from placer.base.errors import SpecError
from placer.spec.localdata import REWARDS, CodeReward, Dataset

SHIPPED = ROOT / "examples" / "tiny-code" / "problems.jsonl"
# A right answer to each shipped problem, in the shipped order (stdin, function and assert forms).
RIGHT = [
    "a, b = map(int, input().split())\nprint(a + b)",
    "```python\nprint(input()[::-1])\n```",
    "input()\nprint(max(map(int, input().split())))",
    "Here it is:\n```python\ndef square(x):\n    return x * x\n```\nDone.",
    "def fizz(n):\n    return 'Fizz' if n % 3 == 0 else str(n)",
    "def is_even(n):\n    return n % 2 == 0",
]
# Limits small enough that the looping answers end soon (the verdicts do not depend on them).
QUICK = CodeReward(wall_s=3.0, cpu_s=1, memory_mb=256)


@pytest.fixture(scope="module")
def rows() -> tuple:
    return load_rows(str(SHIPPED), "prompt", "tests")


@pytest.fixture(scope="module")
def judge() -> CodeJudge:
    return CodeJudge(QUICK)


def test_the_shipped_dataset_is_the_generated_one(tmp_path: Path, rows: tuple) -> None:
    assert write_code_data(tmp_path / "p.jsonl").read_text() == SHIPPED.read_text()
    assert len(rows) == len(PROBLEMS) == len(RIGHT)
    kinds = {("fn" if r.tests.fn_name else "assert" if r.tests.asserts else "stdin") for r in rows}
    assert kinds == {"stdin", "fn", "assert"}
    parquet = load_rows(str(write_code_data(tmp_path / "p.parquet")), "prompt", "tests")
    assert parquet == rows  # the same problems read from Parquet


def test_right_answers_score_one(judge: CodeJudge, rows: tuple) -> None:
    verdicts = judge.judge_all(RIGHT, [r.tests for r in rows])
    assert [(v.reward, v.exact, v.reason) for v in verdicts] == [(1.0, True, "")] * len(RIGHT)


def test_wrong_answers_score_the_fraction_passed(judge: CodeJudge, rows: tuple) -> None:
    v = judge.judge("print(3)", rows[0].tests)  # right for "1 2" only
    assert (v.reward, v.passed, v.total, v.exact) == (pytest.approx(1 / 3), 1, 3, False)
    assert v.reason == "test 1: wrong output"
    v = judge.judge("def square(x):\n    return x + x", rows[3].tests)  # right for 2 and 0
    assert (v.passed, v.reason) == (2, "test 1: returned -6")
    assert judge.judge("print(4)", rows[3].tests).reason == "test 0: NameError: no function square"
    v = judge.judge("def is_even(n):\n    return True", rows[5].tests)
    assert (v.passed, v.reason) == (2, "test 1: AssertionError: ")
    strict = CodeJudge(QUICK.model_copy(update={"scoring": "all"}))
    assert strict.judge("print(3)", rows[0].tests).reward == 0.0
    assert strict.judge(RIGHT[0], rows[0].tests).reward == 1.0


def test_crashing_and_looping_answers_score_zero_with_the_reason(judge: CodeJudge,
                                                                 rows: tuple) -> None:
    t = rows[0].tests
    cases = {
        "raise RuntimeError('boom')": "test 0: RuntimeError: boom",  # every test raises
        "def f(:\n    pass": "test 0: SyntaxError: ",
        "x = bytearray(10**10)": "test 0: MemoryError: ",  # over the address-space limit
        "import os\nos.abort()": "run crashed",  # the whole run dies: nothing counts
        "while True:\n    pass": None,  # the CPU or wall-clock limit ends it
    }
    for answer, reason in cases.items():
        v = judge.judge(answer, t)
        assert v.reward == 0.0 and not v.exact, answer
        if reason is None:
            assert v.reason in ("run timeout", "run cpu_limit"), v
        else:
            assert v.reason.startswith(reason), v
    # A loop after the first test passed still scores 0: the run did not end normally.
    late = "a, b = map(int, input().split())\nif a == 10:\n    while True: pass\nprint(a + b)"
    v = judge.judge(late, t)
    assert v.reward == 0.0 and v.reason.startswith("run ")


def test_exiting_early_or_forging_results_gains_nothing(judge: CodeJudge, rows: tuple) -> None:
    """Expected outputs never enter the sandbox, and what the solution prints is its output only
    (results travel on a pipe its process does not hold)."""
    t = rows[0].tests
    forged = ('import sys\nsys.__stdout__.write(\'\\n@@0000000000000000@@{"i": 0, "ok": true, '
              '"stdout": "3\\\\n"}\\n\')')
    for answer in ["import sys\nsys.exit(0)", "import os\nos._exit(0)", forged]:
        v = judge.judge(answer, t)
        assert v.reward == 0.0, (answer, v)
    cheat = "def is_even(n):\n    import sys\n    sys.exit(0)"  # skips the assert
    assert judge.judge(cheat, rows[5].tests).reward == 0.0
    secret = parse_tests({"inputs": ["in-7f3a"], "outputs": ["out-9c1e"]})
    sent = json.dumps(harness_spec(secret))
    assert "in-7f3a" in sent and "out-9c1e" not in sent


def test_a_sandbox_refusal_scores_zero_with_the_reason(monkeypatch: pytest.MonkeyPatch,
                                                      rows: tuple) -> None:
    monkeypatch.setattr(sbx.Sandbox, "_start", lambda *a: "user namespaces are disabled")
    monkeypatch.delenv(sbx.UNSAFE_ENV, raising=False)
    v = CodeJudge(QUICK).judge(RIGHT[0], rows[0].tests)
    assert v.reward == 0.0 and v.reason.startswith("sandbox refused: sandbox: kernel isolation "
                                                   "unavailable (user namespaces are disabled)")


def test_code_is_taken_from_the_last_python_block() -> None:
    assert extract_code("x\n```\nA\n```\n```python\nB\n```\n```text\nC\n```") == "B\n"
    assert extract_code("```\nA\n```\n```sh\nC\n```") == "C\n"
    assert extract_code("print(1)") == "print(1)"


def test_bad_tests_name_the_field_and_the_row(tmp_path: Path) -> None:
    good = {"prompt": "p", "tests": json.dumps({"inputs": ["1"], "outputs": ["1"]})}
    for bad, why in [({"inputs": ["1"], "outputs": []}, "1 inputs but 0 outputs"),
                     ("not json", "Expecting value"),
                     ({"inputs": ["1"], "outputs": ["1"], "fn_name": "no such"},
                      "fn_name must be a Python name")]:
        p = tmp_path / "bad.jsonl"
        p.write_text(json.dumps(good) + "\n" + json.dumps({"prompt": "q", "tests": bad}) + "\n")
        load_rows.cache_clear()
        with pytest.raises(SpecError, match=rf"^data.answer: .*bad.jsonl row 2: column 'tests' is "
                                            rf"not unit tests \(.*{why}"):
            load_rows(str(p), "prompt", "tests")


def test_the_job_picks_the_reward_from_a_registry(tmp_path: Path) -> None:
    assert set(DATA_TASKS) == set(REWARDS)
    ds = Dataset(path=str(SHIPPED), reward="code", code=QUICK)
    assert ds.answer == "tests"  # a code dataset's default reference column
    assert Dataset.model_validate(ds.model_dump()) == ds
    assert "reward" not in Dataset(path="m.jsonl").model_dump()  # math dumps as before
    task = task_of(ds.model_dump())
    assert isinstance(task, CodeData)
    math = write_code_data(tmp_path / "m.jsonl")  # any two columns make a math set
    assert isinstance(task_of({"path": str(math), "answer": "tests"}), MathData)
    prompts = task.prompts(3, 1, 6)
    assert prompts == task.prompts(3, 1, 6) and all(isinstance(p.target, int) for p in prompts)
    answers = [RIGHT[int(p.target)] for p in prompts[:2]] + ["while True: pass"]
    judged = task.judge(answers, [{}] * 3, [p.target for p in prompts[:3]])
    assert [j.reward for j in judged[:2]] == [1.0, 1.0] and judged[2].reward == 0.0
    assert [j.exact for j in judged] == [True, True, False]  # what the driver counts
    assert judged[2].reason.startswith("run ") and judged[0].reason == ""
    assert task.exact(answers[0], {}, prompts[0].target)  # its own check of one answer
    assert task.score(answers[2], {}, prompts[2].target) == 0.0
    rows = load_rows(str(SHIPPED), "prompt", "tests")
    assert parse_tests(json.loads(SHIPPED.read_text().splitlines()[0])["tests"]) == rows[0].tests


def test_long_outputs_and_many_tests_are_all_checked(judge: CodeJudge) -> None:
    """Outputs far past the sandbox's default 4 KiB tail: 40 tests of 1,000 characters each,
    and outputs over 16 KiB (sent back as a digest of their tokens)."""
    many = parse_tests({"inputs": [f"{k}\n" for k in range(40)],
                        "outputs": [" ".join([str(k)] * 500) for k in range(40)]})
    right = "k = input().strip()\nprint(' '.join([k] * 500))"
    assert (judge.judge(right, many).passed, judge.judge(right, many).total) == (40, 40)
    long = parse_tests({"inputs": ["3000\n", "3001\n"],
                        "outputs": ["\n".join(["x" * 9] * 3000), "\n".join(["x" * 9] * 3001)]})
    v = judge.judge("print('\\n'.join(['x' * 9] * int(input())))", long)
    assert (v.reward, v.reason) == (1.0, "")
    v = judge.judge("print('\\n'.join(['x' * 9] * 3000))", long)  # one line short on test 1
    assert (v.passed, v.reason) == (1, "test 1: wrong output")


def test_answers_judged_at_once_do_not_disturb_each_other(judge: CodeJudge, rows: tuple) -> None:
    """A batch runs a few sandboxes at once; a sleeper hits the wall-clock limit (its run is then
    killed by its throwaway uid, as root) while many quick answers start and end meanwhile:
    their verdicts are their own."""
    sleeper = "import time\nwhile True:\n    time.sleep(0.01)"
    answers = [sleeper] + [RIGHT[0], "print(3)"] * 10
    verdicts = judge.judge_all(answers, [rows[0].tests] * len(answers))
    assert (verdicts[0].reward, verdicts[0].reason) == (0.0, "run timeout")
    assert [v.passed for v in verdicts[1:]] == [3, 1] * 10


def _code_plan(tmp_path: Path) -> Any:
    import yaml

    from placer.api import plan as make_plan
    job = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    job["data"] = {"path": str(SHIPPED), "reward": "code", "code": QUICK.model_dump()}
    job["lengths"]["prompt"] = {"kind": "fixed", "value": 80}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return make_plan(str(tmp_path / "job.yaml"))


def _judged_once(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every (answer, tests) this process's code judge runs; the driver's own checks of an
    answer (`CodeData.exact`, the environment's verify run) fail the test."""
    from executors.codetask import CodeJudge
    runs: list[tuple[str, Any]] = []
    judge = CodeJudge.judge

    def counted(self: CodeJudge, answer: str, tests: Any) -> Any:
        runs.append((answer, tests))
        return judge(self, answer, tests)

    def never(*a: Any) -> Any:
        raise AssertionError("the driver ran an answer again")
    monkeypatch.setattr(CodeJudge, "judge", counted)
    monkeypatch.setattr(CodeData, "exact", never)
    monkeypatch.setattr(sbx.Sandbox, "run_batch", never)  # no verify call: the tests are the run
    return runs


def test_a_run_scores_code_answers_and_records_why(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One GRPO step of the whole loop (one process) on the shipped code set: the reward worker
    judges each answer in the sandbox, once (the driver counts exact answers from its verdicts,
    and no separate verify call runs them); the trace's reward event says why each one lost
    reward."""
    from executors.run import execute
    runs = _judged_once(monkeypatch)
    result = execute(_code_plan(tmp_path), 1, tmp_path / "out", local=True)
    assert runs and len(runs) == len({(a, id(t)) for a, t in runs})  # no answer twice
    assert len(result.stats) == 1 and result.ledger_ok, result.ledger_problems
    result.trace.check()  # `reasons` is a key the trace schema names
    [reward] = result.trace.of("reward")
    n = len(reward.args["sample_ids"])
    reasons = reward.args["reasons"]
    # a random-init policy writes no working code: every sample scores 0 and says why
    assert result.stats[0].reward == 0.0 and len(reasons) == n
    assert all(why.startswith(("test 0: ", "run ")) for why in reasons.values())
    assert len(runs) <= n and result.stats[0].exact == 0.0
    assert not [e for e in result.trace.of("tool") if e.args.get("call") == "verify"]


@pytest.mark.slow  # the local runtime's test covers the rule; this one the Ray path
@pytest.mark.ray
def test_under_ray_the_driver_never_runs_an_answer(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On Ray the reward worker (its own process) judges; the driver (this process) counts the
    step's exact answers from the verdicts that came back with the rewards."""
    from executors.run import execute
    runs = _judged_once(monkeypatch)
    result = execute(_code_plan(tmp_path), 1, tmp_path / "out")
    assert not runs and len(result.stats) == 1 and result.ledger_ok
    [reward] = result.trace.of("reward")
    assert len(reward.args["reasons"]) == len(reward.args["sample_ids"])
