"""Workload traces: JSONL, one sample a line, e.g.

    {"sample_id": 17, "prompt_tokens": 212, "response_tokens": [803, 95], "tool_latency_s": [1.7]}

A job replays a field with `{kind: empirical, path: FILE, field: response_tokens}`. List fields are
flattened (one value per turn).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.base.inputs import load_json, read_text

MAX_VALUE = 1e15  # tokens or seconds; beyond it a value is corrupt (and a float overflows later)


def file_version(path: str | Path) -> tuple[int, int] | None:
    """(modification time in ns, size) of a file, None when it is missing: caches of what a file
    holds are keyed by it, so an edited trace is read again."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


@lru_cache(maxsize=32)
def _read(path: str, version: tuple[int, int] | None) -> tuple[dict[str, Any], ...]:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{path}: workload trace not found")
    rows = []
    for i, line in enumerate(read_text(p, "workload trace").splitlines(), 1):
        if not line.strip():
            continue
        row = load_json(line, path, line=i)  # no NaN/Infinity: a length or latency is finite
        if not isinstance(row, dict):
            raise SpecError(f"{path}:{i}: expected a JSON object per line")
        rows.append(row)
    if not rows:
        raise SpecError(f"{path}: workload trace is empty")
    return tuple(rows)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    return list(_read(str(path), file_version(path)))


def read_field(path: str | Path, field: str) -> list[float]:
    """All values of `field` in the trace, flattened, as floats (> 0 for lengths)."""
    out: list[float] = []
    for i, row in enumerate(_read(str(path), file_version(path)), 1):
        if field not in row:
            raise SpecError(f"{path}:{i}: no field {field!r}")
        vals = row[field] if isinstance(row[field], list) else [row[field]]
        for v in vals:
            if (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_VALUE):
                raise SpecError(f"{path}:{i}: {field}: expected non-negative numbers up to "
                                f"{MAX_VALUE:g} (got {v!r:.60})")
            out.append(float(v))
    if not out:
        raise SpecError(f"{path}: field {field!r} has no values")
    return out


def write_rows(path: str | Path, rows: Iterable[Mapping[str, object]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
