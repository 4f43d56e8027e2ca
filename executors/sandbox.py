"""Run untrusted generated code (answers, tool calls) isolated by the kernel.

Every run starts a sandbox: new user, mount, PID, network, IPC and UTS namespaces, made by
`bwrap` (bubblewrap) when it is installed, else by `unshare` (util-linux) with
`_sandbox_runner.py` doing the mounts itself. Inside, the program sees a read-only root holding
only the interpreter's prefix, the system libraries it loads, /dev/null, /dev/zero and
/dev/urandom, and a private tmpfs at /work (its working directory, capped in bytes and in files,
the only writable place); no /proc, no host /tmp or /dev/shm, no sockets of the host, no network
but a down loopback, an empty environment. The runner is PID 1: it drops every capability, sets
no_new_privs and rlimits (CPU seconds, address space, file size, processes, no core files),
installs a seccomp filter (`executors.seccomp`) and only then forks the untrusted code. When we
are root, the sandbox runs under a throwaway host uid, so that the process limit binds. The audit
hook of the runner is an extra layer, never the wall.

`run` executes one program; `run_batch` evaluates many short expressions in one sandbox, each in
its own forked child that cannot reach the result pipe; between answers PID 1 kills every other
process of the namespace and empties /work, so no answer can change another's result. Output is
read as it comes and cut at `Limits.output_bytes` (the run is then killed); the wall-clock limit
kills the namespace's PID 1, which ends every process in it.

A run's `status` says how it ended: ok, error, timeout, cpu_limit, memory_limit, file_limit,
disk_limit, process_limit, output_limit, network_blocked, access_denied, crashed.
When no isolation can be set up, `SandboxUnavailable` is raised, unless the caller opts out with
`allow_weak=True` or `PLACER_UNSAFE_SANDBOX=1` (rlimits, seccomp and the audit hook only; loudly
reported on stderr).
"""
from __future__ import annotations

import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from executors.seccomp import build_filter, host_arch

RUNNER = Path(__file__).with_name("_sandbox_runner.py")
UID_BASE = 1_000_000  # throwaway uids start here; no account on the machine owns them
WORK = "/work"
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
UNSAFE_ENV = "PLACER_UNSAFE_SANDBOX"
BACKENDS = ("auto", "bwrap", "unshare")
UID_SLOTS = 16  # throwaway uids per process: the most runs one process has at once (as root)
# The slots of this process's live runs, across every Sandbox and thread (the code reward runs a
# few at once): two live runs never share a uid, so a timeout's kill-by-uid ends only its own.
_uid_lock = threading.Lock()
_uids_live: set[int] = set()
_uid_next = itertools.count()


class SandboxUnavailable(RuntimeError):
    """The kernel isolation cannot be set up here; generated code is refused."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 2
    memory_bytes: int = 512 * 2**20
    file_bytes: int = 16 * 2**20     # one file
    disk_bytes: int = 32 * 2**20     # all files together (the size of the tmpfs)
    files: int = 4096                # inodes of the tmpfs (unshare backend)
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
    values: list[dict] | None = None  # batch mode: one result per expression
    backend: str = ""

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
           ("outside the working directory", "access_denied"),
           ("PermissionError", "access_denied"), ("Read-only file system", "access_denied"))
_CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE,
                  signal.SIGSYS)


class Sandbox:
    """Runs code under `limits`. Instances are cheap; each run is a fresh sandbox."""

    def __init__(self, limits: Limits | None = None, python: str | None = None,
                 audit_hook: bool = True, backend: str = "auto",
                 allow_weak: bool | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"sandbox backend must be one of {BACKENDS} (got {backend!r})")
        self.limits = limits or Limits()
        self.audit_hook = audit_hook  # off only to test the layers below it
        self.python = os.path.realpath(python or sys.executable)
        self.backend = backend
        self.allow_weak = (os.environ.get(UNSAFE_ENV, "") in ("1", "true", "yes")
                           if allow_weak is None else allow_weak)
        self._weak_reason: str | None = None  # set once isolation failed and weak was allowed

    def run(self, code: str) -> Result:
        return self._launch("exec", code, self.limits.wall_s)

    def run_batch(self, exprs: list[str]) -> Result:
        wall = self.limits.wall_s + self.limits.per_item_s * len(exprs)
        res = self._launch("batch", list(exprs), wall)
        got = {int(v.pop("item")): v for v in (res.values or []) if isinstance(v.get("item"), int)}
        res.values = [got.get(i, {"status": "timeout" if res.status == "timeout" else "error",
                                  "error": f"no result (sandbox {res.status})"})
                      for i in range(len(exprs))]
        if res.status == "ok" and len(got) < len(exprs):
            res.status = "error"
        return res

    # -------------------------------------------------------------------------- launching

    def _backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "bwrap" if shutil.which("bwrap") else "unshare"

    def _launch(self, mode: str, payload: Any, wall_s: float) -> Result:
        if self._weak_reason is None:
            res = self._start(mode, payload, wall_s, self._backend())
            if not isinstance(res, str):
                return res
            if not self.allow_weak:
                raise SandboxUnavailable(
                    f"sandbox: kernel isolation unavailable ({res}); install bubblewrap or allow "
                    f"unprivileged user namespaces, or opt out with {UNSAFE_ENV}=1 (unsafe)")
            self._weak_reason = res
            print(f"WARNING: sandbox: kernel isolation unavailable ({res}); running generated "
                  "code WITHOUT namespaces (unsafe opt-out)", file=sys.stderr, flush=True)
        res = self._start(mode, payload, wall_s, "weak")
        if isinstance(res, str):
            raise SandboxUnavailable(f"sandbox: cannot start even without isolation ({res})")
        return res

    def _start(self, mode: str, payload: Any, wall_s: float, backend: str) -> Result | str:
        """One sandboxed run; a string says why the sandbox itself could not be set up. As root
        it runs under a throwaway uid of its own (held until the run and its kills are over)."""
        slot = _take_slot() if backend != "weak" and os.geteuid() == 0 else None
        try:
            uid = None if slot is None else UID_BASE + (os.getpid() % 1_000_000) * UID_SLOTS + slot
            return self._start_as(mode, payload, wall_s, backend, uid)
        finally:
            if slot is not None:
                with _uid_lock:
                    _uids_live.discard(slot)

    def _start_as(self, mode: str, payload: Any, wall_s: float, backend: str,
                  uid: int | None) -> Result | str:
        lim = self.limits
        view = _view(self.python)
        cfg: dict[str, Any] = {
            "mode": mode, "payload": payload, "backend": backend, "audit_hook": self.audit_hook,
            "limits": {"wall_s": lim.wall_s, "cpu_s": lim.cpu_s, "memory_bytes": lim.memory_bytes,
                       "file_bytes": lim.file_bytes, "disk_bytes": lim.disk_bytes,
                       "processes": lim.processes,
                       "per_item_s": lim.per_item_s},
            "seccomp": _filter_hex(), "ipcns": backend != "weak", "throwaway_uid": uid is not None,
            "host_markers": [str(RUNNER), "/proc/self", "/tmp", "/etc"],
            "allowed_paths": [WORK, *view["ro"], "/dev"]}
        if backend != "weak" and not shutil.which(backend):
            return f"{backend} is not installed"
        workdir = None
        kwargs: dict[str, Any] = {}
        work = {"bytes": lim.disk_bytes, "inodes": lim.files}
        if backend == "bwrap":
            argv = self._bwrap_argv(view)
            cfg["work_tmpfs"] = work
            if uid is not None:  # root: bwrap runs as the throwaway uid (a staging step first)
                stage = {"uid": uid, "prefix": view["prefix"], "hide": view["hide"], "argv": argv}
                argv = [self.python, "-I", "-S", "-c", _runner_source(), "stage", json.dumps(stage)]
        elif backend == "unshare":
            argv = [shutil.which("unshare") or "unshare", "--mount", "--pid", "--net", "--ipc",
                    "--uts", "--fork", "--kill-child", "--propagation", "private"]
            if uid is None:
                argv[1:1] = ["--user", "--map-root-user"]
            argv += ["--", self.python, "-I", "-S", "-c", _runner_source()]
            cfg["setup"] = {"binds": [(p, p) for p in view["ro"]], "links": view["links"],
                            "devices": list(DEVICES), "uid": uid, "work": work}
        else:
            workdir = tempfile.mkdtemp(prefix="placer-sbx-")
            cfg.update(workdir=workdir, ipcns=False, host_markers=[],
                       allowed_paths=[workdir, *view["ro"], "/dev"])
            argv = [self.python, "-I", "-S", "-c", _runner_source()]
            kwargs["cwd"] = workdir
        res_r, res_w = os.pipe()
        cfg["result_fd"] = res_w
        t0 = time.monotonic()
        try:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env={}, start_new_session=True,
                                        pass_fds=(res_w,), **kwargs)
            except OSError as e:
                os.close(res_r)
                return f"{argv[0]}: {e.strerror}"
            finally:
                os.close(res_w)
            res = self._collect(proc, res_r, json.dumps(cfg) + "\n", wall_s + 2.0, uid)
        finally:
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        out, err, frames, timed_out, cut = res
        wall = time.monotonic() - t0
        protections = next((f["protections"] for f in frames if "protections" in f), None)
        if protections is None:
            setup = next((f["setup_error"] for f in frames if "setup_error" in f), None)
            if setup or not timed_out:
                return setup or (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            protections = []
        exit_frame = next((f for f in frames if "exit" in f), None)
        rc = exit_frame["exit"] if exit_frame else None
        timed_out = timed_out or bool(exit_frame and exit_frame.get("timeout"))
        status = _classify(rc, err, timed_out, cut)
        values = [f for f in frames if "item" in f] if mode == "batch" else None
        keep = lim.keep_bytes
        return Result(status, rc, out[-keep:], err[-keep:], wall, protections, values,
                      backend if backend != "weak" else f"weak ({self._weak_reason})")

    def _bwrap_argv(self, view: dict) -> list[str]:
        argv = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--unshare-pid",
                "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--as-pid-1", "--uid", "1000", "--gid", "1000",
                "--hostname", "sandbox", "--clearenv"]
        for p in view["ro"]:
            argv += ["--ro-bind", p, p]
        for link, target in view["links"]:
            argv += ["--symlink", target, link]
        for dev in DEVICES:
            argv += ["--dev-bind", dev, dev]
        # /work is mounted by the runner (bwrap cannot cap a tmpfs's inodes), with the capability
        # kept for it and the one to empty the bounding set; all go before any untrusted code.
        argv += ["--dir", WORK, "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP",
                 "--remount-ro", "/",
                 self.python, "-I", "-S", "-c", _runner_source()]
        return argv

    def _collect(self, proc: subprocess.Popen, res_r: int, cfg_line: str, wall_s: float,
                 uid: int | None) -> tuple[str, str, list[dict], bool, bool]:
        """Feed the config, read output as it comes (bounded), kill everything at the end."""
        assert proc.stdin and proc.stdout and proc.stderr
        try:
            proc.stdin.write(cfg_line.encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        bufs: dict[int, bytearray] = {}
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        caps = {out_fd: self.limits.output_bytes, err_fd: self.limits.output_bytes,
                res_r: 16 * 2**20}
        sel = selectors.DefaultSelector()
        for fd in caps:
            bufs[fd] = bytearray()
            sel.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + wall_s
        timed_out = cut = False
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                fd = int(key.fd)
                data = os.read(fd, 65536)
                if not data:
                    sel.unregister(fd)
                    continue
                bufs[fd] += data
            out_total = len(bufs[out_fd]) + len(bufs[err_fd])
            if out_total > self.limits.output_bytes or len(bufs[res_r]) > caps[res_r]:
                cut = True
                break
        sel.close()
        _kill_group(proc.pid)  # the launcher, and the sandbox's PID 1 with it
        if uid is not None and (timed_out or cut):
            _kill_uid(uid)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            f.close()
        os.close(res_r)
        frames = []
        for line in bytes(bufs[res_r]).decode(errors="replace").splitlines():
            try:
                frames.append(json.loads(line))
            except ValueError:
                break  # a cut final line
        out = bytes(bufs[out_fd]).decode(errors="replace")
        err = bytes(bufs[err_fd]).decode(errors="replace")
        return out, err, frames, timed_out, cut


# ------------------------------------------------------------------------------ helpers

def _take_slot() -> int:
    """A uid slot no live run of this process holds; the next ones in turn (as before: a slot is
    not reused by the very next run, while the last run's processes may still be dying)."""
    with _uid_lock:
        for _ in range(UID_SLOTS):
            slot = next(_uid_next) % UID_SLOTS
            if slot not in _uids_live:
                _uids_live.add(slot)
                return slot
    raise SandboxUnavailable(f"sandbox: more than {UID_SLOTS} runs at once in one process")


@cache
def _runner_source() -> str:
    return RUNNER.read_text()


@cache
def _filter_hex() -> str | None:
    return build_filter().hex() if host_arch() else None


@cache
def _view(python: str) -> dict:
    """What the sandbox mounts read-only: the interpreter's prefix and the system libraries."""
    real = os.path.realpath(python)
    prefix = (os.path.realpath(sys.base_prefix) if real == os.path.realpath(sys.executable)
              else os.path.dirname(os.path.dirname(real)))
    ro, links = [prefix], []
    for d in ("/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(d):
            links.append((d, os.readlink(d)))
        elif os.path.isdir(d):
            ro.append(d)
    multi = sysconfig.get_config_var("MULTIARCH")
    usrlib = f"/usr/lib/{multi}" if multi and os.path.isdir(f"/usr/lib/{multi}") else "/usr/lib"
    ro.append(usrlib)
    if os.path.isdir("/usr/lib64") and not os.path.islink("/usr/lib64"):
        ro.append("/usr/lib64")
    ro = sorted({p for p in ro if p == prefix or not p.startswith(prefix + "/")})
    # The first ancestor of the prefix that other uids cannot traverse (e.g. /root, mode 0700).
    hide = []
    parts = Path(prefix).parts
    for i in range(2, len(parts)):
        anc = str(Path(*parts[:i]))
        if not os.stat(anc).st_mode & 0o001:
            hide.append(anc)
            break
    return {"prefix": prefix, "ro": ro, "links": links, "hide": hide}


def _classify(rc: int | None, err: str, timed_out: bool, cut: bool) -> str:
    if timed_out:
        return "timeout"
    if cut:
        return "output_limit"
    if rc == 0:
        return "ok"
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


def probe(backend: str = "auto", allow_weak: bool | None = None) -> list[str]:
    """The protections that take effect on this machine (runs one empty program); raises
    `SandboxUnavailable` where isolation cannot be set up and weak runs are not allowed."""
    return Sandbox(Limits(wall_s=10), backend=backend, allow_weak=allow_weak).run("pass").protections
