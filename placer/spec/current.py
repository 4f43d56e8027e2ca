"""The placement a job runs today: recorded by `placer import` from a verl or OpenRLHF run.

A job's optional `current:` section names, for every role, the pool and devices it runs on with
its tensor/pipeline sizes, and which roles share devices (`colocate`). `placer compare` prices it
on the same cost model as the ILP's plan and shows it as the baseline `current`
(`placer.solve.current.current_assignment`). Only the shape is kept here, so the job model
(`placer.spec.job`) can hold it without importing the planner.
"""
from __future__ import annotations

from pydantic import Field, StrictBool

from placer.spec.base import PosInt, Strict


class CurrentRole(Strict):
    """Where one role runs: `devices` of pool `pool`, split `tp` x `cp` x `pp` (data parallel the
    rest), the experts over `ep` x `etp` of those ranks."""

    pool: str
    devices: PosInt
    tp: PosInt = 1
    pp: PosInt = 1
    cp: PosInt = Field(1, description="context parallelism (training)")
    ep: PosInt = Field(1, description="expert parallelism (mixture of experts)")
    etp: PosInt = Field(1, description="expert tensor parallelism (with ep > 1)")
    offload: StrictBool = Field(
        False, description="optimizer state kept in host memory through the optimizer step "
                           "(state parked only between phases, as verl's offload does, is the "
                           "colocated slot's switch, not this)")


class CurrentPlacement(Strict):
    source: str = Field("", description="where it was read from (framework and file)")
    roles: dict[str, CurrentRole]
    colocate: list[list[str]] = Field(
        [], description="groups of roles that share their devices (a role in none runs alone)")
