"""The trusted set-up of a sandboxed run, inside the sandbox's namespaces, before any untrusted code.

`executors.sandbox` starts this file's source followed by `_sandbox_runner.py`'s as one program
(compiled by the host and sent on stdin, or `python -I -S -c SOURCE`; never read from the project
tree inside the sandbox), under `bwrap` or `unshare`, so that it is PID 1 of a new PID namespace,
in new mount, network, IPC and UTS namespaces. This half builds and checks the sandbox; the runner
half then runs the answers.

Steps, all before any untrusted code runs:
  1. (`unshare` backend only) build the filesystem view that `bwrap` would build: a read-only tmpfs
     root holding read-only binds of the interpreter's prefix and the system libraries it loads,
     /dev/null, /dev/zero and /dev/urandom, and a size- and inode-capped tmpfs at /work; then
     pivot_root into it, leave the host's uid when started as root (a throwaway uid), and enter a
     new user namespace of our own in which the sandbox runs as uid 1000;
     (`bwrap` backend: bwrap built the view and kept CAP_SYS_ADMIN and CAP_SETPCAP of its user
     namespace for us; we mount /work, since bwrap cannot cap a tmpfs's inodes);
  2. drop every capability and lock the securebits, set no_new_privs, make this process
     non-dumpable (so no program can open its /proc files or memory), set the rlimits;
  3. install the seccomp filter built by `executors.seccomp` (inherited by every child): among
     others it refuses `prlimit` and scheduling calls on any process but the caller, so no answer
     can lower PID 1's limits, which every later child would inherit;
  4. `verify` what the process can see of its own isolation; a missing protection fails the run.
`stage` (this file alone, `python -I -S -c SOURCE stage ARGV_JSON`) is the root-only step before
`bwrap`: it makes the interpreter's
prefix reachable for the throwaway uid in a private mount namespace, drops to that uid and execs
`bwrap`.

This file imports only the standard library and must stay that way.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_READ, PR_CAPBSET_DROP = 1, 4, 23, 24
PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 28, 38, 22
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SECCOMP_MODE_FILTER = 2
# NOROOT (uid 0 gains no capabilities on exec), KEEP_CAPS locked off, no ambient raise, each locked.
SECUREBITS = 0x01 | 0x02 | 0x20 | 0x40 | 0x80
CAP_VERSION_3 = 0x20080522
SANDBOX_UID = 1000
HOSTNAME = "sandbox"
WORK = "/work"

libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enc(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def _mount(src: str | None, dst: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = _enc
    _check(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {dst}")


def _ro_remount(target: str, extra: int) -> None:
    """Make a bind mount read-only, keeping the flags it already has: in a user namespace the
    kernel refuses a remount that would clear a flag the host set (they are locked)."""
    have = os.statvfs(target).f_flag
    keep = have & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048)  # NOATIME, NODIRATIME
    keep |= (1 << 21) if have & 4096 else 0  # ST_RELATIME is MS_RELATIME
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | extra | keep)


# ----------------------------------------------------------------------------- filesystem view

def build_root(setup: dict) -> None:
    """The `unshare` backend's trusted setup: mounts, pivot_root, hostname (needs CAP_SYS_ADMIN)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Sources are opened first and bound through /proc/self/fd, so that the tmpfs mounted below
    # cannot hide one of them.
    fds = [(os.open(src, os.O_PATH), dst) for src, dst in setup["binds"]]
    dev_fds = [(os.open(d, os.O_PATH), d) for d in setup["devices"]]
    new = "/tmp"
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=512,mode=0755")
    for fd, dst in fds:
        target = new + dst
        os.makedirs(target, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        _ro_remount(target, MS_NOSUID | MS_NODEV)
        os.close(fd)
    for link, target in setup["links"]:
        os.makedirs(os.path.dirname(new + link), exist_ok=True)
        os.symlink(target, new + link)
    os.makedirs(new + "/dev", exist_ok=True)
    for fd, dev in dev_fds:
        open(new + dev, "w").close()
        _mount(f"/proc/self/fd/{fd}", new + dev, None, MS_BIND)
        _ro_remount(new + dev, MS_NOSUID | MS_NOEXEC)
        os.close(fd)
    os.makedirs(new + WORK)
    owner = setup["uid"] if setup["uid"] is not None else os.geteuid()
    mount_work(setup["work"], owner, new)
    # /proc/self of the host, kept open to write our own user namespace's maps after the pivot.
    proc_self = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    os.chdir(new)
    _check(libc.syscall(155 if os.uname().machine == "x86_64" else 41, b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _check(libc.sethostname(HOSTNAME.encode(), len(HOSTNAME)), "sethostname")
    if setup["uid"] is not None:  # started as root: become the throwaway uid before anything else
        os.setgroups([])
        os.setresgid(setup["uid"], setup["uid"], setup["uid"])
        os.setresuid(setup["uid"], setup["uid"], setup["uid"])
    euid, egid = os.geteuid(), os.getegid()
    _check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")  # our map files must be ours
    _check(libc.unshare(CLONE_NEWUSER), "unshare user namespace")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{SANDBOX_UID} {euid} 1"),
                       ("gid_map", f"{SANDBOX_UID} {egid} 1")):
        fd = os.open(name, os.O_WRONLY, dir_fd=proc_self)
        os.write(fd, text.encode())
        os.close(fd)
    os.close(proc_self)


def mount_work(spec: dict, owner: int, root: str = "") -> None:
    """The program's only writable place: a tmpfs capped in bytes and in files (inodes)."""
    _mount("tmpfs", root + WORK, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
           f"size={spec['bytes']},nr_inodes={spec['inodes']},mode=0700,uid={owner},gid={owner}")


def stage(spec: dict) -> None:
    """Root before `bwrap`: expose the interpreter to the throwaway uid, drop to it, exec bwrap."""
    _check(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    fd = os.open(spec["prefix"], os.O_PATH)
    for hidden in spec["hide"]:  # an ancestor the uid cannot traverse (e.g. /root): an empty one
        _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    if spec["hide"]:
        os.makedirs(spec["prefix"], exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", spec["prefix"], None, MS_BIND | MS_REC)
    os.close(fd)
    uid = spec["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    os.execv(spec["argv"][0], spec["argv"])


# ----------------------------------------------------------------------------- privileges

def drop_privileges() -> list[str]:
    """No capabilities (bounding, ambient, effective, permitted), locked securebits, no_new_privs."""
    active = []
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:
            break  # EINVAL: past the last capability (EPERM: no CAP_SETPCAP, already dropped)
    libc.prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    libc.capset(header, data)
    libc.capget(header, data)
    bounding = [c for c in range(64) if libc.prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1]
    if not any(data) and not bounding:
        active.append("no_caps")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        active.append("no_new_privs")
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # Credential changes cleared the parent-death signal: re-arm it (the launcher's death ends us).
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return active


def install_seccomp(program: bytes) -> None:
    buf = ctypes.create_string_buffer(program, len(program))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


# What an isolated (not weak) run must have verified before any untrusted code runs.
REQUIRED = frozenset({"pidns", "netns", "mountns", "private_root", "no_caps", "no_new_privs",
                      "seccomp"})


def verify(cfg: dict) -> list[str]:
    """The namespaces this process can see it is in (cheap checks, no /proc needed)."""
    found = []
    if os.getpid() == 1:
        found.append("pidns")
    if os.getuid() == SANDBOX_UID:
        found.append("userns")
    if socket.gethostname() == HOSTNAME:
        found.append("utsns")
    if cfg["ipcns"]:
        found.append("ipcns")
    try:
        if {name for _, name in socket.if_nameindex()} <= {"lo"}:
            found.append("netns")
    except OSError:
        pass
    if cfg["host_markers"] and not any(os.path.exists(p) for p in cfg["host_markers"]):
        found += ["mountns", "private_root"]
    st = os.statvfs(os.getcwd())
    if os.getcwd() == WORK and st.f_blocks * st.f_frsize <= cfg["limits"]["disk_bytes"]:
        found.append("tmpfs_work")
    return found


