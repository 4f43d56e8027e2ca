"""Figures of a simulated run (matplotlib, Agg backend: no display needed).

  timeline.png       one row per slot: when its devices work, coloured by the kind of work
                     (prefill, decode, forward, reward, train, transfer); a rollout split over
                     pools gets one row per part, labelled with the part's pool
  utilization.png    busy share of each pool's planned devices over time (binned)
  response_vs_completion.png
                     each sample's total response tokens against when its rollout finished,
                     relative to its rollout's start: the long tail at a glance
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from placer.base.figlayout import legend_below, legend_beside
from placer.base.palette import kind_colour, kind_handles, save  # one palette, one writer
from placer.base.roles import Role

if TYPE_CHECKING:
    from simulator.result import SimResult

BINS = 200
PIXELS = 1200  # the timeline's time bins: about its width in pixels at the saved dpi
MAX_ITERATION_COLOURS = 5
SLOT_BUSY = "0.88"  # a slot held by work no event of its own shows (under the events' bars)


def write_plots(result: SimResult, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [timeline(result, out / "timeline.png"), utilization(result, out / "utilization.png"),
             response_vs_completion(result, out / "response_vs_completion.png")]
    return paths


def _pool_work(result: SimResult) -> dict[str, list[tuple[float, float, float]]]:
    """Pool -> (start, dur, devices kept busy): slot work plus every engine step from the trace
    rows. A rollout split over pools: its slot work (weight sync) busies every part's devices,
    and each engine step one replica of the part on its own pool (the event's pid)."""
    run = result.run
    where = {s.name: s.pool_devices() for s in result.plan.slots}
    split = {s.name for s in result.plan.slots if s.parts}
    out: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for slot, t, d, share in run.busy:
        for pool, n in where[slot]:
            out[pool].append((t, d, share * n))
    share = 1.0 / max(run.replicas, 1)
    per_part = {pool: n / max(reps, 1) for pool, reps, n in run.engine_groups}
    rec = result._rec  # its columns: no tuple per event
    for cat, ts, dur, tid, pid in zip(rec.cats, rec.ts, rec.dur, rec.tids, rec.pids):
        if cat in ("prefill", "decode"):
            slot = tid.split("/engine")[0]
            if slot in split:
                out[pid].append((ts, dur, per_part[pid]))
            else:
                pool, n = where[slot][0]
                out[pool].append((ts, dur, share * n))
    return out


Row = tuple[str, str | None]  # (slot, pool of one part of a split slot; None: the whole slot)


def timeline_rows(result: SimResult) -> list[Row]:
    """The timeline's rows in slot order: a slot, or a split slot's parts one by one (each part's
    engines run on its own pool, so one row would hide which part is the tail)."""
    rows: list[Row] = []
    for s in result.plan.slots:
        rows.extend([(s.name, q.pool) for q in s.parts] if s.parts else [(s.name, None)])
    return rows


def _row_label(row: Row) -> str:
    slot, pool = row
    return slot if pool is None else f"{slot} @ {pool}"


def _work_rows(result: SimResult, rows: list[Row]) -> list[tuple[int, float, float, str, str]]:
    """(row, start, dur, kind of work, track) for every traced event that ran on a slot; the
    track is the engine or core that did it. A split slot's event goes to the row of the part
    on whose pool it was recorded (the event's pid)."""
    index = {row: i for i, row in enumerate(rows)}
    split = {slot for slot, pool in rows if pool is not None}
    env = result.plan.roles.get(Role.ENVIRONMENT)
    slots = {s.name for s in result.plan.slots}
    out = []
    rec = result._rec
    for cat, ts, dur, tid, pid in zip(rec.cats, rec.ts, rec.dur, rec.tids, rec.pids):
        slot = tid.split("/")[0]
        # tool calls are traced per CPU core ("env3"): draw them on the environment's slot (a
        # verify held on a slot is traced on it)
        if cat == "tool" and slot not in slots and env is not None:
            slot = env.slot
        i = index.get((slot, pid if slot in split else None))
        if i is not None and dur > 0:
            out.append((i, ts, dur, cat, tid))
    return out


def covered(starts: np.ndarray, durs: np.ndarray, edges: np.ndarray,
            weights: np.ndarray | None = None) -> np.ndarray:
    """Seconds of work inside each bin [edges[b], edges[b+1]), summed over intervals (each
    counted `weights[i]` times: devices it kept busy).

    The work done by time x is W(x) = sum_i w_i clamp(x - start_i, 0, dur_i) = sum over started
    intervals of w_i (x - start_i) minus the same over ended ones; with starts and ends sorted and
    their weighted prefix sums, W at every edge costs O((n + bins) log n), so a figure of millions
    of events is as cheap as its sort (one bar per event took minutes)."""
    w = np.ones(len(starts)) if weights is None else np.asarray(weights, dtype=float)
    if len(starts) == 0:
        return np.zeros(len(edges) - 1)

    def started(points: np.ndarray) -> np.ndarray:  # sum over points p < x of w (x - p)
        order = np.argsort(points)
        p, wp = points[order], w[order]
        cw = np.concatenate(([0.0], np.cumsum(wp)))
        cwp = np.concatenate(([0.0], np.cumsum(wp * p)))
        k = np.searchsorted(p, edges)
        return cw[k] * edges - cwp[k]

    return np.diff(started(starts) - started(starts + durs))


def _bars(ax: Axes, row: int, edges: np.ndarray, share: np.ndarray, colour: str,
          floor: float) -> None:
    """One collection per row and kind: a bar per busy pixel, as opaque as the pixel is busy
    (at least `floor`, so that a short call stays visible), so a 2%-busy sandbox reads pale."""
    busy = np.flatnonzero(share > 0)
    if len(busy) == 0:
        return
    rgba = np.tile(to_rgba(colour), (len(busy), 1))
    rgba[:, 3] = np.clip(share[busy], floor, 1.0)
    ax.broken_barh([(edges[b], edges[b + 1] - edges[b]) for b in busy], (row - 0.4, 0.8),
                   facecolors=rgba, linewidth=0)


def timeline(result: SimResult, path: Path) -> Path:
    return save(timeline_figure(result), path)


def timeline_figure(result: SimResult) -> Figure:
    """One row per slot (a split slot: one per part); bars coloured by the kind of work
    (generation, scoring, training...).

    Time is binned at the figure's pixel width: each pixel of a row shows the share of it that
    each kind of work kept busy (work of parallel engines or cores adds up, capped at one)."""
    rows = timeline_rows(result)
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(rows) + 2.0))
    edges = np.linspace(0.0, max(result.run.end_s, 1e-9), PIXELS + 1)
    width = edges[1] - edges[0]
    under: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for slot, t, d, _share in result.run.busy:  # slot work first, pale, under the events
        for i, (row_slot, _pool) in enumerate(rows):  # a split slot's work busies every part
            if row_slot == slot and d > 0:
                under[i].append((t, d))
    for r, spans in under.items():
        arr = np.array(spans)
        _bars(ax, r, edges, np.minimum(covered(arr[:, 0], arr[:, 1], edges) / width, 1.0),
              SLOT_BUSY, 1.0)
    # keyed also by whether the slot itself did the work (a verify holds it whole) or its
    # engines or cores did (tool calls): each is full when all of its tracks were busy
    slots = {s.name for s in result.plan.slots}
    work: dict[tuple[int, str, bool], list[tuple[float, float]]] = defaultdict(list)
    tracks: dict[tuple[int, str, bool], set[str]] = defaultdict(set)
    for r, t, d, cat, track in _work_rows(result, rows):
        key = (r, cat, track in slots)
        work[key].append((t, d))
        tracks[key].add(track)
    for key, spans in sorted(work.items()):
        arr = np.array(spans)
        share = covered(arr[:, 0], arr[:, 1], edges) / (width * len(tracks[key]))
        _bars(ax, key[0], edges, np.minimum(share, 1.0), kind_colour(key[1]), 0.25)
    for rec in result.run.iterations:
        ax.axvline(rec.end, color="k", lw=0.5, ls=":")
    ax.set_xlim(0, edges[-1])
    ax.set_yticks(range(len(rows)), [_row_label(row) for row in rows])
    ax.set_xlabel("simulated time (s)")
    ax.set_title(f"{result.plan.spec.name}: work per slot (dotted: iteration ends; paler: less "
                 f"of the slot busy)")
    handles = kind_handles(cat for _r, cat, _whole in work)  # colour and label from one table
    if under:
        handles.append(Patch(color=SLOT_BUSY, label="slot busy (other)"))
    legend_below(fig, handles)
    return fig


def utilization(result: SimResult, path: Path) -> Path:
    plan, run = result.plan, result.run
    span = max(run.end_s, 1e-9)
    edges = np.linspace(0, span, BINS + 1)
    width = edges[1] - edges[0]
    busy = {pool: covered(a[:, 0], a[:, 1], edges, a[:, 2])
            for pool, a in ((pool, np.array(v)) for pool, v in _pool_work(result).items())}
    total: defaultdict[str, int] = defaultdict(int)
    for s in plan.slots:
        for pool, n in s.pool_devices():
            total[pool] += n
    fig, ax = plt.subplots(figsize=(11, 3.5))
    mids = (edges[:-1] + edges[1:]) / 2
    for pool, arr in sorted(busy.items()):
        ax.plot(mids, np.minimum(arr / width / total[pool], 1.0), label=pool)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("busy share of planned devices")
    ax.set_title(f"{plan.spec.name}: utilization per pool ({BINS} time bins)")
    legend_beside(ax, fontsize=None)
    return save(fig, path)


def response_vs_completion(result: SimResult, path: Path) -> Path:
    """A colour per iteration up to `MAX_ITERATION_COLOURS`; more share one colour and one label
    (a dozen colours would tell nothing apart)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    drawn = [rec for rec in result.run.iterations
             if result.run.samples.get(rec.index) is not None and rec.done_at]
    apart = len(drawn) <= MAX_ITERATION_COLOURS
    for k, rec in enumerate(drawn):
        smp = result.run.samples[rec.index]
        t0 = rec.stages.get("rollout", (rec.start, rec.start))[0]
        ids = sorted(rec.done_at)
        label = (f"iteration {rec.index}" if apart else
                 f"iterations {drawn[0].index}-{drawn[-1].index}" if k == 0 else None)
        ax.scatter([rec.done_at[i] - t0 for i in ids], [sum(smp.response[i]) for i in ids], s=4,
                   alpha=0.5, color=f"C{k % 10}" if apart else "C0", label=label)
    ax.set_xlabel("rollout finish time after rollout start (s)")
    ax.set_ylabel("response tokens (all turns)")
    ax.set_title(f"{result.plan.spec.name}: response length vs finish time", fontsize=10)
    if drawn:
        legend_beside(ax, markerscale=3, fontsize=None)
    return save(fig, path)
