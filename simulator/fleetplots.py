"""Figures of a fleet's simulation (matplotlib, Agg backend: no display needed).

  fleet_gantt.png   one row per node, grouped by pool; time across; each node's bar coloured by
                    the job holding it (a lending team's own work on a node it took back is
                    grey and hatched); a black cross marks each node a preemption took from a
                    job; the preempted job's kept nodes are light grey and dotted while it
                    re-plans and restarts, then its bar runs on in its colour on those fewer
                    nodes; a grey square ends the bars of a job suspended (no plan fit)
  fleet_usage.png   per team and pool, the nodes its jobs hold against its nominal quota and its
                    cap (nominal plus borrowing limit): as allocated and, where a preemption
                    moved nodes, after it

A pool of more than `MAX_NODES_SHOWN` nodes is drawn as its first ones (the title says so).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from placer.base.figlayout import legend_beside
from placer.base.palette import save
from simulator.fleetresult import FleetSimResult

MAX_NODES_SHOWN = 24  # per pool
RECLAIMED = "0.6"
RESTARTING = "0.85"
SUSPENDED = "0.3"
ROW = 0.8  # bar height, in rows


def job_colours(names: list[str]) -> dict[str, str | tuple[float, float, float]]:
    """A colour per job: the ten default ones, then tab20's without its greys."""
    if len(names) <= 10:
        return {n: f"C{i}" for i, n in enumerate(names)}
    tab20 = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]
    pairs = [c for i, c in enumerate(tab20) if i not in (14, 15)]
    return {n: pairs[i % len(pairs)] for i, n in enumerate(names)}


def write_fleet_plots(result: FleetSimResult, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [save(gantt(result), out / "fleet_gantt.png"),
            save(usage(result), out / "fleet_usage.png")]


def _rows(result: FleetSimResult) -> tuple[dict[tuple[str, int], int], list[tuple[str, int]]]:
    """(pool, node) -> row (top to bottom, pool by pool), and each pool's first row and count."""
    row, first = {}, []
    y = 0
    for pool, n in result.pools.items():
        shown = min(n, MAX_NODES_SHOWN)
        first.append((pool, y))
        for node in range(shown):
            row[(pool, node)] = y
            y += 1
    return row, first


def gantt(result: FleetSimResult) -> Figure:
    """Nodes by pool against time, coloured by job; preemptions marked (module docstring)."""
    row, first = _rows(result)
    colours = job_colours([j.name for j in result.jobs])
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.22 * max(len(row), 4)))
    bars: dict[str, list[tuple[float, float, int]]] = {}
    for s in result.spans:
        if (s.pool, s.node) in row and s.end_s > s.start_s:
            key = "reclaimed" if s.reclaimed else "restarting" if s.restarting else s.holder
            bars.setdefault(key, []).append((s.start_s, s.end_s - s.start_s, row[(s.pool, s.node)]))
    handles: list[Patch | Line2D] = []
    for name, colour in colours.items():
        for x, w, y in bars.get(name, []):
            ax.broken_barh([(x, w)], (y - ROW / 2, ROW), facecolors=colour, label=name)
        if name in bars:
            handles.append(Patch(color=colour, label=name))
    for kind, colour, hatch, label in (
            ("reclaimed", RECLAIMED, "//", "taken back by the lending team"),
            ("restarting", RESTARTING, "..",
             "preempted job re-planning and restarting on the nodes it kept")):
        if kind not in bars:
            continue
        for x, w, y in bars[kind]:
            ax.broken_barh([(x, w)], (y - ROW / 2, ROW), facecolors=colour, hatch=hatch,
                           edgecolor="white")
        handles.append(Patch(facecolor=colour, hatch=hatch, edgecolor="white", label=label))
    handles += _marks(ax, result, row)
    for _pool, y0 in first[1:]:
        ax.axhline(y0 - 0.5, color="black", linewidth=0.6)
    ax.set_yticks([y0 + (min(result.pools[p], MAX_NODES_SHOWN) - 1) / 2 for p, y0 in first])
    ax.set_yticklabels([f"{p} ({result.pools[p]} nodes)" for p, _ in first])
    ax.set_ylim(len(row) - 0.5, -0.5)
    ax.set_xlim(0, max(result.end_s, max((s.end_s for s in result.spans), default=1.0)) or 1.0)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("nodes, by pool")
    cut = [p for p, n in result.pools.items() if n > MAX_NODES_SHOWN]
    note = f"; first {MAX_NODES_SHOWN} nodes of {', '.join(cut)}" if cut else ""
    ax.set_title(f"fleet {result.fleet}: who holds each node{note}")
    legend_beside(ax, handles)
    return fig


def _marks(ax: Axes, result: FleetSimResult, row: dict[tuple[str, int], int]) -> list[Line2D]:
    """A cross on each node a preemption took from a job, a square where a suspended job's bars
    end; their legend entries."""
    ended = {(s.pool, s.node, s.end_s) for s in result.spans if not s.reclaimed}
    took = [(s.start_s, row[(s.pool, s.node)]) for s in result.spans
            if s.reclaimed and (s.pool, s.node) in row and (s.pool, s.node, s.start_s) in ended
            and any(ev.pool == s.pool and ev.at_s == s.start_s for ev in result.preemptions)]
    names = {j.name: j.suspended_at_s for j in result.jobs if j.suspended_at_s is not None}
    stopped = [(s.end_s, row[(s.pool, s.node)]) for s in result.spans
               if (s.pool, s.node) in row and names.get(s.holder) == s.end_s
               and (s.end_s, row[(s.pool, s.node)]) not in took]
    out = []
    for points, marker, colour, label in ((took, "X", "black", "preemption"),
                                          (stopped, "s", SUSPENDED,
                                           "suspended: no plan fits what it kept")):
        if points:
            ax.plot([x for x, _ in points], [y for _, y in points], linestyle="none",
                    marker=marker, markersize=9, color=colour, label=label)
            out.append(Line2D([], [], linestyle="none", marker=marker, color=colour, label=label))
    return out


def usage(result: FleetSimResult) -> Figure:
    """Per team and pool: nodes held against the nominal quota and the cap."""
    after = {(u.team, u.pool): u.used for u in result.usage_after}
    rows = result.usage
    moved = any(after.get((u.team, u.pool), u.used) != u.used for u in rows)
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4))
    xs = list(range(len(rows)))
    width = 0.38 if moved else 0.7
    ax.bar([x - width / 2 if moved else x for x in xs], [u.used for u in rows], width,
           color="C0", label="held, as allocated")
    handles: list[Patch | Line2D] = [Patch(color="C0", label="held, as allocated")]
    if moved:
        ax.bar([x + width / 2 for x in xs], [after.get((u.team, u.pool), u.used) for u in rows],
               width, color="C1", label="held after the preemptions")
        handles.append(Patch(color="C1", label="held after the preemptions"))
    ax.plot(xs, [u.nominal for u in rows], linestyle="none", marker="_", markersize=28,
            markeredgewidth=2.5, color="black", label="nominal quota")
    ax.plot(xs, [u.cap for u in rows], linestyle="none", marker="_", markersize=28,
            markeredgewidth=1.5, color="C3", label="cap (nominal + borrowing limit)")
    handles += [Line2D([], [], linestyle="none", marker="_", markersize=14, markeredgewidth=2.5,
                       color="black", label="nominal quota"),
                Line2D([], [], linestyle="none", marker="_", markersize=14, markeredgewidth=1.5,
                       color="C3", label="cap (nominal + borrowing limit)")]
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{u.team}\n{u.pool}" for u in rows], fontsize=8)
    ax.set_ylabel("nodes")
    ax.set_xlabel("team and pool")
    ax.set_title(f"fleet {result.fleet}: each team's nodes against its quota")
    ax.set_ylim(0, max([u.cap for u in rows] + [1]) * 1.15)
    legend_beside(ax, handles)
    return fig
