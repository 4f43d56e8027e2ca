"""Figures of a simulated run (matplotlib, Agg backend: no display needed).

  timeline.png       one row per slot: when its devices work, coloured by the kind of work
                     (prefill, decode, forward, reward, train, transfer)
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
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

if TYPE_CHECKING:
    from simulator.api import SimResult

BINS = 200


def write_plots(result: "SimResult", out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [timeline(result, out / "timeline.png"), utilization(result, out / "utilization.png"),
             response_vs_completion(result, out / "response_vs_completion.png")]
    return paths


def _save(fig, path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)  # atomic: readers never see half a figure
    return path


def _intervals(result: "SimResult") -> list[tuple[str, float, float, float]]:
    """(slot, start, dur, share): slot work plus every engine step from the trace rows."""
    share = 1.0 / max(result.run.replicas, 1)
    out = list(result.run.busy)
    for name, cat, ts, dur, _pid, tid, _args in result._rec.rows:
        if cat in ("prefill", "decode"):
            out.append((tid.split("/engine")[0], ts, dur, share))
    return out


def _work_rows(result: "SimResult", slots: list[str]) -> list[tuple[int, float, float, str]]:
    """(slot row, start, dur, kind of work) for every traced event that ran on a slot."""
    row = {slot: i for i, slot in enumerate(slots)}
    env = result.plan.roles.get("environment")
    out = []
    for _name, cat, ts, dur, _pid, tid, _args in result._rec.rows:
        # tool calls are traced per CPU core ("env3"); draw them on the environment's slot
        slot = env.slot if cat == "tool" and env is not None else tid.split("/")[0]
        if slot in row and dur > 0:
            out.append((row[slot], ts, dur, cat))
    return out


def timeline(result: "SimResult", path: Path) -> Path:
    """One row per slot; bars coloured by the kind of work (generation, scoring, training...)."""
    from matplotlib.patches import Patch  # noqa: PLC0415

    from placer.plots import KIND_COLOURS  # noqa: PLC0415  (one palette for every timeline)

    slots = [s.name for s in result.plan.slots]
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(slots) + 2.0))
    for slot, t, d, _share in result.run.busy:  # slot work first, pale, under the events
        if slot in slots and d > 0:
            ax.broken_barh([(t, d)], (slots.index(slot) - 0.4, 0.8), color="0.88")
    kinds = set()
    for r, t, d, cat in _work_rows(result, slots):
        ax.broken_barh([(t, d)], (r - 0.4, 0.8), color=KIND_COLOURS.get(cat, "C7"))
        kinds.add(cat)
    for rec in result.run.iterations:
        ax.axvline(rec.end, color="k", lw=0.5, ls=":")
    ax.set_yticks(range(len(slots)), slots)
    ax.set_xlabel("simulated time (s)")
    ax.set_title(f"{result.plan.job.get('name', 'job')}: work per slot (dotted: iteration ends)")
    handles = [Patch(color=KIND_COLOURS.get(k, "C7"), label=k) for k in sorted(kinds)]
    handles.append(Patch(color="0.88", label="slot busy (other)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25),
              ncol=len(handles), fontsize=8, frameon=False)
    return _save(fig, path)


def utilization(result: "SimResult", path: Path) -> Path:
    plan, run = result.plan, result.run
    span = max(run.end_s, 1e-9)
    edges = np.linspace(0, span, BINS + 1)
    width = edges[1] - edges[0]
    dev_of = {s.name: (s.pool, s.devices) for s in plan.slots}
    busy: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(BINS))
    for slot, t, d, share in _intervals(result):
        pool, n = dev_of[slot]
        lo, hi = np.searchsorted(edges, [t, t + d], side="right") - 1
        for b in range(max(lo, 0), min(hi, BINS - 1) + 1):
            overlap = min(t + d, edges[b + 1]) - max(t, edges[b])
            if overlap > 0:
                busy[pool][b] += overlap * share * n
    total = defaultdict(int)
    for s in plan.slots:
        total[s.pool] += s.devices
    fig, ax = plt.subplots(figsize=(11, 3.5))
    mids = (edges[:-1] + edges[1:]) / 2
    for pool, arr in sorted(busy.items()):
        ax.plot(mids, np.minimum(arr / width / total[pool], 1.0), label=pool)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("busy share of planned devices")
    ax.legend(loc="upper right")
    return _save(fig, path)


def response_vs_completion(result: "SimResult", path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for rec in result.run.iterations:
        smp = result.run.samples.get(rec.index)
        if smp is None or not rec.done_at:
            continue
        t0 = rec.stages.get("rollout", (rec.start, rec.start))[0]
        ids = sorted(rec.done_at)
        ax.scatter([rec.done_at[i] - t0 for i in ids], [sum(smp.response[i]) for i in ids], s=4,
                   alpha=0.5, label=f"iteration {rec.index}")
    ax.set_xlabel("rollout finish time after rollout start (s)")
    ax.set_ylabel("response tokens (all turns)")
    if len(result.run.iterations) <= 5:
        ax.legend(loc="lower right", markerscale=3)
    return _save(fig, path)
