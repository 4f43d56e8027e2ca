"""The `current` baseline: a job's recorded placement (`job.current`), priced like any plan.

Each role's recorded (pool, devices, TP, PP, CP, EP, expert TP, offload) becomes a candidate: the
cost table's own when it holds that config, else one estimated now with the same cost model (the
table prunes dominated configs, and a run as it is configured today may well be one of them).
Roles in one `colocate` group share a slot; the others get one each. The result is an
`Assignment`, so `plan_assignment` assembles and prices it exactly as it does the ILP's and the
other baselines'.
A recorded config the cost model finds over memory is priced all the same (it is the user's run),
and then is the one baseline that may look faster than the ILP's plan: `placer import` says so
(`unfit_roles`).
"""
from __future__ import annotations

from placer.base.errors import SpecError
from placer.cost.sharding import Parallel
from placer.solve.candidates import Candidate
from placer.solve.problem import Assignment, Problem, slot_names
from placer.spec.catalog import Resolved
from placer.spec.current import CurrentPlacement, CurrentRole
from placer.spec.hardware import DeviceKind


def _check_roles(cur: CurrentPlacement, want: list[str], pools: set[str]) -> None:
    have = set(cur.roles)
    if have != set(want):
        raise SpecError(f"job.current.roles: the job runs {', '.join(sorted(map(str, want)))} "
                        f"but the recorded placement names {', '.join(sorted(have))}; "
                        f"missing: {', '.join(sorted(set(want) - have)) or 'none'}, not run: "
                        f"{', '.join(sorted(have - set(want))) or 'none'} "
                        f"(got {sorted(have)})")
    for role, at in cur.roles.items():
        if at.pool not in pools:
            raise SpecError(f"job.current.roles.{role}.pool: no pool {at.pool!r} in the "
                            f"cluster (pools: {', '.join(sorted(pools))}) (got {at.pool!r})")
    seen: set[str] = set()
    for i, group in enumerate(cur.colocate):
        for r in group:
            if r not in have:
                raise SpecError(f"job.current.colocate.{i}: no role {r!r} in current.roles "
                                f"(got {r!r})")
            if r in seen:
                raise SpecError(f"job.current.colocate.{i}: role {r!r} is in two groups "
                                f"(got {r!r})")
            seen.add(r)
        pools = {cur.roles[r].pool for r in group}
        if len(pools) > 1:
            raise SpecError(f"job.current.colocate.{i}: colocated roles must share one pool "
                            f"(got {sorted(pools)})")


def _candidate(problem: Problem, role: str, at: CurrentRole) -> Candidate:
    res = problem.res
    pool = res.cluster.pool(at.pool)  # checked by _check_roles
    cap = pool.devices_per_node * pool.nodes
    if at.devices > cap:
        raise SpecError(f"job.current.roles.{role}.devices: pool {pool.name} has {cap} "
                        f"(got {at.devices})")
    for c in problem.cands[role]:
        p = c.est.par
        if (c.pool == pool.name and c.devices == at.devices and p.tp == at.tp and p.pp == at.pp
                and (p.cp, p.ep, p.etp) == (at.cp, at.ep, at.etp) and p.offload == at.offload):
            return c
    model = at.tp * at.cp * at.pp
    if at.devices % model:
        raise SpecError(f"job.current.roles.{role}: devices {at.devices} is not a multiple "
                        f"of tp x cp x pp = {model}")
    if (at.devices // at.pp) % (at.ep * at.etp):
        raise SpecError(f"job.current.roles.{role}: ep x etp = {at.ep * at.etp} does not divide "
                        f"the {at.devices // at.pp} ranks of a pipeline stage")
    return Candidate(role, pool.name, problem.px.estimate(role, pool, _parallel(res, role, at)))


def _parallel(res: Resolved, role: str, at: CurrentRole) -> Parallel:
    """The recorded layout: TP x PP x DP on GPUs; a count of devices elsewhere."""
    pool = res.cluster.pool(at.pool)
    if res.device_of(pool).kind is DeviceKind.gpu and res.model_of(role) is not None:
        return Parallel(tp=at.tp, pp=at.pp, dp=at.devices // (at.tp * at.cp * at.pp),
                        offload=at.offload, cp=at.cp, ep=at.ep, etp=at.etp)
    return Parallel(dp=at.devices)


def current_assignment(problem: Problem) -> Assignment | None:
    """The job's recorded placement as an Assignment (None when the job records none)."""
    cur = problem.res.job.current
    if cur is None:
        return None
    _check_roles(cur, problem.roles, {p.name for p in problem.res.cluster.pools})
    choice = {r: _candidate(problem, r, cur.roles[r]) for r in problem.roles}
    apart = problem.px.apart_roles()
    for i, group in enumerate(cur.colocate):
        both = [r for r in apart if r in group]
        if len(both) > 1:
            p = problem.res.job.profile
            raise SpecError(f"job.current.colocate.{i}: {p.name} ({p.title}) runs "
                            f"{' and '.join(both)} apart under pipeline.mode async "
                            f"({p.sources.get('async_apart', '')}) (got {group})")
    grouped = {r for g in cur.colocate for r in g}
    groups = [[r for r in problem.roles if r in g] for g in cur.colocate if g]
    groups += [[r] for r in problem.roles if r not in grouped]
    slot_of = slot_names(groups)
    used: dict[str, int] = {}
    for g in groups:
        pool = choice[g[0]].pool
        used[pool] = used.get(pool, 0) + max(choice[r].devices for r in g)
    for name, n in used.items():
        cap = problem.capacity()[name]
        if n > cap:
            raise SpecError(f"job.current: the recorded placement uses {n} devices of pool "
                            f"{name}, which has {cap}")
    return Assignment(choice, slot_of)


def unfit_roles(a: Assignment) -> dict[str, str]:
    """Roles whose recorded config the cost model says cannot run as configured (usually: out of
    memory), with its reason. `compare` still prices them; the importer says so."""
    return {r: c.est.reason for r, c in a.choice.items() if not c.est.feasible}
