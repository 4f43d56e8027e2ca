"""The runner half of a sandboxed run: PID 1 of the sandbox runs the answers, each in a process of its own.

`executors.sandbox` starts `_sandbox_setup.py`'s source followed by this file's as one program
(compiled by the host and sent first on stdin, or `python -I -S -c SOURCE`); the set-up half has
built and checked the sandbox when `main` reaches a mode. The host writes a stream of messages on
stdin (`read_message`: ten decimal digits, a newline, the bytes): first the configuration, which
PID 1 reads; then each answer's code, which the child that runs it reads itself, exactly, before
closing stdin and running it. So PID 1
never holds an answer's text, and nothing of one answer is in another's address space (each is
forked from PID 1 before its own text is read). Results leave as JSON lines on a pipe
(`result_fd`) that only PID 1 holds.

Modes:
  exec   one program in one child;
  batch  many short expressions (tool calls, verify), one child each, one at a time: a child
         writes its result on its own pipe, which PID 1 copies to the host unparsed through one
         reused buffer that it zeroes; after each answer PID 1 kills every other process of the
         namespace (`kill(-1)`), reaps them and returns /work to its first state in a child of
         its own. A failure of
         PID 1 on one answer is that answer's result; when it can no longer keep answers apart, it
         stops and the host starts a fresh sandbox for the rest;
  tests  unit tests graded outside the graded process (`_sandbox_judge.py`): the solution is served
         by a child forked before the tests reach PID 1, which runs them and calls the solution
         over a pipe.
Signals sent from inside the namespace cannot kill PID 1, and seccomp keeps its limits and
scheduling out of the answers' reach.

This file imports only the standard library and must stay that way.
"""
import json
import marshal
import os
import resource
import select
import signal
import sys
import time
import traceback

TYPE_CHECKING = False
if TYPE_CHECKING:  # in the sandbox the set-up half precedes this source and defines these
    from executors._sandbox_setup import (
        REQUIRED,
        SANDBOX_UID,
        WORK,
        build_root,
        drop_privileges,
        install_seccomp,
        mount_work,
        verify,
    )

HEADER = 11  # a message's length: ten decimal digits and a newline
RESULT_MAX = 4096  # bytes of one batch answer's result read (a well-formed one is far shorter)


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


def _read_exact(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_message(fd: int = 0) -> bytes:
    """One message of the host's stream on stdin: ten decimal digits, a newline, the bytes.
    Read exactly, never ahead: what follows belongs to another process."""
    head = _read_exact(fd, HEADER)
    if len(head) != HEADER or not head[:-1].isdigit() or head[-1:] != b"\n":
        raise OSError("sandbox: the host's message stream is cut or malformed")
    data = _read_exact(fd, int(head[:-1]))
    if len(data) != int(head[:-1]):
        raise OSError("sandbox: the host's message stream is cut")
    return data


def _take_message(ready_fd: int | None) -> str:
    """In a forked child, before any untrusted code: its own message, then stdin closed (the
    next messages are other answers' or the tests); a ready byte tells PID 1 it is done."""
    data = read_message(0)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if ready_fd is not None:
        os.write(ready_fd, b"R")
    return data.decode("utf-8", "surrogatepass")


def _set_child_limits(limits: dict, cpu_s: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)


def _child_setup(cfg: dict, keep: list[int], cpu_s: int, quiet: bool) -> None:
    """In the forked child, before untrusted code: no descriptor but stdio and `keep` (never the
    result pipe), limits, its own process group."""
    top = max([2, *keep]) + 1
    for fd in range(3, top):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    os.closerange(top, 1024)
    if quiet:
        null = os.open("/dev/null", os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    if not cfg["pid1"]:
        os.setpgid(0, 0)
    _set_child_limits(cfg["limits"], cpu_s)


def _exec_child(code: str) -> int:
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


def _ended(status: int | None) -> dict:
    if status is None:
        return {"exit": None, "timeout": True}
    if os.WIFSIGNALED(status):
        return {"exit": -os.WTERMSIG(status)}
    return {"exit": os.WEXITSTATUS(status)}


def _empty_at(fd: int) -> None:
    """Remove everything in the directory open at `fd` (even unwritable directories; symlinks
    never followed; by names relative to open directories, so that depth cannot make a path
    too long)."""
    with os.scandir(fd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in names:
        if not is_dir:
            os.unlink(name, dir_fd=fd)
            continue
        os.chmod(name, 0o700, dir_fd=fd)
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        try:
            _empty_at(sub)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=fd)


def _swept(cfg: dict) -> bool:
    """Return the working directory to its first state between answers (no entry, no extended
    attribute, its mode, fixed times: nothing an answer leaves there reaches the next), in a child
    of its own, so that no name an answer wrote enters PID 1's memory; whether that worked."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chmod(".", 0o700)
            top = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
            _empty_at(top)
            for name in os.listxattr(top):
                os.removexattr(top, name)
            os.utime(top, (0, 0))
            code = 0 if not os.listdir(top) and not os.listxattr(top) else 1
        finally:
            os._exit(code)
    status = _wait(pid, time.monotonic() + 10.0)
    _kill_rest(cfg, pid)
    return status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def run_exec(cfg: dict, out: int) -> None:
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            program = _take_message(None)
            _child_setup(cfg, [], cfg["limits"]["cpu_s"], quiet=False)
            code = _exec_child(program)
        finally:
            os._exit(code & 0xFF)
    status = _wait(pid, time.monotonic() + cfg["limits"]["wall_s"])
    _kill_rest(cfg, pid)
    _send(out, _ended(status))


def _eval_child(expr: str, w: int) -> None:
    try:
        value = eval(compile(expr, "<answer>", "eval"), {"__builtins__": {}})
        res = {"status": "ok", "value": repr(value)[:64]}
    except BaseException as e:  # noqa: BLE001 - any failure of untrusted code is a result
        res = {"status": "error", "error": f"{type(e).__name__}: {str(e)[:80]}"}
    os.write(w, json.dumps(res).encode())


def _batch_item(cfg: dict, cpu_s: int, buf: bytearray) -> tuple[int, dict]:
    """Run the next answer in a child of its own: it reads its expression from stdin itself, so
    that PID 1 never holds an answer's text. Its result is read into `buf`, never into a new
    object; returns the bytes read (the ready byte first) and how the child ended."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            expr = _take_message(w)
            _child_setup(cfg, [w], cpu_s, quiet=True)
            _eval_child(expr, w)
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + cfg["limits"]["per_item_s"]
    got, status, ended = 0, None, False
    view = memoryview(buf)
    while got < len(buf):  # a well-formed result is far shorter; more is not read
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            break
        n = os.readv(r, [view[got:]])
        if not n:  # every holder of the pipe is gone: the child ended
            status, ended = _wait(pid, deadline), True
            break
        got += n
    view.release()
    os.close(r)
    _kill_rest(cfg, pid)
    if status is not None and os.WIFSIGNALED(status):
        return got, {"signal": os.WTERMSIG(status)}
    return got, {} if ended and status is not None else {"timeout": got < len(buf)}


def run_batch(cfg: dict, out: int) -> None:
    """Each answer in its own forked child, one at a time; between answers every other process
    of the namespace is killed and /work emptied. A per-answer failure is that answer's frame;
    when this process can no longer keep answers apart (its input stream or /work), it stops and
    the host starts a fresh sandbox for the rest."""
    cpu_s = max(int(cfg["limits"]["per_item_s"] + 0.999), 1)
    buf = bytearray(RESULT_MAX + 1)  # the ready byte and the result, reused and zeroed
    os.utime(".", (0, 0))  # /work's first state, as the sweep leaves it after each answer
    for i in range(cfg["items"]):
        _send(out, {"start": i})
        t0 = time.time()
        try:
            got, ended = _batch_item(cfg, cpu_s, buf)
            ready = got > 0 and buf[0] == ord("R")
            raw = memoryview(buf)[1:got] if ready else memoryview(buf)[0:0]
            _send(out, {"item": i, "raw": len(raw), "ts": t0, "dur": time.time() - t0, **ended},
                  raw)
            raw.release()
            buf[:got] = bytes(got)
        except Exception as e:  # noqa: BLE001 - PID 1's own failure on this answer: its verdict
            _kill_rest(cfg, 0)
            _send(out, {"item": i, "failed": f"{type(e).__name__}: {e}"[:200], "ts": t0,
                        "dur": time.time() - t0})
            ready = False
        if not ready:
            _send(out, {"stopped": "an answer's input was not read whole"})
            return
        if not _swept(cfg):
            _send(out, {"stopped": "the working directory could not be emptied"})
            return
    _send(out, {"exit": 0})


def run_tests(cfg: dict, out: int) -> None:
    """Unit tests, graded outside the graded process: the solution is served by a child forked
    before the tests reach this process (it reads its code from stdin itself); this process then
    reads the tests and runs them, calling the solution over a pipe (`_sandbox_judge`)."""
    blob = read_message(0)  # the judge's code, compiled or its source (trusted: the host's)
    judge: dict = {"__name__": "placer_sandbox_judge"}
    exec(marshal.loads(blob) if cfg["compiled"] else compile(blob.decode(), "<judge>", "exec"),
         judge)
    deadline = time.monotonic() + cfg["limits"]["wall_s"]
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.close(req_w)
            os.close(rep_r)
            solution = _take_message(rep_w)
            _child_setup(cfg, [req_r, rep_w], cfg["limits"]["cpu_s"], quiet=False)
            judge["serve"](solution, req_r, rep_w)
            code = 0
        finally:
            os._exit(code)
    os.close(req_r)
    os.close(rep_w)
    chan = judge["Channel"](req_w, rep_r, deadline)
    timed_out = not chan.ready()
    if not timed_out:
        tests = json.loads(read_message(0))
        timed_out = not judge["judge"](tests, chan, lambda frame: _send(out, frame))
    os.close(req_w)  # the solution's process ends at the end of its requests
    status = None if timed_out else _wait(pid, deadline)
    _kill_rest(cfg, pid)
    os.close(rep_r)
    _send(out, _ended(status))


def _send(out: int, frame: dict, raw: memoryview | None = None) -> None:
    """A result frame: one JSON line, then `raw` bytes and a newline when given."""
    parts: list[bytes | memoryview] = [json.dumps(frame).encode() + b"\n"]
    if raw is not None:
        parts += [raw, b"\n"]
    for part in parts:
        view = memoryview(part)
        while view:
            view = view[os.write(out, view):]


MODES = {"exec": run_exec, "batch": run_batch, "tests": run_tests}


def main() -> None:
    cfg = json.loads(read_message(0))
    out = cfg["result_fd"]
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
        missing = [] if cfg["backend"] == "weak" else sorted(REQUIRED - set(active))
        if missing:  # a protection that did not verify is a sandbox that is not there
            raise OSError(f"protections not in force: {', '.join(missing)}")
    except OSError as e:
        _send(out, {"setup_error": str(e)})
        sys.exit(70)
    _send(out, {"protections": active})
    cfg["pid1"] = os.getpid() == 1
    MODES[cfg["mode"]](cfg, out)


if __name__ == "__main__":
    main()
