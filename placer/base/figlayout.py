"""Where a figure's legend and labels go: outside the data, placed from the drawn extents.

A legend inside the axes (matplotlib's "best", or a fixed corner) hides whatever data lands there
for some input, so every figure puts its legend outside its axes: beside the axes' right edge
(`legend_beside`) or under everything the figure draws (`legend_below`: placed after a draw, from
the axes' extents with their tick labels and axis labels). Text placed by the data (a point's
label) is kept inside its axes by `fit_texts`, which widens the limits until every text fits, so
that none spills over a legend or a key beside the axes. Saving with a tight bounding box
(`placer.base.palette.save`) keeps whatever lies outside the axes in the picture.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backend_bases import RendererBase
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text

PAD_PX = 8  # pixels between a legend and what it sits beside
TEXT_PAD_PX = 4  # between a text fitted in and the axes' frame
FIT_ROUNDS = 6  # widening converges in one or two rounds; more only for texts wider than the axes


def renderer(fig: Figure) -> RendererBase:
    fig.canvas.draw()  # extents are those of the drawn figure
    r: RendererBase = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    return r


def legend_beside(ax: Axes, handles: Sequence[Artist] | None = None, **kw: Any) -> Legend:
    """The axes' legend outside its right edge, top-aligned with it."""
    kw.setdefault("fontsize", 8)
    kw.setdefault("frameon", False)
    if handles is not None:
        kw["handles"] = list(handles)
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kw)


def legend_below(fig: Figure, handles: Sequence[Artist], **kw: Any) -> Legend:
    """One legend for the whole figure, centred under the lowest axes' tick and axis labels."""
    r = renderer(fig)
    boxes = [ax.get_tightbbox(r) for ax in fig.axes]
    bottom = min(b.y0 for b in boxes if b is not None)
    kw.setdefault("fontsize", 8)
    kw.setdefault("frameon", False)
    kw.setdefault("ncol", max(len(handles), 1))
    return fig.legend(handles=list(handles), loc="upper center",
                      bbox_to_anchor=(0.5, (bottom - PAD_PX) / fig.bbox.height),
                      bbox_transform=fig.transFigure, borderaxespad=0.0, **kw)


def fit_texts(ax: Axes, texts: Sequence[Text] | None = None) -> None:
    """Widen the axes' (increasing, linear) limits until every text lies inside the axes.

    A text anchored at data x with its far edge o pixels past the axes' edge comes inside when
    the limits grow by o pixels' worth at the new scale: span / (width - overflow) per pixel."""
    r = renderer(ax.figure)  # type: ignore[arg-type]
    items = list(ax.texts if texts is None else texts)
    for _ in range(FIT_ROUNDS):
        box = ax.get_window_extent(r).padded(-TEXT_PAD_PX)  # a little clear of the frame
        ext = [t.get_window_extent(r) for t in items if t.get_text()]
        if not ext:
            return
        over = (max(0.0, box.x0 - min(e.x0 for e in ext)), max(0.0, max(e.x1 for e in ext) - box.x1),
                max(0.0, box.y0 - min(e.y0 for e in ext)), max(0.0, max(e.y1 for e in ext) - box.y1))
        if max(over) < 0.5:
            return
        for (lo, hi), size, (o_lo, o_hi), setter in (
                (ax.get_xlim(), box.width, over[:2], ax.set_xlim),
                (ax.get_ylim(), box.height, over[2:], ax.set_ylim)):
            if o_lo or o_hi:
                per_px = (hi - lo) / max(size - o_lo - o_hi, 0.2 * size)  # at the new scale
                setter(lo - 1.05 * o_lo * per_px, hi + 1.05 * o_hi * per_px)
