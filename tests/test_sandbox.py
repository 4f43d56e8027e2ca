"""The code-execution sandbox contains hostile programs and reports how each one ended.

Each case runs through an `EnvWorker` (the environment role's worker class) so that the test also
shows the worker survives: after every hostile program the same worker still runs a good one.
"""
from __future__ import annotations

import os

import pytest

from executors.roles import EnvWorker, RunConfig
from executors.sandbox import Limits, Sandbox, SandboxUnavailable, probe
from executors.sandbox_launch import UID_BASE, uid_of

CFG = RunConfig(algorithm="grpo", arch={}, model_dir="", seed=0, max_new_tokens=4)
LIMITS = Limits(wall_s=3.0, cpu_s=1, memory_bytes=256 * 2**20, file_bytes=8 * 2**20,
                processes=16, per_item_s=1.0)


@pytest.fixture(scope="module")
def worker() -> EnvWorker:
    return EnvWorker(CFG, 0, LIMITS)


def _check_alive(w: EnvWorker) -> None:
    r = w.run_code("print(6 * 7)")
    assert r["status"] == "ok" and r["stdout"].strip() == "42"


def test_protections_reported() -> None:
    active = probe()
    # Root or not: the kernel isolation (namespaces, the private view, seccomp, no capabilities)
    # and the rlimits; a throwaway uid when root; a cgroup's caps, or memfd refused without one.
    assert {"pidns", "userns", "netns", "mountns", "ipcns", "utsns", "private_root", "seccomp",
            "no_caps", "no_new_privs", "rlimit_cpu", "rlimit_as", "rlimit_fsize",
            "rlimit_nproc"} <= set(active)
    assert ("uid" in active) == (os.geteuid() == 0)
    assert {"cgroup_memory", "cgroup_pids"} <= set(active) or "memfd_refused" in active


@pytest.mark.parametrize("name, code, statuses", [
    ("infinite loop", "while True:\n    pass", {"cpu_limit", "timeout"}),
    ("sleeper", "import time\ntime.sleep(60)", {"timeout"}),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", {"process_limit", "timeout", "cpu_limit"}),
    ("memory hog", "x = bytearray(8 * 2**30)", {"memory_limit"}),
    ("10 GB write", "f = open('big', 'wb')\nfor _ in range(10 * 1024):\n    f.write(b'0' * 2**20)",
     {"file_limit"}),
    ("socket connect", "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)",
     {"network_blocked"}),
])
def test_hostile_program_is_contained(worker: EnvWorker, name: str, code: str,
                                      statuses: set[str]) -> None:
    r = worker.run_code(code)
    assert r["status"] in statuses, (name, r)
    assert r["wall_s"] < LIMITS.wall_s + 5  # the wall-clock kill fired (generous: loaded machine)
    _check_alive(worker)


def test_read_outside_directory(worker: EnvWorker, tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    r = worker.run_code(f"print(open({str(secret)!r}).read())")
    # the file is not in the sandbox's view at all
    assert r["status"] == "error" and "FileNotFoundError" in r["stderr"], r
    assert "s3cret" not in r["stdout"]
    _check_alive(worker)


def test_no_process_left_behind(worker: EnvWorker) -> None:
    before = _sandbox_uids()
    worker.run_code("import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n"
                    "        os.setsid()\n        time.sleep(60)\ntime.sleep(60)")
    leftover = [p for p in _sandbox_uids() if p not in before and _alive(p)]
    assert not leftover


def test_network_blocked() -> None:
    """Seccomp refuses the socket, and the namespace has no route out anyway."""
    r = Sandbox(LIMITS).run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert r.status == "network_blocked", r


def test_unavailable_isolation_is_refused_unless_opted_out(monkeypatch, capsys) -> None:
    """Without bwrap or unshare generated code is refused; the explicit opt-out runs it weakly,
    says so loudly, and still applies seccomp, the rlimits and the cgroup."""
    monkeypatch.setattr("executors.sandbox.shutil.which", lambda name: None)
    monkeypatch.delenv("PLACER_UNSAFE_SANDBOX", raising=False)
    with pytest.raises(SandboxUnavailable, match="kernel isolation unavailable"):
        Sandbox(LIMITS).run("print(1)")
    r = Sandbox(LIMITS, allow_weak=True).run("print(6 * 7)")
    assert r.ok and r.stdout.strip() == "42" and r.backend.startswith("weak"), r
    assert {"seccomp", "rlimit_nproc"} <= set(r.protections) and "pidns" not in r.protections
    assert "WITHOUT namespaces" in capsys.readouterr().err
    monkeypatch.setenv("PLACER_UNSAFE_SANDBOX", "1")
    assert Sandbox(LIMITS).run("print(1)").ok


def test_batch_evaluates_answers_each_in_its_own_child() -> None:
    r = Sandbox(LIMITS).run_batch(["1+2", "9**9**9", "abc", "(", "3*4"])
    assert r.ok and r.values is not None
    st = [v["status"] for v in r.values]
    assert st == ["ok", "timeout", "error", "error", "ok"]
    assert [r.values[0]["value"], r.values[4]["value"]] == ["3", "12"]


def _sandbox_uids() -> list[int]:
    """Processes under this process's throwaway uids (see `executors.sandbox_launch.UidSlots`), so that
    sandboxes of other processes on the machine do not count."""
    first = UID_BASE + (os.getpid() % 1_000_000) * 16
    return [int(d) for d in os.listdir("/proc")
            if d.isdigit() and first <= (uid_of(d) or 0) < first + 16]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read()
    except OSError:
        return False
