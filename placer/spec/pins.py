"""Layout pins: a job fixes some dimensions of a role's placement, and the planner keeps to them.

RL teams often cannot let the planner choose a role's layout freely: a checkpoint was saved at
TP 2, an inference engine config is the one known to work, the trainer's mesh is set by the code
that restarts from it. A job says so under `pin:`, one entry per role, with any of

    pool      the pool the role runs on
    avoid     pools the role may not run on (a fleet's shared rollout pool keeps the members'
              other roles off its engines' nodes)
    devices   how many devices it takes (tp x cp x pp x dp)
    tp pp dp cp ep   its tensor, pipeline, data, context and expert parallel degrees
    shard     a trainer's ZeRO shard group in dp ranks (HSDP, verl's `fsdp_size`; = dp: plain
              ZeRO over all of dp)
    sharded   a frozen model (reference, reward model): true holds its weights FSDP-sharded
              over its dp ranks (verl's and NeMo-RL's reference workers), false a whole copy on
              every tp x pp group

for example `pin: {actor: {tp: 2, dp: 2}, rollout: {tp: 1}}`. A dimension left out stays free.

How the planner honours a pin: `pinned_layouts` drops every layout that disagrees with it before
the layouts are estimated and pruned (`placer.solve.candidates.role_candidates`), so the ILP only ever
sees pinned candidates, and the dominance pruning (one candidate per device count) cannot discard
the pinned layout in favour of a faster unpinned one. A rollout pinned without a `pool` may still
be split over two pools (`placer.cost.split`), each part in the pinned layout; pin the pool to keep it
on one.

Checks: keys and values are checked by the model here (unknown role or key, a value that is not a
positive integer, `devices` that the pinned degrees do not divide); `check_pins` adds what needs
the whole job (a role the algorithm does not run, a pool the cluster lacks). A pin that no
candidate satisfies makes the job infeasible: `placer.solve.diagnose` names the role, the pin and
why.

This module sits under `placer.spec.job` (the job model holds `Pins`), so it imports only the spec
base and the roles; what pins mean for a job (`pin_of`, `pinned_layouts`) lives in
`placer.spec.job`, and `check_pins` in `placer.spec.load`.
"""
from __future__ import annotations

from typing import Protocol

from pydantic import Field, StrictBool, model_validator

from placer.base.roles import Role
from placer.spec.base import PosInt, Strict

DIMS = ("tp", "pp", "dp", "cp", "ep")  # parallel degrees a pin may fix, in display order


class Pin(Strict):
    """One role's pinned placement: any of pool, device count and parallel degrees."""

    pool: str | None = Field(None, description="the pool the role runs on")
    avoid: list[str] | None = Field(None, min_length=1,
                                    description="pools the role may not run on")
    devices: PosInt | None = Field(None, description="devices the role takes (tp x cp x pp x dp)")
    tp: PosInt | None = Field(None, description="tensor-parallel degree")
    pp: PosInt | None = Field(None, description="pipeline stages")
    dp: PosInt | None = Field(None, description="data-parallel degree (replicas)")
    cp: PosInt | None = Field(None, description="context-parallel degree (training)")
    ep: PosInt | None = Field(None, description="expert-parallel degree (a mixture of experts)")
    shard: PosInt | None = Field(None, description="HSDP: dp ranks of one ZeRO shard group "
                                 "(verl's fsdp_size; training roles)")
    sharded: StrictBool | None = Field(None, description="frozen models (reference, reward): weights "
                                 "FSDP-sharded over the dp ranks (true) or a whole copy on each "
                                 "tp x pp group (false)")

    @model_validator(mode="after")
    def _consistent(self) -> Pin:
        if not self.fixed():
            raise ValueError("a pin fixes at least one of pool, avoid, devices, " + ", ".join(DIMS)
                             + ", shard, sharded")
        factors = {d: getattr(self, d) for d in ("tp", "cp", "pp", "dp") if getattr(self, d)}
        product = 1
        for v in factors.values():
            product *= v
        if self.devices is not None and self.devices % product:
            raise ValueError(f"devices {self.devices} is not a multiple of "
                             f"{' x '.join(factors)} = {product}")
        if self.shard is not None and self.dp is not None and self.dp % self.shard:
            raise ValueError(f"shard {self.shard} does not divide dp {self.dp}")
        return self

    def fixed(self) -> dict[str, str | int | list[str]]:
        """The pinned keys and their values, in display order."""
        keys = ("pool", "avoid", "devices", *DIMS, "shard", "sharded")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}

    def describe(self) -> str:
        """`pool gpu, tp 2, dp 2` (`avoid h20/l40s`): how messages and `--explain` name the
        pin."""
        return ", ".join(f"{k} {'/'.join(v) if isinstance(v, list) else v}"
                         for k, v in self.fixed().items())

    def allows(self, pool: str, par: _Layout) -> bool:
        """Whether a layout of the role on `pool` keeps to the pin."""
        if self.pool is not None and pool != self.pool:
            return False
        if self.avoid is not None and pool in self.avoid:
            return False
        if self.devices is not None and par.devices != self.devices:
            return False
        if self.shard is not None and par.shard_dp != self.shard:
            return False
        if self.sharded is not None and (par.sharded_weights and par.dp > 1) != self.sharded:
            return False
        return all(getattr(self, d) is None or getattr(par, d) == getattr(self, d) for d in DIMS)


class Pins(Strict):
    """Per-role layout pins (`placer.spec.pins`): the planner only considers layouts that keep to
    them. Example: `{actor: {tp: 2, dp: 2}, rollout: {pool: gpu, tp: 1}}`."""

    actor: Pin | None = Field(None, description="the trained policy (e.g. the TP of its checkpoint)")
    rollout: Pin | None = Field(None, description="the generation engines (e.g. a known-good engine "
                                                  "config)")
    reference: Pin | None = Field(None, description="the frozen reference policy")
    reward: Pin | None = Field(None, description="the reward model or rule checker")
    critic: Pin | None = Field(None, description="the PPO value model")
    environment: Pin | None = Field(None, description="the tool-call and code workers")

    def of(self, role: str) -> Pin | None:
        return getattr(self, str(role), None) if str(role) in type(self).model_fields else None

    @model_validator(mode="after")
    def _sharded_only_frozen(self) -> Pins:
        for role in ("actor", "rollout", "critic", "environment"):
            pin = getattr(self, role)
            if pin is not None and pin.sharded is not None:
                raise ValueError(f"{role}.sharded: {pin.sharded}: only a frozen model "
                                 "(reference, reward) is sharded or whole by choice; a trainer's "
                                 "sharding is its `shard` group")
        return self

    def items(self) -> list[tuple[Role, Pin]]:
        return [(Role(r), p) for r in type(self).model_fields
                if (p := getattr(self, r)) is not None]


class _Layout(Protocol):
    """What a pin looks at in a layout (`placer.cost.sharding.Parallel`, a frozen dataclass)."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def sharded_weights(self) -> bool: ...
    @property
    def devices(self) -> int: ...
    @property
    def shard_dp(self) -> int: ...
