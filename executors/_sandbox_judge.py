"""Unit tests graded outside the graded process: the solution's server and the harness that calls it.

Inside one sandbox (`_sandbox_runner.run_tests`) two processes share the work:
  the solution's process  forked from PID 1 before the tests reach the sandbox, it reads its code
                          from stdin itself and serves requests on a pipe (`serve`): run the code
                          as a fresh `__main__` on a test's stdin, call a function, read a name or
                          an attribute, hand over what it printed;
  the harness (PID 1)     reads the tests after that fork, and runs them (`judge`): each test's
                          code, its function call, then its assert statement, evaluated here with
                          every name the solution defines bound to a proxy that calls it over the
                          pipe (`Remote`).
Values cross the pipe as tagged JSON (`encode`, `decode`): None, booleans, numbers, text, bytes,
lists, tuples, sets, dicts and complex numbers arrive in the harness as the plain built-in types,
so no object of the solution's (an `__eq__` that always says yes, a patched `json`) is ever
evaluated here; anything else stays in the solution's process behind a reference (`Ref`), which
can be called and have attributes read but compares by identity only. The assert statements, the
test inputs' expected results and the per-request nonces are never in the solution's process:
frame inspection, monkeypatching or forged output there can change only the values the solution
returns, never how they are judged. A nonce (drawn after the fork) on each request keeps replies
matched to requests, whatever else the solution writes on its pipe.

This file imports only the standard library and must stay that way: PID 1 executes its source,
which `executors.sandbox` sends with the run's configuration.
"""
from __future__ import annotations

import builtins
import hashlib
import io
import json
import math
import os
import select
import sys
import time
from collections.abc import Callable
from typing import Any

REPLY_MAX = 4 * 2**20  # bytes of one reply from the solution's process
MAX_DEPTH = 64  # nesting of one value that crosses the pipe
INT_BITS = 63  # larger integers cross as hex text (JSON readers cap the digits of a number)
ERROR_CHARS = 200


def describe(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - an exception whose str() fails still has a type
        text = "<unprintable>"
    return f"{type(e).__name__}: {text}"[:ERROR_CHARS]


# ------------------------------------------------------------------------------- values

_PLAIN_BASES = (tuple, list, dict, set, frozenset, str, bytes, int, float)
COLLECTION_TAGS: dict[type, str] = {tuple: "$t", set: "$s", frozenset: "$fs"}


def encode(v: Any, other: Callable[[Any], Any], depth: int = 0) -> Any:
    """A value as tagged JSON; `other` gives what a value of no plain type becomes."""
    t = type(v)
    if depth > MAX_DEPTH:
        return other(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return v if v.bit_length() <= INT_BITS else {"$i": hex(v)}
    if t is float:
        return v if math.isfinite(v) else {"$f": repr(v)}
    d = depth + 1
    if t is list:
        return [encode(x, other, d) for x in v]
    if t in COLLECTION_TAGS:
        return {COLLECTION_TAGS[t]: [encode(x, other, d) for x in v]}
    if t is dict:
        return {"$d": [[encode(k, other, d), encode(x, other, d)] for k, x in v.items()]}
    if t in (bytes, bytearray):
        return {"$b" if t is bytes else "$ba": v.hex()}
    if t is complex:
        return {"$c": [encode(v.real, other, d), encode(v.imag, other, d)]}
    for base in _PLAIN_BASES:  # a subclass (a namedtuple, an IntEnum) crosses as its base
        if isinstance(v, base):
            make: Any = base
            try:
                return encode(make(v), other, depth)
            except Exception:  # noqa: BLE001 - a subclass that cannot become its base
                break
    return other(v)


def decode(obj: Any, ref: Callable[[dict], Any], depth: int = 0) -> Any:
    """A value from tagged JSON, as plain built-in types only (`ref` makes a `$r` reference)."""
    if depth > MAX_DEPTH:
        raise ValueError("a value nested too deeply")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    d = depth + 1
    if isinstance(obj, list):
        return [decode(x, ref, d) for x in obj]
    if not isinstance(obj, dict) or len(obj) < 1:
        raise ValueError("not a value")
    if "$r" in obj:
        return ref(obj)
    if len(obj) != 1:
        raise ValueError("not a value")
    (tag, body), = obj.items()
    if tag in ("$t", "$s", "$fs") and isinstance(body, list):
        kind = {"$t": tuple, "$s": set, "$fs": frozenset}[tag]
        return kind(decode(x, ref, d) for x in body)
    if tag == "$d" and isinstance(body, list):
        return {decode(k, ref, d): decode(x, ref, d) for k, x in body}
    if tag == "$i" and isinstance(body, str) and len(body) < 100_000:
        return int(body, 16)
    if tag == "$f" and body in ("inf", "-inf", "nan"):
        return float(body)
    if tag in ("$b", "$ba") and isinstance(body, str):
        return (bytes if tag == "$b" else bytearray).fromhex(body)
    if tag == "$c" and isinstance(body, list) and len(body) == 2:
        re_, im = (decode(x, ref, d) for x in body)
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (re_, im)):
            return complex(re_, im)
    raise ValueError("not a value")


def _plain(v: Any) -> Any:
    """A function test's return value as JSON data (what the host compares with the expected)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)


def _send(fd: int, msg: dict, deadline: float | None = None) -> None:
    view = memoryview(json.dumps(msg).encode() + b"\n")
    while view:
        if deadline is not None:
            left = deadline - _now()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise Timeout()
        view = view[os.write(fd, view):]


def _now() -> float:
    return time.monotonic()


# ------------------------------------------------------------------------------- the solution

class Solution:
    """The solution's side: its code run as `__main__` once per test, then called on request."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.g: dict[str, Any] = {}
        self.refs: list[Any] = []
        self.out = io.StringIO()
        self.stdin = io.StringIO()

    def _run(self, fn: Callable[[], Any]) -> Any:
        saved = sys.stdin, sys.stdout
        sys.stdin, sys.stdout = self.stdin, self.out
        try:
            return fn()
        finally:
            sys.stdin, sys.stdout = saved

    def _ref(self, v: Any) -> dict:
        self.refs.append(v)
        return {"$r": len(self.refs) - 1, "c": callable(v)}

    def _arg(self, obj: dict) -> Any:
        k = obj.get("$r")
        if not isinstance(k, int) or not 0 <= k < len(self.refs):
            raise ValueError("no such reference")
        return self.refs[k]

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        if op == "load":
            self.g, self.refs = {"__name__": "__main__"}, []
            self.out, self.stdin = io.StringIO(), io.StringIO(str(req.get("stdin", "")))
            try:
                self._run(lambda: exec(compile(self.code, "<solution>", "exec"), self.g))
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
            return {}
        if op == "fn":
            fn = self.g.get(str(req.get("name")))
            if not callable(fn):
                raise NameError(f"no function {req.get('name')}")
            args = req.get("args")
            if not isinstance(args, list):
                raise TypeError("arguments must be a list")
            listed: list[Any] = args
            ret = self._run(lambda: fn(*listed))
            return {"ret": json.dumps(_plain(ret))}
        if op == "get":
            name = str(req.get("name"))
            if name not in self.g or name.startswith("__"):
                raise NameError(name)
            return {"v": encode(self.g[name], self._ref)}
        if op == "call":
            target = self._arg(req)
            args = decode(req.get("args", []), self._arg)
            kwargs = decode(req.get("kwargs", {"$d": []}), self._arg)
            return {"v": encode(self._run(lambda: target(*args, **kwargs)), self._ref)}
        if op == "attr":
            value = self._run(lambda: getattr(self._arg(req), str(req.get("name"))))
            return {"v": encode(value, self._ref)}
        if op == "out":
            text = self.out.getvalue()
            if len(text) <= int(req.get("max", 0)):
                return {"stdout": text}
            return {"sha": hashlib.sha256(" ".join(text.split()).encode()).hexdigest()}
        raise ValueError(f"unknown request {op!r}")


def serve(code: str, req_fd: int, rep_fd: int) -> None:
    """The solution's process: answer requests until the harness closes its end."""
    reader = Lines(req_fd)
    sol = Solution(code)
    while True:
        line = reader.line(None)
        if line is None:
            return
        req: Any = None
        try:
            req = json.loads(line)
            rep = sol.handle(req)
        except BaseException as e:  # noqa: BLE001 - whatever the solution raises is its reply
            rep = {"error": describe(e)}
        nonce = req.get("n") if isinstance(req, dict) else None
        try:
            _send(rep_fd, {"n": nonce, **rep})
        except (TypeError, ValueError) as e:  # a value JSON cannot carry
            _send(rep_fd, {"n": nonce, "error": describe(e)})


# ------------------------------------------------------------------------------- the harness

class Remote(Exception):
    """What the solution raised (its text), raised again where the harness called it: as the
    same built-in exception class when it is one, so that a test's `except ValueError` works."""

    text = ""


def remote_error(text: str) -> Remote:
    name, _, message = text.partition(": ")
    base = getattr(builtins, name, None)
    err: Remote = Remote(text)
    if isinstance(base, type) and issubclass(base, Exception):
        try:  # a class of the harness's own making: nothing of the solution's runs here
            err = type(name, (base, Remote), {})(message)
        except Exception:  # noqa: BLE001 - a built-in whose constructor wants more than a text
            pass
    err.text = text
    return err


class Ended(BaseException):
    """The solution's process is gone (or broke its pipe); nothing more can be asked of it."""


class Timeout(BaseException):
    """The run's wall-clock deadline passed."""


class Lines:
    """Newline-ended lines from a pipe, each at most REPLY_MAX bytes."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, b""

    def line(self, deadline: float | None) -> bytes | None:
        while b"\n" not in self.buf:
            if len(self.buf) > REPLY_MAX:
                raise Ended("a reply longer than the limit")
            if deadline is not None:
                left = deadline - _now()
                if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                    raise Timeout()
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


class Channel:
    """The harness's end of the solution's pipes."""

    def __init__(self, req_fd: int, rep_fd: int, deadline: float) -> None:
        self.req_fd, self.deadline = req_fd, deadline
        self.lines = Lines(rep_fd)
        self.ended = ""

    def ready(self) -> bool:
        """Whether the solution's process took its code (its first byte, before any code ran)."""
        left = self.deadline - _now()
        if left <= 0 or not select.select([self.lines.fd], [], [], left)[0]:
            return False
        first = os.read(self.lines.fd, 1)
        if first != b"R":
            self.ended = "the solution's process did not start"
        return True

    def call(self, req: dict) -> dict:
        if self.ended:
            raise Ended(self.ended)
        nonce = os.urandom(8).hex()
        try:
            _send(self.req_fd, {**req, "n": nonce}, self.deadline)
            while True:
                line = self.lines.line(self.deadline)
                if line is None:
                    raise Ended("the solution's process ended")
                try:
                    rep = json.loads(line)
                except ValueError:
                    continue  # not a reply of the server's (the solution may write here)
                if isinstance(rep, dict) and rep.get("n") == nonce:
                    break
        except (BrokenPipeError, Ended) as e:
            self.ended = str(e) or "the solution's process ended"
            raise Ended(self.ended) from None
        if "error" in rep:
            raise remote_error(str(rep["error"])[:ERROR_CHARS])
        return rep

    def value(self, rep: dict) -> Any:
        return decode(rep.get("v"), lambda obj: Ref(self, obj))


class Ref:
    """An object that stays in the solution's process: callable and readable there, equal only
    to itself here."""

    __slots__ = ("_chan", "_ref")

    def __init__(self, chan: Channel, obj: dict) -> None:
        self._chan, self._ref = chan, obj["$r"]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pack = lambda v: encode(v, _as_ref)  # noqa: E731
        return self._chan.value(self._chan.call({"op": "call", "$r": self._ref,
                                                 "args": pack(list(args)), "kwargs": pack(kwargs)}))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._chan.value(self._chan.call({"op": "attr", "$r": self._ref, "name": name}))

    def __repr__(self) -> str:
        return f"<the solution's object #{self._ref}>"


def _as_ref(v: Any) -> dict:
    if isinstance(v, Ref):
        return {"$r": object.__getattribute__(v, "_ref")}
    raise TypeError(f"cannot pass a {type(v).__name__} to the solution")


def _names(code: Any) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def check(src: str, chan: Channel) -> None:
    """Run one assert statement (any test code) here, with the solution's names as proxies."""
    code = compile(src, "<test>", "exec")
    env: dict[str, Any] = {"__builtins__": builtins, "__name__": "__test__"}
    # a builtin name is never the solution's: a `len` of its own would judge its own results
    for name in sorted(_names(code) - set(dir(builtins))):
        try:
            env[name] = chan.value(chan.call({"op": "get", "name": name}))
        except Remote:
            pass  # not the solution's: a module, an attribute, the test's own name
    exec(code, env)


def judge(tests: dict, chan: Channel, emit: Callable[[dict], None]) -> bool:
    """Run every test, emitting one frame each: whether it ran through (`ok`), its return value
    (`ret`, function tests), its output (`stdout`, or `sha` of a long one) or its `error`.
    False when the run's deadline passed (the rest are not run)."""
    fn, inputs, asserts = tests.get("fn"), tests["inputs"], tests.get("asserts")
    for i in range(len(inputs)):
        frame: dict[str, Any] = {"test": i}
        try:
            try:
                chan.call({"op": "load", "stdin": "" if fn else inputs[i]})
                if fn:
                    frame["ret"] = str(chan.call({"op": "fn", "name": fn, "args": inputs[i]})["ret"])
                if asserts:
                    check(asserts[i], chan)
                frame["ok"] = True
            except Remote as e:
                frame["error"] = e.text
            except Ended as e:
                frame["error"] = str(e)[:ERROR_CHARS]
            except Exception as e:  # noqa: BLE001 - the test failed here (an AssertionError)
                frame["error"] = describe(e)
            if not chan.ended:
                try:
                    out = chan.call({"op": "out", "max": tests["max_stdout"]})
                except (Ended, Remote):
                    out = {}
                # only the output: whether the test passed is never the solution's to say
                frame.update({k: out[k] for k in ("stdout", "sha") if isinstance(out.get(k), str)})
        except Timeout:
            return False
        emit({k: frame[k] for k in ("test", "ok", "ret", "stdout", "sha", "error") if k in frame})
    return True
