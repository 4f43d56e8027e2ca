"""The trusted bootstrap of a sandboxed run: lock the process down, then run untrusted code.

Started by `executors.sandbox` as `python -I -S _sandbox_runner.py CONFIG_JSON` in a new session
(its own process group) with an empty temporary directory as its working directory. It reads the
untrusted code from stdin, then, before running a line of it:

  1. leaves the network namespace (`unshare(CLONE_NEWNET)`: no interfaces but a down loopback);
  2. sets rlimits: CPU seconds, address space, file size, process count, no core files;
  3. sets no_new_privs and, when started as root, drops to a throwaway uid/gid that owns nothing
     but the working directory (so RLIMIT_NPROC counts only the sandbox's own processes and every
     leftover process can be found and killed by uid);
  4. installs an audit hook (PEP 578) that refuses sockets, process spawning (exec, system,
     posix_spawn), ctypes, and any file access outside the working directory and the
     interpreter's own library;
and writes the list of protections that took effect to the status pipe. Modes: `exec` runs one
program; `batch` evaluates a JSON list of expressions, each in a forked child with its own alarm,
and prints a JSON list of results, so that a step's many answers cost one interpreter start.
This file imports only the standard library and must stay that way (it runs with -I -S).
"""
import json
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38


def _libc():
    import ctypes  # imported before the hook forbids it; the hook blocks later imports
    return ctypes.CDLL(None, use_errno=True)


# Imported before the uid drop: the interpreter's library may be unreadable to the throwaway uid
# (e.g. under /root), so untrusted code gets these and whatever is built in. socket is loaded so
# that a program fails on the policy (audit hook, no network), not on a missing module.
PRELOAD = ("math", "re", "json", "itertools", "collections", "functools", "string", "random",
           "statistics", "fractions", "decimal", "heapq", "bisect", "operator", "socket",
           "encodings.idna")


def lock_down(cfg: dict) -> list:
    active = []
    for name in PRELOAD:
        __import__(name)
    libc = _libc()
    if cfg.get("netns", True) and libc.unshare(CLONE_NEWNET) == 0:
        active.append("netns")
    limits = cfg["limits"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    active += ["rlimit_cpu", "rlimit_as", "rlimit_fsize"]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        active.append("no_new_privs")
    uid = cfg.get("uid")
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        active.append("uid")
    # Without a private uid the count includes every process of the user; still set it, but
    # above what the user already runs, so that the limit bounds the sandbox's own growth.
    base = 0 if "uid" in active else _user_processes()
    resource.setrlimit(resource.RLIMIT_NPROC, (base + limits["processes"],) * 2)
    active.append("rlimit_nproc")
    if cfg.get("audit_hook", True):
        _install_hook(os.getcwd())
        active.append("audit_hook")
    return active


def _user_processes() -> int:
    uid, n = str(os.getuid()), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            n += line.split()[1] == uid
                            break
            except OSError:
                pass
    return n


def _install_hook(workdir: str) -> None:
    allowed = tuple({os.path.realpath(p) + os.sep for p in (sys.base_prefix, sys.prefix)
                     if p} | {os.path.realpath(workdir) + os.sep})
    denied_events = ("socket.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                     "subprocess.Popen", "ctypes.", "os.chroot", "os.kill", "os.killpg")

    def hook(event, args):
        if event.startswith(denied_events):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].split(".")[0] in ("ctypes", "_ctypes", "socket",
                                                           "_socket"):
            raise PermissionError(f"sandbox: import {args[0]} is not allowed")
        if event in ("open", "os.listdir", "os.scandir", "os.chdir", "os.rename", "os.remove",
                     "os.rmdir", "os.mkdir", "shutil.rmtree", "os.symlink", "os.link"):
            path = args[0] if args else None
            if isinstance(path, int) or path is None:
                return  # an already-open descriptor: it was opened under this hook
            p = os.path.realpath(os.fsdecode(path))
            if not (p + os.sep).startswith(allowed) and not p.startswith(allowed):
                raise PermissionError(f"sandbox: access to {p} is outside the working directory")

    sys.addaudithook(hook)


def run_batch(exprs: list, per_item_s: float, out_fd: int, null_fd: int) -> None:
    results = []
    for expr in exprs:
        t0 = time.time()
        res = _eval_forked(expr, per_item_s, null_fd)
        res.update(ts=t0, dur=time.time() - t0)  # each answer is one tool call in the trace
        results.append(res)
    os.write(out_fd, json.dumps(results).encode())


def _eval_forked(expr: str, per_item_s: float, null_fd: int) -> dict:
    alarm = max(int(per_item_s + 0.999), 1)
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        return {"status": "error", "error": f"fork: {e}"}
    if pid == 0:
        os.close(r)
        os.dup2(null_fd, 1)
        signal.alarm(alarm)
        try:
            value = eval(compile(expr, "<answer>", "eval"), {"__builtins__": {}})
            out = {"status": "ok", "value": repr(value)[:64]}
        except BaseException as e:  # noqa: BLE001 - any failure of untrusted code is a result
            out = {"status": "error", "error": f"{type(e).__name__}: {str(e)[:80]}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    # The child's alarm ends it (SIGALRM's default action) even inside C code; the parent only
    # reads and reaps. It never signals (the hook forbids os.kill in this process).
    ready, _, _ = select.select([r], [], [], alarm + 1)
    data = os.read(r, 65536) if ready else b""
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if data:
        return json.loads(data)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    return {"status": "timeout" if sig in (signal.SIGKILL, signal.SIGALRM, signal.SIGXCPU)
            else "error", "error": f"killed by signal {sig}" if sig else "no result"}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    status_fd = cfg["status_fd"]
    code = sys.stdin.read()
    out_fd = os.dup(1)
    null_fd = os.open(os.devnull, os.O_WRONLY)
    active = lock_down(cfg)
    os.write(status_fd, json.dumps(active).encode())
    os.close(status_fd)
    if cfg["mode"] == "batch":
        run_batch(json.loads(code), cfg["limits"]["per_item_s"], out_fd, null_fd)
        return
    exec(compile(code, "<untrusted>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
