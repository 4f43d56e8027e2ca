"""docs/cost-model.md's table of efficiency factors matches `Efficiency`: every field has one row,
every row names a field, and each row's default is the code's (compared as numbers)."""
from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import pytest

from placer.cost.efficiency import Efficiency

DOC = Path(__file__).resolve().parent.parent / "docs" / "cost-model.md"
HEADING = "## The efficiency factors"


def documented(text: str) -> dict[str, str]:
    """factor name -> its default cell, from the table under HEADING."""
    assert HEADING in text, f"docs/cost-model.md has no '{HEADING}' section"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip().strip("|") for ln in section.splitlines() if ln.startswith("|")]
    assert len(lines) > 2, "the factor table is missing"
    assert [c.strip() for c in lines[0].split("|")][:3] == ["factor", "default", "unit"]
    out: dict[str, str] = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.split(" | ")]
        name = cells[0]
        assert name.startswith("`") and name.endswith("`") and name.count("`") == 2, (
            f"a row whose first cell is not one `factor`: {cells[:2]}")
        assert name[1:-1] not in out, f"{name} has two rows"
        out[name[1:-1]] = cells[1]
    return out


def mismatches(text: str) -> list[str]:
    """What the table gets wrong against `Efficiency`, one line each."""
    rows = documented(text)
    out = [f"{f.name}: no row" for f in fields(Efficiency) if f.name not in rows]
    names = {f.name for f in fields(Efficiency)}
    out += [f"{name}: a row that names no field" for name in rows if name not in names]
    for f in fields(Efficiency):
        if f.name not in rows:
            continue
        try:
            value = float(rows[f.name])
        except ValueError:
            out.append(f"{f.name}: default {rows[f.name]!r} is not a number")
            continue
        if not math.isclose(value, float(f.default), rel_tol=1e-9):
            out.append(f"{f.name}: the table says {rows[f.name]}, the code {f.default}")
    return out


def test_the_table_matches_the_efficiency_fields() -> None:
    assert mismatches(DOC.read_text()) == []


def test_the_table_lists_the_fields_in_their_order() -> None:
    assert list(documented(DOC.read_text())) == [f.name for f in fields(Efficiency)]


@pytest.mark.parametrize("old, new, want", [
    ("| `mfu_train` | 0.86 |", "| `mfu_train` | 0.87 |",
     ["mfu_train: the table says 0.87, the code 0.86"]),
    ("| `link_eff` |", "| `link_efficiency` |",
     ["link_eff: no row", "link_efficiency: a row that names no field"]),
    ("| `coll_base_s` | 6.6e-6 |", "| `coll_base_s` | 6.6 us |",
     ["coll_base_s: default '6.6 us' is not a number"]),
])
def test_a_stale_table_is_caught(old: str, new: str, want: list[str]) -> None:
    text = DOC.read_text()
    assert old in text
    assert mismatches(text.replace(old, new)) == want
