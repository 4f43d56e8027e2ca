"""The error band of a predicted iteration time: the range the cost model was right within on
comparable published runs, measured leave-one-out.

The residuals come from `python -m workflows.published --loo --write-band`, which predicts every
published step-time row with the row factors fitted on the other rows and writes, per row, the
error e = predicted / published - 1 with the row's tags (device type, model class, mode) to
`placer/cost/data/band.json` (shipped with the package: the planner sits below `workflows` and
reads the file, never the code that made it; tests/test_band.py checks the file against a fresh
computation).

For a plan with tags t and prediction p: the `K` rows most similar to t (most tags equal, ties in
table order) give the spread [min e, max e]; truth = p / (1 + e), so the band is
[p / (1 + max e), p / (1 + min e)]. Each chosen row that differs from t in some tags widens the
spread by `WIDEN_PER_TAG` per differing tag, averaged over the chosen rows: a plan unlike every
published run gets a wider band than one like them.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placer.base.fileio import atomic_write_text
from placer.spec.arch import ModelArch

BAND_FILE = Path(__file__).resolve().parent / "data" / "band.json"
K = 5  # rows a band is taken over
WIDEN_PER_TAG = 0.10  # added to each side of the spread per differing tag (mean over the rows)
MIN_ONE_PLUS_E = 0.1  # the lower side's 1 + e is kept at least this (a band stays finite)
TAGS = ("device", "model", "mode")


def model_class(arch: ModelArch | None) -> str:
    """'hybrid' (linear attention in some layers), 'moe' (routed experts) or 'dense'."""
    if arch is None:
        return "dense"
    if arch.linear_attention is not None:
        return "hybrid"
    return "moe" if arch.experts else "dense"


def mode_of(overlaps_steps: bool, actor_slot: str | None, rollout_slot: str | None) -> str:
    """'async' (a pipeline whose steps overlap, `PipelineMode.overlaps_steps`), 'colocate'
    (actor and rollout share a slot) or 'split' (they run on separate devices, in sync)."""
    if overlaps_steps:
        return "async"
    return "colocate" if actor_slot is not None and actor_slot == rollout_slot else "split"


@dataclass(frozen=True)
class Tags:
    """What makes two runs comparable: the actor's device type, the policy's model class and
    the pipeline mode."""

    device: str
    model: str
    mode: str

    def differing(self, other: Tags) -> int:
        return sum(getattr(self, t) != getattr(other, t) for t in TAGS)

    def to_dict(self) -> dict[str, str]:
        return {t: getattr(self, t) for t in TAGS}


@dataclass(frozen=True)
class Residual:
    """One published row's leave-one-out error and its tags."""

    name: str
    error: float
    tags: Tags

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "error": self.error, **self.tags.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Residual:
        return cls(str(d["name"]), float(d["error"]),
                   Tags(str(d["device"]), str(d["model"]), str(d["mode"])))


@dataclass(frozen=True)
class ResidualTable:
    """The residuals a band is taken from, with the command that wrote them."""

    rows: tuple[Residual, ...]
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResidualTable:
        return cls(tuple(Residual.from_dict(r) for r in d["rows"]), str(d["source"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def write(self, path: Path = BAND_FILE) -> None:
        atomic_write_text(path, self.to_json())


def load_table(path: Path = BAND_FILE) -> ResidualTable:
    """The shipped residual table (or the one at `path`)."""
    return ResidualTable.from_dict(json.loads(path.read_text()))


@dataclass(frozen=True)
class Band:
    """A prediction's band [lo, hi] and where it came from: the rows used (each with its error
    and how many tags it differs in) and the widening they got."""

    lo: float
    hi: float
    tags: Tags
    rows: tuple[tuple[str, float, int], ...]
    widen: float

    def to_source(self) -> dict[str, Any]:
        return {"tags": self.tags.to_dict(), "widen": self.widen,
                "rows": [{"name": n, "error": e, "differing_tags": d} for n, e, d in self.rows]}


def band(predicted_s: float, tags: Tags, table: ResidualTable, k: int = K) -> Band:
    """The band of `predicted_s` for a run with `tags` (see the module docstring)."""
    if not table.rows:
        raise ValueError("the residual table has no rows")
    ranked = sorted(enumerate(table.rows), key=lambda ir: (tags.differing(ir[1].tags), ir[0]))
    chosen = [r for _, r in ranked[:k]]
    diffs = [tags.differing(r.tags) for r in chosen]
    widen = WIDEN_PER_TAG * sum(diffs) / len(chosen)
    e_lo = min(r.error for r in chosen) - widen
    e_hi = max(r.error for r in chosen) + widen
    lo = predicted_s / max(1 + e_hi, MIN_ONE_PLUS_E)
    hi = predicted_s / max(1 + e_lo, MIN_ONE_PLUS_E)
    return Band(lo, hi, tags, tuple((r.name, r.error, d) for r, d in zip(chosen, diffs)), widen)

