"""Answers of one batch cannot touch each other: what one answer does ends as its own result, and
every other answer's result is unchanged.

A batch (`Sandbox.run_batch`) is the path every tool call and verify takes through an environment
worker. Each answer here is an expression evaluated without builtins that reaches `exec` anyway
(`_answer`), so it can run any code: leave an undeletable directory behind, lower the limits of
the sandbox's PID 1 (which every later answer would inherit), renice or pin PID 1, read PID 1's
memory after the fork (the other answers' text, the previous answer's result). Every case runs on
each backend the machine has; `test_sandbox_unprivileged.py` runs this file again as an
unprivileged user.
"""
from __future__ import annotations

import shutil
from typing import Any

import pytest

from executors import sandbox as sbx
from executors.roles import EnvWorker, RunConfig
from executors.sandbox import Limits, Result, Sandbox
from executors.task import Arithmetic

BACKENDS = ["bwrap", "unshare"] if shutil.which("bwrap") else ["unshare"]
LIMITS = Limits(wall_s=3.0, cpu_s=1, memory_bytes=256 * 2**20, file_bytes=4 * 2**20,
                disk_bytes=8 * 2**20, files=256, processes=16, output_bytes=256 * 2**10,
                per_item_s=1.0)
GET_OS = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
          ".__init__.__globals__")
# Writes 1,000 bytes to a new file; its value is the count written (a lowered FSIZE shows here).
WRITER = f"{GET_OS}['write']({GET_OS}['open']('f', 65), b'x' * 1000)"
REFUSED = "PermissionError: [Errno 1] Operation not permitted"


def _answer(code: str) -> str:
    """An answer (an expression evaluated without builtins) that runs arbitrary code anyway."""
    return f"(lambda b: b['exec']({code!r}, {{'__builtins__': b}}))({GET_OS}['__builtins__'])"


# name: (code, the attack's own status and error fragment)
ATTACKS = {
    "mkdir": ("import os\nos.mkdir('d')", ("ok", "")),
    "unwritable tree": ("import os\nos.makedirs('d/e/f')\nopen('d/e/f/x', 'w').write('x')\n"
                        "os.chmod('d/e', 0)\nos.chmod('d', 0o500)\nos.chmod('.', 0)", ("ok", "")),
    "prlimit NPROC=0 on PID 1": ("import resource\n"
                                 "resource.prlimit(1, resource.RLIMIT_NPROC, (0, 0))",
                                 ("error", REFUSED)),
    "prlimit NOFILE=3 on PID 1": ("import resource\n"
                                  "resource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3))",
                                  ("error", REFUSED)),
    "prlimit FSIZE=0 on PID 1": ("import resource\n"
                                 "resource.prlimit(1, resource.RLIMIT_FSIZE, (0, 0))",
                                 ("error", REFUSED)),
    "leave marks on /work itself": ("import os\nos.setxattr('.', 'user.mark', b'12')\n"
                                    "os.utime('.', (12, 12))\nos.chmod('.', 0o1777)", ("ok", "")),
    "renice PID 1": ("import os\nos.setpriority(os.PRIO_PROCESS, 1, 19)", ("error", REFUSED)),
    "renice the whole uid": ("import os\nos.setpriority(os.PRIO_USER, 0, 19)", ("error", REFUSED)),
    "pin PID 1 to one CPU": ("import os\nos.sched_setaffinity(1, {0})", ("error", REFUSED)),
}


@pytest.fixture(scope="module", params=BACKENDS)
def sb(request: pytest.FixtureRequest) -> Sandbox:
    return Sandbox(LIMITS, backend=request.param)


def _short(v: dict) -> tuple[str, str]:
    return v["status"], str(v.get("value", v.get("error", "")))


def test_an_answer_cannot_sabotage_the_later_ones(sb: Sandbox) -> None:
    """Each attack, then good answers and a file writer: the attack is refused (or harmless),
    and every later answer's result is exact."""
    exprs, want = ["1+2"], [("ok", "3")]
    for k, (code, own) in enumerate(ATTACKS.values()):
        exprs += [_answer(code), f"{k}*7", WRITER]
        want += [own, ("ok", str(k * 7)), ("ok", "1000")]
    r = sb.run_batch(exprs)
    assert r.ok and r.values is not None, r
    got = [_short(v) for v in r.values]
    for name, g, w in zip(["first", *[n for n in ATTACKS for _ in range(3)]], got, want):
        assert g[0] == w[0] and w[1] in g[1], (name, g, w)


def test_through_the_environment_worker_correct_answers_keep_their_reward() -> None:
    """One earlier answer lowers PID 1's process limit; the four correct answers after it are
    still run and score 1.0 (it used to drop them to 0.2 each, raising the saboteur's relative
    advantage in its GRPO group)."""
    cfg = RunConfig(algorithm="grpo", arch={}, model_dir="", seed=0, max_new_tokens=4)
    w = EnvWorker(cfg, 0, LIMITS)
    saboteur = _answer(ATTACKS["prlimit NPROC=0 on PID 1"][0])
    answers, targets = [saboteur, "1+2", "3+4", "2+2", "5+4"], [0, 3, 7, 4, 9]
    values, _ = w.execute([f"s{i}" for i in range(5)], answers)
    rewards = [Arithmetic().score(a, v, t) for a, v, t in zip(answers, values, targets)]
    assert rewards[1:] == [1.0] * 4, values
    assert values[0]["status"] == "error" and REFUSED in values[0]["error"], values[0]


SPY = _answer("""
import gc, sys
marks = (''.join(['SEC', 'RET_AAA']), ''.join(['SEC', 'RET_C']))  # built at run time only
hits = []
def look(o):
    if any(o is m for m in marks):
        return
    if isinstance(o, str) and any(m in o for m in marks):
        hits.append(o[:40])
    elif isinstance(o, (bytes, bytearray)) and any(m.encode() in o for m in marks):
        hits.append(bytes(o[:40]))
for o in gc.get_objects():
    if o is not hits:
        for v in (o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()):
            look(v)
f = sys._getframe()
while f is not None:
    for v in list(f.f_locals.values()) + list(f.f_globals.values()):
        look(v)
    f = f.f_back
raise LookupError(f'found {len(hits)}: {hits[:3]}')
""")


def test_an_answer_cannot_read_the_others(sb: Sandbox) -> None:
    """After its fork an answer searches every object and frame it can reach for the marker
    that the answer before it (text and result) and the one after it (text) carry: none is in
    its address space, because PID 1 never held them."""
    r = sb.run_batch(["'SECRET_' + 'AAA'", SPY, "'SECRET_C'"])
    assert r.values is not None and [v["status"] for v in r.values] == ["ok", "error", "ok"], r
    assert r.values[0]["value"] == "'SECRET_AAA'"
    assert r.values[1]["error"] == "LookupError: found 0: []", r.values[1]


def test_nothing_of_an_answer_is_left_in_work(sb: Sandbox) -> None:
    """Files, directories, extended attributes, times and mode of /work: the next answer finds
    /work as the first one did."""
    look = _answer("import os\nst = os.stat('.')\nraise LookupError(repr((os.listdir('.'), "
                   "os.listxattr('.'), st.st_mtime, oct(st.st_mode))))")
    marks = ("import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('12')\n"
             "os.setxattr('.', 'user.mark', b'12')\nos.utime('.', (12, 12))\nos.chmod('.', 0o1777)")
    r = sb.run_batch([look, _answer(marks), look])
    assert r.values is not None and r.values[1]["status"] == "ok", r.values
    first, second = r.values[0]["error"], r.values[2]["error"]
    assert first == second and "[], []" in first, (first, second)


def test_an_answer_that_breaks_its_sandbox_gets_its_own_result(sb: Sandbox) -> None:
    """An answer leaves /work nested deeper than the sweep between answers can empty: PID 1 says
    so and stops, and the answers after it run in a fresh sandbox (an empty /work)."""
    deep = _answer("import os\nfor _ in range(1500):\n    os.mkdir('a')\n    os.chdir('a')")
    lister = f"{GET_OS}['listdir']('.')"
    lim = Limits(wall_s=5.0, cpu_s=2, files=2048, processes=16, per_item_s=2.0)
    r = Sandbox(lim, backend=sb.backend).run_batch(["1+2", deep, lister, "3*4"])
    assert r.ok and r.values is not None, r
    assert [_short(v) for v in r.values] == [("ok", "3"), ("ok", "None"), ("ok", "[]"),
                                             ("ok", "12")]


def test_a_sandbox_that_dies_during_an_answer_costs_that_answer_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's bookkeeping when a batch's sandbox ends mid-answer (e.g. its PID 1 chosen by
    the OOM killer): that answer gets the failure, the rest run in a new sandbox. The launches
    are simulated here (a regression guard of `run_batch` itself)."""
    calls: list[list[str]] = []

    def launch(self: Sandbox, mode: str, payload: list[str], wall_s: float,
               items: int = 0) -> tuple[Result, list[dict]]:
        calls.append(list(payload))
        if len(calls) == 1:  # answers 0 and 1 ran; the sandbox died during answer 2
            frames: list[dict[str, Any]] = [
                {"start": 0}, {"item": 0, "raw": 1, "payload": b'{"status": "ok", "value": "a"}'},
                {"start": 1}, {"item": 1, "raw": 1, "payload": b'{"status": "ok", "value": "b"}'},
                {"start": 2}]
            return Result("memory_limit", None, "", "", 0.1), frames
        frames = [f for k, e in enumerate(payload) for f in (
            {"start": k}, {"item": k, "raw": 1, "payload": b'{"status": "ok", "value": "%s"}'
                           % e.encode()})]
        return Result("ok", 0, "", "", 0.1), frames + [{"exit": 0}]

    monkeypatch.setattr(sbx.Sandbox, "_launch", launch)
    r = Sandbox(LIMITS).run_batch(["x0", "x1", "x2", "x3", "x4"])
    assert calls == [["x0", "x1", "x2", "x3", "x4"], ["x3", "x4"]]
    assert r.ok and r.values is not None
    assert [_short(v) for v in r.values] == [
        ("ok", "a"), ("ok", "b"),
        ("memory_limit", "the sandbox ended during this answer (memory_limit)"),
        ("ok", "x3"), ("ok", "x4")]
