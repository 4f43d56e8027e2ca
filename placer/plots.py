"""Figures for plans (matplotlib, Agg backend: no display needed).

  placement(plan)           which role sits on which pool, node and device: one row of nodes per
                            pool, one cell per device, coloured by the slot (the roles that
                            time-share those devices); idle devices grey. A role split over
                            pools is drawn on each part's pool, in its slot's colour, each
                            part's devices labelled with the part's share of the samples

Each function draws on a new figure and returns it; `save(fig, path)` writes a PNG atomically,
`png(fig)` returns its bytes (for notebooks); both come from `placer.base.palette`, the one
palette of every timeline. The figures of fidelity reports and what-if sweeps live in
`workflows.plots`, the simulator's in `simulator.plots`.
"""
from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from placer.base.figlayout import fit_texts, legend_beside
from placer.base.palette import png, save
from placer.solve.planfile import Plan

__all__ = ["part_labels", "placement", "png", "save"]

MAX_NODES_SHOWN = 12  # per pool; a 1000-node pool is drawn as its first nodes plus a count


def slot_colours(n: int) -> list[str | tuple[float, float, float]]:
    """n colours, different up to 18 (none near the idle grey): the ten default ones, or tab20's
    without its two greys."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    tab20 = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]
    pairs = [c for i, c in enumerate(tab20) if i not in (14, 15)]
    return [pairs[i % len(pairs)] for i in range(n)]


def part_labels(plan: Plan) -> dict[tuple[str, int], list[tuple[list[int], str]]]:
    """(pool, node) -> (devices, label) of each split role's part there: `ROLE SHARE%`, the part's
    share of the samples (its bundles on that pool, `Bundle.pool`, are its devices)."""
    split = {r.slot: (name, r) for name, r in plan.roles.items() if r.parts}
    out: dict[tuple[str, int], list[tuple[list[int], str]]] = {}
    for b in plan.bundles:
        if b.slot in split and b.devices:
            name, r = split[b.slot]
            share = sum(q.share for q in r.parts if q.pool == b.pool)
            out.setdefault((b.pool, b.node), []).append((b.devices, f"{name} {share:.0%}"))
    return out


def placement(plan: Plan) -> Any:
    """Pools as rows, nodes as boxes, devices as cells coloured by slot."""
    res = plan.resolved()
    pools = res.job.cluster.pools
    # keyed by slot name; an unused device looks up None and gets the default grey
    slot_colour: dict[str | None, str | tuple[float, float, float]] = dict(zip(
        (s.name for s in plan.slots), slot_colours(len(plan.slots))))
    used: dict[tuple[str, int, int], str] = {}
    for b in plan.bundles:
        for d in b.devices:
            used[(b.pool, b.node, d)] = b.slot
    shown = {pool.name: min(pool.nodes, MAX_NODES_SHOWN) for pool in pools}
    drawn = {slot for (pool, node, _d), slot in used.items() if node < shown[pool]}
    shares = part_labels(plan)
    width = max(min(p.nodes, MAX_NODES_SHOWN) * (p.devices_per_node + 1) for p in pools)
    fig, ax = plt.subplots(figsize=(min(2 + 0.35 * width, 16), 1.2 + 1.1 * len(pools)))
    for row, pool in enumerate(pools):
        y = len(pools) - 1 - row
        x = 0.0
        for node in range(min(pool.nodes, MAX_NODES_SHOWN)):
            ax.add_patch(Rectangle((x - 0.1, y - 0.1), pool.devices_per_node + 0.2, 0.9,
                                   fill=False, lw=1, ec="k"))
            for d in range(pool.devices_per_node):
                slot = used.get((pool.name, node, d))
                ax.add_patch(Rectangle((x + d, y), 1.0, 0.7, fc=slot_colour.get(slot, "0.85"),
                                       ec="white", lw=0.8))
            for devs, text in shares.get((pool.name, node), []):  # a split role's part here
                ax.text(x + (min(devs) + max(devs) + 1) / 2, y + 0.35, text, ha="center",
                        va="center", fontsize=7, color="white", fontweight="bold")
            x += pool.devices_per_node + 1
        if pool.nodes > MAX_NODES_SHOWN:
            ax.text(x, y + 0.35, f"+{pool.nodes - MAX_NODES_SHOWN} nodes", va="center", fontsize=8)
        dev = res.device_of(pool.name)
        ax.text(-0.5, y + 0.35, f"{pool.name}\n{dev.name}", ha="right", va="center", fontsize=9)
    ax.set_xlim(-4, width + 3)
    ax.set_ylim(-0.5, len(pools) + 0.1)
    ax.axis("off")
    handles = [Patch(color=slot_colour[s.name], label=f"{' + '.join(s.roles)} ({s.devices}"
                     + ("" if not s.parts else ": " + " + ".join(f"{q.devices} {q.pool}"
                                                                 for q in s.parts)) + ")")
               for s in plan.slots if s.name in drawn]  # an entry only for what is drawn
    if any((p.name, n, d) not in used for p in pools for n in range(shown[p.name])
           for d in range(p.devices_per_node)):
        handles.append(Patch(color="0.85", label="idle"))
    fit_texts(ax)  # pool names and node counts inside the axes: clear of the legend beside it
    legend_beside(ax, handles, frameon=True, title="slot: roles (devices)")
    hidden = [f"{' + '.join(s.roles)} ({s.devices})" for s in plan.slots if s.name not in drawn]
    ax.set_title(f"{res.job.name}: placement (one box per node, one cell per device)"
                 + (f"\non nodes not drawn: {', '.join(hidden)}" if hidden else ""))
    return fig
