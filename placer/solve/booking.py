"""Booked against used cost, and the idle nodes a plan can give back at the same time.

Booked is every node of the cluster, used the plan's devices. A pool's idle nodes (no bundle of
the plan on them) are a `Release` when the plan's placement, re-priced through the cost table on
the cluster with that pool cut to the nodes it uses, keeps the plan's iteration time. `placer
plan` prints the release lines under the plan; `placer.solve.explain` reports the `Booking`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from placer.base.errors import Infeasible
from placer.base.records import Record
from placer.cost.pricer import Pricer
from placer.cost.timing import Placed
from placer.solve.assemble import placed_estimate, shares_slot
from placer.solve.planfile import Plan
from placer.solve.pricing import device_price
from placer.spec.catalog import with_nodes


@dataclass(frozen=True)
class Release:
    """Idle nodes of a pool that can go back at the same iteration time."""

    pool: str
    nodes: int
    keep: int  # nodes the plan uses
    usd_per_hour: float

    def line(self) -> str:
        return (f"release {self.nodes} node{'s' if self.nodes != 1 else ''} of {self.pool}: "
                f"same time, {self.usd_per_hour:.2f} USD/h less")


def releases(plan: Plan, px: Pricer) -> list[Release]:
    """Per pool, the nodes no bundle of the plan uses, if giving them back keeps the time."""
    used: dict[str, set[int]] = {}
    for b in plan.bundles:
        used.setdefault(b.pool, set()).add(b.node)
    res = px.res
    out = []
    for p in res.cluster.pools:
        keep = len(used.get(p.name, ()))
        idle = p.nodes - keep
        if idle > 0 and _same_time(plan, px, p.name, keep):
            out.append(Release(p.name, idle, keep,
                               device_price(res, p.name) * p.devices_per_node * idle))
    return out


def _same_time(plan: Plan, px: Pricer, pool: str, keep: int) -> bool:
    """The plan's placement priced by the cost table on the cluster with `pool` cut to `keep`
    nodes (0: gone) has the plan's iteration time."""
    try:
        small = px.with_res(with_nodes(px.res.job, {pool: keep}))
    except Infeasible:  # no nodes left at all
        return False
    placed = []
    for role, r in plan.roles.items():
        est = placed_estimate(small, role, r, shares_slot(plan, role))  # every part priced
        if not est.feasible:
            return False
        placed.append(Placed(r.slot, est))
    t = small.iteration_time(placed).iteration_s
    return math.isclose(t, plan.predicted_iteration_s, rel_tol=1e-9)


class ReleaseRow(Record):
    """A `Release` as the booking reports it: its figures (USD/h to 4 decimals) and its line."""

    pool: str
    nodes: int
    keep: int
    usd_per_hour: float
    line: str

    @classmethod
    def of(cls, r: Release) -> ReleaseRow:
        return cls(pool=r.pool, nodes=r.nodes, keep=r.keep,
                   usd_per_hour=round(r.usd_per_hour, 4), line=r.line())


class Booking(Record):
    """Booked (every node of the cluster) against used (the plan's devices) cost, and the idle
    nodes that can be released at the same iteration time."""

    booked_usd_per_hour: float
    used_usd_per_hour: float
    booked_cost_per_sample: float
    used_cost_per_sample: float
    release: list[ReleaseRow]


def booking(plan: Plan, px: Pricer) -> Booking:
    """Booked against used USD/h and per sample, and the nodes that can be released."""
    return Booking(booked_usd_per_hour=plan.booked_usd_per_hour,
                   used_usd_per_hour=plan.used_usd_per_hour,
                   booked_cost_per_sample=plan.booked_cost_per_sample,
                   used_cost_per_sample=plan.cost_per_sample,
                   release=[ReleaseRow.of(r) for r in releases(plan, px)])


def booking_lines(b: Booking) -> list[str]:
    """Booked vs used cost and the release advice, as `--explain` prints them."""
    lines = [f"booked {b.booked_usd_per_hour:.2f} USD/h ({b.booked_cost_per_sample:.6f} "
             f"USD/sample), used {b.used_usd_per_hour:.2f} USD/h "
             f"({b.used_cost_per_sample:.6f} USD/sample)"]
    lines += [f"  {r.line}" for r in b.release]
    return lines
