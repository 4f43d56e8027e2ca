"""A cap on the whole sandbox: a cgroup around each sandbox run, for its memory and its processes.

Per-process rlimits cannot bound what a sandbox holds as a whole: pages of `memfd_create` files
and of shared memory count against no address-space limit, and a dozen processes each under its
limit add up. A memory cgroup counts all of it (anonymous memory, memfd, shm and tmpfs pages, every
process together) and the kernel's OOM killer then acts inside the cgroup, on the sandbox, never on
the trainer or Ray; its pids controller caps the processes. Each run gets a cgroup of its own
(`RunCgroup`): the launcher enters it through a one-line shell before `exec`-ing bubblewrap or
unshare, so that every process of the sandbox is born inside; afterwards its processes are killed
and it is removed.

Where the cgroups come from, the first that works on this machine (found once per process by
`support`, with a real process moved into a probe cgroup):
  1. `PLACER_SANDBOX_CGROUP`: cgroups delegated to this user (v2: a directory of the unified
     hierarchy whose children may get memory and pids; v1: a directory of the memory hierarchy
     and one of the pids hierarchy, joined by ':');
  2. cgroup v2, a delegated subtree: this process's own cgroup when its children may get memory
     and pids (the root of a cgroup namespace, a writable container);
  3. cgroup v2 through systemd: `systemd-run --scope` (`--user` when not root), a transient scope
     with MemoryMax, MemorySwapMax=0 and TasksMax;
  4. cgroup v1: this process's own memory and pids cgroups, when it may create children there
     (root, or a subtree chowned to it).
Where none works (a container without delegation), `support` says so once on stderr and the
sandbox falls back to rlimits with `memfd_create` refused by seccomp (System V shared memory is
refused always); it never runs without a cap silently.
"""
from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ENV = "PLACER_SANDBOX_CGROUP"
ROOT = Path("/sys/fs/cgroup")
PREFIX = "placer-sbx-"
# Enters every cgroup.procs file given before `--` (the shell's own pid: exec keeps it), then
# becomes the sandbox's launcher; 125 when a cgroup cannot be entered.
ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
ENTER_FAILED = 125


@dataclass(frozen=True)
class Support:
    """How this machine caps a sandbox: `kind` v2, v1, systemd-run, or "" (none: `reason`)."""

    kind: str
    parents: dict[str, str] = field(default_factory=dict)  # hierarchy -> parent directory
    reason: str = ""

    @property
    def capped(self) -> bool:
        return bool(self.kind)


NONE = Support("", reason="cgroups off for this sandbox")


class RunCgroup:
    """The cgroup of one sandbox run: created with its caps, entered by the launcher, then
    emptied and removed (`close`)."""

    def __init__(self, support: Support, memory_bytes: int, pids: int) -> None:
        self.support, self.name = support, PREFIX + f"{os.getpid()}-{secrets.token_hex(4)}"
        self.memory_bytes, self.pids = memory_bytes, pids
        self.dirs: dict[str, str] = {}
        try:
            for hier, parent in support.parents.items():
                d = os.path.join(parent, self.name)
                os.mkdir(d)
                self.dirs[hier] = d
            self._set_caps()
        except OSError:
            self.close()
            raise

    def _set_caps(self) -> None:
        kind, m = self.support.kind, str(self.memory_bytes)
        if kind == "v2":
            d = self.dirs["unified"]
            _write(d, "memory.max", m)
            _write(d, "memory.swap.max", "0", optional=True)
            _write(d, "pids.max", str(self.pids))
        elif kind == "v1":
            mem = self.dirs["memory"]
            _write(mem, "memory.limit_in_bytes", m)
            _write(mem, "memory.memsw.limit_in_bytes", m, optional=True)  # with swap accounting
            if "pids" in self.dirs:
                _write(self.dirs["pids"], "pids.max", str(self.pids))

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` started inside this cgroup."""
        if self.support.kind == "systemd-run":
            user = ["--user"] if os.geteuid() != 0 else []
            return [shutil.which("systemd-run") or "systemd-run", *user, "--quiet", "--scope",
                    "--collect", "--unit", self.name, "-p", f"MemoryMax={self.memory_bytes}",
                    "-p", "MemorySwapMax=0", "-p", f"TasksMax={self.pids}", "--", *argv]
        procs = [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]
        return ["/bin/sh", "-c", ENTER, "sh", *procs, "--", *argv]

    def protections(self) -> list[str]:
        """What this cgroup caps, as the sandbox reports its protections."""
        kind = self.support.kind
        return ["cgroup_memory"] + (["cgroup_pids"] if kind != "v1" or "pids" in self.dirs else [])

    def oom_kills(self) -> int:
        """Processes the kernel killed for the memory cap so far (0 where it cannot tell)."""
        if self.support.kind == "v2":
            text = _read(self.dirs["unified"], "memory.events")
        elif self.support.kind == "v1":
            text = _read(self.dirs["memory"], "memory.oom_control")
        else:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def peak_bytes(self) -> int | None:
        """The most memory the sandbox held at once (None where the kernel does not say)."""
        name = {"v2": ("unified", "memory.peak"),
                "v1": ("memory", "memory.max_usage_in_bytes")}.get(self.support.kind)
        if name is None:
            return None
        text = _read(self.dirs[name[0]], name[1]).strip()
        return int(text) if text.isdigit() else None

    def close(self) -> None:
        """Kill whatever is left in the cgroup, then remove it."""
        for d in self.dirs.values():
            _empty(d)
        for d in self.dirs.values():
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: a killed process is still exiting
                    time.sleep(0.01)
        self.dirs = {}


def _write(d: str, name: str, value: str, optional: bool = False) -> None:
    try:
        with open(os.path.join(d, name), "w") as f:
            f.write(value)
    except OSError:
        if not optional:
            raise


def _read(d: str, name: str) -> str:
    try:
        with open(os.path.join(d, name)) as f:
            return f.read()
    except OSError:
        return ""


def _empty(d: str) -> None:
    if os.path.exists(os.path.join(d, "cgroup.kill")):
        try:
            _write(d, "cgroup.kill", "1")
        except OSError:
            pass
    for _ in range(100):
        pids = [int(p) for p in _read(d, "cgroup.procs").split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


# ------------------------------------------------------------------------------ detection

def _own(hierarchy: str) -> str | None:
    """This process's cgroup path in a hierarchy ("" for v2's unified one), from /proc."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if (hierarchy in names.split(",")) if hierarchy else names == "":
            return path
    return None


def _v2_candidates() -> list[str]:
    if not (ROOT / "cgroup.controllers").exists():  # no unified hierarchy at the usual place
        return []
    own = _own("")
    return [str(ROOT) + own.rstrip("/")] if own is not None else []


def _enable(parent: str) -> None:
    """Give the children of a v2 cgroup the memory and pids controllers (when not yet so)."""
    have = _read(parent, "cgroup.subtree_control").split()
    missing = [c for c in ("memory", "pids") if c not in have]
    if missing:
        _write(parent, "cgroup.subtree_control", " ".join("+" + c for c in missing))


def _try(support: Support) -> str | None:
    """Why `support` does not work here (None: a probe cgroup took a process and its caps)."""
    try:
        if support.kind == "v2":
            _enable(support.parents["unified"])
        cg = RunCgroup(support, 64 * 2**20, 8)
    except OSError as e:
        return f"{e.strerror or e} ({getattr(e, 'filename', '') or ''})"
    try:
        argv = cg.wrap(["/bin/sh", "-c", "exit 0"])
        r = subprocess.run(argv, capture_output=True, timeout=30)
        if r.returncode != 0:
            return (r.stderr.decode(errors="replace").strip().splitlines() or
                    [f"exit {r.returncode}"])[-1]
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    finally:
        cg.close()


def _given(value: str) -> Support:
    """`PLACER_SANDBOX_CGROUP`: a v2 directory, or v1 directories (memory, and pids) joined by
    ':', each delegated to this user."""
    dirs = [d for d in value.split(":") if d]
    if len(dirs) == 1 and os.path.exists(os.path.join(dirs[0], "cgroup.controllers")):
        return Support("v2", {"unified": dirs[0]})
    parents = {}
    for d in dirs:
        for hier, probe in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max")):
            if os.path.exists(os.path.join(d, probe)):
                parents[hier] = d
    return Support("v1", parents) if "memory" in parents else Support(
        "", reason=f"{ENV}={value}: no memory cgroup there")


def _candidates() -> list[Support]:
    given = os.environ.get(ENV, "")
    if given:
        return [_given(given)]
    out = [Support("v2", {"unified": p}) for p in _v2_candidates()]
    if shutil.which("systemd-run") and os.path.isdir("/run/systemd/system"):
        out.append(Support("systemd-run"))
    mem, pids = _own("memory"), _own("pids")
    if mem is not None and (ROOT / "memory").is_dir():
        parents = {"memory": str(ROOT / "memory") + mem.rstrip("/")}
        if pids is not None and (ROOT / "pids").is_dir():
            parents["pids"] = str(ROOT / "pids") + pids.rstrip("/")
        out.append(Support("v1", parents))
    return out


def _remove_stale(support: Support) -> None:
    """Remove the empty cgroups that sandboxes of processes no longer alive left behind (a
    process killed before it could remove its own)."""
    for parent in support.parents.values():
        for name in os.listdir(parent):
            pid = name[len(PREFIX):].split("-")[0]
            if name.startswith(PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass  # not empty, or not ours to remove


@functools.cache
def support() -> Support:
    """How sandboxes are capped in this process (found once; said once on stderr when none)."""
    tried = []
    for cand in _candidates():
        why = _try(cand) if cand.capped else cand.reason
        if why is None:
            _remove_stale(cand)
            return cand
        tried.append(f"{cand.kind}: {why}")
    reason = "; ".join(tried) or "no cgroup hierarchy is mounted"
    print(f"WARNING: sandbox: no cgroup can cap a sandbox's memory and processes here ({reason}); "
          "falling back to per-process rlimits with memfd_create and System V shared memory "
          f"refused (delegate a cgroup and name it in {ENV} to cap whole sandboxes)",
          file=sys.stderr, flush=True)
    return Support("", reason=reason)
