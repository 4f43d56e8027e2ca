"""Which TCP sockets a process tree listens on (`ss -ltnp` and /proc), for
tests/test_listeners.py: `listening(pid)` maps each listening local address of the tree of `pid`
(it and every descendant) to the names of the processes holding it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


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


def listening(root: int) -> dict[str, str]:
    """Local address -> process names, for every listening socket of the tree of `root`."""
    tree = _tree(root)
    return {local: users for local, users, pids in _listeners() if pids & tree}
