"""An executed fleet's shared CPU environment pools: which jobs' plans can share one, each
member's run plan on the pool's workers, and what the run measured beside the prices.

A CPU pool the fleet's plan shares (`FleetResult.shared`, `placer.fleet.sharing`) runs as the
environment workers of its first member's plan: that job's plan puts its environment role on the
pool's shared nodes, one worker per environment replica of its plan (the single job's executor's
count: one per CPU device, each running its share of a request's answers in its sandbox), and
those are the pool's workers. The simulator's shared pool counts call slots instead (the pool's
cores over `cpu_per_call`), so on nodes of several cores it runs more calls at once than the
executed pool has workers. Every other member's run plan takes the first member's environment
role and seats (`env_view`), so that its runtime starts none of its own and holds the pool's
actors instead (`executors.fleetrun.start`); its reward and other roles keep their own workers.
Every member's sandbox calls then queue on the pool (`executors.envpool.SharedEnvPool`, first
come first served over the jobs' calls, as the simulator's shared pool serves them).

The summary (`pool_summary`) gives, per member: its calls on the pool, the queueing wait it
measured (total, mean, largest), the worker processes that ran its calls, and beside them the
slowdown the plan priced for sharing (its iteration on the shared pool over the same nodes
alone) and, when `--simulate` ran too, the simulator's slowdown and mean wait.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from executors.envpool import SharedEnvPool
from executors.run import tail_deadlines
from executors.runplan import RunPlan
from placer.base.roles import Role
from placer.fleet.result import SharedUse
from placer.fleet.spec import Fleet
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
            if tail_deadlines(runs[name].job.tail_policy):
                return (f"{where}: job {name!r} re-issues slow tool calls (tail_policy "
                        f"reissue); the shared pool's queue runs each call once (got "
                        f"{name!r})")
    return None


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
            "priced_slowdown": round(shared_s / alone_s, 4) if alone_s else None,
            "simulated_slowdown": slow.get(name)}
    return {"pool": use.pool, "nodes": use.nodes, "workers": len(pool.workers),
            "worker_pids": [p for p in workers if p is not None],
            "policy": "first come, first served over the jobs' calls (per-job queues)",
            "simulated_mean_wait_s": sim_wait, "jobs": jobs,
            "calls": [c.to_dict() for c in pool.records]}


def pool_trace(trace: Trace, pool: SharedEnvPool, t0: float) -> None:
    """Each call on the pool: its wait on the job's queue track, its run on its worker's."""
    for c in pool.records:
        at = max(c.asked - t0, 0.0)
        if c.waited_s > 0:
            trace.add(f"wait {c.job}", "queue", at, c.waited_s, f"cpu pool {pool.pool}",
                      f"queue {c.job}", step=c.step, role=Role.ENVIRONMENT, call=c.what)
        trace.add(f"env {c.job}", "tool", at + c.waited_s, max(c.ended - c.started, 0.0),
                  f"cpu pool {pool.pool}", f"worker {c.worker}", step=c.step,
                  role=Role.ENVIRONMENT, call=c.what, size=c.size)
