"""What a sync plan leaves idle that the asynchronous pipeline would use (`plan --explain`).

In sync mode a step's stages run one after another, so a pool that cannot hold a role beside
the others' phases gains the step nothing: a rollout part on the H20s of an H100 + H20 cluster
would wait for the actor's training either way. Async mode overlaps the next step's rollout
with this step's training, and such pools then pay. A user who planned sync sees only that some
pools are idle; this says what async would make of them, with both times, so the choice of mode
is the user's with the numbers in hand (async trains on samples one step stale).

Only for a sync plan of a job whose accelerator pools (GPU or LPU) are not all in use: the job
is planned again as async (`max_staleness` 1, the least async allows), priced by the same cost
model, and both plans' predicted times and idle devices are reported.
"""
from __future__ import annotations

from placer.base.errors import Infeasible
from placer.base.records import Record
from placer.cost.pricer import Pricer
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.hardware import DeviceKind


class AsyncWhy(Record):
    """A sync plan's idle accelerators beside the async plan of the same job."""

    sync_iteration_s: float
    async_iteration_s: float
    idle_sync: dict[str, int]  # pool -> accelerator devices the sync plan leaves idle
    idle_async: dict[str, int]  # the same for the async plan
    status: str  # the async solve's status


def idle_accelerators(plan: Plan, px: Pricer) -> dict[str, int]:
    """Pool -> GPU or LPU devices no slot of `plan` holds (pools with none idle left out)."""
    used: dict[str, int] = {}
    for s in plan.slots:
        for pool, n in s.pool_devices():
            used[pool] = used.get(pool, 0) + n
    out = {}
    for p in px.res.cluster.pools:
        if px.res.device_of(p).kind is DeviceKind.cpu:
            continue
        idle = p.devices_per_node * p.nodes - used.get(p.name, 0)
        if idle > 0:
            out[p.name] = idle
    return out


def async_why(plan: Plan, px: Pricer, time_limit_s: float = 5.0) -> AsyncWhy | None:
    """The async alternative of a sync plan that leaves accelerators idle; None for an async
    plan, a plan that uses every accelerator, or an async plan not found in the time limit."""
    job = px.res.job
    if job.pipeline.mechanism.overlaps_steps:  # already async
        return None
    idle = idle_accelerators(plan, px)
    if not idle:
        return None
    other = job.model_copy(update={"pipeline": job.pipeline.model_copy(
        update={"mode": "async", "max_staleness": 1})})
    apx = Pricer(resolve(other), px.calib)
    try:
        alt = plan_job(apx, time_limit_s=time_limit_s, workers=1)
    except Infeasible:
        return None
    return AsyncWhy(sync_iteration_s=plan.predicted_iteration_s,
                    async_iteration_s=alt.predicted_iteration_s, idle_sync=idle,
                    idle_async=idle_accelerators(alt, apx), status=alt.solver.status)


def async_lines(why: AsyncWhy | None) -> list[str]:
    """`--explain`'s lines for `async_why` (none when it has nothing to say)."""
    if why is None:
        return []
    idle = ", ".join(f"{pool} {n}" for pool, n in why.idle_sync.items())
    used = {p: n - why.idle_async.get(p, 0) for p, n in why.idle_sync.items()}
    uses = ", ".join(f"{n} on {p}" for p, n in used.items() if n > 0) or "none of them"
    return [f"idle in sync: {idle} accelerators. pipeline.mode async (max_staleness 1) would use "
            f"{uses}: {why.async_iteration_s:.1f} s a step against {why.sync_iteration_s:.1f} s "
            f"({why.async_iteration_s / why.sync_iteration_s - 1:+.0%}; async trains on samples "
            f"one step stale; {why.status})"]
