"""Run untrusted generated code (answers, tool calls, unit tests) isolated by the kernel.

Every run starts a sandbox: new user, mount, PID, network, IPC and UTS namespaces, made by
`bwrap` (bubblewrap) when it is installed, else by `unshare` (util-linux) with the runner doing
the mounts itself (`_sandbox_setup.py`). Inside, the program sees a read-only root holding only
the interpreter's prefix, the system libraries it loads, /dev/null, /dev/zero and /dev/urandom,
and a private tmpfs at /work (its working directory, capped in bytes and in files, the only
writable place); no /proc, no host /tmp or /dev/shm, no sockets of the host, no network but a
down loopback, an empty environment. The runner is PID 1: it drops every capability, sets
no_new_privs and rlimits (CPU seconds, address space, file size, processes, no core files),
installs a seccomp filter (`executors.seccomp`) and only then forks the untrusted code. When we
are root, the sandbox runs under a throwaway host uid, so that the process limit binds.
A cgroup around each sandbox (`executors.cgroups`) caps its memory (anonymous, memfd, shm and
tmpfs pages of every process together) and its processes; where none can be had, that is said
once and seccomp refuses `memfd_create` on top of the rlimits.

`run` executes one program; `run_tests` runs unit tests on a solution, graded by a process the
solution cannot reach (`_sandbox_judge.py`); `run_batch` evaluates many short expressions in one
sandbox, each in its own forked child, one at a time, that never holds another answer's text or
result; between answers PID 1 kills every other process of the namespace and empties /work.
An answer that breaks its batch's sandbox gets that as its own result, and the answers after it
run in a fresh sandbox. Output is read as it comes and cut at `Limits.output_bytes` (the run is
then killed); the wall-clock limit kills the namespace's PID 1, which ends every process in it.
Text leaving the sandbox is cleaned (`clean_text`): whatever an answer prints, the driver can
encode it.

A run's `status` says how it ended: ok, error, timeout, cpu_limit, memory_limit, file_limit,
disk_limit, process_limit, output_limit, network_blocked, access_denied, crashed.
When no isolation can be set up, `SandboxUnavailable` is raised, unless the caller opts out with
`allow_weak=True` or `PLACER_UNSAFE_SANDBOX=1` (rlimits, seccomp and the cgroup only; loudly
reported on stderr).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from executors import cgroups
from executors.sandbox_launch import (
    DEVICES,
    RUNNER,
    UID_SLOTS,
    Collected,
    boot,
    bwrap_argv,
    collect,
    filter_hex,
    judge_code,
    kill_uid,
    message,
    native,
    staged,
    uid_slots,
    unshare_argv,
    view,
)

UNSAFE_ENV = "PLACER_UNSAFE_SANDBOX"
BACKENDS = ("auto", "bwrap", "unshare")
CGROUPS = ("auto", "none")
LAUNCHERS = 4  # processes of a sandbox besides the answers' (launcher, PID 1, a sweeper)


class SandboxUnavailable(RuntimeError):
    """The kernel isolation cannot be set up here; generated code is refused."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 2
    # each process's address space, and the whole sandbox's memory (its cgroup, where one is had)
    memory_bytes: int = 512 * 2**20
    file_bytes: int = 16 * 2**20     # one file
    disk_bytes: int = 32 * 2**20     # all files together (the size of the tmpfs)
    files: int = 4096                # inodes of the tmpfs
    processes: int = 32
    output_bytes: int = 1 * 2**20    # stdout and stderr together; more ends the run
    per_item_s: float = 1.0          # batch mode: each expression's own timeout
    keep_bytes: int = 4096           # characters of stdout (and of stderr) kept in the Result: the tail


@dataclass
class Result:
    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    protections: list[str] = field(default_factory=list)
    values: list[dict] | None = None  # batch: one result per expression; tests: one per test
    backend: str = ""
    memory_peak_bytes: int | None = None  # the most the sandbox held at once (its cgroup)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# (stderr fragment, status): the first match names how a run that raised ended.
_ERRORS = (("MemoryError", "memory_limit"), ("File too large", "file_limit"),
           ("No space left on device", "disk_limit"), ("Disk quota exceeded", "disk_limit"),
           ("Resource temporarily unavailable", "process_limit"),
           ("BlockingIOError", "process_limit"), ("can't start new thread", "process_limit"),
           ("sandbox: socket", "network_blocked"),
           ("Network is unreachable", "network_blocked"),
           ("PermissionError", "access_denied"), ("Read-only file system", "access_denied"))
_CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE,
                  signal.SIGSYS)
# Lone surrogates, and control characters but tab, newline and carriage return (C0, DEL, C1).
_UNSAFE = re.compile("[\ud800-\udfff\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def clean_text(text: str) -> str:
    """Text any tokenizer can encode: a lone surrogate becomes U+FFFD, another control character
    (not tab or a line end) its `\\xNN` escape."""
    def fix(m: re.Match[str]) -> str:
        c = m.group()
        return "\ufffd" if "\ud800" <= c <= "\udfff" else f"\\x{ord(c):02x}"
    return _UNSAFE.sub(fix, text)


class Sandbox:
    """Runs code under `limits`. Instances are cheap; each run is a fresh sandbox.
    `cgroup="none"` runs without the whole-sandbox cap (rlimits, memfd refused)."""

    def __init__(self, limits: Limits | None = None, python: str | None = None,
                 backend: str = "auto", allow_weak: bool | None = None,
                 cgroup: str = "auto") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"sandbox backend must be one of {BACKENDS} (got {backend!r})")
        if cgroup not in CGROUPS:
            raise ValueError(f"sandbox cgroup must be one of {CGROUPS} (got {cgroup!r})")
        self.limits = limits or Limits()
        self.python = os.path.realpath(python or sys.executable)
        self.backend = backend
        self.allow_weak = (os.environ.get(UNSAFE_ENV, "") in ("1", "true", "yes")
                           if allow_weak is None else allow_weak)
        self.caps = cgroups.support() if cgroup == "auto" else cgroups.NONE
        self._weak_reason: str | None = None  # set once isolation failed and weak was allowed

    def run(self, code: str) -> Result:
        return self._launch("exec", [code], self.limits.wall_s)[0]

    def run_tests(self, code: str, tests: dict[str, Any]) -> Result:
        """`tests` (fn, inputs, asserts, max_stdout: `_sandbox_judge.judge`) on `code`; `values`
        holds one frame per test that ran, in order."""
        res, frames = self._launch("tests", [code, json.dumps(tests)], self.limits.wall_s)
        res.values = [_test_frame(f) for f in frames if isinstance(f.get("test"), int)]
        return res

    def run_batch(self, exprs: list[str]) -> Result:
        """Each expression's value (`values`, in order), each in a process of its own. When an
        answer ends the sandbox itself, that is its result and the rest run in a fresh one."""
        values: list[dict | None] = [None] * len(exprs)
        first: Result | None = None
        at, wall, complete = 0, 0.0, True
        while at < len(exprs):
            todo = exprs[at:]
            res, frames = self._launch("batch", todo, self.limits.wall_s
                                       + self.limits.per_item_s * len(todo), len(todo))
            first, wall = first or res, wall + res.wall_s
            started = {f["start"] for f in frames if isinstance(f.get("start"), int)}
            for f in frames:
                k = f.get("item")
                if isinstance(k, int) and 0 <= k < len(todo):
                    values[at + k] = _item_value(f, self.caps.capped)
            k = next((k for k in range(len(todo)) if values[at + k] is None), None)
            if k is None:
                break
            if k in started:  # the sandbox ended during this answer: its own result
                status = res.status if res.status in ("timeout", "memory_limit") else "error"
                values[at + k] = {"status": status, "error": "the sandbox ended during this "
                                                             f"answer ({res.status})"}
                at += k + 1
            elif k > 0:  # PID 1 stopped before it (it could not keep answers apart): a new one
                at += k
            else:
                complete = False
                for i in range(at, len(exprs)):
                    values[i] = {"status": "timeout" if res.status == "timeout" else "error",
                                 "error": f"no result (sandbox {res.status})"}
                break
        out = first or Result("ok", 0, "", "", 0.0)
        out.values = [v or {"status": "error", "error": "no result"} for v in values]
        out.wall_s = wall
        out.status = "ok" if complete else out.status
        return out

    # -------------------------------------------------------------------------- launching

    def _backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "bwrap" if shutil.which("bwrap") else "unshare"

    def _launch(self, mode: str, payload: list[str], wall_s: float,
                items: int = 0) -> tuple[Result, list[dict]]:
        if self._weak_reason is None:
            res = self._start(mode, payload, wall_s, self._backend(), items)
            if not isinstance(res, str):
                return res
            if not self.allow_weak:
                raise SandboxUnavailable(
                    f"sandbox: kernel isolation unavailable ({res}); install bubblewrap or allow "
                    f"unprivileged user namespaces, or opt out with {UNSAFE_ENV}=1 (unsafe)")
            self._weak_reason = res
            print(f"WARNING: sandbox: kernel isolation unavailable ({res}); running generated "
                  "code WITHOUT namespaces (unsafe opt-out)", file=sys.stderr, flush=True)
        res = self._start(mode, payload, wall_s, "weak", items)
        if isinstance(res, str):
            raise SandboxUnavailable(f"sandbox: cannot start even without isolation ({res})")
        return res

    def _start(self, mode: str, payload: list[str], wall_s: float, backend: str,
               items: int) -> tuple[Result, list[dict]] | str:
        """One sandboxed run; a string says why the sandbox itself could not be set up. As root
        it runs under a throwaway uid of its own (held until the run and its kills are over)."""
        slots = uid_slots()
        slot = slots.take() if backend != "weak" and os.geteuid() == 0 else None
        if slot is None and backend != "weak" and os.geteuid() == 0:
            raise SandboxUnavailable(f"sandbox: more than {UID_SLOTS} runs at once in one process")
        try:
            uid = None if slot is None else slots.uid(slot)
            return self._start_as(mode, payload, wall_s, backend, uid, items)
        finally:
            if slot is not None:
                slots.give(slot)

    def _config(self, mode: str, backend: str, uid: int | None, items: int) -> dict[str, Any]:
        lim = self.limits
        cfg: dict[str, Any] = {
            "mode": mode, "items": items, "backend": backend,
            "limits": {"wall_s": lim.wall_s, "cpu_s": lim.cpu_s, "memory_bytes": lim.memory_bytes,
                       "file_bytes": lim.file_bytes, "disk_bytes": lim.disk_bytes,
                       "processes": lim.processes, "per_item_s": lim.per_item_s},
            "seccomp": filter_hex(not self.caps.capped), "ipcns": backend != "weak",
            "throwaway_uid": uid is not None,
            "host_markers": [str(RUNNER), "/proc/self", "/tmp", "/etc"],
            "compiled": native(self.python)}
        return cfg

    def _argv(self, cfg: dict[str, Any], backend: str, uid: int | None) -> list[str]:
        v, lim = view(self.python), self.limits
        work = {"bytes": lim.disk_bytes, "inodes": lim.files}
        program = boot(self.python)[0]
        if backend == "bwrap":
            cfg["work_tmpfs"] = work
            argv = bwrap_argv(self.python, v, program)
            # root: bwrap runs as the throwaway uid (a staging step first)
            return argv if uid is None else staged(self.python, v, uid, argv)
        if backend == "unshare":
            cfg["setup"] = {"binds": [(p, p) for p in v["ro"]], "links": v["links"],
                            "devices": list(DEVICES), "uid": uid, "work": work}
            return unshare_argv(self.python, uid is not None, program)
        cfg.update(ipcns=False, host_markers=[])
        return [self.python, "-I", "-S", "-c", program]

    def _start_as(self, mode: str, payload: list[str], wall_s: float, backend: str,
                  uid: int | None, items: int) -> tuple[Result, list[dict]] | str:
        if backend != "weak" and not shutil.which(backend):
            return f"{backend} is not installed"
        lim, cfg = self.limits, self._config(mode, backend, uid, items)
        argv = self._argv(cfg, backend, uid)
        try:
            cg = (cgroups.RunCgroup(self.caps, lim.memory_bytes, lim.processes + LAUNCHERS)
                  if self.caps.capped else None)
        except OSError as e:
            return f"cannot make the sandbox's cgroup: {e}"
        workdir = tempfile.mkdtemp(prefix="placer-sbx-") if backend == "weak" else None
        cfg["workdir"] = workdir
        t0 = time.monotonic()
        try:
            col = self._run(cg.wrap(argv) if cg else argv, cfg, mode, payload, wall_s, workdir,
                            uid)
            if isinstance(col, str):
                return col
            oom, peak = (cg.oom_kills(), cg.peak_bytes()) if cg else (0, None)
            capped = cg.protections() if cg else ["memfd_refused"]
        finally:
            if cg:
                cg.close()
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        protections = next((f["protections"] for f in col.frames if "protections" in f), None)
        if protections is None:
            setup = next((f["setup_error"] for f in col.frames if "setup_error" in f), None)
            if setup or not col.timed_out:
                return setup or (col.err.strip().splitlines() or ["no protections reported"])[-1]
            protections = []
        exit_frame = next((f for f in col.frames if "exit" in f), None)
        rc = exit_frame["exit"] if exit_frame else None
        timed_out = col.timed_out or bool(exit_frame and exit_frame.get("timeout"))
        # the runner kills nothing before its deadline: a SIGKILL under a cgroup is its OOM kill
        status = _classify(rc, col.err, timed_out, col.cut,
                           oom > 0 or (cg is not None and rc == -signal.SIGKILL))
        keep = lim.keep_bytes
        name = backend if backend != "weak" else f"weak ({self._weak_reason})"
        return Result(status, rc, clean_text(col.out[-keep:]), clean_text(col.err[-keep:]),
                      time.monotonic() - t0, protections + capped, None, name, peak), col.frames

    def _run(self, argv: list[str], cfg: dict[str, Any], mode: str, payload: list[str],
             wall_s: float, workdir: str | None, uid: int | None) -> Collected | str:
        """Start the launcher, feed it the runner (compiled), the configuration, the judge (tests
        mode) and the payload, collect what comes back; a string says why it could not start."""
        res_r, res_w = os.pipe()
        cfg["result_fd"] = res_w
        feed = boot(self.python)[1] + message(json.dumps(cfg).encode())
        if mode == "tests":
            feed += message(judge_code(self.python))
        feed += b"".join(message(m.encode("utf-8", "surrogatepass")) for m in payload)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env={}, start_new_session=True,
                                    pass_fds=(res_w,), cwd=workdir)
        except OSError as e:
            os.close(res_r)
            return f"{argv[0]}: {e.strerror}"
        finally:
            os.close(res_w)
        col = collect(proc, res_r, feed, wall_s + 2.0, self.limits.output_bytes)
        if uid is not None and (col.timed_out or col.cut):
            kill_uid(uid)
        return col


# ------------------------------------------------------------------------------ results

def _item_value(f: dict, capped: bool) -> dict:
    """One batch answer's result: what its own process wrote (checked for shape; it can only
    describe itself), or how it ended."""
    if "failed" in f:
        return {"status": "error", "error": clean_text(f"sandbox: {f['failed']}")[:100]}
    data = f.get("payload") or b""
    out: dict[str, Any]
    if data:
        try:
            res = json.loads(data)
        except ValueError:
            res = None
        if isinstance(res, dict) and res.get("status") in ("ok", "error"):
            out = {"status": res["status"], **{k: clean_text(str(res[k]))[:100]
                                               for k in ("value", "error") if k in res}}
        else:
            out = {"status": "error", "error": "malformed result"}
    elif f.get("timeout"):
        out = {"status": "timeout", "error": "per-answer time limit"}
    else:
        sig = f.get("signal") or 0
        if sig == signal.SIGKILL and capped:  # PID 1 sends none before the deadline
            out = {"status": "memory_limit", "error": "killed at the sandbox's memory cap"}
        else:
            out = {"status": "timeout" if sig in (signal.SIGKILL, signal.SIGXCPU) else "error",
                   "error": f"killed by signal {sig}" if sig else "no result"}
    out.update(ts=f.get("ts"), dur=f.get("dur"))
    return out


def _test_frame(f: dict) -> dict:
    """A test's frame as the host reads it: error text cleaned, output text made encodable."""
    out: dict[str, Any] = {"test": f["test"], "ok": f.get("ok") is True}
    for key in ("ret", "stdout", "sha", "error"):
        if key in f:
            text = str(f[key])
            out[key] = clean_text(text) if key == "error" else text.encode(
                "utf-8", "surrogatepass").decode("utf-8", "replace")
    return out


def _classify(rc: int | None, err: str, timed_out: bool, cut: bool, oom: bool) -> str:
    if timed_out:
        return "timeout"
    if cut:
        return "output_limit"
    if rc == 0:
        return "ok"
    if oom:
        return "memory_limit"
    if rc == -signal.SIGXCPU:
        return "cpu_limit"
    if rc == -signal.SIGXFSZ:
        return "file_limit"
    for frag, status in _ERRORS:
        if frag in err:
            return status
    if rc is not None and -rc in _CRASH_SIGNALS:
        return "crashed"
    return "error"


def probe(backend: str = "auto", allow_weak: bool | None = None) -> list[str]:
    """The protections that take effect on this machine (runs one empty program); raises
    `SandboxUnavailable` where isolation cannot be set up and weak runs are not allowed."""
    return Sandbox(Limits(wall_s=10), backend=backend, allow_weak=allow_weak).run("pass").protections

