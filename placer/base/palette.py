"""One palette and one writer for every figure (matplotlib, Agg backend: no display needed).

`KIND_COLOURS` colours the kinds of work (a trace event's category) on every timeline (the
simulator's and the fidelity figures) and `kind_label` names them; `kind_handles` builds a
legend from both, so that a colour and its label come from the one table: kinds of the same work
(a tool call, a sandbox verify, the executor's environment stage) share a colour and a label.
`save(fig, path)` writes a PNG atomically, `png(fig)` returns its bytes (for notebooks). A leaf
module: figures in every layer build on it (`placer.base.figlayout` places their legends).
"""
from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

KIND_COLOURS = {"stage": "0.82", "environment": "C8", "generate": "C0", "prefill": "C9",
                "decode": "#1f3b73", "tool": "C8", "forward": "C2",
                "reward": "C4", "train": "C3", "transfer": "C1", "checkpoint": "C7"}
OTHER_COLOUR = "C5"  # a kind the table does not name
ENVIRONMENT_WORK = "environment (tool calls, sandbox)"
# Kinds whose legend label is not their name; kinds of one colour must share one label.
KIND_LABELS = {"stage": "driver stage", "environment": ENVIRONMENT_WORK, "tool": ENVIRONMENT_WORK}


def kind_colour(kind: str) -> str:
    return KIND_COLOURS.get(kind, OTHER_COLOUR)


def kind_label(kind: str) -> str:
    """The legend label of a kind of work: the same for every kind of `kind_colour`'s colour."""
    return KIND_LABELS.get(kind, kind) if kind in KIND_COLOURS else "other"


def kind_handles(kinds: Iterable[str]) -> list[Patch]:
    """One legend entry per label of the kinds drawn, in the table's order."""
    order = {k: i for i, k in enumerate(KIND_COLOURS)}
    out: dict[str, Patch] = {}
    for k in sorted(set(kinds), key=lambda k: (order.get(k, len(order)), k)):
        out.setdefault(kind_label(k), Patch(color=kind_colour(k), label=kind_label(k)))
    return list(out.values())


def save(fig: Figure, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(p)  # readers never see half a figure
    return p


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (closed afterwards): `IPython.display.Image(png(fig))` shows it
    whatever matplotlib backend the kernel runs."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
