"""Starting a sandbox and talking to it, host side: the launchers' command lines, the runner's
source, throwaway uids, the message stream on stdin and the result frames.

`executors.sandbox` decides what runs; this module starts it under `bwrap` or `unshare` (or, for
the weak opt-out, neither) and moves the bytes: the configuration and each answer go down stdin as
length-prefixed messages (`message`), written as the sandbox reads them; stdout and stderr are
read as they come and cut at a cap; results come back as JSON lines on a pipe only the sandbox's
PID 1 holds (`frames`). As root every run gets a throwaway uid of its own (`UidSlots`), so that
the sandbox's process limit binds and a timeout can kill by uid.
"""
from __future__ import annotations

import itertools
import json
import marshal
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from executors.seccomp import build_filter, host_arch

HERE = Path(__file__).parent
SETUP, RUNNER, JUDGE = (HERE / f"_sandbox_{n}.py" for n in ("setup", "runner", "judge"))
UID_BASE = 1_000_000  # throwaway uids start here; no account on the machine owns them
UID_SLOTS = 16  # throwaway uids per process: the most runs one process has at once (as root)
WORK = "/work"
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
RESULT_CAP = 16 * 2**20  # bytes of result frames read from one run


class UidSlots:
    """The throwaway uids of this process's live runs, across every Sandbox and thread (the code
    reward runs a few at once): two live runs never share a uid, so a timeout's kill-by-uid ends
    only its own. A slot is not reused by the very next run, while the last run's processes may
    still be dying."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: set[int] = set()
        self.turn = itertools.count()

    def take(self) -> int | None:
        with self.lock:
            for _ in range(UID_SLOTS):
                slot = next(self.turn) % UID_SLOTS
                if slot not in self.live:
                    self.live.add(slot)
                    return slot
        return None

    def give(self, slot: int) -> None:
        with self.lock:
            self.live.discard(slot)

    @staticmethod
    def uid(slot: int) -> int:
        return UID_BASE + (os.getpid() % 1_000_000) * UID_SLOTS + slot


@cache
def uid_slots() -> UidSlots:
    """This process's uid slots. One table per process, by necessity: the uids are derived from
    the process id, and every sandbox of the process (each thread's) must draw from it."""
    return UidSlots()


# PID 1 of a sandbox starts as this short program: it reads the runner, compiled, from the first
# message on stdin and runs it, so that no sandbox compiles the runner's source again (marshal's
# format is the interpreter's own: only for the interpreter this process runs on).
BOOT = ("import marshal, os\n"
        "def _take(n):\n"
        "    b = b''\n"
        "    while len(b) < n:\n"
        "        c = os.read(0, n - len(b))\n"
        "        if not c:\n"
        "            raise SystemExit(70)\n"
        "        b += c\n"
        "    return b\n"
        "exec(marshal.loads(_take(int(_take(11)))))\n")


@cache
def runner_source() -> str:
    """The sandbox's PID 1: the set-up half, then the runner half, as one program."""
    return SETUP.read_text() + "\n" + RUNNER.read_text()


@cache
def stage_source() -> str:
    """The root-only step before bwrap (`_sandbox_setup.stage`), as a program: argv[2] is its
    JSON."""
    return (SETUP.read_text() + "\n\nif __name__ == '__main__':\n    import json, sys\n"
            "    stage(json.loads(sys.argv[2]))\n")


@cache
def _compiled(path: str, source: str) -> bytes:
    return marshal.dumps(compile(source, path, "exec"))


def native(python: str) -> bool:
    """Whether `python` is the interpreter this process runs on (compiled code can be sent)."""
    return os.path.realpath(python) == os.path.realpath(sys.executable)


def boot(python: str) -> tuple[str, bytes]:
    """PID 1's program text (`-c`) and what must precede the configuration on its stdin."""
    if native(python):
        return BOOT, message(_compiled("<sandbox runner>", runner_source()))
    return runner_source(), b""


def judge_code(python: str) -> bytes:
    """The judge's code as PID 1 reads it in tests mode: compiled, or its source."""
    source = JUDGE.read_text()
    return _compiled("<sandbox judge>", source) if native(python) else source.encode()


@cache
def filter_hex(deny_memfd: bool) -> str | None:
    return build_filter(deny_memfd=deny_memfd).hex() if host_arch() else None


@cache
def view(python: str) -> dict:
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


def bwrap_argv(python: str, v: dict, program: str) -> list[str]:
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--unshare-pid",
            "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--as-pid-1", "--uid", "1000", "--gid", "1000",
            "--hostname", "sandbox", "--clearenv"]
    for p in v["ro"]:
        argv += ["--ro-bind", p, p]
    for link, target in v["links"]:
        argv += ["--symlink", target, link]
    for dev in DEVICES:
        argv += ["--dev-bind", dev, dev]
    # /work is mounted by the runner (bwrap cannot cap a tmpfs's inodes), with the capability
    # kept for it and the one to empty the bounding set; all go before any untrusted code.
    argv += ["--dir", WORK, "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP",
             "--remount-ro", "/", python, "-I", "-S", "-c", program]
    return argv


def staged(python: str, v: dict, uid: int, argv: list[str]) -> list[str]:
    """`argv` started as the throwaway `uid` (root only), through the runner's stage step."""
    spec = {"uid": uid, "prefix": v["prefix"], "hide": v["hide"], "argv": argv}
    return [python, "-I", "-S", "-c", stage_source(), "stage", json.dumps(spec)]


def unshare_argv(python: str, as_root: bool, program: str) -> list[str]:
    argv = [shutil.which("unshare") or "unshare", "--mount", "--pid", "--net", "--ipc",
            "--uts", "--fork", "--kill-child", "--propagation", "private"]
    if not as_root:
        argv[1:1] = ["--user", "--map-root-user"]
    return argv + ["--", python, "-I", "-S", "-c", program]


def message(data: bytes) -> bytes:
    """One message of the stream the sandbox reads on stdin (`_sandbox_runner.read_message`)."""
    return b"%010d\n" % len(data) + data


@dataclass
class Collected:
    out: str
    err: str
    frames: list[dict]
    timed_out: bool
    cut: bool


def collect(proc: subprocess.Popen, res_r: int, feed: bytes, wall_s: float,
            output_bytes: int) -> Collected:
    """Write `feed` to the sandbox's stdin as it reads, read its output as it comes (bounded),
    until every pipe closes, the output passes `output_bytes` or the wall-clock limit passes;
    then kill the launcher (and the sandbox's PID 1 with it)."""
    assert proc.stdin and proc.stdout and proc.stderr
    in_fd = proc.stdin.fileno()
    os.set_blocking(in_fd, False)
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray(), res_r: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    pending = memoryview(feed)
    if pending:
        sel.register(in_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    deadline = time.monotonic() + wall_s
    timed_out = cut = False
    while any(fd in sel.get_map() for fd in bufs):
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(left):
            fd = int(key.fd)
            if fd == in_fd:
                pending = _feed(in_fd, pending, sel)
                if not pending:
                    proc.stdin.close()  # every message is written: the sandbox reads no more
                continue
            data = os.read(fd, 65536)
            if not data:
                sel.unregister(fd)
                continue
            bufs[fd] += data
        if (len(bufs[out_fd]) + len(bufs[err_fd]) > output_bytes
                or len(bufs[res_r]) > RESULT_CAP):
            cut = True
            break
    sel.close()
    kill_group(proc.pid)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        try:
            f.close()
        except OSError:
            pass
    os.close(res_r)
    return Collected(bytes(bufs[out_fd]).decode(errors="replace"),
                     bytes(bufs[err_fd]).decode(errors="replace"),
                     frames(bytes(bufs[res_r])), timed_out, cut)


def _feed(fd: int, pending: memoryview, sel: selectors.BaseSelector) -> memoryview:
    """Write what the pipe takes now; close it when all is written or the reader is gone."""
    try:
        pending = pending[os.write(fd, pending[:65536]):]
    except BlockingIOError:
        return pending
    except (BrokenPipeError, OSError):
        pending = pending[len(pending):]
    if not pending:
        sel.unregister(fd)
    return pending


def frames(data: bytes) -> list[dict]:
    """PID 1's result frames: JSON lines, a `raw` one followed by that many bytes and a newline
    (kept as `payload`). A cut last frame is dropped."""
    out, pos = [], 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        try:
            f = json.loads(data[pos:nl])
        except ValueError:
            break
        pos = nl + 1
        if not isinstance(f, dict):
            break
        n = f.get("raw")
        if isinstance(n, int):
            if n < 0 or pos + n + 1 > len(data):
                break
            f["payload"] = data[pos:pos + n]
            pos += n + 1
        out.append(f)
    return out


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_uid(uid: int) -> None:
    """Kill every process still running as the throwaway uid, until none is left."""
    for _ in range(50):
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit() and uid_of(d) == uid]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def uid_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
