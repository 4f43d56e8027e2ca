"""Run untrusted generated code in a separate, locked-down process.

Every run starts a fresh interpreter (`python -I -S`, no site, no environment variables honoured)
in its own session and process group, in an empty temporary working directory that is removed
afterwards. `_sandbox_runner.py` locks the child down before the untrusted code runs (network
namespace, rlimits for CPU seconds, address space, file size and process count, a throwaway uid
when we are root, an audit hook against sockets, spawning, ctypes and file access outside the
directory) and reports which protections took effect. The parent enforces the wall-clock timeout
and always kills the whole process group, then every process left under the throwaway uid (a
forked child that called setsid has left the group but not the uid).

`run` executes a program; `run_batch` evaluates many short expressions in one sandboxed
interpreter, each in its own forked child with its own timeout (one interpreter start per batch
instead of per answer). A run's `status` says how it ended: ok, error, timeout, cpu_limit,
memory_limit, file_limit, process_limit, network_blocked, access_denied.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RUNNER = Path(__file__).with_name("_sandbox_runner.py")
UID_BASE = 1_000_000  # throwaway uids start here; no account on the machine owns them


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 2
    memory_bytes: int = 512 * 2**20
    file_bytes: int = 16 * 2**20
    processes: int = 32
    per_item_s: float = 1.0  # batch mode: each expression's own timeout


@dataclass
class Result:
    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    protections: list[str] = field(default_factory=list)
    values: list[dict] | None = None  # batch mode: one result per expression

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# (stderr fragment, status): the first match names how a run that raised ended.
_ERRORS = (("MemoryError", "memory_limit"), ("File too large", "file_limit"),
           ("Resource temporarily unavailable", "process_limit"),
           ("BlockingIOError", "process_limit"), ("sandbox: socket", "network_blocked"),
           ("sandbox: import socket", "network_blocked"), ("sandbox: import _socket", "network_blocked"),
           ("Network is unreachable", "network_blocked"),
           ("outside the working directory", "access_denied"),
           ("PermissionError", "access_denied"))


class Sandbox:
    """Runs code under `limits`. Instances are cheap; each run is independent."""

    def __init__(self, limits: Limits | None = None, python: str | None = None,
                 audit_hook: bool = True) -> None:
        self.limits = limits or Limits()
        self.audit_hook = audit_hook  # off only to test the layers below it
        self.python = python or sys.executable
        self._runs = 0

    def run(self, code: str) -> Result:
        return self._launch(code, "exec", self.limits.wall_s)

    def run_batch(self, exprs: list[str]) -> Result:
        wall = self.limits.wall_s + self.limits.per_item_s * len(exprs)
        res = self._launch(json.dumps(exprs), "batch", wall)
        if res.status == "ok":
            try:
                res.values = json.loads(res.stdout)
            except json.JSONDecodeError:
                res.status, res.values = "error", None
        return res

    def _uid(self) -> int | None:
        if os.geteuid() != 0:
            return None
        self._runs += 1
        # Unique per worker process and run, so concurrent sandboxes never share a uid.
        return UID_BASE + (os.getpid() % 1_000_000) * 16 + self._runs % 16

    def _launch(self, payload: str, mode: str, wall_s: float) -> Result:
        lim = self.limits
        workdir = tempfile.mkdtemp(prefix="placer-sbx-")
        uid = self._uid()
        if uid is not None:
            os.chown(workdir, uid, uid)
        status_r, status_w = os.pipe()
        cfg = {"mode": mode, "uid": uid, "status_fd": status_w, "audit_hook": self.audit_hook,
               "limits": {"cpu_s": lim.cpu_s, "memory_bytes": lim.memory_bytes,
                          "file_bytes": lim.file_bytes, "processes": lim.processes,
                          "per_item_s": lim.per_item_s}}
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen([self.python, "-I", "-S", str(RUNNER), json.dumps(cfg)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=workdir, env={},
                                    start_new_session=True, pass_fds=(status_w,), text=True)
            os.close(status_w)
            timed_out = False
            try:
                out, err = proc.communicate(payload, timeout=wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                if uid is not None:  # a child that left the group may still hold the pipes
                    _kill_uid(uid)
                try:
                    out, err = proc.communicate(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, err = "", "sandbox: output pipes held open by an escaped process"
            _kill_group(proc.pid)  # children the program left behind in its group
            if uid is not None:
                _kill_uid(uid)
            protections = _read_status(status_r)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        wall = time.monotonic() - t0
        return Result(_classify(proc.returncode, err, timed_out), proc.returncode, out[-4096:],
                      err[-4096:], wall, protections)


def _read_status(fd: int) -> list[str]:
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    try:
        return json.loads(data) if data else []
    except json.JSONDecodeError:
        return []


def _classify(rc: int | None, err: str, timed_out: bool) -> str:
    if timed_out:
        return "timeout"
    if rc == 0:
        return "ok"
    if rc == -signal.SIGXCPU:
        return "cpu_limit"
    if rc == -signal.SIGXFSZ:
        return "file_limit"
    for frag, status in _ERRORS:
        if frag in err:
            return status
    return "error"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """Kill every process still running as the throwaway uid, until none is left."""
    for _ in range(50):
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit() and _uid_of(d) == uid]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _uid_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def probe() -> list[str]:
    """The protections that take effect on this machine (runs one empty program)."""
    return Sandbox(Limits(wall_s=10)).run("pass").protections
