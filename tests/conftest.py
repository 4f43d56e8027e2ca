"""Fixtures shared by the test files, and the suite's settings.

`PLACER_STRICT_TRACES=1`: every trace the suite writes or reads through `TraceEvent.fields` must
use only the keys `traces.schema.EventArgs` names (outside the tests a foreign key is kept).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PLACER_STRICT_TRACES", "1")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def placer_cmd() -> list[str]:
    """The `placer` console script next to this interpreter (else `python -m placer.cli`)."""
    script = Path(sys.executable).with_name("placer")
    return [str(script)] if script.exists() else [sys.executable, "-m", "placer.cli"]

