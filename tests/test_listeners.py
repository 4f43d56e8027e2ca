"""Every socket a `placer execute` run listens on is on loopback.

An embedded run starts Ray (GCS, raylet, object manager, agents, workers) and the trainer's
process group (torch.distributed's store and gloo's pairs). The suite's shared CLI run
(tests/conftest.py: the tiny plan, two steps, a real subprocess) reads `ss -ltnp` while it runs
(tests/listening.py); every listening socket of the run's process tree (the driver and every
descendant: Ray's daemons, agents and workers) must be bound to 127.0.0.0/8 or ::1, never to
0.0.0.0, `*` or a routable address.
"""
from __future__ import annotations

import ipaddress
import shutil

import pytest

pytestmark = pytest.mark.ray


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
def test_execute_listens_on_loopback_only(grpo_cli_run) -> None:
    """The suite's shared CLI run (tests/conftest.py: a resumed run), watched while it ran
    (trainer DP=2: the process group is formed)."""
    seen = grpo_cli_run.listening  # local address -> process names
    names = " ".join(seen.values())
    # the poll saw the run: Ray's daemons and the trainer's store were listening
    assert "gcs_server" in names and "raylet" in names, seen
    assert "Trainer" in names, seen
    wide = {local: users for local, users in seen.items() if not is_loopback(local)}
    assert not wide, f"listening beyond loopback: {wide}"
