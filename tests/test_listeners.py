"""Every socket a `placer execute` run listens on is on loopback.

An embedded run starts Ray (GCS, raylet, object manager, agents, workers) and the trainer's
process group (torch.distributed's store and gloo's pairs). This test runs the tiny plan for two
steps as a real subprocess, reads `ss -ltnp` while it runs, and checks every listening socket of
the run's process tree (the driver and every descendant: Ray's daemons, agents and workers) is
bound to 127.0.0.0/8 or ::1, never to 0.0.0.0, `*` or a routable address.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from exec_util import GRPO_LAYOUT, ROOT, hand_plan

from placer.planfile import save_plan

pytestmark = pytest.mark.ray


def _children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc."""
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ')'
        out.setdefault(ppid, []).append(int(d))
    return out


def _tree(root: int) -> set[int]:
    kids, seen, todo = _children(), set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(kids.get(pid, []))
    return seen


def _listeners() -> list[tuple[str, str, set[int]]]:
    """(local address, process names, pids) of every listening TCP socket."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 6:
            continue
        users = " ".join(parts[5:])
        pids = {int(tok.split("=")[1].rstrip(")")) for tok in users.replace(",", " ").split()
                if tok.startswith("pid=")}
        rows.append((parts[3], users, pids))
    return rows


def _host(local: str) -> str:
    """'127.0.0.1:80' -> '127.0.0.1', '[::1]:80' -> '::1', '*:80' -> '*', 'a%lo:80' -> 'a'."""
    host = local.rsplit(":", 1)[0].strip("[]")
    return host.split("%", 1)[0]


def is_loopback(local: str) -> bool:
    host = _host(local)
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False  # '*' or a name: every interface
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1:6379") and is_loopback("[::1]:80")
    assert is_loopback("[::ffff:127.0.0.1]:80") and is_loopback("127.0.0.53%lo:53")
    assert not is_loopback("*:40807") and not is_loopback("0.0.0.0:8265")
    assert not is_loopback("[::]:80") and not is_loopback("10.0.0.5:6379")


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_execute_listens_on_loopback_only(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    save_plan(hand_plan(GRPO_LAYOUT), plan)  # trainer DP=2: the process group is formed
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "placer.cli", "execute", str(plan), "--steps",
                             "2", "--out", str(tmp_path / "out")], stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    seen: dict[str, str] = {}  # local address -> process names
    try:
        while proc.poll() is None:
            tree = _tree(proc.pid)
            for local, users, pids in _listeners():
                if pids & tree:
                    seen[local] = users
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        log.close()
    text = (tmp_path / "run.log").read_text()
    assert proc.returncode == 0, text[-3000:]
    names = " ".join(seen.values())
    # the poll saw the run: Ray's daemons and the trainer's store were listening
    assert "gcs_server" in names and "raylet" in names, seen
    assert "Trainer" in names, seen
    wide = {local: users for local, users in seen.items() if not is_loopback(local)}
    assert not wide, f"listening beyond loopback: {wide}"
