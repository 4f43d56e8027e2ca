"""The constraints that hold a plan where it is.

Pools used to the last device, slots whose roles do not fit in memory together (they pay
offload/onload, or park an optimizer: `placer.solve.parktwins`), the slot that sets each stage
(sync) or the busiest slot or the step chain (async), and roles that already take a whole pool.
Each is one sentence; `placer.solve.explain` gathers them and `binding_lines` prints them.
"""
from __future__ import annotations

from placer.cost.pricer import Pricer
from placer.solve.candidates import role_candidates
from placer.solve.parktwins import park_note
from placer.solve.planfile import Plan
from placer.spec.catalog import Resolved


def binding(plan: Plan, px: Pricer) -> list[str]:
    res = px.res
    notes = []
    used: dict[str, int] = {}
    for s in plan.slots:
        for pool_name, n in s.pool_devices():  # a split role's slot: its devices on each pool
            used[pool_name] = used.get(pool_name, 0) + n
    for p in res.cluster.pools:
        cap = p.devices_per_node * p.nodes
        if used.get(p.name, 0) == cap:
            notes.append(f"pool {p.name}: all {cap} devices used (capacity binds)")
    for slot, t in plan.breakdown.switch_s.items():
        notes.append(park_note(plan, res, slot, t) or
                     f"slot {slot}: its roles do not fit in memory together; "
                     f"offload/onload costs {t:.2f} s per iteration")
    notes += _pace_notes(plan)
    for role, r in plan.roles.items():
        if r.parts:  # a part that takes its whole pool: more of that pool would speed it up
            notes += [f"role {role}: its part on pool {q.pool} uses the whole pool ({q.devices} "
                      "devices)" for q in r.parts if q.devices == _capacity(res, q.pool)]
            continue
        biggest = max((c.devices for c in role_candidates(px, role, res.cluster.pool(r.pool))),
                      default=0)
        if r.devices == biggest and r.devices == _capacity(res, r.pool):
            notes.append(f"role {role}: uses the whole pool {r.pool}; only more nodes would "
                         "speed it up")
    return notes


def _pace_notes(plan: Plan) -> list[str]:
    """What sets the iteration time: the busiest slot or the step chain (async), else the
    slot that sets each stage."""
    busy = plan.breakdown.slot_busy_s
    if plan.pipeline.overlaps_steps and busy:
        top = max(busy, key=busy.__getitem__)
        chain = sum(plan.breakdown.stage_s.values())
        stale = plan.pipeline.staleness
        if plan.pipeline.chain_bound_s(chain) > busy[top]:
            return [f"async: one step's sync -> rollout -> score -> train chain "
                    f"({chain:.2f} s) must fit in staleness + 1 = {stale + 1} iterations "
                    f"and sets the iteration time (busiest slot {top}: {busy[top]:.2f} s)"]
        return [f"async: slot {top} is the busiest ({busy[top]:.2f} s) and sets the "
                "iteration time"]
    return [f"stage {stage}: {t:.2f} s, set by {_stage_setter(plan, stage)}"
            for stage, t in plan.breakdown.stage_s.items() if t > 0]


def _capacity(res: Resolved, pool_name: str) -> int:
    pool = res.cluster.pool(pool_name)
    return pool.devices_per_node * pool.nodes


def _stage_setter(plan: Plan, stage: str) -> str:
    agents = plan.resolved().job.agents
    if agents is not None and stage in ("sync", "rollout"):  # `placer.cost.agents`
        what = "weight syncs" if stage == "sync" else "rollouts"
        parts = [f"{r} {rp.stage_s.get('rollout', 0.0):.2f} s" for r, rp in plan.roles.items()
                 if r.endswith(".rollout")] if stage == "rollout" else []
        return (f"every agent's {what}, one agent after another"
                + (f" ({' + '.join(parts)})" if parts else ""))
    if stage == "sync":
        return "weight sync actor -> rollout"
    if stage == "switch":
        return "offload/onload of a colocated slot"
    per_slot: dict[str, float] = {}
    for r in plan.roles.values():
        per_slot[r.slot] = per_slot.get(r.slot, 0.0) + r.stage_s.get(stage, 0.0)
    slot = max(per_slot, key=per_slot.__getitem__)
    roles = [role for role, r in plan.roles.items() if r.slot == slot and r.stage_s.get(stage)]
    return f"slot {slot} ({', '.join(roles)})"


def binding_lines(notes: list[str]) -> list[str]:
    """The binding constraints as `placer plan --explain` prints them."""
    return ["binding:", *([f"  - {b}" for b in notes] or ["  (none)"])]
