"""An executed fleet's shared CPU environment pools: which jobs' plans can share one, each
member's run plan on the pool's workers, the pool's slots and call timeouts, and what the run
measured beside the prices.

A CPU pool the fleet's plan shares (`FleetResult.shared`, `placer.fleet.sharing`) runs as the
environment workers of its first member's plan: that job's plan puts its environment role on the
pool's shared nodes, one worker per environment seat of its plan (one per CPU device), and those
are the pool's workers. The pool runs as many calls at once as the simulator's shared pool and
the cost model count (`pool_slots`: the cores of its shared nodes over the members' largest
`cpu_per_call`), spread over those workers, whose actors run that many calls each in threads
(`lanes`). Every other member's run plan takes the first member's environment role and seats
(`env_view`), so that its runtime starts none of its own and holds the pool's actors instead
(`executors.fleetrun.start`); its reward and other roles keep their own workers. Every member's
sandbox calls then queue on the pool (`executors.envpool.SharedEnvPool`, first come first served
over the jobs' calls, as the simulator's shared pool serves them); a call past its timeout
(`priced_call_s`, a member's tail-policy deadline where it sets one: `pool_deadlines`) is
re-issued once to another worker.

The summary (`pool_summary`) gives, per member: its calls on the pool, the queueing wait it
measured (total, mean, largest), the worker processes that ran its calls, its re-issued calls,
and beside them the slowdown the plan priced for sharing (its iteration on the shared pool over
the same nodes alone) and, when `--simulate` ran too, the simulator's slowdown and mean wait.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from executors.envpool import SharedEnvPool
from executors.run import tail_deadlines
from executors.runplan import RunPlan
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


def pool_slots(use: SharedUse, plans: dict[str, Plan], fleet: Fleet) -> int:
    """Calls the shared pool runs at once: its shared nodes' cores over the members' largest
    `cpu_per_call` (no call runs on fewer cores than it asks), as the simulator counts them."""
    dev = plans[use.jobs[0]].resolved().device_of(use.pool)
    per_node = next(p.devices_per_node for p in fleet.cluster.pools if p.name == use.pool)
    per_call = max(plans[n].spec.environment.cpu_per_call for n in use.jobs)
    return call_slots(use.nodes * per_node * dev.cores, per_call)


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


def env_view(run: RunPlan, pool: RunPlan) -> RunPlan:
    """A member's run plan on the shared pool: its own roles, slots and seats but the
    environment's, which are those of the job whose workers the pool runs (`pool`)."""
    return dataclasses.replace(
        run, roles={**run.roles, Role.ENVIRONMENT: pool.roles[Role.ENVIRONMENT]},
        seats=tuple(s for s in run.seats if s.role != Role.ENVIRONMENT)
        + tuple(s for s in pool.seats if s.role == Role.ENVIRONMENT))


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
            "calls": len(waits), "waited_s": round(sum(waits), 4),
            "mean_wait_s": _mean(waits), "max_wait_s": round(max(waits), 4) if waits else None,
            "worker_pids": sorted(pool.pids(name)),
            "reissued": [c.reissue.to_dict() | {"step": c.step, "what": c.what}
                         for c in pool.reissues(name) if c.reissue is not None],
            "priced_slowdown": round(shared_s / alone_s, 4) if alone_s else None,
            "simulated_slowdown": slow.get(name)}
    return {"pool": use.pool, "nodes": use.nodes, "workers": len(pool.workers),
            "slots": pool.slots,
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
