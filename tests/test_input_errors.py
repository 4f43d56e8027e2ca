"""Bad input found by an adversarial sweep of the job spec and the command line: each exits 2
with one line naming the field (or flag) and the value, never a traceback.

Each case pins one that used to pass or fail badly: a KL coefficient on a job without its
reference model (accepted, and the runner then trained with no KL term), a recorded placement
naming the wrong roles (a line of Python enum reprs), `placer export kuberay --image ''`
(silently the default image), and a `--json` document into a closed or full stdout (a
traceback).
"""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from placer.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny-cpu.yaml"


def _error_line(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    lines = err.getvalue().strip().splitlines()
    assert rc == 2, (rc, err.getvalue())
    assert len(lines) == 1 and lines[0].startswith("placer: error: "), lines
    return lines[0]


def _job(tmp_path: Path, **changes: Any) -> str:
    doc = yaml.safe_load(TINY.read_text())
    for key, value in changes.items():
        *outer, last = key.split("__")
        cur = doc
        for k in outer:
            cur = cur.setdefault(k, {})
        cur[last] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_kl_without_its_reference(tmp_path: Path) -> None:
    line = _error_line(["validate", _job(tmp_path, kl={"coef": 0.1},
                                         models__use_reference=False)])
    assert "kl.coef" in line and "use_reference" in line and "(got 0.1)" in line


def test_kl_off_without_reference_is_fine(tmp_path: Path) -> None:
    path = _job(tmp_path, kl={"coef": 0.0}, models__use_reference=False)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["validate", path]) == 0


def test_current_placement_names_the_roles(tmp_path: Path) -> None:
    """The roles the job runs and the ones the recorded placement names, as names."""
    path = _job(tmp_path, current={"roles": {"actor": {"pool": "gpu", "devices": 1},
                                             "critic9": {"pool": "gpu", "devices": 1}}})
    line = _error_line(["compare", path, "--time-limit", "3"])
    assert "job.current.roles" in line and "Role." not in line
    assert "missing: environment, reference, reward, rollout" in line
    assert "not run: critic9" in line and "(got ['actor', 'critic9'])" in line


def test_export_empty_image(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["plan", str(TINY), "-o", str(plan), "--time-limit", "3"]) == 0
    line = _error_line(["export", "kuberay", str(plan), "-o", str(tmp_path / "k"),
                        "--image", ""])
    assert "--image" in line and "(got '')" in line
    assert not (tmp_path / "k").exists()


@pytest.mark.parametrize("redirect, needle", [
    ({"stdout": subprocess.DEVNULL}, None),  # the control: it does write
    ("closed", "stdout: closed"),
    ("full", "stdout: cannot write the JSON document"),
])
def test_json_into_a_closed_or_full_stdout(redirect: Any, needle: str | None) -> None:
    """The real process (a closed stdout is None only there): one line and exit 2."""
    if redirect == "full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    cmd = [sys.executable, "-c", "import sys; from placer.cli import main; "
           "sys.exit(main(sys.argv[1:]))", "validate", str(TINY), "--json"]
    if redirect == "closed":
        kw: dict[str, Any] = {"stdout": subprocess.DEVNULL}
        cmd = ["sh", "-c", '"$@" >&-', "sh", *cmd]
    elif redirect == "full":
        cmd = ["sh", "-c", '"$@" >/dev/full', "sh", *cmd]
        kw = {}
    else:
        kw = redirect
    r = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, timeout=120, check=False, **kw)
    if needle is None:
        assert r.returncode == 0, r.stderr
        return
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and lines[0].startswith(f"placer: error: {needle}"), lines


@pytest.mark.parametrize("json_flag", [False, True])
def test_plain_or_json_output_into_a_full_stdout_is_one_line(json_flag: bool) -> None:
    """Plain text into `>/dev/full` was a traceback (the print's OSError, or the interpreter's
    flush at exit): now one line naming stdout and the reason, exit 2, for text and JSON alike."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    cmd = ["sh", "-c", '"$@" >/dev/full', "sh", sys.executable, "-c",
           "import sys; from placer.cli import main; sys.exit(main(sys.argv[1:]))",
           "validate", str(TINY), *(["--json"] if json_flag else [])]
    r = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and lines[0].startswith("placer: error:"), lines
    assert "No space left on device" in lines[0] or "cannot write the JSON" in lines[0], lines


@pytest.mark.parametrize("changes, needle", [
    # booleans a YAML "yes", 1 or "true" passed as True (lax), and a negative parameter count
    ({"pin": {"reference": {"sharded": 1}}}, "pin.reference.sharded: Input should be a valid "
                                             "boolean (got 1)"),
    ({"weight_sync": {"transport": "nixl", "shard_experts": "yes"}},
     "weight_sync.shard_experts: Input should be a valid boolean (got 'yes')"),
    ({"catalog": {"models": [{"name": "m", "layers": 2, "hidden": 64, "heads": 4,
                              "kv_heads": 4, "mlp": 128, "vocab": 64, "params_b": -1}]}},
     "catalog.models.0.params_b: Input should be greater than 0 (got -1)"),
])
def test_strict_spec_values(tmp_path: Path, changes: dict[str, Any], needle: str) -> None:
    line = _error_line(["validate", _job(tmp_path, **changes)])
    assert needle in line, line


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("address, start", [
    ("", "--address: not a Ray address"),  # ran an embedded Ray as if none were given
    ("host:99999", "--address: not a Ray address"),  # Ray's own dial hung for minutes
    ("closed", "--address: cannot reach Ray at"),
])
def test_execute_checks_its_address_first(tmp_path: Path, address: str, start: str) -> None:
    """`placer execute --address` is checked (and dialled) before the plan is read, as
    `placer fleet --execute --address` is: the plan here does not even exist."""
    if address == "closed":
        address = f"127.0.0.1:{_closed_port()}"
    line = _error_line(["execute", str(tmp_path / "no-plan.json"), "--address", address,
                        "--out", str(tmp_path / "out")])
    assert line.startswith(f"placer: error: {start}") and f"(got {address!r})" in line, line
    assert not (tmp_path / "out").exists()
