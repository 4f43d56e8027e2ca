"""Assemble a `Plan` from chosen candidates: slots, predicted time, bundles and sync routes.

The ILP, the baselines and hand-written test plans all end here, so every plan is priced by the
same `timing.iteration_time` and mapped to nodes by the same `mapping.map_to_nodes`.
"""
from __future__ import annotations

from placer.base.roles import Role
from placer.cost import optpark
from placer.cost.band import Tags, band, load_table, mode_of, model_class
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.roleestimate import Estimate, Part
from placer.cost.split import join
from placer.cost.timing import Breakdown as Timing
from placer.cost.timing import Placed
from placer.solve.planfile import (
    BandRow,
    BandSource,
    Breakdown,
    Plan,
    RolePart,
    RolePlacement,
    SlotPart,
    SlotPlan,
    SolverInfo,
)
from placer.solve.pricing import booked_per_hour, per_sample, slots_price
from placer.spec.catalog import Resolved, resolve
from placer.spec.job import Job
from placer.spec.load import dump_job


def slot_plans(res: Resolved, placed: list[Placed]) -> list[SlotPlan]:
    """One slot per distinct slot name, in the job's role order, on its first role's pool and
    holding on each pool its largest role's devices there. A split role's slot lists its
    devices per pool (`parts`): alone, its parts'; a mixed rollout sharing a slot
    (`placer.cost.split.colocated`), its first part with the slot's other roles on their pool,
    its other parts on theirs."""
    order: dict[str, int] = {r: i for i, r in enumerate(res.job.role_names())}
    held: dict[str, dict[str, int]] = {}  # slot -> pool -> devices, the slot's pool first
    roles: dict[str, list[str]] = {}
    split_in: dict[str, str] = {}  # slot -> its role split over pools (one at most)
    for p in sorted(placed, key=lambda p: order[p.est.role]):
        pools = ([(q.est.pool, q.est.devices) for q in p.est.parts] if p.est.parts
                 else [(p.est.pool, p.est.devices)])
        cur = held.setdefault(p.slot, {})
        if cur and next(iter(cur)) != pools[0][0]:
            raise ValueError(f"slot {p.slot} mixes pools {next(iter(cur))} and {pools[0][0]}")
        if p.est.parts and p.slot in split_in:
            raise ValueError(f"slot {p.slot}: roles {split_in[p.slot]} and {p.est.role} are "
                             "both split over pools")
        if p.est.parts:
            split_in[p.slot] = p.est.role
        for pool, n in pools:
            cur[pool] = max(cur.get(pool, 0), n)
        roles.setdefault(p.slot, []).append(p.est.role)
    out = []
    for name, cur in held.items():
        first = next(iter(cur))
        parts = ([SlotPart(pool=pool, devices=n) for pool, n in cur.items()] if len(cur) > 1
                 else [])
        out.append(SlotPlan(name=name, pool=first, devices=sum(cur.values()),
                            roles=roles[name], parts=parts))
    return out


def role_part(q: Part, total: int) -> RolePart:
    e = q.est
    return RolePart(pool=e.pool, devices=e.devices, tp=e.par.tp, pp=e.par.pp, dp=e.par.dp,
                    ep=e.par.ep, attn_dp=e.par.attn_dp, fp8_weights=e.par.fp8_weights,
                    fp8_kv=e.par.fp8_kv, share=q.samples / total, samples=q.samples, time_s=e.time_s,
                    stage_s=dict(e.stage_s), memory_gb=e.memory.total,
                    concurrency=e.concurrency)


def role_placement(p: Placed) -> RolePlacement:
    e: Estimate = p.est
    total = sum(q.samples for q in e.parts)
    parts = [role_part(q, total) for q in e.parts]
    return RolePlacement(pool=parts[0].pool if parts else e.pool, devices=e.devices, parts=parts,
                         tp=e.par.tp, pp=e.par.pp, dp=e.par.dp,
                         zero=e.par.zero, recompute=e.par.recompute, offload=e.par.offload,
                         cp=e.par.cp, ep=e.par.ep, etp=e.par.etp, attn_dp=e.par.attn_dp,
                         shard=e.par.shard_dp if e.par.hsdp else 0,
                         sharded_weights=e.par.sharded_weights, micro_batch=e.par.micro_batch,
                         park_optimizer=e.par.park_optimizer,
                         stream_params_bytes=e.par.stream_params_bytes,
                         fp8_weights=e.par.fp8_weights,
                         fp8_kv=e.par.fp8_kv, fp8_train=e.par.fp8_train,
                         slot=p.slot, time_s=e.time_s, stage_s=dict(e.stage_s),
                         memory_gb=e.memory.total, concurrency=e.concurrency,
                         parked_gb=optpark.parked_gb(e.memory, e.par))


def cost_per_hour(res: Resolved, slots: list[SlotPlan]) -> float:
    """Price of the devices the plan holds (USD per hour)."""
    return slots_price(res, (pd for s in slots for pd in s.pool_devices()))


def plan_tags(res: Resolved, roles: dict[str, RolePlacement]) -> Tags:
    """What a plan is compared with published runs by (`placer.cost.band`): the actor's
    device type, the policy's model class and the mode."""
    agents = res.job.agents  # a multi-agent job: its first turn's agent's
    first = f"{agents.first()}." if agents is not None else ""
    actor, rollout = roles.get(f"{first}{Role.ACTOR}"), roles.get(f"{first}{Role.ROLLOUT}")
    device = res.device_of(actor.pool).name if actor is not None else ""
    return Tags(device, model_class(res.model_of(f"{first}{Role.ACTOR}")),
                mode_of(res.job.pipeline.mechanism.overlaps_steps, actor.slot if actor else None,
                        rollout.slot if rollout else None))


def error_band(res: Resolved, roles: dict[str, RolePlacement],
               predicted_s: float) -> tuple[tuple[float, float], BandSource]:
    """The predicted time's band and its source, from the shipped residual table."""
    table = load_table()
    b = band(predicted_s, plan_tags(res, roles), table)
    return (b.lo, b.hi), BandSource(
        tags=b.tags.to_dict(), widen=b.widen, table=table.source,
        rows=[BandRow(name=n, error=e, differing_tags=d) for n, e, d in b.rows])


def assemble(px: Pricer, placed: list[Placed], solver: SolverInfo) -> Plan:
    """Price, slot and map a placement into a plan; the plan records the pricer's calibration
    profile (none when it prices with the shipped factors)."""
    from placer.solve.mapping import map_to_nodes  # lazy: networkx (~0.1 s) only when assembling

    res = px.res
    bd = px.iteration_time(placed)
    slots = slot_plans(res, placed)
    roles = {p.est.role: role_placement(p) for p in placed}
    slots, bundles, routes = map_to_nodes(res, slots, roles)
    samples = res.job.batch.samples
    per_hour, booked = cost_per_hour(res, slots), booked_per_hour(res)
    lohi, source = error_band(res, roles, bd.iteration_s)
    return Plan(job=dump_job(res.job), mode=res.job.pipeline.mode, objective=res.job.objective,
                predicted_iteration_s=bd.iteration_s, predicted_iteration_s_band=lohi,
                band_source=source,
                throughput_samples_s=samples / bd.iteration_s,
                cost_per_sample=per_sample(per_hour, bd.iteration_s, samples),
                used_usd_per_hour=per_hour, booked_usd_per_hour=booked,
                booked_cost_per_sample=per_sample(booked, bd.iteration_s, samples),
                breakdown=Breakdown(stage_s=bd.stage_s, slot_busy_s=bd.slot_busy_s,
                                    switch_s=bd.switch_s, sync_s=bd.sync_s),
                roles={r: roles[r] for r in res.job.role_names() if r in roles},
                slots=slots, bundles=bundles, sync_routes=routes, solver=solver,
                calibration=None if px.given.is_default else px.given)


def reprice(plan: Plan, job: Job, calib: Calibration) -> Timing:
    """A plan's placement (every role's pool, layout and slot) priced for `job`: e.g. the job at
    its means (`rollout_tail.at_means`), what a no-variance simulation of the plan runs."""
    px = Pricer(resolve(job, plan.job.get("name", "plan")), calib)
    placed = [Placed(r.slot, placed_estimate(px, role, r, shares_slot(plan, role)))
              for role, r in plan.roles.items()]
    return px.iteration_time(placed)


def shares_slot(plan: Plan, role: str) -> bool:
    """Whether `role` time-shares its slot with another role of the plan."""
    slot = plan.roles[role].slot
    return any(r.slot == slot for name, r in plan.roles.items() if name != role)


def placed_estimate(px: Pricer, role: str, r: RolePlacement, shared: bool = False) -> Estimate:
    """A plan's role priced again for `px`'s job (its parts too, each on its own samples; a
    split role sharing its slot, `shared`, as a mixed rollout: `placer.cost.split.colocated`)."""
    if not r.parts:
        return px.estimate(role, px.res.cluster.pool(r.pool), r.par)
    parts = []
    for q in r.parts:
        part = px.with_samples(q.samples)
        parts.append(Part(part.estimate(role, part.res.cluster.pool(q.pool), q.par), q.samples))
    return join(parts, shared)
