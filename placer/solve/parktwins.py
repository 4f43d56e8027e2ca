"""Optimizer parking as a layout option of trained roles (`placer.cost.optpark`).

A trained candidate on GPUs may have a twin with `park_optimizer`: the same estimate (the step
runs on the GPU either way), priced by its slot instead (`timing.slot_switch`: less memory held
beside colocated roles, the state's copy out and back once per RL step). Twins are offered only
where the job's framework can park an optimizer (`FrameworkProfile.park_optimizer`), and only of
the `PARK_TWINS` fastest candidates per role and pool, which keeps the ILP's size bounded: at
most that many candidates more per trained role and pool.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Protocol, TypeVar

from placer.cost import optpark
from placer.cost.roleestimate import Estimate
from placer.solve.planfile import Plan
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind

PARK_TWINS = 4


class _Cand(Protocol):
    """What this module reads of `candidates.Candidate` (which imports this module)."""

    @property
    def role(self) -> str: ...

    @property
    def pool(self) -> str: ...

    @property
    def est(self) -> Estimate: ...


C = TypeVar("C", bound=_Cand)


def parkable(res: Resolved, c: _Cand) -> bool:
    """Whether `c` may park its optimizer: a trained role on a GPU pool whose memory is not host
    RAM, one pool, its optimizer on the device (not `offload`), under a framework that parks."""
    dev = res.device_of(c.pool) if not c.est.parts else None
    return (dev is not None and c.role in res.job.profile.park_optimizer
            and dev.kind is DeviceKind.gpu and not dev.host_backed
            and not c.est.par.offload and not c.est.par.park_optimizer
            and c.est.memory.optimizer > 0)


def park_twins(res: Resolved, cands: list[C]) -> list[tuple[C, Estimate]]:
    """(candidate, its parked twin's estimate) for the `PARK_TWINS` fastest parkable candidates
    of one role and pool."""
    fastest = sorted((c for c in cands if parkable(res, c)), key=lambda c: c.est.time_s)
    return [(c, replace(c.est, par=replace(c.est.par, park_optimizer=True)))
            for c in fastest[:PARK_TWINS]]


def park_note(plan: Plan, res: Resolved, slot: str, switch_s: float) -> str | None:
    """The `--explain` note of a slot that parks optimizers and fits on its devices so (None:
    it does not, or it parks nothing): who parks how much, the peak, and the copies' time."""
    sl = next(s for s in plan.slots if s.name == slot)
    rs = {r: plan.roles[r] for r in sl.roles if r in plan.roles}
    parked = {r: p.parked_gb for r, p in rs.items() if p.park_optimizer}
    dev_gb = res.device_of(sl.pool).memory_gb
    peak = optpark.slot_peak_gb((p.memory_gb, p.parked_gb) for p in rs.values())
    if not parked or peak > dev_gb:
        return None
    who = ", ".join(f"{r} {gb:.1f} GB" for r, gb in parked.items())
    whole = sum(p.memory_gb for p in rs.values())
    return (f"slot {slot}: optimizer state parked in host memory between phases ({who} per "
            f"device), stepped on the GPU: its roles peak at {peak:.1f} of {dev_gb:g} GB per "
            f"device ({whole:.1f} GB with every optimizer resident); the copies out and back "
            f"cost {switch_s:.2f} s per iteration")
