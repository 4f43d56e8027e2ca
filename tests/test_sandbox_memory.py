"""Memory is capped for the whole sandbox: anonymous memory, memfd files, shared memory and every
process together stay within the cap (+10%), and an answer over it ends as its own result.

Per-process rlimits do not count memfd pages or System V shared memory, nor the sum over a dozen
processes; a cgroup around each sandbox does (`executors.cgroups`). Each attack runs with the
machine's cgroup (`cgroup="auto"`; the fallback where none can be had) and with none
(`cgroup="none"`: rlimits, with memfd and shm refused), on each backend the machine has. An
attack prints the MiB it holds after each step, so the most it reached is in its output; where a
cgroup caps the run, its peak is measured too. `test_sandbox_unprivileged.py` runs this file
again as an unprivileged user (with a cgroup delegated to it when the suite runs as root).
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgroup_util import child_cgroups

from executors import cgroups
from executors.sandbox import Limits, Sandbox

BACKENDS = ["bwrap", "unshare"] if shutil.which("bwrap") else ["unshare"]
MIB = 2**20
CAP = 256 * MIB
LIMITS = Limits(wall_s=8.0, cpu_s=4, memory_bytes=CAP, processes=32, per_item_s=3.0)

MEMFD = """
import os
chunk, held, fds = b'x' * (15 << 20), 0, []
try:
    for _ in range(96):
        fd = os.memfd_create('x')
        os.write(fd, chunk)
        fds.append(fd)
        held += 15
        print(held, flush=True)
except OSError as e:
    print('refused', e.errno, flush=True)
"""
SHM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
held = 0
for _ in range(12):
    sid = libc.shmget(0, 128 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if sid < 0:
        print('refused', ctypes.get_errno(), flush=True)
        break
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 1, 128 << 20)
    libc.shmdt(ctypes.c_void_p(addr))  # the segment stays, unmapped: no address space held
    held += 128
    print(held, flush=True)
"""
PROCESSES = """
import os, select, time
r, w = os.pipe()
for _ in range(12):
    if os.fork() == 0:
        os.close(r)
        block = b'x' * (150 << 20)
        os.write(w, b'1')
        time.sleep(60)
        os._exit(0)
os.close(w)
held, t0 = 0, time.time()
while time.time() - t0 < 1.5 and held < 12 * 150:
    if not select.select([r], [], [], 0.2)[0]:
        continue
    if not os.read(r, 1):
        break
    held += 150
    print(held, flush=True)
"""


@pytest.fixture(scope="module", params=[(b, c) for b in BACKENDS for c in ("auto", "none")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def sb(request: pytest.FixtureRequest) -> Sandbox:
    backend, cgroup = request.param
    return Sandbox(LIMITS, backend=backend, cgroup=cgroup)


def _most_held(stdout: str) -> int:
    return max([int(x) for x in stdout.split() if x.isdigit()] or [0])


@pytest.mark.parametrize("attack", ["memfd", "shm"])
def test_memory_no_rlimit_counts_is_capped(sb: Sandbox, attack: str) -> None:
    """memfd files and System V shared memory, which no address-space limit counts: 96 x 15 MiB
    and 12 x 128 MiB under a 256 MiB cap."""
    r = sb.run(MEMFD if attack == "memfd" else SHM)
    assert _most_held(r.stdout) * MIB <= 1.1 * CAP, r
    if attack == "shm" or not sb.caps.capped:  # refused outright (EPERM)
        assert "refused 1" in r.stdout and r.ok, r
    else:
        assert r.status == "memory_limit" and r.memory_peak_bytes is not None, r
        assert r.memory_peak_bytes <= 1.1 * CAP, r


def test_many_processes_together_are_capped(sb: Sandbox) -> None:
    """Twelve processes of 150 MiB each, every one under its own address-space limit."""
    if not sb.caps.capped:  # the fallback caps each process only, and says so (not run: 1.8 GB)
        r = sb.run("pass")
        assert "memfd_refused" in r.protections and "cgroup_memory" not in r.protections
        return
    r = sb.run(PROCESSES)
    assert {"cgroup_memory", "cgroup_pids"} <= set(r.protections), r
    assert r.memory_peak_bytes is not None and r.memory_peak_bytes <= 1.1 * CAP, r


def test_a_memory_hog_in_a_batch_is_its_own_result(sb: Sandbox) -> None:
    """Through the environment's batch: the hog ends as its own result; the others are exact."""
    get_os = ("[c for c in ().__class__.__base__.__subclasses__() "
              "if c.__name__ == '_wrap_close'][0].__init__.__globals__")
    hog = f"(lambda b: b['exec']({MEMFD!r}, {{'__builtins__': b}}))({get_os}['__builtins__'])"
    r = sb.run_batch(["1+2", hog, "3*4", hog, "5*5"])
    assert r.ok and r.values is not None, r
    assert [(v["status"], v.get("value")) for v in r.values[0::2]] == [
        ("ok", "3"), ("ok", "12"), ("ok", "25")], r.values
    for v in r.values[1::2]:
        assert v["status"] == ("memory_limit" if sb.caps.capped else "ok"), v


@pytest.fixture
def no_cgroup_found(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cgroups, "_candidates", lambda: [])
    yield


def test_without_cgroups_the_fallback_is_said_once(no_cgroup_found: None,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    found = cgroups.support.__wrapped__()
    assert not found.capped
    err = capsys.readouterr().err
    assert err.count("WARNING: sandbox: no cgroup can cap") == 1 and "memfd_create" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="delegating a cgroup needs root")
def test_a_delegated_cgroup_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PLACER_SANDBOX_CGROUP` names cgroups delegated to the user (here, this machine's own
    cgroup as found: v2, or v1's memory and pids directories)."""
    found = cgroups.support()
    if not found.capped or found.kind == "systemd-run":
        pytest.skip(f"no cgroup directory to delegate from here ({found.kind or found.reason})")
    with child_cgroups(found, "test") as made:
        monkeypatch.setenv(cgroups.ENV, ":".join(made))
        given = cgroups.support.__wrapped__()
        assert given.kind == found.kind and set(given.parents.values()) == set(made), given
        sb = Sandbox(LIMITS)
        sb.caps = given
        r = sb.run(MEMFD)
        assert r.status == "memory_limit" and "cgroup_memory" in r.protections, r
        assert r.memory_peak_bytes is not None and r.memory_peak_bytes <= 1.1 * CAP, r
        assert all(not os.listdir(d) or all(not n.startswith(cgroups.PREFIX)
                                             for n in os.listdir(d)) for d in made)


def test_the_caps_each_kind_of_cgroup_gets(tmp_path: Path) -> None:
    """What each kind writes and how it starts the launcher, on a stand-in directory for v2 and
    v1 (the machine has one kind at most) and for systemd-run. A regression guard of the file and
    property names, which the kernel and systemd define."""
    v2 = cgroups.RunCgroup(cgroups.Support("v2", {"unified": str(tmp_path)}), 2**28, 36)
    d = Path(v2.dirs["unified"])
    assert {f: (d / f).read_text() for f in ("memory.max", "memory.swap.max", "pids.max")} == {
        "memory.max": str(2**28), "memory.swap.max": "0", "pids.max": "36"}
    assert v2.wrap(["bwrap", "x"]) == ["/bin/sh", "-c", cgroups.ENTER, "sh",
                                       str(d / "cgroup.procs"), "--", "bwrap", "x"]
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (d / "memory.peak").write_text("268435456\n")
    assert (v2.oom_kills(), v2.peak_bytes()) == (1, 2**28)
    mem, pids = tmp_path / "memory", tmp_path / "pids"
    mem.mkdir()
    pids.mkdir()
    v1 = cgroups.RunCgroup(cgroups.Support("v1", {"memory": str(mem), "pids": str(pids)}),
                           2**28, 36)
    assert (Path(v1.dirs["memory"]) / "memory.limit_in_bytes").read_text() == str(2**28)
    assert (Path(v1.dirs["pids"]) / "pids.max").read_text() == "36"
    assert v1.protections() == ["cgroup_memory", "cgroup_pids"]
    unit = cgroups.RunCgroup(cgroups.Support("systemd-run"), 2**28, 36)
    argv = unit.wrap(["bwrap", "x"])
    assert argv[argv.index("--scope"):] == [
        "--scope", "--collect", "--unit", unit.name, "-p", f"MemoryMax={2**28}",
        "-p", "MemorySwapMax=0", "-p", "TasksMax=36", "--", "bwrap", "x"]


def test_cgroups_left_by_dead_processes_are_removed(tmp_path: Path) -> None:
    dead, mine, other = (f"{cgroups.PREFIX}999999999-ab", f"{cgroups.PREFIX}{os.getpid()}-cd",
                         "someone-elses")
    for name in (dead, mine, other):
        (tmp_path / name).mkdir()
    cgroups._remove_stale(cgroups.Support("v2", {"unified": str(tmp_path)}))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine, other])
