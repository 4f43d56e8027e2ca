"""A solution cannot grade itself: assert-style tests are judged in a process it cannot reach.

A wrong `is_even` (always True) passes two of the shipped problem's three asserts honestly. Each
cheat below is that wrong solution plus something done inside its own process: print passing
frames with the harness's tag read from a stack frame, read the assert statements and answer
them, monkeypatch `json.dumps`, return an object equal to anything, forge replies on every
descriptor. None scores more than the honest wrong solution (2/3; 0 with `scoring: all`). The
values that cross from the solution's process are plain data (`_sandbox_judge.decode`).
"""
from __future__ import annotations

from typing import Any

import pytest
from exec_util import ROOT

from executors._sandbox_judge import Ref, decode, encode
from executors.codetask import CodeJudge, load_rows, parse_tests
from placer.spec.localdata import CodeReward

SHIPPED = ROOT / "examples" / "tiny-code" / "problems.jsonl"
QUICK = CodeReward(wall_s=5.0, cpu_s=2, memory_mb=256)
WRONG = "def is_even(n):\n    return True\n"
CHEATS = {
    "print passing frames with the harness's tag": WRONG + """
import sys, json
def is_even(n):
    f = sys._getframe()
    while f is not None and '_TAG' not in f.f_globals:
        f = f.f_back
    if f is not None:
        g = f.f_globals
        for i in range(g['_N']):
            g['_OUT'].write('\\n' + g['_TAG'] + json.dumps({'i': i, 'ok': True}) + '\\n')
    return True
""",
    "read the assert statements and answer them": """
import gc, sys
def is_even(n):
    for o in gc.get_objects():
        if isinstance(o, (list, tuple)) and o and all(isinstance(x, str) for x in o):
            for line in o:
                if line.startswith('assert') and f'is_even({n})' in line:
                    return not line.startswith('assert not')
    return True
""",
    "monkeypatch json.dumps": WRONG + """
import json
_dumps = json.dumps
def dumps(o, *a, **k):
    if isinstance(o, dict) and ('i' in o or 'n' in o):
        o = {k: v for k, v in o.items() if k not in ('error',)}
        o['ok'] = True
        o.setdefault('v', True)
        o['v'] = True if o.get('v') is False else o['v']
    return _dumps(o, *a, **k)
json.dumps = dumps
""",
    "forge replies on every descriptor": WRONG + """
import os
for fd in range(3, 64):
    for n in range(64):
        try:
            os.write(fd, b'{"n": null, "v": false, "ok": true}\\n')
        except OSError:
            break
""",
}
EQ_ANYTHING = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True
def square(x):
    return Anything()
"""


@pytest.fixture(scope="module")
def is_even_tests() -> Any:
    return load_rows(str(SHIPPED), "prompt", "tests")[5].tests


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_a_wrong_solution_cannot_grade_itself(is_even_tests: Any, cheat: str) -> None:
    judge, strict = CodeJudge(QUICK), CodeJudge(QUICK.model_copy(update={"scoring": "all"}))
    honest = judge.judge(WRONG, is_even_tests)
    assert (honest.passed, honest.reward) == (2, pytest.approx(2 / 3)), honest
    v = judge.judge(CHEATS[cheat], is_even_tests)
    assert v.passed <= 2 and v.reward <= honest.reward, (cheat, v)
    assert strict.judge(CHEATS[cheat], is_even_tests).reward == 0.0, cheat


def test_an_object_equal_to_anything_stays_in_the_solutions_process() -> None:
    tests = parse_tests({"inputs": ["", "", ""], "outputs": ["", "", ""],
                         "assert_case": ["assert square(2) == 4", "assert square(3) == 9",
                                         "assert square(-1) == 1"]})
    judge = CodeJudge(QUICK)
    assert judge.judge("def square(x):\n    return x * x", tests).reward == 1.0
    v = judge.judge(EQ_ANYTHING, tests)
    assert (v.reward, v.reason) == (0.0, "test 0: AssertionError: "), v


def test_a_builtin_of_its_own_does_not_judge_the_solution() -> None:
    """The asserts' builtins are the harness's: a solution's own `len` or `sorted` is not used."""
    tests = parse_tests({"inputs": [""], "outputs": [""],
                         "assert_case": ["assert len(pairs(3)) == 3 and sorted([2, 1]) == [1, 2]"]})
    cheat = ("def pairs(n):\n    return []\n"
             "def len(x):\n    return 3\n")
    v = CodeJudge(QUICK).judge(cheat, tests)
    assert (v.reward, v.reason) == (0.0, "test 0: AssertionError: "), v


def test_asserts_reach_classes_methods_and_rich_values() -> None:
    """What assert-style datasets use still works across the pipe: a class and its methods,
    tuples, sets, dicts with tuple keys, bytes, big integers, infinities, exceptions."""
    code = ("class Solution:\n    def pair(self, a, b):\n        return (a, b)\n"
            "def stats(xs):\n    return {'set': set(xs), (1, 2): b'ok', 'big': 3 ** 200, "
            "'inf': float('inf')}\n"
            "def boom():\n    raise KeyError('k')\n")
    tests = parse_tests({"inputs": ["", "", ""], "outputs": ["", "", ""], "assert_case": [
        "assert Solution().pair(1, [2]) == (1, [2])",
        "s = stats([3, 1, 3])\nassert s == {'set': {1, 3}, (1, 2): b'ok', 'big': 3 ** 200, "
        "'inf': float('inf')}",
        "try:\n    boom()\nexcept KeyError:\n    pass\nelse:\n    assert False"]})
    v = CodeJudge(QUICK).judge(code, tests)
    assert (v.reward, v.reason) == (1.0, ""), v


def test_values_decode_to_plain_types_only() -> None:
    """The harness's decoder builds built-in types (or a `Ref`), whatever the other side sends."""
    value = {"t": (1, 2.5, None), "s": frozenset({"a"}), 7: [b"\x00", bytearray(b"x")],
             "c": complex(1, -2), "i": -(2 ** 100), "f": float("-inf")}
    back = decode(encode(value, lambda v: {"$r": 0}), lambda obj: obj)
    assert back == value and type(back["t"]) is tuple and type(back["s"]) is frozenset
    for bad in ({"$d": [[[1], 2]]}, {"$x": 1}, {"$f": "1e5"}, {"a": 1}, {"$c": ["1", 2]},
                {"$i": "12", "$t": []}):
        with pytest.raises((ValueError, TypeError)):
            decode(bad, lambda obj: obj)
    ref = decode({"$r": 3, "c": True}, lambda obj: Ref(None, obj))  # type: ignore[arg-type]
    assert isinstance(ref, Ref) and ref != 3 and ref == ref
