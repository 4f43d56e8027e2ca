"""Pipeline modes: the job's `pipeline` section and what each mode does, in one place.

The cost model, the ILP, the simulator and the executor ask a mode the same questions through
its mechanism (`Pipeline.mechanism`), never by its name:

  overlaps_steps      the next step's sync and rollout run while this step scores and trains
  staleness           policy versions a rollout's samples may be behind the step that trains them
  iteration_s(c, b)   a step's time from its chain of stages (c: sync -> rollout -> score ->
                      train, in sequence) and its busiest slot's work (b)

  sync   stages in sequence: T = chain
  async  rollout i + 1 overlaps scoring and training of step i within a staleness bound s >= 1:
         the busiest slot bounds throughput, and one step's chain fits in s + 1 iterations, so
         T = max(busiest, chain / (s + 1)) (the bounds `placer.cost.timing` and the ILP use)

Adding a mode is one class here with its name in `PipelineKind` and `MODES`.
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from placer.spec.base import Strict

PipelineKind = Literal["sync", "async"]


class Pipeline(Strict):
    mode: PipelineKind = "sync"
    max_staleness: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] = 0

    @model_validator(mode="after")
    def _staleness(self) -> Pipeline:
        low = MODES[self.mode].MIN_STALENESS
        if self.max_staleness < low:
            raise ValueError(f"{self.mode} mode needs max_staleness >= {low}")
        return self

    @property
    def mechanism(self) -> PipelineMode:
        """What this mode does (`MODES`)."""
        return MODES[self.mode](self.max_staleness)


class PipelineMode:
    """A pipeline mode's behaviour; the base is `sync`: one step's stages in sequence."""

    kind: ClassVar[str] = "sync"
    MIN_STALENESS: ClassVar[int] = 0

    def __init__(self, max_staleness: int = 0) -> None:
        self.max_staleness = max_staleness

    @property
    def overlaps_steps(self) -> bool:
        """The next step's sync and rollout run during this step's scoring and training."""
        return False

    @property
    def staleness(self) -> int:
        """Versions a trained sample's policy may be behind the step (0: the step's own)."""
        return 0

    def chain_bound_s(self, chain_s: float) -> float:
        """The least iteration time one step's chain of stages allows."""
        return chain_s

    def iteration_s(self, chain_s: float, busiest_s: float) -> float:
        """A step's time from its chain of stages and its busiest slot's work."""
        return chain_s


class Async(PipelineMode):
    """Rollout ahead of training by at most `max_staleness` policy versions."""

    kind = "async"
    MIN_STALENESS = 1

    @property
    def overlaps_steps(self) -> bool:
        return True

    @property
    def staleness(self) -> int:
        return self.max_staleness

    def chain_bound_s(self, chain_s: float) -> float:
        """Rollout i starts only once step i - s - 1 trained, so one step's chain (sync ->
        rollout -> score -> train) spans at most s + 1 iterations."""
        return chain_s / (self.max_staleness + 1)

    def iteration_s(self, chain_s: float, busiest_s: float) -> float:
        return max(busiest_s, self.chain_bound_s(chain_s))


MODES: dict[str, type[PipelineMode]] = {c.kind: c for c in (PipelineMode, Async)}
