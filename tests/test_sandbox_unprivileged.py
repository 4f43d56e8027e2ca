"""The sandbox holds for an unprivileged user too: the attack suite, run again as uid 65534.

As root (CI), the suite runs in a child that leaves root the way the sandbox's own staging step
does (`_sandbox_runner.py stage`): a private mount namespace in which the interpreter's prefix is
reachable even when an ancestor such as /root is closed to other users, then uid and gid 65534
with no supplementary groups. Without root, the suite already runs unprivileged: the child is
the same user. Either way the sandboxes inside are built without any privilege: user namespaces
that the unprivileged user creates, by `bwrap` and by `unshare`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from executors.sandbox import _runner_source, _view

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534


def test_attack_suite_as_an_unprivileged_user(tmp_path: Path) -> None:
    suite = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
             "tests/test_sandbox_attacks.py"]
    probe = [sys.executable, "-c", "import os; print(os.geteuid())"]
    os.chmod(tmp_path, 0o777)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1",
           "TMPDIR": str(tmp_path)}

    def as_user(argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        view = _view(sys.executable)
        spec = {"uid": NOBODY, "prefix": view["prefix"], "hide": view["hide"], "argv": argv}
        return [sys.executable, "-I", "-S", "-c", _runner_source(), "stage", json.dumps(spec)]

    who = subprocess.run(as_user(probe), cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert who.returncode == 0 and int(who.stdout) != 0, who
    res = subprocess.run(as_user(suite), cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "skipped" not in res.stdout, res.stdout[-2000:]
