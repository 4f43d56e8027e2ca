"""Figures of the workflows' reports (matplotlib, Agg backend): fidelity and what-if sweeps.

  timelines(measured, sim)  the executed and the simulated run, one above the other on one time
                            axis: one lane per worker (pid/tid), bars coloured by the kind of work
  length_finish(report)     each sample's response tokens against when its generation finished,
                            measured and simulated
  step_bars(report)         measured and simulated time of every step, and the stage means
  sweep(rows)               one what-if sweep (`workflows.whatif` rows): iteration time
                            (predicted, simulated, p99) and throughput against the knob
  pareto(points)            throughput against cost per sample, every point labelled, the
                            frontier joined

Each function draws on a new figure and returns it; `placer.base.palette.save` / `png` write it.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from placer.base.figlayout import fit_texts, legend_below, legend_beside, renderer
from placer.base.palette import KIND_COLOURS, kind_colour, kind_handles, png, save
from traces.schema import Trace

if TYPE_CHECKING:
    from workflows.report import Report

__all__ = ["length_finish", "pareto", "png", "save", "step_bars", "sweep", "timelines"]

FRONTIER, OTHER_POINT, INFEASIBLE = "C3", "0.6", "C1"


def _lanes(trace: Trace, t0: float, extra: Sequence[tuple[str, float, float, str]] = ()
           ) -> tuple[list[str], list[tuple[int, float, float, str]]]:
    bars: list[tuple[str, float, float, str]] = [(n, t - t0, d, c) for n, t, d, c in extra]
    for e in trace.events:
        if e.cat in KIND_COLOURS and e.dur_s > 0:
            bars.append((f"{e.pid}/{e.tid}", e.ts_s - t0, e.dur_s, e.cat))
    lanes = sorted({b[0] for b in bars})
    idx = {name: i for i, name in enumerate(lanes)}
    return lanes, [(idx[n], t, d, c) for n, t, d, c in bars]


def timelines(measured: Trace, simulated: Trace, step_edges: tuple[list[float], list[float]],
              title: str = "", extra: Sequence[tuple[str, float, float, str]] = ()) -> Any:
    """Executed (top) and simulated (bottom) runs on one time axis; dotted lines end steps.

    `step_edges` are the (measured, simulated) step end times, measured relative to its first
    step's start (the times the bars are shifted by); `extra` adds (lane, start, duration, kind)
    bars to the executed panel (work the trace has no event for)."""
    m_starts = [e.ts_s for e in measured.events if e.cat in ("stage", "step")]
    t0 = min(m_starts) if m_starts else 0.0
    ml, mb = _lanes(measured, t0, extra)
    sl, sb = _lanes(simulated, 0.0)
    fig, (a1, a2) = plt.subplots(2, 1, sharex=True, figsize=(12, 1.6 + 0.32 * (len(ml) + len(sl))),
                                 gridspec_kw={"height_ratios": [max(len(ml), 1), max(len(sl), 1)]})
    panels = ((a1, ml, mb, step_edges[0], "measured (executed)"),
              (a2, sl, sb, step_edges[1], "simulated (replayed inputs)"))
    for ax, lanes, bars, edges, name in panels:
        by_colour: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
        for lane, t, d, cat in bars:
            by_colour[cat].append((lane, t, d))
        for cat, items in by_colour.items():
            for lane, t, d in items:
                ax.broken_barh([(t, d)], (lane - 0.4, 0.8), color=kind_colour(cat))
        for x in edges:
            ax.axvline(x, color="k", lw=0.7, ls=":")
        ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
        ax.set_ylim(-0.6, max(len(lanes), 1) - 0.4)
        ax.invert_yaxis()
        ax.set_title(name, fontsize=10, loc="left")
    a2.set_xlabel("time since the first step began (s); dotted: step ends")
    fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    # a colour's label comes from the kind that chose it (a sandbox verify: environment work)
    legend_below(fig, kind_handles({b[3] for b in mb} | {b[3] for b in sb}))
    return fig


def length_finish(report: Report) -> Any:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    lengths = report.lengths
    for side, rel, colour, marker in (("measured", lengths.measured, "C3", "o"),
                                      ("simulated", lengths.simulated, "C0", "x")):
        pts = rel.points or ()
        ax.scatter([p[1] for p in pts], [p[2] for p in pts], s=16, c=colour, marker=marker,
                   alpha=0.6, label=f"{side} (makespan {rel.makespan_s:.3f} s)")
    ax.set_xlabel("response tokens of the sample")
    ax.set_ylabel("generation finished, s after rollout start")
    ax.set_title(f"{report.job}: rollout length vs finish time (steady steps)", fontsize=10)
    legend_beside(ax)
    return fig


def step_bars(report: Report) -> Any:
    """Measured and simulated time of every step, and the stage means side by side."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    steps = sorted(report.steps)
    w = 0.38
    a1.bar([s - w / 2 for s in steps], [report.steps[s].measured for s in steps], w,
           color="C3", label="measured")
    a1.bar([s + w / 2 for s in steps], [report.steps[s].simulated for s in steps], w,
           color="C0", label="simulated")
    a1.axhline(report.predicted_s, color="k", ls="--", lw=1, label="predicted (plan)")
    a1.set_xticks(steps)
    a1.set_xlabel("step")
    a1.set_ylabel("step time (s)")
    a1.set_title("steps", fontsize=10)
    names = list(report.stages)
    xs = range(len(names))
    a2.bar([x - w / 2 for x in xs], [report.stages[n].measured for n in names], w, color="C3")
    a2.bar([x + w / 2 for x in xs], [report.stages[n].simulated for n in names], w, color="C0")
    a2.set_xticks(list(xs), names, fontsize=8)
    a2.set_xlabel("stage")
    a2.set_ylabel("mean over steady steps (s)")
    a2.set_title("stages", fontsize=10)
    fig.suptitle(f"{report.job}: measured vs simulated", fontsize=11)
    legend_below(fig, a1.get_legend_handles_labels()[0])  # both panels' colours
    return fig


def sweep(rows: list[dict[str, Any]]) -> Any:
    """One sweep (workflows/whatif.py rows): predicted, simulated mean and p99 iteration time, and
    throughput, against the knob's value; infeasible points are marked on the time axis."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
    ok = [(str(r["value"]), r) for r in rows if "infeasible" not in r]
    xs = [str(r["value"]) for r in rows]
    simulated = all("simulated_s" in r for _, r in ok)  # a grid may be planned only
    for key, style, name in (("predicted_s", "k--o", "predicted (plan)"),
                             ("simulated_s", "C0-o", "simulated mean"),
                             ("p99_s", "C3:o", "simulated p99")):
        if key == "predicted_s" or simulated:
            a1.plot([x for x, _ in ok], [r[key] for _, r in ok], style, label=name)
    basis = "simulated" if simulated else "predicted"
    a2.bar([x for x, _ in ok], [r["samples_per_s"] for _, r in ok], color="C2",
           label=f"throughput ({basis})")
    bad = [str(r["value"]) for r in rows if "infeasible" in r]
    if bad:
        a1.plot(bad, [0] * len(bad), "x", color=INFEASIBLE, ms=9, ls="none",
                label="infeasible (no plan)")
    knob = rows[0]["knob"] if rows else ""
    a1.set_xlabel(knob)
    a1.set_ylabel("iteration time (s)")
    a1.set_title("iteration time", fontsize=10)
    a2.set_xlabel(knob)
    a2.set_ylabel(f"samples per s ({basis})")
    a2.set_title("throughput", fontsize=10)
    long = max((len(x) for x in xs), default=0) > 8  # grid labels: "gen.nodes=2, ..."
    for ax in (a1, a2):
        ax.set_xticks(range(len(xs)), xs, rotation=35 if long else 0,
                      ha="right" if long else "center", fontsize=7 if long else None)
    fig.suptitle(f"sweep: {knob}", fontsize=10)
    fig.tight_layout()  # the panels' rotated labels apart before the legend goes under them
    legend_below(fig, [h for ax in (a1, a2) for h in ax.get_legend_handles_labels()[0]])
    return fig


def pareto(points: list[dict[str, Any]], x: str = "cost_per_sample",
           y: str = "samples_per_s", label: str = "label", title: str = "") -> Any:
    """Scatter of every point and the non-dominated ones (higher y, lower x) joined. Every point
    is labelled: short labels beside it, long ones (a sweep's "pool.nodes=2, ...") by a number
    beside it and a key of the numbers beside the axes; points at the same place share one.
    The limits grow until every label lies inside the axes; the legend and the key sit outside
    them (the key under the legend, placed from its drawn extent), so neither covers a point
    or a label."""
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.scatter([p[x] for p in points], [p[y] for p in points], c=OTHER_POINT, s=18,
               label="plans", zorder=2)
    labels: dict[tuple[float, float], list[str]] = defaultdict(list)
    for p in points:
        labels[(p[x], p[y])].append(str(p[label]))
    uniq = list(labels)
    front = sorted((q for q in uniq if not any(o[0] <= q[0] and o[1] >= q[1] and o != q
                                                for o in uniq)), key=lambda q: q[0])
    ax.plot([q[0] for q in front], [q[1] for q in front], "o-", c=FRONTIER,
            label="Pareto frontier (and its labels)", zorder=3)
    numbered = max((len(str(p[label])) for p in points), default=0) > 14
    key, n = [], 0
    for k, (at, names) in enumerate(sorted(labels.items())):
        if numbered:
            ids = list(range(n + 1, n + len(names) + 1))
            n += len(names)
            key += [f"{i}: {name}" for i, name in zip(ids, names)]
            text = ",".join(map(str, ids))
        else:
            text = "\n".join(names)
        # alternate above and below so that neighbours' labels do not sit on each other
        ax.annotate(text, at, fontsize=7, xytext=(5, 5 if k % 2 == 0 else -12),
                    textcoords="offset points", color=FRONTIER if at in front else "0.25")
    ax.set_xlabel(x.replace("_", " ") + (" (USD)" if "cost" in x else ""))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title(title or f"{y.replace('_', ' ')} against {x.replace('_', ' ')}", fontsize=10)
    fit_texts(ax)  # every label inside the axes: none reaches the legend beside them
    legend = legend_beside(ax)
    if key:
        r = renderer(fig)
        below = ax.transAxes.inverted().transform(legend.get_window_extent(r))[0][1]
        ax.text(1.02, below - 0.04, "\n".join(key), transform=ax.transAxes, fontsize=7,
                va="top", family="monospace")
    return fig
