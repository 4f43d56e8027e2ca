"""The sandbox holds for an unprivileged user too: the attack suites, run again as uid 65534.

As root (CI), the suites run in a child that leaves root the way the sandbox's own staging step
does (`_sandbox_setup.stage`): a private mount namespace in which the interpreter's prefix is
reachable even when an ancestor such as /root is closed to other users, then uid and gid 65534
with no supplementary groups. Without root, the suites already run unprivileged: the child is
the same user. Either way the sandboxes inside are built without any privilege: user namespaces
that the unprivileged user creates, by `bwrap` and by `unshare`.
Memory caps: as root on a cgroup v1 machine, the child gets memory and pids cgroups delegated to
it (chowned, named in PLACER_SANDBOX_CGROUP), as an administrator would; elsewhere it runs with
what it finds (often none: the fallback, which the memory suite checks too).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from cgroup_util import child_cgroups

from executors import cgroups
from executors.sandbox_launch import stage_source, view

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534
SUITES = ["tests/test_sandbox_attacks.py", "tests/test_sandbox_siblings.py",
          "tests/test_sandbox_memory.py"]


@contextlib.contextmanager
def delegated_cgroup() -> Iterator[dict[str, str]]:
    """Root on cgroup v1: memory and pids cgroups owned by the unprivileged user, as env."""
    found = cgroups.support()
    if os.geteuid() != 0 or found.kind != "v1":
        yield {}
        return
    with child_cgroups(found, "nobody", owner=NOBODY) as made:
        yield {cgroups.ENV: ":".join(made)}


def test_attack_suites_as_an_unprivileged_user(tmp_path: Path) -> None:
    suite = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *SUITES,
             "--deselect", "tests/test_sandbox_memory.py::test_a_delegated_cgroup_is_used"]
    probe = [sys.executable, "-c", "import os\nfrom executors import cgroups\n"
             "print(os.geteuid(), cgroups.support().kind or 'none')"]
    os.chmod(tmp_path, 0o777)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1",
           "TMPDIR": str(tmp_path)}

    def as_user(argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        v = view(sys.executable)
        spec = {"uid": NOBODY, "prefix": v["prefix"], "hide": v["hide"], "argv": argv}
        return [sys.executable, "-I", "-S", "-c", stage_source(), "stage", json.dumps(spec)]

    with delegated_cgroup() as extra:
        who = subprocess.run(as_user(probe), cwd=ROOT, env={**env, **extra}, capture_output=True,
                             text=True, timeout=60)
        assert who.returncode == 0 and who.stdout.split()[0] != "0", who
        if extra:  # the delegated cgroups are the ones its sandboxes use
            assert who.stdout.split()[1] == "v1", who
        res = subprocess.run(as_user(suite), cwd=ROOT, env={**env, **extra}, capture_output=True,
                             text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "skipped" not in res.stdout, res.stdout[-2000:]
