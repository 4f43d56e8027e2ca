"""A role's estimate: the time its work takes per iteration, by stage, and its memory per device.

`Estimate` is what every estimator (`placer.cost.estimate` for the trainers, frozen passes,
reward and environment, `placer.cost.rolloutcost` for the engines) returns and what the planner's
cost table holds; `Part` is one pool's share of a role split over pools (`placer.cost.split`).
`infeasible` marks an estimate that cannot run, with the reason the planner reports.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.cost.roofline import Memory
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceType


@dataclass(frozen=True)
class Estimate:
    """Time (s) of a role's work per iteration, split by stage, and its memory per device (GB)."""

    role: str
    pool: str
    par: Parallel
    memory: Memory
    stage_s: dict[str, float]
    feasible: bool = True
    reason: str = ""
    concurrency: int = 0  # rollout: sequences per replica at once
    # A role split over pools (`placer.cost.split`): each part's own estimate and samples; the
    # whole's `pool` names the parts' pools joined by "+", `par` is the first part's layout.
    parts: tuple[Part, ...] = ()

    @property
    def time_s(self) -> float:
        return sum(self.stage_s.values())

    @property
    def devices(self) -> int:
        return sum(p.est.devices for p in self.parts) if self.parts else self.par.devices

    def pool_devices(self) -> dict[str, int]:
        """Devices held on each pool: one pool, or every part's."""
        if not self.parts:
            return {self.pool: self.devices}
        out: dict[str, int] = {}
        for p in self.parts:
            out[p.est.pool] = out.get(p.est.pool, 0) + p.est.devices
        return out


@dataclass(frozen=True)
class Part:
    """One part of a split role: its estimate for its `samples` of the batch's kept samples."""

    est: Estimate
    samples: int


def lpu_short(m: ModelArch, dev: DeviceType, chips: int, par: Parallel) -> str:
    return (f"{m.name} needs {chips} {dev.name} chips to hold {m.params() * 2 / 1e9:.1f} GB of "
            f"weights plus KV reserve in {dev.memory_gb:g} GB of SRAM each, got {par.devices}")


def infeasible(est: Estimate, reason: str) -> Estimate:
    return Estimate(est.role, est.pool, est.par, est.memory, est.stage_s, False, reason,
                    est.concurrency)
