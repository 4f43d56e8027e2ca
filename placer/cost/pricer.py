"""The pricer: what the solver, the baselines, the simulator and the fits ask the cost model.

`Pricer(res, calib)` is one problem's pricing context (`placer.cost.context`: the resolved job,
its efficiency factors and the memo of its prices) with the cost model's entry points as
methods. Make one per problem and pass it along; two problems priced with two pricers, in any
order, get the numbers each gets alone (tests/test_pricer.py).
"""
from __future__ import annotations

from placer.cost.context import PriceContext
from placer.cost.estimate import Estimate, RolloutShape, estimate, rollout_shape
from placer.cost.sharding import Parallel
from placer.cost.split import SplitKeep, SplitSpace, split_estimates
from placer.cost.timing import (
    Breakdown,
    Placed,
    iteration_time,
    rollout_tool_time,
    slot_switch,
    sync_time,
)
from placer.spec.hardware import DeviceType, Pool


class Pricer(PriceContext):
    """A problem's prices: estimates of roles, their iteration time and the weight sync."""

    def estimate(self, role: str, pool: Pool, par: Parallel,
                 env_cores: int | None = None) -> Estimate:
        """One role's work per iteration on `pool` with `par` (`placer.cost.estimate`)."""
        return estimate(self, role, pool, par, env_cores)

    def split_estimates(self, role: str, singles: dict[str, list[Estimate]],
                        keep: SplitKeep | None = None, space: SplitSpace | None = None,
                        shared: frozenset[str] = frozenset()) -> list[Estimate]:
        """`role` split over every pair of pools, from its single-pool estimates
        (`placer.cost.split`); `space` counts what was searched; `shared`: pools where a part
        may time-share a slot."""
        return split_estimates(self, role, singles, keep, space, shared)

    def rollout_shape(self, dev: DeviceType, par: Parallel) -> RolloutShape:
        """How the batch's samples meet the rollout's engine replicas."""
        return rollout_shape(self, dev, par, self.calib.for_device(dev))

    def iteration_time(self, placed: list[Placed]) -> Breakdown:
        """Placed estimates combined into one RL step (`placer.cost.timing`)."""
        return iteration_time(self, placed)

    def sync_time(self, actor: Placed, rollout: Placed) -> float:
        """One weight refresh from the actor's placement to the rollout's."""
        return sync_time(self, actor, rollout)

    def tool_time(self, rollout: Placed, env: Placed) -> float:
        """What tool calls queueing for the environment's cores add to the rollout stage."""
        return rollout_tool_time(self, rollout, env)

    def slot_switch(self, placed: list[Placed]) -> dict[str, float]:
        """Onload seconds per slot whose roles do not fit on its devices together."""
        return slot_switch(self, placed)
