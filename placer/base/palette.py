"""One palette and one writer for every figure (matplotlib, Agg backend: no display needed).

`KIND_COLOURS` colours the kinds of work on every timeline (the plan's, the simulator's and the
fidelity figures); `save(fig, path)` writes a PNG atomically, `png(fig)` returns its bytes (for
notebooks). A leaf module: figures in every layer build on it.
"""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

KIND_COLOURS = {"stage": "0.82", "environment": "C8", "generate": "C0", "prefill": "C9",
                "decode": "#1f3b73", "tool": "C8", "forward": "C2",
                "reward": "C4", "train": "C3", "transfer": "C1", "checkpoint": "C7"}


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
