"""What devices cost: one definition for the ILP, plan assembly, the reports and the sweeps.

A slot holds its devices for the whole iteration whichever of its roles runs, so a placement's
price per hour (used) is the sum over its slots of devices x the pool's device price; a booking
(booked) pays every node of every pool of the job's cluster, idle or not. The CP-SAT model
counts prices in whole milli-dollars per hour (`PRICE_SCALE`; its coefficients must be
integers); `units=True` gives that count.
"""
from __future__ import annotations

from collections.abc import Iterable

from placer.solve.planfile import Plan
from placer.spec.catalog import Resolved

PRICE_SCALE = 1000  # milli-dollars per hour


def device_price(res: Resolved, pool: str, units: bool = False) -> float:
    """Price of one device of `pool` per hour: USD, or (`units`) whole milli-dollars."""
    usd = res.device_of(pool).price_per_hour
    return float(round(usd * PRICE_SCALE)) if units else usd


def slots_price(res: Resolved, slots: Iterable[tuple[str, int]], units: bool = False) -> float:
    """Price per hour of slots given as (pool, devices)."""
    return sum(device_price(res, pool, units) * n for pool, n in slots)


def usd_per_hour(plan: Plan) -> float:
    """What a plan's devices cost per hour, from its per-sample cost and throughput."""
    return plan.cost_per_sample * plan.throughput_samples_s * 3600


def pool_price(res: Resolved, pool: str) -> float:
    """USD per hour of every device of every node of `pool`."""
    p = res.cluster.pool(pool)
    return device_price(res, pool) * p.devices_per_node * p.nodes


def booked_per_hour(res: Resolved) -> float:
    """What the job's cluster costs per hour: every node of every pool, used or idle (a booking
    is paid whole; the plan's `used_usd_per_hour` counts only its slots' devices)."""
    return sum(pool_price(res, p.name) for p in res.cluster.pools)


def per_sample(usd_per_hour: float, iteration_s: float, samples: int) -> float:
    """USD per sample at `usd_per_hour` for an iteration of `samples` samples."""
    return usd_per_hour / 3600 * iteration_s / samples
