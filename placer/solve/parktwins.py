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

from placer.cost.estimate import Estimate
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
