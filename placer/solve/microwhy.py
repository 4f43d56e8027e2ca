"""Why a trained role runs the micro-batch it does (`plan --explain`).

The planner prices each trained layout at every micro-batch of `candidates.micro_batches` and
keeps the fastest that fits the device (`candidates.MICRO_BATCH_CHOICES`): a larger one runs its
GEMMs on more tokens and pays fewer per-micro-batch collectives, but holds more activations and,
with pipeline stages, leaves fewer micro-batches to fill the bubble. This re-prices the plan's
layout of each such role at every size tried, so the user sees both sides of the choice: the
time of the role's work at each size and, where one did not fit, what it would have needed.
"""
from __future__ import annotations

from dataclasses import replace

from placer.base.records import Record
from placer.base.roles import TRAINING_ROLES
from placer.cost.pricer import Pricer
from placer.solve.candidates import micro_batches
from placer.solve.planfile import Plan


class MicroTry(Record):
    """One micro-batch size tried for a role's layout."""

    micro_batch: int
    time_s: float
    """the role's work per iteration at this size (score + train)"""
    memory_gb: float
    """per device, activations of the largest micro-batch included"""
    fits: bool
    chosen: bool


def micro_why(plan: Plan, px: Pricer) -> dict[str, list[MicroTry]]:
    """Per trained role with a chosen micro-batch (on one pool): each size tried on its layout."""
    out: dict[str, list[MicroTry]] = {}
    for role, r in plan.roles.items():
        if role not in TRAINING_ROLES or r.micro_batch <= 0 or r.parts:
            continue
        pool = px.res.cluster.pool(r.pool)
        tries = []
        for k in sorted(micro_batches(px.res, r.par)):
            est = px.estimate(role, pool, replace(r.par, micro_batch=k))
            tries.append(MicroTry(micro_batch=k, time_s=round(est.time_s, 4),
                                  memory_gb=round(est.memory.total, 2), fits=est.feasible,
                                  chosen=k == r.micro_batch))
        out[role] = tries
    return out


def micro_lines(why: dict[str, list[MicroTry]], device_gb: dict[str, float]) -> list[str]:
    """`render`'s lines: one per role, every size tried with its time or the memory it lacks."""
    lines = []
    for role, tries in why.items():
        cells = [f"{t.micro_batch}: {t.time_s:.3f} s, {t.memory_gb:.1f} GB"
                 + (" (chosen)" if t.chosen else "")
                 if t.fits else
                 f"{t.micro_batch}: needs {t.memory_gb:.1f} GB of {device_gb.get(role, 0):g}"
                 for t in tries]
        lines.append(f"micro-batch of the {role} (sequences per device): " + "; ".join(cells))
    return lines
