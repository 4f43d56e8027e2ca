"""The plausible range of each efficiency factor the published rows determine: the least and
greatest value its leave-one-out fits took (every row held out in turn).

`python -m workflows.published --loo --write-band` writes them to
`placer/cost/data/factor_ranges.json` beside the band's residual table (the planner sits below
`workflows` and reads the file, never the code that made it; tests/test_band.py checks the file
against a fresh computation). `placer plan --robust --explain` re-prices the chosen plan and the
runner-up at each end of these ranges (`placer.solve.robust.sensitivity`).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placer.base.fileio import atomic_write_text

RANGES_FILE = Path(__file__).resolve().parent / "data" / "factor_ranges.json"


@dataclass(frozen=True)
class FactorRanges:
    """factor -> (least, greatest) leave-one-out fit, with the command that wrote them."""

    ranges: Mapping[str, tuple[float, float]]
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source,
                "factors": {n: {"lo": lo, "hi": hi} for n, (lo, hi) in self.ranges.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FactorRanges:
        return cls({str(n): (float(r["lo"]), float(r["hi"])) for n, r in d["factors"].items()},
                   str(d["source"]))

    def write(self, path: Path = RANGES_FILE) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")


def load_ranges(path: Path = RANGES_FILE) -> FactorRanges:
    """The shipped factor ranges (or the ones at `path`)."""
    return FactorRanges.from_dict(json.loads(path.read_text()))
