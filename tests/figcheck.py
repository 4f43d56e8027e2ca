"""Checks every figure must pass, measured on the drawn figure (display coordinates).

`check_figure(fig, explained)`: every colour the data is drawn in has one legend entry (a colour
explained in a title or axis label instead, such as dotted guides, names the words that explain
it), every entry's colour is drawn, no two entries share a colour; no legend overlaps a data
point, a bar, a line, a text or a tick or axis label of any axes; every visible axes has axis
labels and a title (its own or the figure's).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.collections import Collection, PathCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import Bbox

RGB = tuple[float, float, float]
SEGMENT_POINTS = 24  # points sampled along each line segment for the overlap check


def rgb(colour: Any) -> RGB:
    r, g, b, _a = to_rgba(colour)
    return (round(r, 3), round(g, 3), round(b, 3))


def legends(fig: Figure) -> list[Legend]:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


def legend_entries(fig: Figure) -> dict[RGB, list[str]]:
    out: dict[RGB, list[str]] = {}
    for leg in legends(fig):
        for handle, text in zip(leg.legend_handles, leg.get_texts()):
            if isinstance(handle, Patch):
                colour = handle.get_facecolor()
            elif isinstance(handle, Line2D):
                colour = handle.get_color()
            else:
                colour = handle.get_facecolor()[0]  # type: ignore[union-attr]
            out.setdefault(rgb(colour), []).append(text.get_text())
    return out


def drawn_colours(fig: Figure) -> set[RGB]:
    """Colours of the data: filled patches and bars, collections' faces, lines."""
    out: set[RGB] = set()
    for ax in fig.axes:
        out |= {rgb(p.get_facecolor()) for p in ax.patches if p.get_fill() and p.get_visible()}
        for c in ax.collections:
            out |= {rgb(f) for f in c.get_facecolor()}
        out |= {rgb(ln.get_color()) for ln in ax.lines if ln.get_visible()}
    return out


def _collection_boxes(c: Collection) -> list[Bbox]:
    if isinstance(c, PathCollection):  # scatter: a marker at each offset
        pts = c.get_offset_transform().transform(c.get_offsets())
        half = np.sqrt(max(float(np.max(c.get_sizes())), 1.0)) / 2 * c.figure.dpi / 72
        return [Bbox([[x - half, y - half], [x + half, y + half]]) for x, y in pts]
    tr = c.get_transform()
    return [Bbox.from_extents(*np.r_[v.min(axis=0), v.max(axis=0)])
            for v in (tr.transform(p.vertices) for p in c.get_paths()) if len(v)]


def _line_boxes(ln: Line2D) -> list[Bbox]:
    xy = ln.get_transform().transform(ln.get_xydata())
    pts = [xy[0]] if len(xy) == 1 else [a + (b - a) * t for a, b in zip(xy[:-1], xy[1:])
                                         for t in np.linspace(0, 1, SEGMENT_POINTS)]
    return [Bbox([p - 1, p + 1]) for p in pts]


def data_boxes(fig: Figure) -> list[tuple[str, Bbox]]:
    """(what, display box) of every point, bar, line piece and text the axes draw."""
    r = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    out: list[tuple[str, Bbox]] = []
    for ax in fig.axes:
        out += [("patch", p.get_window_extent(r)) for p in ax.patches]
        for c in ax.collections:
            out += [("collection", b) for b in _collection_boxes(c)]
        for ln in ax.lines:
            out += [("line", b) for b in _line_boxes(ln)]
        texts = [*ax.texts, ax.xaxis.label, ax.yaxis.label, ax.title,
                 *ax.get_xticklabels(), *ax.get_yticklabels()]
        out += [(f"text {t.get_text()!r}", t.get_window_extent(r))
                for t in texts if t.get_visible() and t.get_text()]
    return out


def check_figure(fig: Figure, explained: dict[str, str] | None = None) -> dict[RGB, str]:
    """Assert the module docstring's rules; the legend's colour -> label."""
    fig.canvas.draw()
    legs = legends(fig)
    assert legs, "a figure with colours needs a legend"
    entries = legend_entries(fig)
    shared = {c: labels for c, labels in entries.items() if len(labels) > 1}
    assert not shared, f"one colour, several labels: {shared}"
    suptitle = fig._suptitle.get_text() if fig._suptitle else ""  # type: ignore[attr-defined]
    words = " ".join([suptitle] + [t for ax in fig.axes for t in (ax.get_title(), ax.get_title("left"),
                                                       ax.get_xlabel(), ax.get_ylabel())])
    guides = {rgb(c): w for c, w in (explained or {}).items()}
    for w in guides.values():
        assert w in words, f"{w!r} should explain a colour; titles and labels say {words!r}"
    drawn = drawn_colours(fig)
    unlabelled = drawn - set(entries) - set(guides)
    assert not unlabelled, f"drawn colours without a legend entry: {unlabelled}"
    assert not set(entries) - drawn, f"entries without data: " \
        f"{ {c: entries[c] for c in set(entries) - drawn} }"
    r = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for leg in legs:
        box = leg.get_window_extent(r)
        hit = [(what, b) for what, b in data_boxes(fig)
               if min(box.x1, b.x1) - max(box.x0, b.x0) > 0.5
               and min(box.y1, b.y1) - max(box.y0, b.y0) > 0.5]
        assert not hit, f"the legend {box} covers {hit[:5]}"
    for ax in fig.axes:
        assert ax.get_title() or ax.get_title("left") or suptitle, "no title"
        if not ax.axison:
            continue
        shared_x = ax.get_shared_x_axes().get_siblings(ax)
        assert any(a.get_xlabel() for a in shared_x), "no x label"
        assert ax.get_ylabel() or any(t.get_text() for t in ax.get_yticklabels()), "no y label"
    return {c: labels[0] for c, labels in entries.items()}
