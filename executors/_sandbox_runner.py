"""The trusted side of a sandboxed run, executed inside the sandbox's namespaces.

`executors.sandbox` starts this file's source as `python -I -S -c SOURCE` (it is never read from
the project tree inside the sandbox) under `bwrap` or `unshare`, so that it is PID 1 of a new PID
namespace, in new mount, network, IPC and UTS namespaces. The configuration arrives as one JSON
line on stdin; results leave as JSON lines on a pipe (`result_fd`) that no untrusted process holds.

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
  3. install the seccomp filter built by `executors.seccomp` (inherited by every child).
Then each program (`exec` mode) or each expression (`batch` mode) runs in a forked child that
first closes the result pipe. After each one, this process (PID 1) kills every other process of
the namespace (`kill(-1)`), reaps them and empties /work, so nothing of one answer survives into the
next. Signals sent from inside the namespace cannot kill PID 1. Stage mode (`stage ARGV_JSON`)
is the root-only step before `bwrap`: it makes the interpreter's prefix reachable for the
throwaway uid in a private mount namespace, drops to that uid and execs `bwrap`.

This file imports only the standard library and must stay that way.
"""
from __future__ import annotations

import ctypes
import io
import json
import os
import resource
import select
import signal
import socket
import sys
import time
import traceback

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


# ----------------------------------------------------------------------------- running code

def _user_processes() -> int:
    uid, n = str(os.getuid()), 0
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/status") as f:
                n += any(line.startswith("Uid:") and line.split()[1] == uid for line in f)
        except OSError:
            pass
    return n


def _set_child_limits(limits: dict, cpu_s: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)


def _install_hook(allowed: tuple[str, ...]) -> None:
    """An extra layer only: refuses spawning, sockets, ctypes and files outside the view."""
    denied = ("socket.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
              "ctypes.", "os.kill", "os.killpg")
    paths = ("open", "os.listdir", "os.scandir", "os.rename", "os.symlink", "os.link")

    def hook(event: str, args: tuple) -> None:
        if event.startswith(denied):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].split(".")[0] in ("ctypes", "_ctypes"):
            raise PermissionError(f"sandbox: import {args[0]} is not allowed")
        if event in paths and args and isinstance(args[0], (str, bytes)):
            p = os.path.abspath(os.fsdecode(args[0]))
            if not (p + "/").startswith(allowed):
                raise PermissionError(f"sandbox: access to {p} is outside the working directory")

    sys.addaudithook(hook)


def _child_setup(cfg: dict, result_fd: int, cpu_s: int, quiet: bool) -> None:
    """In the forked child, before untrusted code: no result pipe, limits, own process group."""
    os.close(result_fd)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    if quiet:
        os.dup2(null, 1)
        os.dup2(null, 2)
    os.close(null)
    if not cfg["pid1"]:
        os.setpgid(0, 0)
    _set_child_limits(cfg["limits"], cpu_s)
    if cfg["audit_hook"]:
        _install_hook(tuple(p.rstrip("/") + "/" for p in cfg["allowed_paths"]))


def _exec_child(cfg: dict, code: str) -> int:
    try:
        exec(compile(code, "<untrusted>", "exec"), {"__name__": "__main__",
                                                   "__builtins__": __builtins__})
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - any failure of untrusted code is a result
        traceback.print_exc()
        if isinstance(e, OSError) and any(f.filename.endswith("socket.py")
                                          for f in traceback.extract_tb(e.__traceback__)):
            print("sandbox: socket denied", file=sys.stderr)
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a closed or full pipe: nothing left to say
        pass
    return status


def _kill_rest(cfg: dict, pid: int) -> None:
    """Kill everything the program left, then reap it (PID 1 adopts every orphan)."""
    try:
        if cfg["pid1"]:
            os.kill(-1, signal.SIGKILL)  # from PID 1: every other process of the namespace
        else:
            os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    while True:
        try:
            if os.waitpid(-1, 0)[0] == 0:
                break
        except ChildProcessError:
            break


def _wait(pid: int, deadline: float) -> int | None:
    """The child's wait status, or None when the deadline passed first."""
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if select.select([pidfd], [], [], left)[0]:
                return os.waitpid(pid, 0)[1]
    finally:
        os.close(pidfd)


def _wipe(top: str) -> None:
    """Empty the working directory between answers (even of unwritable directories)."""
    for root, dirs, _ in os.walk(top):
        for d in dirs:
            try:
                os.chmod(os.path.join(root, d), 0o700, follow_symlinks=False)
            except OSError:
                pass
    for root, dirs, files in os.walk(top, topdown=False):
        for name in files:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for d in dirs:
            p = os.path.join(root, d)
            try:
                os.unlink(p) if os.path.islink(p) else os.rmdir(p)
            except OSError:
                pass


def run_exec(cfg: dict, out: io.TextIOWrapper) -> None:
    pid = os.fork()
    if pid == 0:
        _child_setup(cfg, cfg["result_fd"], cfg["limits"]["cpu_s"], quiet=False)
        os._exit(_exec_child(cfg, cfg["payload"]) & 0xFF)
    status = _wait(pid, time.monotonic() + cfg["limits"]["wall_s"])
    _kill_rest(cfg, pid)
    if status is None:
        _emit(out, {"exit": None, "timeout": True})
    elif os.WIFSIGNALED(status):
        _emit(out, {"exit": -os.WTERMSIG(status)})
    else:
        _emit(out, {"exit": os.WEXITSTATUS(status)})


def _eval_child(expr: str, w: int) -> None:
    try:
        value = eval(compile(expr, "<answer>", "eval"), {"__builtins__": {}})
        res = {"status": "ok", "value": repr(value)[:64]}
    except BaseException as e:  # noqa: BLE001 - any failure of untrusted code is a result
        res = {"status": "error", "error": f"{type(e).__name__}: {str(e)[:80]}"}
    os.write(w, json.dumps(res).encode())


def _item_result(data: bytes, status: int | None) -> dict:
    if data:
        try:  # the answer's own process wrote this: it can only describe itself, so check shape
            res = json.loads(data)
            if isinstance(res, dict) and res.get("status") in ("ok", "error"):
                return {"status": res["status"], **{k: str(res[k])[:100] for k in ("value", "error")
                                                    if k in res}}
        except ValueError:
            pass
        return {"status": "error", "error": "malformed result"}
    if status is None:
        return {"status": "timeout", "error": "per-answer time limit"}
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    return {"status": "timeout" if sig in (signal.SIGKILL, signal.SIGXCPU) else "error",
            "error": f"killed by signal {sig}" if sig else "no result"}


def run_batch(cfg: dict, out: io.TextIOWrapper) -> None:
    per_item = cfg["limits"]["per_item_s"]
    cpu_s = max(int(per_item + 0.999), 1)
    for i, expr in enumerate(cfg["payload"]):
        t0 = time.time()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child_setup(cfg, cfg["result_fd"], cpu_s, quiet=True)
            _eval_child(str(expr), w)
            os._exit(0)
        os.close(w)
        deadline = time.monotonic() + per_item
        data, status = b"", None
        while len(data) <= 4096:  # a well-formed answer is far shorter; more is not read
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                break
            chunk = os.read(r, 4096)
            if not chunk:
                status = _wait(pid, deadline)
                break
            data += chunk
        os.close(r)
        _kill_rest(cfg, pid)
        res = _item_result(data if status is not None or data else b"", status)
        _wipe(os.getcwd())
        _emit(out, {"item": i, **res, "ts": t0, "dur": time.time() - t0})
    _emit(out, {"exit": 0})


def _emit(out: io.TextIOWrapper, frame: dict) -> None:
    out.write(json.dumps(frame) + "\n")
    out.flush()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "stage":
        stage(json.loads(sys.argv[2]))
        return
    cfg = json.loads(sys.stdin.readline())
    out = os.fdopen(cfg["result_fd"], "w")
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores what it has no handler for
    try:
        if cfg.get("setup"):
            build_root(cfg["setup"])
        elif cfg.get("work_tmpfs"):  # bwrap kept CAP_SYS_ADMIN (of its user namespace) for this
            mount_work(cfg["work_tmpfs"], SANDBOX_UID)
        os.chdir(cfg.get("workdir") or WORK)
        # Python itself sets LC_CTYPE (C locale coercion) and bwrap sets PWD; anything else leaked.
        leaked = set(os.environ) - {"PWD", "LC_CTYPE"}
        os.environ.clear()
        active = [cfg["backend"]] + (["uid"] if cfg.get("throwaway_uid") else [])
        active += verify(cfg) + (["empty_env"] if not leaked else []) + drop_privileges()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # In a user namespace of its own the count starts at zero; without one (the weak
        # opt-out) it includes every process of the user, so the limit goes on top of those.
        base = _user_processes() if cfg["backend"] == "weak" else 0
        resource.setrlimit(resource.RLIMIT_NPROC, (base + cfg["limits"]["processes"],) * 2)
        active += ["rlimit_cpu", "rlimit_as", "rlimit_fsize", "rlimit_nproc", "rlimit_core"]
        if cfg.get("seccomp"):
            install_seccomp(bytes.fromhex(cfg["seccomp"]))
            active.append("seccomp")
        if cfg["audit_hook"]:
            active.append("audit_hook")
        missing = [] if cfg["backend"] == "weak" else sorted(REQUIRED - set(active))
        if missing:  # a protection that did not verify is a sandbox that is not there
            raise OSError(f"protections not in force: {', '.join(missing)}")
    except OSError as e:
        _emit(out, {"setup_error": str(e)})
        sys.exit(70)
    _emit(out, {"protections": active})
    cfg["pid1"] = os.getpid() == 1
    (run_batch if cfg["mode"] == "batch" else run_exec)(cfg, out)


if __name__ == "__main__":
    main()
