"""An executed fleet's shared CPU environment pools: which jobs' plans can share one, each
member's run plan on the pool's workers, the pool's slots and call timeouts, and what the run
measured beside the prices.

A CPU pool the fleet's plan shares (`FleetResult.shared`, `placer.fleet.sharing`) runs as the
environment workers of its first member's plan: that job's plan puts its environment role on the
pool's shared nodes, one worker per environment seat of its plan (one per CPU device), and those
are the pool's workers, and that job's bundles are the only ones on the shared nodes
(`pool_views`). The pool holds its shared nodes' cores (`pool_cores`) and a member's call takes
that member's `cpu_per_call` of them, so each member runs as many calls at once as the
simulator's shared pool and the cost model count for it (`pool_slots`: the cores over its own
`cpu_per_call`); the slots (the most of those counts) are spread over those workers, whose
actors run that many calls each in threads (`lanes`). Every other member's run plan takes the
first member's environment role and seats (`pool_views`), so that its runtime starts none of its
own and holds the pool's actors instead (`executors.fleetrun.start`), and makes no placement
group on the shared nodes: its roles that its plan puts there beside the environment (a rule
reward) run their own workers in the first member's bundles (the plan charges the shared nodes
once, to the first member); its other roles keep their own workers and bundles. Every member's
sandbox calls then queue on the pool (`executors.envpool.SharedEnvPool`, first come first served
over the jobs' calls, as the simulator's shared pool serves them); a call past its timeout
(`priced_call_s`, a member's tail-policy deadline where it sets one: `pool_deadlines`) is
re-issued once to another worker (in a pool of one worker, to another of its slots).

The summary (`pool_summary`) gives, per member: its slots, its calls on the pool, the queueing
wait it measured (total, mean, largest), the worker processes that ran its calls, its re-issued calls,
and beside them the slowdown the plan priced for sharing (its iteration on the shared pool over
the same nodes alone) and, when `--simulate` ran too, the simulator's slowdown and mean wait.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from executors.envpool import SharedEnvPool
from executors.run import tail_deadlines
from executors.runplan import RunPlan, SlotRun
from executors.seats import Seat
from placer.base.roles import Role
from placer.cost.model import call_slots
from placer.fleet.result import SharedUse
from placer.fleet.spec import Fleet
from placer.solve.planfile import Plan, calibration_of
from traces.schema import Trace


def cpu_problem(fleet: Fleet, shared: list[SharedUse], runs: dict[str, RunPlan]) -> str | None:
    """One line naming the field and value of a shared CPU pool this driver cannot run."""
    decls = fleet.shared.cpu_pools if fleet.shared is not None else []
    for use in shared:
        i = next((k for k, d in enumerate(decls) if set(d.jobs) == set(use.jobs)), 0)
        where = f"shared.cpu_pools.{i}.jobs"
        for name in use.jobs:
            env = runs[name].roles.get(Role.ENVIRONMENT)
            if env is None:
                return (f"{where}: job {name!r} plans no environment workers; a shared CPU "
                        f"pool runs its members' sandbox calls (got {name!r})")
            if env.parts or env.pool != use.pool:
                return (f"{where}: job {name!r} runs its environment on {env.pool!r}, not "
                        f"on the shared pool {use.pool!r} alone (got {name!r})")
    return None


def pool_cores(use: SharedUse, plans: dict[str, Plan], fleet: Fleet) -> int:
    """The cores of the shared pool's nodes."""
    dev = plans[use.jobs[0]].resolved().device_of(use.pool)
    per_node = next(p.devices_per_node for p in fleet.cluster.pools if p.name == use.pool)
    return use.nodes * per_node * dev.cores


def pool_slots(use: SharedUse, plans: dict[str, Plan], fleet: Fleet) -> dict[str, int]:
    """Per member, its calls the shared pool runs at once: the shared nodes' cores over its own
    `cpu_per_call` (`call_slots`, the cost model's count), as the simulator's shared pool
    counts them (`simulator.environment.SharedCorePool.slots_of`); members of different
    `cpu_per_call` share the cores, each call holding its own."""
    cores = pool_cores(use, plans, fleet)
    return {n: call_slots(cores, plans[n].spec.environment.cpu_per_call) for n in use.jobs}


def per_call(use: SharedUse, plans: dict[str, Plan]) -> dict[str, float]:
    """Each member's cores of one call (`cpu_per_call`, as its job is written)."""
    return {n: plans[n].spec.environment.cpu_per_call for n in use.jobs}


def lanes(slots: int, workers: int) -> int:
    """Calls one worker runs at once when `slots` are spread over `workers` round robin."""
    return -(-slots // max(workers, 1))


def priced_call_s(plan: Plan, pool: str) -> float:
    """The priced seconds of one tool call on `pool`: its latency's mean plus the calibrated
    overhead per call (as `placer.cost.estimate` prices a call)."""
    env = plan.spec.environment
    dev = plan.resolved().device_of(pool)
    return env.tool_latency_s.mean_value() + calibration_of(plan).for_device(dev).tool_overhead_s


def pool_deadlines(use: SharedUse, runs: dict[str, RunPlan]) -> dict[str, float]:
    """Members whose tail policy re-issues tool calls: their deadline, each call's timeout."""
    out = {}
    for name in use.jobs:
        deadline = tail_deadlines(runs[name].job.tail_policy).get(Role.ENVIRONMENT)
        if deadline is not None:
            out[name] = deadline
    return out


def pool_views(use: SharedUse, runs: dict[str, RunPlan]) -> dict[str, RunPlan]:
    """Every member's run plan on the shared pool (module docstring): the shared nodes hold
    the first member's bundles only. Another member takes the first's environment role and
    seats, drops its own environment slot (no placement group of its own on the shared nodes),
    and its roles of that slot (a rule reward beside the environment) sit in the first member's
    bundles on the same plan nodes, as its plan puts them on the shared nodes; every seat of
    those bundles shares their resources (`Seat.sharers` counted over all the members)."""
    lead = runs[use.jobs[0]]
    home = lead.slots[lead.roles[Role.ENVIRONMENT].slot]
    moved = {name: [_into(s, home) for s in runs[name].seats
                    if s.slot == runs[name].roles[Role.ENVIRONMENT].slot
                    and s.role != Role.ENVIRONMENT] for name in use.jobs[1:]}
    count = Counter(s.bundle.index for s in lead.seats if s.slot == home.name)
    count.update(s.bundle.index for seats in moved.values() for s in seats)

    def shared(s: Seat) -> Seat:
        return dataclasses.replace(s, sharers=count[s.bundle.index]) if s.slot == home.name else s

    first = dataclasses.replace(lead, seats=tuple(shared(s) for s in lead.seats))
    env_seats = tuple(s for s in first.seats if s.role == Role.ENVIRONMENT)
    out = {use.jobs[0]: first}
    for name in use.jobs[1:]:
        run = runs[name]
        own = run.roles[Role.ENVIRONMENT].slot
        roles = {k: dataclasses.replace(r, slot=home.name) if r.slot == own else r
                 for k, r in run.roles.items()}
        out[name] = dataclasses.replace(
            run, roles={**roles, Role.ENVIRONMENT: lead.roles[Role.ENVIRONMENT]},
            slots={k: v for k, v in run.slots.items() if k != own},
            seats=tuple(s for s in run.seats if s.slot != own)
            + tuple(shared(s) for s in moved[name]) + env_seats)
    return out


def _into(seat: Seat, home: SlotRun) -> Seat:
    """`seat` in `home`'s bundle on its own plan node (else the one at its position)."""
    pos = next((k for k, b in enumerate(home.bundles)
                if (b.pool, b.node) == (seat.bundle.pool, seat.bundle.node)),
               seat.bundle_pos % len(home.bundles))
    return dataclasses.replace(seat, slot=home.name, bundle=home.bundles[pos], bundle_pos=pos)


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def pool_summary(use: SharedUse, pool: SharedEnvPool, workers: list[int | None],
                 simulated: dict[str, Any] | None) -> dict[str, Any]:
    """One shared CPU pool: its workers and policy; per member, the measured wait beside the
    priced slowdown (and `simulated`'s, `placer.commands.fleet.simulated_sharing`)."""
    sim = simulated or {}
    slow = sim.get("slowdown", {})
    sim_wait = next((w for jobs_, w in sim.get("pool_wait_s", []) if jobs_ == sorted(use.jobs)),
                    None)
    jobs = {}
    for name, shared_s, alone_s in zip(use.jobs, use.iteration_s, use.alone_iteration_s):
        waits = pool.waits(name)
        jobs[name] = {
            "slots": pool.slots_of(name), "calls": len(waits), "waited_s": round(sum(waits), 4),
            "mean_wait_s": _mean(waits), "max_wait_s": round(max(waits), 4) if waits else None,
            "worker_pids": sorted(pool.pids(name)),
            "reissued": [c.reissue.to_dict() | {"step": c.step, "what": c.what}
                         for c in pool.reissues(name) if c.reissue is not None],
            "priced_slowdown": round(shared_s / alone_s, 4) if alone_s else None,
            "simulated_slowdown": slow.get(name)}
    return {"pool": use.pool, "nodes": use.nodes, "workers": len(pool.workers),
            "slots": pool.slots, "cores": float(pool.cores),
            "worker_pids": [p for p in workers if p is not None],
            "policy": "first come, first served over the jobs' calls (per-job queues)",
            "simulated_mean_wait_s": sim_wait, "jobs": jobs,
            "calls": [c.to_dict() for c in pool.records]}


def pool_trace(trace: Trace, pool: SharedEnvPool, t0: float) -> None:
    """Each call on the pool: its wait on the job's queue track, its run on its answering
    worker's, and a re-issue's marker on the slow worker's."""
    for c in pool.records:
        at = max(c.asked - t0, 0.0)
        if c.waited_s > 0:
            trace.add(f"wait {c.job}", "queue", at, c.waited_s, f"cpu pool {pool.pool}",
                      f"queue {c.job}", step=c.step, role=Role.ENVIRONMENT, call=c.what)
        trace.add(f"env {c.job}", "tool", at + c.waited_s, max(c.ended - c.started, 0.0),
                  f"cpu pool {pool.pool}", f"worker {c.worker}", step=c.step,
                  role=Role.ENVIRONMENT, call=c.what, size=c.size, slot=c.slot)
        if c.reissue is not None:  # an instant on the slow worker's track, at its timeout
            r = c.reissue
            trace.add(f"straggler {c.job}", "straggler", max(c.started + r.deadline_s - t0, 0.0),
                      0.0, f"cpu pool {pool.pool}", f"worker {r.slow_worker}", step=c.step,
                      role=Role.ENVIRONMENT, call=c.what, straggler=True, **r.to_dict())
