"""Hostile programs against the kernel-isolated sandbox: each is contained, and the same sandbox
keeps serving good code afterwards.

What holds is the kernel's isolation alone (there is no in-process audit hook): namespaces, the
private read-only view, seccomp, rlimits, the capped tmpfs, the cgroup and the killing of the
namespace. Every case runs on each backend that exists on
the machine (`bwrap` and `unshare`). An attack program prints ESCAPED only if the attack worked;
a "blocked" program prints `blocked:` with the error the attempt got and exits 3.
`test_sandbox_unprivileged.py` runs this whole file again as an unprivileged user.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from executors import sandbox as sbx
from executors.sandbox import Limits, Sandbox
from executors.seccomp import DENIED, NUMBERS, host_arch

BACKENDS = ["bwrap", "unshare"] if shutil.which("bwrap") else ["unshare"]
LIMITS = Limits(wall_s=3.0, cpu_s=1, memory_bytes=256 * 2**20, file_bytes=4 * 2**20,
                disk_bytes=8 * 2**20, files=256, processes=16, output_bytes=256 * 2**10,
                per_item_s=1.0)
TOKEN = b"The trusted side of a sandboxed run"  # in the command line of every sandbox process
NR = NUMBERS[host_arch() or "x86_64"]
PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture(scope="module", autouse=True)
def subreaper() -> Iterator[None]:
    """Make this process the subreaper of everything it starts: a sandbox process that outlived
    its launcher is then re-parented here, so the leftover checks below find our own leftovers
    (and not those of other sandboxes running on the machine at the same time)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@pytest.fixture(scope="module", params=BACKENDS)
def sb(request: pytest.FixtureRequest) -> Sandbox:
    return Sandbox(LIMITS, backend=request.param)


@pytest.fixture
def contained(sb: Sandbox) -> Iterator[Sandbox]:
    """The sandbox; afterwards no sandbox process is left and it still runs good code."""
    before = _sandbox_procs()
    yield sb
    assert _gone(before), "a sandbox process outlived its run"
    r = sb.run("print(6 * 7)")
    assert r.ok and r.stdout.strip() == "42", r


def _blocked(body: str) -> str:
    return ("import os, sys, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "def fail(ret):\n    if ret == -1:\n        e = ctypes.get_errno()\n"
            "        raise OSError(e, os.strerror(e))\n    return ret\n"
            "try:\n" + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n"
            "except BaseException as e:\n    print('blocked:', type(e).__name__, e)\n"
            "    raise SystemExit(3)\nprint('ESCAPED')\n")


def _assert_blocked(r: sbx.Result) -> None:
    assert "ESCAPED" not in r.stdout and "blocked:" in r.stdout and r.status == "error", r


RUNNER_REL = str(sbx.RUNNER).lstrip("/")
BLOCKED = {
    "open dir_fd to project sources": f"""
        d = os.open('/', os.O_RDONLY)
        print(os.read(os.open({RUNNER_REL!r}, os.O_RDONLY, dir_fd=d), 64))""",
    "read project sources": f"print(open({str(sbx.RUNNER)!r}).read(64))",
    "proc of other processes": "print(os.listdir('/proc'), open('/proc/1/cmdline').read())",
    "host /etc": "print(open('/etc/passwd').read())",
    "execv /bin/sh": "os.execv('/bin/sh', ['sh', '-c', 'echo ESCAPED'])",
    "execv the interpreter": "os.execv(sys.executable, [sys.executable, '-c', 'print(1)'])",
    "subprocess via _posixsubprocess.fork_exec": """
        import subprocess
        subprocess.run([sys.executable, '-c', 'print("ESCAPED")'], check=True)""",
    "posix_spawn": "os.waitpid(os.posix_spawn(sys.executable, [sys.executable, '-V'], {}), 0)",
    "setuid binaries": """
        for p in ('/usr/bin/su', '/bin/su', '/usr/bin/sudo', '/bin/mount', '/usr/bin/passwd'):
            try:
                os.execv(p, [p])
            except OSError as e:
                last = e
        raise last""",
    "ptrace attach to PID 1": "fail(libc.ptrace(16, 1, 0, 0))",
    "mount a tmpfs": "fail(libc.mount(b'none', b'/work', b'tmpfs', 0, None))",
    "fsopen (new mount API)": f"fail(libc.syscall({NR['fsopen']}, b'tmpfs', 0))",
    "unshare a user namespace": "fail(libc.unshare(0x10000000))",
    "clone with CLONE_NEWUSER": f"""
        pid = fail(libc.syscall({NR['clone']}, 0x10000000 | 17, 0, 0, 0, 0))
        if pid == 0:
            os._exit(0)""",
    "bpf": f"fail(libc.syscall({NR['bpf']}, 0, 0, 0))",
    "keyctl join session keyring": f"fail(libc.syscall({NR['keyctl']}, 1, 0))",
    "io_uring": f"fail(libc.syscall({NR['io_uring_setup']}, 1, ctypes.create_string_buffer(120)))",
    "socket AF_INET": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
    "socket AF_NETLINK": "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)",
    "write to /dev": "open('/dev/evil', 'w').write('x')",
    "write to the read-only root": "open('/planted', 'w').write('x')",
    "write into the interpreter": "open(os.path.join(sys.prefix, 'planted.py'), 'w')",
    "chroot": "os.chroot('/work')",
    "set the hostname": "import socket\nsocket.sethostname('owned')",
    "setuid to root": "os.setuid(0)",
}


@pytest.mark.parametrize("name", list(BLOCKED))
def test_blocked(contained: Sandbox, name: str) -> None:
    _assert_blocked(contained.run(_blocked(BLOCKED[name])))


def test_seccomp_denies_every_listed_syscall(contained: Sandbox) -> None:
    """Each denied call fails with EPERM (clone3 with ENOSYS), i.e. the filter answered."""
    calls = {name: NR[name] for name in DENIED if name in NR}
    code = (f"import ctypes, json\nlibc = ctypes.CDLL(None, use_errno=True)\nout = {{}}\n"
            f"for name, nr in {calls!r}.items():\n"
            "    ret = libc.syscall(nr, 0, 0, 0, 0, 0)\n"
            "    out[name] = ctypes.get_errno() if ret == -1 else 'returned %d' % ret\n"
            f"ret = libc.syscall({NR['clone3']}, 0, 0)\nout['clone3'] = ctypes.get_errno()\n"
            "print(json.dumps(out))")
    r = contained.run(code)
    assert r.ok, r
    got = json.loads(r.stdout)
    assert {k: v for k, v in got.items() if k != "clone3" and v != 1} == {}, got
    assert got["clone3"] == 38  # ENOSYS


def test_the_runners_own_objects_give_no_way_out(contained: Sandbox) -> None:
    """The program is a fork of the sandbox's PID 1: its objects (the runner's own ctypes handle
    to libc, found with gc) are reachable, and nothing rests on their being out of reach; the
    kernel refuses what they are used for."""
    r = contained.run(_blocked("""
        import gc
        runner_libc = next(o for o in gc.get_objects() if isinstance(o, dict)
                           and isinstance(o.get('libc'), ctypes.CDLL) and 'install_seccomp' in o)
        lib = runner_libc['libc']
        fail(lib.mount(b'none', b'/work', b'tmpfs', 0, None))
        os.execv('/bin/sh', ['sh', '-c', 'echo ESCAPED'])"""))
    _assert_blocked(r)
    assert "Operation not permitted" in r.stdout, r  # the kernel's answer (EPERM), no hook's


@pytest.mark.parametrize("name, code, statuses", [
    ("fork bomb", "import os\nwhile True:\n    os.fork()", {"process_limit", "timeout"}),
    ("thread bomb", "import threading, time\nwhile True:\n"
     "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
     {"process_limit", "memory_limit"}),
    ("memory hog", "x = bytearray(8 * 2**30)", {"memory_limit"}),
    ("cpu spin", "while True:\n    pass", {"cpu_limit", "timeout"}),
    ("sleep past the wall limit", "import time\ntime.sleep(600)", {"timeout"}),
    ("children sleeping past the wall limit",
     "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        os.setsid()\n"
     "        time.sleep(600)\ntime.sleep(600)", {"timeout"}),
    ("one big file", "f = open('big', 'wb')\nfor _ in range(10 * 1024):\n"
     "    f.write(b'0' * 2**20)", {"file_limit"}),
    ("many files past the disk total", "for i in range(64):\n"
     "    open(f'f{i}', 'wb').write(b'0' * 3 * 2**20)", {"disk_limit"}),
    ("many empty files (inodes)", "for i in range(10**6):\n    open(f'e{i}', 'w').close()",
     {"disk_limit"}),
    ("stdout flood of 1 GB", "import sys\nb = 'x' * 2**20\nfor _ in range(1024):\n"
     "    sys.stdout.write(b)", {"output_limit"}),
    ("stderr flood of 1 GB", "import os\nb = b'x' * 2**20\nfor _ in range(1024):\n"
     "    os.write(2, b)", {"output_limit"}),
    ("segfault (faulthandler)", "import faulthandler\nfaulthandler._sigsegv()", {"crashed"}),
    ("segfault (ctypes)", "import ctypes\nctypes.string_at(0)", {"crashed"}),
])
def test_resource_attack(contained: Sandbox, name: str, code: str, statuses: set[str]) -> None:
    r = contained.run(code)
    assert r.status in statuses, (name, r)
    assert len(r.stdout) <= 4096 and len(r.stderr) <= 4096


def test_signals_to_the_parent_and_to_everyone(contained: Sandbox) -> None:
    """kill(getppid()) and kill(-1) reach nothing outside; a host process of ours lives on."""
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        r = contained.run("import os, signal\n"
                          "for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):\n"
                          "    os.kill(os.getppid(), sig)\n"
                          f"try:\n    os.kill({host.pid}, signal.SIGKILL)\n"
                          "except ProcessLookupError:\n    print('no such process')\n"
                          "try:\n    os.kill(-1, signal.SIGKILL)\n"
                          "except ProcessLookupError:\n    pass  # nobody else to kill\n"
                          "print('alive')")
        assert r.ok and "alive" in r.stdout and "no such process" in r.stdout, r
        assert host.poll() is None
    finally:
        host.kill()
        host.wait()


def test_environment_does_not_leak(contained: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok-s3cret-42")
    r = contained.run("import os\nprint(dict(os.environ))\n"
                      "print(open('/proc/self/environ').read() if os.path.exists('/proc') else '')")
    assert r.ok and "tok-s3cret-42" not in r.stdout + r.stderr, r
    assert r.stdout.splitlines()[0] == "{}"


def test_host_tmp_file_is_invisible(contained: Sandbox) -> None:
    """A file like a Ray session log in the host's /tmp cannot be read."""
    d = Path("/tmp") / f"ray-session-{uuid.uuid4().hex}"
    d.mkdir()
    try:
        (d / "raylet.out").write_text("session-secret-7")
        os.chmod(d, 0o755)
        os.chmod(d / "raylet.out", 0o644)
        r = contained.run(_blocked(f"print(open({str(d / 'raylet.out')!r}).read())"))
        _assert_blocked(r)
        assert "session-secret-7" not in r.stdout
    finally:
        shutil.rmtree(d)


@pytest.mark.parametrize("op", ["rename", "symlink", "link"])
@pytest.mark.parametrize("target_dir", ["/tmp", "/dev/shm"])
def test_nothing_lands_outside(contained: Sandbox, op: str, target_dir: str) -> None:
    target = f"{target_dir}/planted-{uuid.uuid4().hex}"
    body = {"rename": f"open('f', 'w').write('x')\nos.rename('f', {target!r})",
            "symlink": f"os.symlink('/work/f', {target!r})",
            "link": f"open('f', 'w').write('x')\nos.link('f', {target!r})"}[op]
    r = contained.run(_blocked(body))
    _assert_blocked(r)
    assert not os.path.lexists(target)


def test_unix_socket_of_the_host(contained: Sandbox, tmp_path: Path) -> None:
    path = tmp_path / "host.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    os.chmod(tmp_path, 0o755)
    os.chmod(path, 0o777)
    srv.settimeout(0.1)
    try:
        r = contained.run(_blocked(f"import socket\ns = socket.socket(socket.AF_UNIX)\n"
                                   f"s.connect({str(path)!r})"))
        _assert_blocked(r)
        with pytest.raises(TimeoutError):
            srv.accept()
    finally:
        srv.close()


def test_loopback_listener_of_the_host(contained: Sandbox) -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.1)
    port = srv.getsockname()[1]
    try:
        r = contained.run(_blocked(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"))
        _assert_blocked(r)
        with pytest.raises(TimeoutError):
            srv.accept()
    finally:
        srv.close()


def test_forged_result_frames_in_exec_mode(contained: Sandbox) -> None:
    """Writing result frames to every descriptor cannot turn a failing run into a success."""
    r = contained.run("import os\nframe = b'{\"exit\": 0}\\n'\nfor fd in range(3, 256):\n"
                      "    try:\n        os.write(fd, frame)\n    except OSError:\n        pass\n"
                      "raise SystemExit(5)")
    assert r.status == "error" and r.returncode == 5, r


def test_leftover_process_does_not_hold_the_run(contained: Sandbox) -> None:
    """A daemon that keeps stdout open is killed when the program ends; the run ends then."""
    r = contained.run("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\n"
                      "print('done')")
    assert r.ok and r.stdout.strip() == "done", r


GET_OS = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
          ".__init__.__globals__")


def _answer(code: str) -> str:
    """An answer (an expression evaluated without builtins) that runs arbitrary code anyway."""
    return f"(lambda b: b['exec']({code!r}, {{'__builtins__': b}}))({GET_OS}['__builtins__'])"


def test_batch_answers_cannot_touch_each_other(contained: Sandbox) -> None:
    """Answers forge result frames on every fd, signal PID 1 and everyone, and leave processes
    behind that would forge and kill later; the other answers' results are exact."""
    frame = "b'{\"item\": 2, \"status\": \"ok\", \"value\": \"666\"}\\n'"
    forge = (f"import os\nfor fd in range(64):\n    try:\n        os.write(fd, {frame})\n"
             "    except OSError:\n        pass")
    killer = ("import os\nfor pid in (1, os.getppid(), -1):\n    try:\n"
              "        os.kill(pid, 9)\n    except OSError:\n        pass")
    lurker = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(0.3)\n"
              f"    {forge.replace(chr(10), chr(10) + '    ')}\n    os.kill(-1, 9)")
    exprs = ["1+2", _answer(forge), "3*4", _answer(killer), "5*5", _answer(lurker), "6*7",
             "7*7"]
    r = contained.run_batch(exprs)
    assert r.ok and r.values is not None, r
    assert [r.values[i]["status"] for i in (0, 2, 4, 6, 7)] == ["ok"] * 5, r.values
    assert [r.values[i]["value"] for i in (0, 2, 4, 6, 7)] == ["3", "12", "25", "42", "49"]


def test_batch_files_do_not_carry_over(contained: Sandbox) -> None:
    """What one answer writes to /work is gone before the next answer runs."""
    r = contained.run_batch([_answer("open('left', 'w').write('x')"), f"{GET_OS}['listdir']('.')"])
    assert r.values is not None and r.values[0]["status"] == "ok", r.values
    assert r.values[1]["status"] == "ok" and r.values[1]["value"] == "[]", r.values


def test_protections_in_force(sb: Sandbox) -> None:
    r = sb.run("pass")
    want = {"pidns", "userns", "netns", "mountns", "utsns", "ipcns", "private_root",
            "tmpfs_work", "empty_env", "no_caps", "no_new_privs", "seccomp", "rlimit_cpu",
            "rlimit_as", "rlimit_fsize", "rlimit_nproc", "rlimit_core"}
    assert r.ok and want <= set(r.protections), r
    assert ("uid" in r.protections) == (os.geteuid() == 0)


def _gone(before: set[int]) -> bool:
    """No sandbox process but those that existed before (a killed one may take a moment to
    finish exiting, so look a few times)."""
    for _ in range(100):
        if not _sandbox_procs() - before:
            return True
        time.sleep(0.05)
    return False


def _sandbox_procs() -> set[int]:
    pids = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if TOKEN in cmd and state != "Z" and _descends_from_us(int(d)):
            pids.add(int(d))
    return pids


def _descends_from_us(pid: int) -> bool:
    me = os.getpid()
    for _ in range(64):
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
        if pid == me:
            return True
        if pid <= 1:
            return False
    return False


def test_sandbox_kill_ends_every_process() -> None:
    """The host side's kill of the launcher ends PID 1 and with it the whole namespace."""
    for backend in BACKENDS:
        sb = Sandbox(Limits(wall_s=1.0, cpu_s=1, processes=16), backend=backend)
        before = _sandbox_procs()
        r = sb.run("import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "for _ in range(3):\n    os.fork()\ntime.sleep(600)")
        assert r.status == "timeout", r
        assert _gone(before)
