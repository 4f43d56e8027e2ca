"""Draw docs/architecture.png: the layers of pyproject.toml's import-linter contract and the data
that flows through them (job -> plan -> simulation or run -> trace -> calibration -> next plan).

    python scripts/draw_architecture.py [-o docs/architecture.png]

The layers are read from `[tool.importlinter]`, so the picture cannot drift from the contract:
a layer's siblings joined by ":" (they may import each other) share one box, siblings joined by
"|" (independent) get a box each. A data item names the layer it lives in; a layer it names that
the contract lacks stops the script.
"""
from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from placer.base.palette import save  # noqa: E402  (the repository root goes on the path first)

# What each layer module holds, in a few words (from the packages' __init__ docstrings).
HOLDS = {
    "placer.base": "errors, input guards, atomic writes, roles, palette",
    "traces": "the trace schema, recording, workload traces",
    "placer.spec": "the job model, catalogs, architectures, hardware, pins",
    "placer.cost": "the cost model: memory and time of every role's work",
    "placer.solve": "candidates, the ILP, baselines, mapping, the Plan",
    "placer.calibrate": "event-level fits of the efficiency factors",
    "placer.fleet": "many jobs on one cluster under team quotas (Kueue)",
    "simulator": "simpy model of RL iterations",
    "executors": "runs a plan on Ray",
    "workflows": "demo, fidelity, stage-level fit, what-if, published runs",
    "bench": "benchmarks that print tables",
}
FRONT_ENDS = "API, CLI, commands, export/import, plots, progress"

# Data items: (label, layer module it lives in, column 0 or 1).
DATA = [
    ("job.yaml -> Job", "placer.spec", 0),
    ("cost table (Estimate)", "placer.cost", 0),
    ("Plan (plan.json)", "placer.solve", 0),
    ("SimResult | run on Ray", "simulator", 0),
    ("trace (Chrome events)", "traces", 1),
    ("calibration profile", "placer.calibrate", 1),
]
HALF = 1.15  # half the width of a data item's box

# Arrows between data items (by index) with their labels; "right" and "left" route an arrow
# around the other boxes.
FLOW = [(0, 1, "candidates", ""), (1, 2, "ILP", ""), (2, 3, "simulate | execute", ""),
        (3, 4, "record", "right"), (4, 5, "calibrate", ""), (5, 1, "next plan", "left")]


def contract_layers(pyproject: Path) -> list[list[list[str]]]:
    """The layers contract, bottom up: each layer a list of independent groups ("|"), each group
    the modules that share it (":")."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    return [[[m.strip() for m in group.split(":")] for group in layer.split("|")]
            for layer in reversed(contract["layers"])]


def _box_text(group: list[str]) -> tuple[str, str]:
    if len(group) > 1:
        return " : ".join(m.removeprefix("placer.") for m in group), FRONT_ENDS
    return group[0], HOLDS.get(group[0], "")


def _arrow(ax: Any, points: list[tuple[float, float]]) -> None:
    """A polyline through `points` with an arrowhead on its last segment."""
    colour = "#c06000"
    xs, ys = zip(*points[:-1])
    ax.plot(xs, ys, color=colour, lw=1.4, zorder=3, solid_capstyle="butt")
    ax.annotate("", xy=points[-1], xytext=points[-2], zorder=3,
                arrowprops={"arrowstyle": "-|>", "color": colour, "lw": 1.4,
                            "mutation_scale": 14, "shrinkA": 0, "shrinkB": 0})


def draw(layers: list[list[list[str]]], out: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    row_of = {m: i for i, layer in enumerate(layers) for group in layer for m in group}
    missing = sorted({home for _, home, _ in DATA} - set(row_of))
    if missing:
        raise SystemExit(f"draw_architecture: data items name layers the contract lacks: {missing}")
    n = len(layers)
    fig, ax = plt.subplots(figsize=(15, 0.72 * n + 1.7))
    stack_w, gap, h = 8.2, 0.25, 0.74
    cols = (9.65, 12.75)
    for i, layer in enumerate(layers):
        if i % 2 == 0:
            ax.add_patch(FancyBboxPatch((-0.1, i - 0.5), 14.7, 1.0, boxstyle="square,pad=0",
                                        facecolor="0.95", edgecolor="none", zorder=0))
        w = (stack_w - gap * (len(layer) - 1)) / len(layer)
        for k, group in enumerate(layer):
            x = k * (w + gap)
            ax.add_patch(FancyBboxPatch((x, i - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.08",
                                        facecolor="#dbe7f5", edgecolor="#1f3b73", lw=1.2, zorder=2))
            name, holds = _box_text(group)
            ax.text(x + w / 2, i + 0.12, name, ha="center", va="center", fontsize=10.5,
                    fontweight="bold", family="monospace", zorder=3)
            ax.text(x + w / 2, i - 0.17, holds, ha="center", va="center", fontsize=8.5,
                    color="0.25", zorder=3)
            if k:
                ax.text(x - gap / 2, i, "|", ha="center", va="center", fontsize=16,
                        color="#b22222", fontweight="bold", zorder=3)
    ax.annotate("", xy=(-0.45, n - 0.6), xytext=(-0.45, -0.4),
                arrowprops={"arrowstyle": "<|-", "color": "0.3", "lw": 1.5})
    ax.text(-0.62, (n - 1) / 2, "imports point down only (make lint: lint-imports)", rotation=90,
            ha="center", va="center", fontsize=9, color="0.3")
    centres: list[tuple[float, float]] = []
    for label, home, col in DATA:
        x, y = cols[col], float(row_of[home])
        centres.append((x, y))
        ax.add_patch(FancyBboxPatch((x - HALF, y - 0.27), 2 * HALF, 0.54,
                                    boxstyle="round,pad=0,rounding_size=0.12",
                                    facecolor="#fdf0d5", edgecolor="#c06000", lw=1.2, zorder=4))
        ax.text(x, y, label, ha="center", va="center", fontsize=9.5, zorder=5)
    for a, b, label, route in FLOW:
        (x0, y0), (x1, y1) = centres[a], centres[b]
        if route == "right":  # out of a's right side, down the far right, into b's right side
            xr = max(cols) + 1.3
            points = [(x0 + HALF, y0), (xr, y0), (xr, y1), (x1 + HALF, y1)]
        elif route == "left":  # out of a's bottom, down beside the columns, into b's right side
            points = [(x0 - 0.8, y0 - 0.27), (x0 - 0.8, y1), (x1 + HALF, y1)]
        else:  # straight up or down, between the boxes' edges
            step = 0.27 if y1 > y0 else -0.27
            points = [(x0, y0 + step), (x1, y1 - step)]
        _arrow(ax, points)
        (lx0, ly0), (lx1, ly1) = points[-3:-1] if len(points) > 2 else points
        ax.text((lx0 + lx1) / 2 + 0.08, (ly0 + ly1) / 2, label, ha="left", va="center",
                fontsize=8.5, color="#8a4500", style="italic", zorder=6,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85})
    ax.text(stack_w / 2, n - 0.35, "layers (pyproject.toml, [tool.importlinter])", ha="center",
            fontsize=11, fontweight="bold")
    ax.text(sum(cols) / 2, n - 0.35, "data flow", ha="center", fontsize=11, fontweight="bold")
    ax.text(stack_w / 2, -0.8, "a | b: independent (neither imports the other)     "
            "a : b: one layer (may import each other)", ha="center", va="center", fontsize=9,
            color="0.3")
    ax.set_xlim(-0.8, 14.7)
    ax.set_ylim(-1.0, n - 0.1)
    ax.axis("off")
    return save(fig, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/draw_architecture.py",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-o", "--out", default=str(ROOT / "docs" / "architecture.png"))
    args = ap.parse_args(argv)
    print(draw(contract_layers(ROOT / "pyproject.toml"), Path(args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
