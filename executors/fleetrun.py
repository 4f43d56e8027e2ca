"""Execute a fleet's plan on Ray: every job's own loop, shared rollout pools time-shared.

`placer fleet FLEET.yaml --execute` runs what `placer fleet` planned (`placer.fleet`): each job
on its plan (`FleetResult.jobs[k].plan`: its roles on its own nodes), all at once on one Ray
cluster, every job with its own trainer, reward, reference and environment workers and its own
RL loop (`executors.loop.Loop`, one thread per job). A shared rollout pool (`shared.
rollout_pools`, `placer.fleet.rolloutpool`) runs as one set of engines, started once with the
rollout layout of the group's first job (the one whose team's quota holds them, as the plan
lists the members); every member's loop uses those engines, in turns (`executors.engineturns`):
before a job's rollout the engines hold that job's current weights, re-sent over its own
weight-sync group when another job's were in them (the pricing's weight swap,
`placer.fleet.rolloutpool.swap_s`: no copy of another job's weights is kept on the engines).

A shared CPU environment pool (`shared.cpu_pools`, `result.shared`) runs as one set of
environment workers, those its first member's plan puts on the pool's shared nodes; every
member's sandbox calls queue there, first come first served over the jobs' calls, on the plan's
cores of the pool's nodes, each call holding its job's `cpu_per_call` of them (the simulator's
count), a call past its timeout re-issued once to another worker (another slot of the one worker
where the pool has one), each job's wait measured (`executors.fleetcpu`, `executors.envpool`).

One embedded Ray advertises every job's plan nodes (`executors.cluster.embed`); each job's plan
numbers its nodes of a pool from 0, so two jobs' node 0 of one pool are two fleet nodes that
advertise the same key (twice its units), but a shared CPU pool's nodes, advertised and held
by its first member alone (`fleetcpu.pool_views`): each job's actors land on its plan's nodes
and bundles, checked as a single job's are (`executors.placement.verify`/`check`). Joining an
existing cluster (`address`, `executors.cluster.join`) places bundles by pool only (node pinning
off): the jobs' node numbers are each job's own, and would name one Ray node for two jobs.

What cannot run this way is refused before Ray starts, one line naming the field and value
(`fleet_problem`, the executor's own checks per job): a shared CPU pool's member whose
environment is not on that pool alone (`fleetcpu.cpu_problem`), a
rollout pool's member whose rollout shares its slot with another role or is split over pools,
or members whose engines would sample differently (response budget, context, temperature,
precision: the engines are started with one job's).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors import cluster
from executors import placement as pl
from executors.backends import DEFAULT_BACKEND, backend_of
from executors.context import LoopConfig, StepStat
from executors.engineturns import EngineGate, JobTurn, TurnRecord
from executors.envpool import SharedEnvPool
from executors.fleetcpu import (
    cpu_problem,
    lanes,
    per_call,
    pool_cores,
    pool_deadlines,
    pool_slots,
    pool_summary,
    pool_trace,
    pool_views,
    priced_call_s,
)
from executors.loop import Loop
from executors.roles import RunConfig, run_config
from executors.run import preflight, prepare_model, tail_deadlines
from executors.runplan import RunPlan, resolve_plan
from executors.runtime import RayRuntime
from executors.weights import GroupRefresh
from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.fleet.result import FleetResult, SharedRolloutUse, SharedUse
from placer.fleet.spec import Fleet
from traces.schema import Trace

# seconds a job's actors may take to start: every job's start at once (each actor loads torch)
START_TIMEOUT_S = 600.0
# what a rollout engine takes from its job's config: members of a pool must agree on it
ENGINE_FIELDS = ("max_new_tokens", "max_model_len", "temperature", "precision",
                 "images_per_prompt")


@dataclass
class FleetJobRun:
    """One job of the fleet as it runs: its run plan (a member's with the group's engines),
    its config, runtime, loop, and what its thread returned."""

    name: str
    run: RunPlan
    cfg: RunConfig
    group: int | None = None  # its shared rollout pool (index in `FleetResult.engines`)
    cpu: int | None = None  # its shared CPU pool (index in `FleetResult.shared`)
    rt: RayRuntime | None = None
    loop: Loop | None = None
    turn: JobTurn | None = None
    placement: list[dict[str, Any]] = field(default_factory=list)
    bundles: list[dict[str, Any]] = field(default_factory=list)  # its own groups' bundles
    held: list[Any] = field(default_factory=list)  # actors of a shared pool another job started
    stats: list[StepStat] = field(default_factory=list)
    error: BaseException | None = None


@dataclass
class FleetExecResult:
    """Every job's steps, its placement and ledger; every shared pool's turns, each swap and
    rollout measured beside the plan's prices."""

    jobs: dict[str, list[StepStat]]
    planned_s: dict[str, float]  # each job's priced iteration (shared pool included)
    placement: dict[str, list[dict[str, Any]]]
    ledger_problems: dict[str, list[str]]
    pools: list[SharedRolloutUse]
    turns: list[list[TurnRecord]]  # per shared pool
    trace: Trace
    described: str = ""
    cpu_pools: list[SharedUse] = field(default_factory=list)
    env_pools: list[SharedEnvPool] = field(default_factory=list)  # per shared CPU pool
    env_pids: list[list[int | None]] = field(default_factory=list)  # its workers' processes
    simulated: dict[str, Any] | None = None  # --simulate's slowdowns, beside the measured
    bundles: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # groups it made

    @property
    def ledger_ok(self) -> bool:
        return not any(self.ledger_problems.values())

    def swaps(self, group: int) -> list[TurnRecord]:
        return [t for t in self.turns[group] if t.swapped]

    def summary(self) -> dict[str, Any]:
        def mean(xs: list[float]) -> float | None:
            return round(sum(xs) / len(xs), 4) if xs else None
        return {
            "jobs": {name: {"step_s": [round(s.step_s, 4) for s in stats],
                            "mean_step_s": mean([s.step_s for s in stats]),
                            "planned_iteration_s": round(self.planned_s[name], 4),
                            "reward": [round(s.reward, 4) for s in stats],
                            "ledger_problems": self.ledger_problems[name],
                            "placement": self.placement[name],
                            "bundles": self.bundles.get(name, [])}
                     for name, stats in self.jobs.items()},
            "shared_rollout": [
                {"pool": use.pool, "nodes": use.nodes, "order": [m.job for m in use.members],
                 "priced_swap_s": round(use.swap_s, 4),
                 "measured_swap_s": mean([t.sync_s for t in self.swaps(g)]),
                 "swaps": len(self.swaps(g)),
                 "priced_generation_s": {m.job: round(m.generation_s, 4) for m in use.members},
                 "measured_rollout_s": {m.job: mean([t.rollout_s for t in self.turns[g]
                                                     if t.job == m.job]) for m in use.members},
                 "turns": [t.to_dict() for t in self.turns[g]]}
                for g, use in enumerate(self.pools)],
            "shared_cpu": [pool_summary(use, pool, pids, self.simulated)
                           for use, pool, pids in zip(self.cpu_pools, self.env_pools,
                                                      self.env_pids)],
            "ledger_balanced": self.ledger_ok, "cluster": self.described}

    def render(self) -> list[str]:
        doc = self.summary()
        lines = ["job          steps  mean s/step  planned s/iter  ledger"]
        for name, j in doc["jobs"].items():
            ok = "balanced" if not j["ledger_problems"] else "NOT balanced"
            lines.append(f"{name:<12} {len(j['step_s']):>5} {j['mean_step_s'] or 0:>12.2f} "
                         f"{j['planned_iteration_s']:>15.2f}  {ok}")
        for p in doc["shared_rollout"]:
            lines.append(f"shared engines {p['pool']} x{p['nodes']} ({' -> '.join(p['order'])}):"
                         f" {p['swaps']} swaps, measured {p['measured_swap_s'] or 0:.3f} s each,"
                         f" priced {p['priced_swap_s']:.3f} s")
            for job, got in p["measured_rollout_s"].items():
                lines.append(f"  {job}: rollout on the engines {got or 0:.2f} s per turn "
                             f"(priced generation {p['priced_generation_s'][job]:.3f} s)")
        for c in doc["shared_cpu"]:
            lines.append(f"shared CPU pool {c['pool']} x{c['nodes']}: {c['slots']} call slots "
                         f"on {c['workers']} environment workers, first come first served")
            for job, w in c["jobs"].items():
                sim = ("" if w["simulated_slowdown"] is None
                       else f", simulated {w['simulated_slowdown']:.2f}x")
                won = sum(r["winner"] == "reissue" for r in w["reissued"])
                lines.append(f"  {job}: {w['calls']} calls, waited {w['waited_s']:.3f} s "
                             f"(mean {w['mean_wait_s'] or 0:.4f} s) on the pool, "
                             f"{len(w['reissued'])} re-issued ({won} answered by the copy); "
                             f"slowdown priced {w['priced_slowdown'] or 0:.2f}x{sim}")
        return lines


def fleet_problem(fleet: Fleet, result: FleetResult, runs: dict[str, RunPlan],
                  cfgs: dict[str, RunConfig]) -> str | None:
    """One line naming the field and value of what this driver cannot run; None: it runs."""
    why = cpu_problem(fleet, result.shared, runs)
    if why is not None:
        return why
    decls = fleet.shared.rollout_pools if fleet.shared is not None else []
    for use in result.engines:
        names = [m.job for m in use.members]
        i = next((k for k, d in enumerate(decls) if set(d.jobs) == set(names)), 0)
        where = f"shared.rollout_pools.{i}.jobs"
        for name in names:
            r = runs[name].roles.get(Role.ROLLOUT)
            if r is None:
                return f"{where}: job {name!r} plans no rollout (got {name!r})"
            if r.parts:
                return (f"{where}: job {name!r}'s rollout is split over pools; the shared "
                        f"engines run on one (got {name!r})")
            if runs[name].slots[r.slot].roles != (Role.ROLLOUT,):
                return (f"{where}: job {name!r}'s rollout shares slot {r.slot} with "
                        f"{', '.join(x for x in runs[name].slots[r.slot].roles if x != 'rollout')};"
                        f" the shared engines hold their nodes alone (got {name!r})")
        first = cfgs[names[0]]
        for name in names[1:]:
            for f in ENGINE_FIELDS:
                mine, theirs = getattr(cfgs[name], f), getattr(first, f)
                if mine != theirs:
                    return (f"{where}: job {name!r} samples with {f} {mine}, the engines are "
                            f"started with {names[0]!r}'s {theirs}; members of a shared pool "
                            f"must agree (got {name!r})")
    return None


def shared_view(run: RunPlan, engines: RunPlan) -> RunPlan:
    """A member's run plan on the group's engines: its own roles and slots but the rollout,
    whose role and seats are those of the job whose layout the engines run (`engines`)."""
    own = run.roles[Role.ROLLOUT].slot
    return dataclasses.replace(
        run, roles={**run.roles, Role.ROLLOUT: engines.roles[Role.ROLLOUT]},
        slots={k: v for k, v in run.slots.items() if k != own},
        seats=tuple(s for s in run.seats if s.role != Role.ROLLOUT)
        + tuple(s for s in engines.seats if s.role == Role.ROLLOUT))


def own_nodes(run: RunPlan) -> list[dict[str, float]]:
    """What the nodes of the run's own slots advertise (`executors.cluster.node_resources`)."""
    res = cluster.node_resources(run)
    used = dict.fromkeys((b.pool, b.node) for s in run.slots.values() for b in s.bundles)
    return [res[k] for k in used]


def prepare(fleet: Fleet, result: FleetResult, out: Path, backend: str,
            unsafe_sandbox: bool) -> list[FleetJobRun]:
    """Every job's run plan, checked (SpecError naming the job, or `fleet_problem`), its
    version-0 model written, its config; a member's view on its group's engines."""
    chosen = backend_of(backend)
    runs: dict[str, RunPlan] = {}
    for j in result.jobs:
        try:
            runs[j.name] = resolve_plan(j.plan)
            preflight(runs[j.name], chosen, False, unsafe_sandbox)
        except SpecError as e:
            raise SpecError(f"jobs.{j.name}: {e}") from None
    groups = {m.job: g for g, use in enumerate(result.engines) for m in use.members}
    cpus = {name: c for c, use in enumerate(result.shared) for name in use.jobs}
    cfgs = {name: run_config(r) for name, r in runs.items()}
    why = fleet_problem(fleet, result, runs, cfgs)
    if why is not None:
        raise SpecError(why)
    for use in result.shared:  # the shared CPU nodes hold their first member's bundles only
        runs.update(pool_views(use, runs))
    out_jobs = []
    for j in result.jobs:
        g = groups.get(j.name)
        run = runs[j.name]
        if g is not None and result.engines[g].members[0].job != j.name:
            run = shared_view(run, runs[result.engines[g].members[0].job])
        c = cpus.get(j.name)
        folder = out / j.name
        folder.mkdir(parents=True, exist_ok=True)
        out_jobs.append(FleetJobRun(j.name, run, run_config(run, None,
                                                            prepare_model(run.job, folder)),
                                    g, c))
    return out_jobs


def _leads(j: FleetJobRun, result: FleetResult) -> list[tuple[str, int]]:
    """The shared pools whose workers `j` starts: ("rollout", group) and ("cpu", pool)."""
    out = []
    if j.group is not None and result.engines[j.group].members[0].job == j.name:
        out.append(("rollout", j.group))
    if j.cpu is not None and result.shared[j.cpu].jobs[0] == j.name:
        out.append(("cpu", j.cpu))
    return out


def _needs(j: FleetJobRun, result: FleetResult) -> list[tuple[str, int]]:
    """The shared pools whose workers `j` holds, started by another job."""
    mine = [("rollout", j.group)] if j.group is not None else []
    mine += [("cpu", j.cpu)] if j.cpu is not None else []
    return [k for k in mine if k not in _leads(j, result)]


def start_order(jobs: list[FleetJobRun], result: FleetResult) -> list[FleetJobRun]:
    """Every job after the jobs that start the shared workers it holds (fleet order else)."""
    order: list[FleetJobRun] = []
    started: set[tuple[str, int]] = set()
    left = list(jobs)
    while left:
        ready = [j for j in left if set(_needs(j, result)) <= started]
        if not ready:
            raise SpecError(f"shared: jobs {', '.join(j.name for j in left)} each hold a shared "
                            f"pool another of them starts; lead every shared pool with a job "
                            f"that holds no other job's (got {left[0].name!r})")
        ready.sort(key=lambda j: not _leads(j, result))
        order.append(ready[0])
        started.update(_leads(ready[0], result))
        left.remove(ready[0])
    return order


def connect(jobs: list[FleetJobRun], address: str | None) -> tuple[bool, str]:
    """An embedded Ray advertising every job's nodes, or the cluster at `address` (a Ray this
    process already runs is used as it is): whether bundles are pinned to plan nodes, and
    where the fleet runs."""
    import ray  # lazy: Ray run only

    cluster.ensure_token_auth()
    if address is not None:
        cluster.join(address)
        return False, f"Ray at {address} (node pinning off: each job numbers its own nodes)"
    if not ray.is_initialized():
        cluster.embed([r for j in jobs for r in own_nodes(j.run)])
        return True, "embedded Ray on 127.0.0.1"
    have = ray.cluster_resources()
    pinned = all(cluster.node_key(p, n) in have for j in jobs for p, n in j.run.nodes)
    return pinned, "the running Ray"


def start(jobs: list[FleetJobRun], result: FleetResult, backend: str, max_restarts: int,
          pinned: bool, cpu_slots: list[int] | None = None) -> list[Any]:
    """Every job's placement groups and actors (a shared pool's workers, its rollout engines
    or its CPU pool's environment workers, started by the pool's first job and held by the
    others; `cpu_slots`: each shared CPU pool's slots, which its workers' actors run in
    threads); every job's own actors checked on its plan node and bundle. The groups made."""
    made: list[Any] = []
    pools: dict[tuple[str, int], dict[tuple[str, int], Any]] = {}
    chosen = backend_of(backend)
    role_of = {"rollout": Role.ROLLOUT, "cpu": Role.ENVIRONMENT}
    slots = cpu_slots or [1] * len(result.shared)
    groups: dict[str, dict[str, Any]] = {}  # each pool's first member's groups, by job
    for j in start_order(jobs, result):
        mine = pl.create_groups(j.run, pinned, prefix=f"{j.name}-")
        made += mine.values()
        j.bundles = [{"slot": name, "pool": b.pool, "node": b.node, "bundle": b.index,
                      "resources": dict(b.resources)}
                     for name in mine for b in j.run.slots[name].bundles]
        groups[j.name] = mine
        # a shared CPU pool's first member's groups: the other members' roles there use them
        held = {k: pg for kind, g in _needs(j, result) if kind == "cpu"
                for k, pg in groups[result.shared[g].jobs[0]].items() if k not in mine}
        reuse = {k: h for need in _needs(j, result) for k, h in pools[need].items()}
        seats = sum(1 for s in j.run.seats if s.role == Role.ENVIRONMENT)
        cpu = [slots[g] for kind, g in _leads(j, result) if kind == "cpu"]
        threads = {Role.ENVIRONMENT.value: lanes(cpu[0], seats)} if cpu else {}
        j.rt = RayRuntime(j.run, j.cfg, {**held, **mine}, pinned, chosen, max_restarts,
                          start_timeout_s=START_TIMEOUT_S, reuse=reuse or None,
                          concurrency=threads or None)
        j.held = list(reuse.values())
        for kind, g in _leads(j, result):
            pools[(kind, g)] = {(m.role, m.rank): m.handle for m in j.rt.members
                                if m.role == role_of[kind]}
        j.placement = pl.verify([m for m in j.rt.members if m.slot in {**held, **mine}
                                 and (m.role, m.rank) not in reuse], {**held, **mine})
        pl.check(j.placement, pinned)
    return made


def job_loop(j: FleetJobRun, steps: int, out: Path, gates: list[EngineGate],
             check_weights: bool, progress: Callable[[str, StepStat], None] | None) -> Loop:
    """The job's RL loop over its runtime; a member's takes turns on its group's engines and
    forms its weight-sync groups under its own name (the engines hold one per job)."""
    assert j.rt is not None
    job = j.run.job
    trace = Trace(metadata={"source": "execute", "job": job.name, "fleet_job": j.name,
                            "seed": job.seed, "algorithm": job.algorithm, "mode": job.mode,
                            "backend": DEFAULT_BACKEND, "runtime": "ray",
                            "predicted_iteration_s": j.run.predicted_iteration_s})
    lc = LoopConfig(steps=steps, out_dir=out / j.name, mode=job.mode,
                    max_staleness=job.max_staleness, retries=1,
                    deadlines=tail_deadlines(job.tail_policy))
    report = (lambda st: progress(j.name, st)) if progress is not None else None
    loop = Loop(j.run, j.rt, j.cfg, lc, trace, report)
    if j.group is not None:
        loop.weights.group = GroupRefresh(j.rt, scope=j.name)
        j.turn = gates[j.group].turn_of(j.name, loop.ctx, check_weights)
        loop.turn = j.turn
    return loop


def _run_one(j: FleetJobRun) -> None:
    assert j.loop is not None
    try:
        j.stats = j.loop.run()
    except BaseException as e:  # noqa: BLE001 - re-raised by the driver's thread
        j.error = e
    finally:
        if j.turn is not None:
            j.turn.leave()


def fleet_trace(gates: list[EngineGate], t0: float, result: FleetResult) -> Trace:
    """Each shared pool's turns on one track: a job's swap (or sync), then its rollout."""
    trace = Trace(metadata={"source": "execute", "fleet": result.name, "runtime": "ray"})
    for gate in gates:
        for r in gate.records:
            at = max(r.t0 - t0, 0.0)
            kind = "swap" if r.swapped else "sync"
            trace.add(f"{kind} {r.job}", "transfer", at, r.sync_s, f"engines {gate.pool}",
                      "turns", step=r.step, role=Role.ROLLOUT, src=r.previous)
            trace.add(f"rollout {r.job}", "generate", at + r.sync_s, r.rollout_s,
                      f"engines {gate.pool}", "turns", step=r.step, role=Role.ROLLOUT)
    return trace


def execute_fleet(fleet: Fleet, result: FleetResult, steps: int, out_dir: str | Path, *,
                  backend: str = DEFAULT_BACKEND, max_restarts: int = 3,
                  check_weights: bool = False, unsafe_sandbox: bool = False,
                  address: str | None = None,
                  progress: Callable[[str, StepStat], None] | None = None,
                  note: Callable[[str], None] | None = None) -> FleetExecResult:
    """Run `steps` RL steps of every job of the planned fleet at once (see the module
    docstring), on an embedded Ray or the cluster at `address`. `check_weights`: after each
    sync on shared engines, compare the engines' weights with the job's trainer's
    (`TurnRecord.weights_match`)."""
    import ray  # lazy: Ray run only

    if steps < 1:
        raise SpecError(f"--steps: must be at least 1 (got {steps})")
    out = Path(out_dir)
    jobs = prepare(fleet, result, out, backend, unsafe_sandbox)
    plans = {j.name: j.plan for j in result.jobs}
    gates = [EngineGate(use.pool, [m.job for m in use.members], use.members[0].job)
             for use in result.engines]
    made: list[Any] = []
    envs: list[SharedEnvPool] = []
    ours = not ray.is_initialized()  # the Ray this call starts or joins, it also stops
    try:
        pinned, described = connect(jobs, address)
        slots = [max(pool_slots(use, plans, fleet).values()) for use in result.shared]
        made = start(jobs, result, backend, max_restarts, pinned, slots)
        if note is not None:
            note(f"fleet: {len(jobs)} jobs started on {described}"
                 + ("" if pinned or address else " (node pinning off)"))
        envs, pids = env_pools(jobs, result, slots, fleet)
        for j in jobs:
            j.loop = job_loop(j, steps, out, gates, check_weights, progress)
            if j.cpu is not None:
                j.loop.env.shared = (envs[j.cpu], j.name)
        t0 = time.time()
        threads = [threading.Thread(target=_run_one, args=(j,), name=f"fleet-{j.name}")
                   for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for pool in envs:
            pool.close()
        for j in sorted(jobs, key=lambda j: bool(_leads(j, result))):  # pools' owners last
            if j.rt is not None:
                j.rt.close(spare=j.held)
        for pg in made:
            ray.util.remove_placement_group(pg)
        if ours and ray.is_initialized():
            ray.shutdown()
    failed = next((j for j in jobs if j.error is not None), None)
    if failed is not None:
        raise RuntimeError(f"fleet job {failed.name}: {failed.error}") from failed.error
    for j in jobs:
        assert j.loop is not None
        j.loop.trace.write(out / j.name / "trace.json")
    priced = {j.name: j.iteration_s for j in result.jobs}
    trace = fleet_trace(gates, t0, result)
    for pool in envs:
        pool_trace(trace, pool, t0)
    return FleetExecResult(
        {j.name: j.stats for j in jobs}, priced, {j.name: j.placement for j in jobs},
        {j.name: j.loop.ledger.problems(steps) if j.loop else [] for j in jobs},
        list(result.engines), [g.records for g in gates], trace, described,
        list(result.shared), envs, pids, bundles={j.name: j.bundles for j in jobs})


def env_pools(jobs: list[FleetJobRun], result: FleetResult, slots: list[int], fleet: Fleet
              ) -> tuple[list[SharedEnvPool], list[list[int | None]]]:
    """Each shared CPU pool's queue over its first member's environment workers, with its
    `slots`, its cores, each member's cores of a call and call timeout
    (`executors.fleetcpu`), and those workers' processes (the pids their runtime read when
    they started)."""
    pools, pids = [], []
    by_name = {j.name: j for j in jobs}
    plans = {j.name: j.plan for j in result.jobs}
    for use, n in zip(result.shared, slots):
        rt = by_name[use.jobs[0]].rt
        assert rt is not None
        workers = [m for m in rt.members if m.role == Role.ENVIRONMENT]
        pools.append(SharedEnvPool(
            use.pool, use.jobs, workers, n,
            {name: priced_call_s(plans[name], use.pool) for name in use.jobs},
            pool_deadlines(use, {name: by_name[name].run for name in use.jobs}),
            pool_cores(use, plans, fleet), per_call(use, plans)))
        pids.append([rt.pids.get(id(m)) for m in workers])
    return pools, pids
