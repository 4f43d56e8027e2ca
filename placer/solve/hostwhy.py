"""Host memory of a plan: the busiest node of each GPU pool, by part, against its capacity.

The figures are `placer.solve.hostmem`'s node-by-node check of the plan (`plan_nodes`), the
rule the ILP keeps to; `placer.solve.explain` gathers them and `host_lines` prints them.
"""
from __future__ import annotations

from placer.base.records import Record
from placer.cost.pricer import Pricer
from placer.solve.hostmem import busiest_per_pool, plan_nodes
from placer.solve.planfile import Plan


class HostMemoryRow(Record):
    """The busiest node of a GPU pool: its host memory by part (GB) against its capacity."""

    node: int
    parts_gb: dict[str, float]
    total_gb: float
    capacity_gb: float


def host_memory(plan: Plan, px: Pricer) -> dict[str, HostMemoryRow]:
    """Per checked GPU pool, its busiest node's host memory by part (GB) and capacity."""
    return {pool: HostMemoryRow(node=n.node, parts_gb={k: round(v, 1) for k, v in n.parts.items()},
                                total_gb=round(n.total_gb, 1), capacity_gb=n.capacity_gb)
            for pool, n in busiest_per_pool(plan_nodes(plan, px)).items()}


def host_lines(rows: dict[str, HostMemoryRow]) -> list[str]:
    """The host-memory section of `placer plan --explain` (none when no pool is checked)."""
    if not rows:
        return []
    lines = ["host memory per node (GB, busiest node of each GPU pool):"]
    for pool, h in rows.items():
        parts = ", ".join(f"{k.replace('_', ' ')} {v:,.1f}" for k, v in h.parts_gb.items() if v)
        lines.append(f"  {pool:<8} node {h.node}: {h.total_gb:,.1f} of "
                     f"{h.capacity_gb:,.0f} ({parts})")
    return lines
