"""`placer execute` refuses to start a run whose generated code the sandbox cannot isolate (exit 2,
one line, before any model is built or any actor starts), unless `--unsafe-sandbox` is given."""
from __future__ import annotations

from pathlib import Path

import pytest
from exec_util import ROOT

from executors import sandbox as sbx
from executors.run import check_sandbox
from placer.cli import main

TINY = ROOT / "examples" / "tiny-cpu.yaml"


@pytest.fixture
def no_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where neither bubblewrap nor user namespaces can isolate a program: every
    isolated start reports why it failed; the weak (opt-out) start still runs for real."""
    real = sbx.Sandbox._start

    def start(self: sbx.Sandbox, mode: str, payload: list[str], wall_s: float, backend: str,
              items: int) -> tuple[sbx.Result, list[dict]] | str:
        if backend != "weak":
            return "user namespaces are disabled"
        return real(self, mode, payload, wall_s, backend, items)

    monkeypatch.setattr(sbx.Sandbox, "_start", start)
    monkeypatch.delenv(sbx.UNSAFE_ENV, raising=False)


def test_execute_refuses_without_isolation(no_isolation: None, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["execute", str(TINY), "--steps", "1", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("placer: error: sandbox: kernel isolation unavailable "
                          "(user namespaces are disabled)") and "--unsafe-sandbox" in err
    assert not (tmp_path / "run" / "model-v0").exists()


def test_unsafe_sandbox_runs_weakly_and_says_so(no_isolation: None,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    check_sandbox(unsafe=True)
    err = capsys.readouterr().err
    assert "WARNING: sandbox: kernel isolation unavailable" in err
    assert "WARNING: --unsafe-sandbox" in err


def test_the_preflight_passes_where_isolation_works() -> None:
    check_sandbox(unsafe=False)  # this machine (and CI) isolates: no error
    assert "seccomp" in sbx.probe()
