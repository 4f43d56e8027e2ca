"""A fleet's jobs in one simulation: each job's iterations as the single-job simulator runs them
(`simulator.iteration.Model`), all on one simpy environment, sharing what the fleet file's
`contention` section names (`placer.fleet.contention`):

  CPU pools   the tool calls of the jobs sharing a CPU environment pool queue on one set of cores
              (`simulator.environment.CorePool`, first come first served across the jobs; jobs
              of different `cpu_per_call` each take their own of the cores, `CoreLedger`);
  spine       a weight sync whose actor and rollout sit in different pools also crosses the spine
              link between the two pools, shared max-min fairly with the other jobs' syncs on it
              (`simulator.fabric`; each job's own links stay its own);
  storage     checkpoints, every `checkpoint_every` iterations, write to the cluster's one storage
              (`cluster.storage_gbs`): a job's checkpoint alone takes `plan_checkpoint_s`, all of
              it treated as storage-bound, and concurrent ones share the bandwidth. A checkpoint
              drains the job's pipeline (the iterations after it start afresh);
  preemption  at a scripted time a lending team takes back its unused nominal nodes of a pool:
              free nodes first, then nodes of the borrowing teams' jobs of its cohort, lowest
              weight first. A preempted job stops at once and loses the work since its last
              checkpoint (counted, and redone). It is re-planned by the job-level planner on
              the nodes it keeps (`JobPlanner.replan`: the planner's own optimum there, warm-
              started from the running plan), pays the re-plan and restart
              (`SimConfig.failures.restart_s`), holding its kept nodes meanwhile, and runs on
              at the new plan's pace from its checkpoint. Only a job that no plan fits on what
              it keeps is suspended (its nodes freed; the result says why).

Stragglers and the workload's variance are the single-job simulator's (`SimConfig`); random
failures are not composed here (`placer goodput` prices them per job). Each job is also simulated
alone on its allocation (the same runs, nothing shared, no
preemption): the slowdown is its median iteration time in the fleet over its median alone
over the same iterations (a job preempted early is compared on the few it ran). Work in flight
when a job is preempted finishes its current stage in the simulation and is thrown away. Every
draw comes from the seed: a job's k-th run of iterations uses a seed derived from (seed, job,
k), alone and in the fleet alike.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import numpy as np
import simpy

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.fleet.contention import Contention, Preemption, SharedCpuPool
from placer.fleet.inner import JobPlanner
from placer.fleet.planner import as_written
from placer.fleet.result import FleetResult, TeamUse
from placer.fleet.spec import Fleet
from placer.solve.hostmem import plan_checkpoint_s
from placer.solve.planfile import Plan
from simulator.api import check_size
from simulator.config import SimConfig
from simulator.environment import CoreLedger, CorePool, pool_slots
from simulator.fabric import Fabric
from simulator.fleetresult import FleetSimResult, JobSim, PreemptionEvent, SharedPoolUse, Span
from simulator.iteration import Model
from simulator.metrics import steady
from simulator.recorder import Recorder
from simulator.workload import has_tools

STORAGE = "storage"


def spine(a: str, b: str) -> str:
    return "spine:" + "-".join(sorted((a, b)))


class FleetModel(Model):
    """One job's iterations whose weight syncs go over the fleet's shared fabric."""

    def __init__(self, px: Pricer, plan: Plan, cfg: SimConfig, seed: int, env: simpy.Environment,
                 fabric: Fabric, prefix: str, spine_gbs: float | None) -> None:
        super().__init__(px, plan, cfg, seed, Recorder(record_tools=False), env=env)
        self.fabric = fabric
        self.paths: list[tuple[str, ...]] = []
        if self.sync is None:
            return
        fabric.links.update({prefix + k: v for k, v in self.sync.links.items()})
        a, r = self.plan.roles[Role.ACTOR], self.plan.roles[Role.ROLLOUT]
        targets = [q.pool for q in r.parts] or [r.pool]
        for f in self.sync.flows:
            pools = [f.name.split("@", 1)[1]] if "@" in f.name else targets
            extra = []
            if spine_gbs is not None:
                extra = sorted({spine(a.pool, p) for p in pools if p != a.pool})
                fabric.links.update(dict.fromkeys(extra, spine_gbs))
            self.paths.append(tuple(prefix + k for k in f.path) + tuple(extra))

    def _weight_sync(self, i: int) -> Generator:
        if self.sync is None:
            return
        env, slot = self.env, self.plan.roles[Role.ROLLOUT].slot
        req = yield from self._hold(slot, Role.ROLLOUT, i)
        t0 = env.now
        yield simpy.AllOf(env, [self.fabric.send(f.gb, p)
                                for f, p in zip(self.sync.flows, self.paths)])
        yield env.timeout(self.sync.fixed_s)
        total = env.now - t0
        for f in self.sync.flows:
            for pool, _ in self.sync.receivers:
                self.rec.add("weight sync", "transfer", t0, total, pool, f"{slot}/sync",
                             role=Role.ROLLOUT, step=i, policy_version=i, tokens=0, gb=f.gb,
                             links=list(f.path), replica=f.name)
        rec = self.records[i]
        rec.sync_s += total
        rec.sync_alone_s += self.sync.fixed_s + self.sync.alone_s
        self.busy.append((slot, t0, total, 1.0))
        self.role_s["sync"] += total
        self.slot_res[slot].release(req)


@dataclass
class _Job:
    index: int
    name: str
    team: str
    weight: float
    plan: Plan
    vector: tuple[int, ...]  # nodes held in the simulation (a shared pool by its first member)
    alloc: tuple[int, ...]  # nodes it is planned on (a shared pool counted for every member)
    preempted: simpy.Event
    shared: CorePool | None = None
    next_plan: Plan | None = None
    why: str | None = None
    durations: dict[int, list[float]] = field(default_factory=dict)  # plan version -> steady
    out: dict[str, Any] = field(default_factory=dict)  # JobSim fields measured
    done: bool = False


def seed_of(seed: int, job: int, run: int) -> int:
    return int(np.random.SeedSequence([seed, job, run]).generate_state(1)[0])


class _Sim:
    """One environment, its fabric, the jobs' drivers and the scripted preemptions."""

    def __init__(self, fleet: Fleet,
                 plans: list[tuple[int, Plan, tuple[int, ...], tuple[int, ...]]],
                 calib: Calibration, cfg: SimConfig, seed: int, iterations: int,
                 contention: Contention, planner: JobPlanner | None) -> None:
        self.fleet, self.calib, self.cfg, self.seed = fleet, calib, cfg, seed
        self.iterations, self.c, self.planner = iterations, contention, planner
        self.env = simpy.Environment()
        self.fabric = Fabric(self.env, {STORAGE: fleet.cluster.storage_gbs})
        self.pools = [p.name for p in fleet.cluster.pools]
        self.jobs = [_Job(j, fleet.jobs[j].name, fleet.jobs[j].team, fleet.jobs[j].weight,
                          plan, vec, alloc, self.env.event()) for j, plan, vec, alloc in plans]
        self.owner: dict[str, list[str | None]] = {p.name: [None] * p.nodes
                                                   for p in fleet.cluster.pools}
        # (pool, node) -> (holder, since, reclaimed, restarting)
        self.opened: dict[tuple[str, int], tuple[str, float, bool, bool]] = {}
        self.spans: list[Span] = []
        self.events: list[PreemptionEvent] = []
        # each shared CPU pool's members' pools (one pool for all of one cpu_per_call)
        self.shared_pools: list[tuple[SharedCpuPool, dict[str, CorePool]]] = []
        # a shared rollout pool's engines: one slot its members' rollouts and syncs take in turn
        self.engines: dict[str, tuple[str, simpy.PriorityResource]] = {}
        for js in self.jobs:
            for p, n in zip(self.pools, js.vector):
                for _ in range(n):
                    self._hold(p, self.owner[p].index(None), js.name)

    # ------------------------------------------------------------------- node bookkeeping
    def _hold(self, pool: str, node: int, holder: str, reclaimed: bool = False,
              restarting: bool = False) -> None:
        self.owner[pool][node] = holder
        self.opened[(pool, node)] = (holder, self.env.now, reclaimed, restarting)

    def _release(self, pool: str, node: int) -> None:
        holder, start, reclaimed, restarting = self.opened.pop((pool, node))
        self.spans.append(Span(pool, node, holder, start, self.env.now, reclaimed, restarting))
        self.owner[pool][node] = None

    def _held(self, js: _Job) -> list[tuple[str, int]]:
        return [(p, node) for p in self.pools for node, h in enumerate(self.owner[p])
                if h == js.name]

    def _free(self, js: _Job) -> None:
        for p, node in self._held(js):
            self._release(p, node)

    def _relabel(self, js: _Job, restarting: bool) -> None:
        """The job's nodes, from now on, as restarting (re-plan and restart) or running."""
        for p, node in self._held(js):
            self._release(p, node)
            self._hold(p, node, js.name, restarting=restarting)

    def close(self) -> None:
        for key in list(self.opened):
            self._release(*key)

    # ---------------------------------------------------------------------------- sharing
    def share_cpu(self, pools: list[SharedCpuPool]) -> None:
        by_name = {js.name: js for js in self.jobs}
        for i, sp in enumerate(pools):
            members = [by_name[n] for n in sp.jobs if n in by_name]
            envs = [js.plan.roles.get(Role.ENVIRONMENT) for js in members]
            where = f"contention.cpu_pools.{i}"
            for js, e in zip(members, envs):
                if e is None or not has_tools(js.plan.spec):
                    raise SpecError(f"{where}.jobs: job {js.name} makes no tool calls on a CPU "
                                    f"pool (got {js.name!r})")
            pool = {e.pool for e in envs if e is not None}
            if len(pool) != 1:
                raise SpecError(f"{where}.jobs: jobs sharing a CPU pool must run their tools on "
                                f"one pool (got pools {sorted(pool)})")
            name = pool.pop()
            res = members[0].plan.resolved()
            dev = res.device_of(name)
            if sp.nodes is not None:
                per_node = next(p for p in self.fleet.cluster.pools if p.name == name)
                cores = sp.nodes * per_node.devices_per_node * dev.cores
            else:
                cores = max(e.devices for e in envs if e is not None) * dev.cores
            widths = [js.plan.spec.environment.cpu_per_call for js in members]
            if len(set(widths)) == 1:  # one queue of cores // cpu_per_call servers
                core_pool = CorePool(name, pool_slots(cores, widths[0]))
                shares = [core_pool] * len(members)
            else:  # each member's calls take its own cpu_per_call of the cores
                ledger = CoreLedger(name, cores)
                shares = [CorePool(name, pool_slots(cores, w), ledger=ledger, width=w)
                          for w in widths]
            self.shared_pools.append((sp, {js.name: p for js, p in zip(members, shares)}))
            for js, share in zip(members, shares):
                js.shared = share

    def share_engines(self, groups: list[tuple[str, list[str]]]) -> None:
        """Each (pool, members) shared rollout pool: one engines slot for all its members."""
        for pool, members in groups:
            slot = simpy.PriorityResource(self.env, 1)
            self.engines.update({name: (pool, slot) for name in members})

    # ----------------------------------------------------------------------------- driving
    def _model(self, js: _Job, version: int, run: int) -> Model:
        px = Pricer(js.plan.resolved(), self.calib)
        m = FleetModel(px, js.plan, self.cfg, seed_of(self.seed, js.index, run), self.env,
                       self.fabric, f"{js.name}#{version}/", self.c.spine_gbs)
        rollout = js.plan.roles.get(Role.ROLLOUT)
        if js.name in self.engines and rollout is not None \
                and rollout.pool == self.engines[js.name][0]:
            m.slot_res[rollout.slot] = self.engines[js.name][1]
        if js.shared is not None and m.tools is not None:
            if js.shared.redraw is None and m.tools.redraw is not None:  # re-issue, as planned
                js.shared.deadline_s, js.shared.redraw = m.tools.deadline_s, m.tools.redraw
            m.tools = js.shared
        return m

    def drive(self, js: _Job) -> Generator:
        env, n, every = self.env, self.iterations, self.c.checkpoint_every
        kept = saved = version = run = 0
        safe_t = env.now
        o = js.out
        o.update(lost_s=0.0, lost_iterations=0, restart_s=0.0, checkpoints=0, checkpoint_s=0.0,
                 checkpoint_alone_s=0.0)
        while kept < n:
            count = min(every or n, n - kept)
            model = self._model(js, version, run)
            run += 1
            work = model.start(count)
            yield work | js.preempted
            done = _durations(model)
            js.durations.setdefault(version, []).extend(
                _paced(done, count, work.triggered, js.plan))
            if not work.triggered or js.preempted.triggered and kept + count < n:
                if not work.triggered:
                    model.stopped = True
                    lost = kept - saved + len(done)
                else:
                    lost = kept + count - saved
                kept = saved
                if not (yield from self._lose(js, lost, safe_t, saved)):
                    return
                version += 1
                safe_t = env.now
                continue
            kept += count
            if every and kept < n:
                gb = plan_checkpoint_s(js.plan, self.calib) * self.fleet.cluster.storage_gbs
                t0 = env.now
                write = self.fabric.send(gb, (STORAGE,))
                yield write | js.preempted
                if not write.triggered:
                    lost, kept = kept - saved, saved
                    if not (yield from self._lose(js, lost, safe_t, saved)):
                        return
                    version += 1
                    safe_t = env.now
                    continue
                o["checkpoints"] += 1
                o["checkpoint_s"] += env.now - t0
                o["checkpoint_alone_s"] += gb / self.fleet.cluster.storage_gbs
                saved, safe_t = kept, env.now
        o["finish_s"] = env.now
        js.done = True
        self._free(js)  # its nodes go back to the pool

    def _lose(self, js: _Job, iterations: int, since: float, saved: int
              ) -> Generator[simpy.Event, object, bool]:
        """A preemption: the iterations since the last checkpoint (at `since`, `saved` kept)
        are lost, then the job re-plans (`_restart`); False when it is suspended."""
        o = js.out
        o["lost_iterations"] += iterations
        o["lost_s"] += self.env.now - since
        o["kept"] = saved
        return (yield from self._restart(js))

    def _restart(self, js: _Job) -> Generator[simpy.Event, object, bool]:
        """After a preemption: the re-plan and restart on the nodes kept (which it holds
        meanwhile), or suspension when no plan fits them."""
        js.preempted = self.env.event()
        if js.next_plan is None:
            js.out["suspended"] = js.why or "no plan fits the nodes it kept"
            js.out["suspended_at_s"] = self.env.now
            js.done = True
            self._free(js)
            return False
        js.plan, js.next_plan = js.next_plan, None
        wait = self.cfg.failures.restart_s
        js.out["restart_s"] += wait
        if wait > 0:
            self._relabel(js, restarting=True)
            yield self.env.timeout(wait)
            if not js.done:
                self._relabel(js, restarting=False)
        return True

    # -------------------------------------------------------------------------- preemption
    def preempt(self, ev: Preemption) -> Generator:
        yield self.env.timeout(ev.at_s)
        p = self.pools.index(ev.pool)
        team = self.fleet.teams[ev.team]
        active = [js for js in self.jobs if not js.done]
        used = {t: sum(js.vector[p] for js in active if js.team == t) for t in self.fleet.teams}
        reclaimed = sum(1 for (q, _), (h, _, back, _) in self.opened.items()
                        if q == ev.pool and back and h == f"team {ev.team}")
        lendable = team.quota[ev.pool].nominal - used[ev.team] - reclaimed
        want = min(ev.nodes, max(lendable, 0))
        free = [i for i, h in enumerate(self.owner[ev.pool]) if h is None]
        from_free = min(want, len(free))
        take = want - from_free
        taken: dict[str, int] = {}
        borrowers = sorted((js for js in active if js.team != ev.team and js.vector[p]
                            and team.cohort is not None
                            and self.fleet.teams[js.team].cohort == team.cohort
                            and used[js.team] > self.fleet.teams[js.team].quota[ev.pool].nominal),
                           key=lambda js: (js.weight, js.name))
        for js in borrowers:
            if take <= 0:
                break
            nominal = self.fleet.teams[js.team].quota[ev.pool].nominal
            k = min(take, js.vector[p], used[js.team] - nominal)
            if k <= 0:
                continue
            take -= k
            used[js.team] -= k
            taken[js.name] = k
            mine = [i for i, h in enumerate(self.owner[ev.pool]) if h == js.name]
            for node in mine[-k:]:
                self._release(ev.pool, node)
                self._hold(ev.pool, node, f"team {ev.team}", reclaimed=True)
            self._replan(js, p, k)
        for node in free[:from_free]:
            self._hold(ev.pool, node, f"team {ev.team}", reclaimed=True)
        self.events.append(PreemptionEvent(self.env.now, ev.team, ev.pool, taken, from_free))

    def _replan(self, js: _Job, p: int, lost: int) -> None:
        """Job `js` lost `lost` nodes of pool `p`: its plan on what it keeps (the job-level
        planner, warm-started from the plan it runs), or why none fits (it is suspended)."""
        assert self.planner is not None, "preemptions need the job planner"
        js.vector = js.vector[:p] + (js.vector[p] - lost,) + js.vector[p + 1:]
        js.alloc = js.alloc[:p] + (js.alloc[p] - lost,) + js.alloc[p + 1:]
        o = js.out
        o["preempted_at_s"] = self.env.now
        o["preemptions"] = o.get("preemptions", 0) + 1
        o["nodes_after"] = kept = {q: n for q, n in zip(self.pools, js.alloc) if n}
        o.pop("replanned_predicted_s", None)
        running = js.next_plan or js.plan  # a second preemption before the restart: the re-plan
        got = self.planner.replan(js.index, js.alloc, running) if kept else "it kept no nodes"
        if isinstance(got, str):
            shown = ", ".join(f"{q} {n}" for q, n in kept.items())
            js.next_plan = None
            js.why = got if not kept else f"no plan fits the nodes it kept ({shown}): {got}"
        else:
            js.next_plan = as_written(got, self.fleet.jobs[js.index].job)
            o["replanned_predicted_s"] = got.predicted_iteration_s
        if not js.preempted.triggered:  # two preemptions at one instant: one roll-back
            js.preempted.succeed()

    def run(self, preemptions: list[Preemption]) -> None:
        for js in self.jobs:
            self.env.process(self.drive(js))
        for ev in sorted(preemptions, key=lambda e: e.at_s):
            self.env.process(self.preempt(ev))
        self.env.run()
        self.close()


def _durations(model: Model) -> list[float]:
    """The finished iterations' durations (overlapping steps: between training commits, the
    first from the run's start)."""
    recs = [r for r in model.records if "train" in r.stages]
    if model.plan.pipeline.overlaps_steps:
        ends = [model.started_at] + [r.end for r in recs]
        return [b - a for a, b in zip(ends, ends[1:])]
    return [r.end - r.start for r in recs]


def _paced(done: list[float], count: int, complete: bool, plan: Plan) -> list[float]:
    """A run's iterations that measure the job's pace, as a run of `count` iterations alone
    gives them (`steady`): a run cut short by a preemption drops the pipeline fill where the
    whole run would have, and has no drain."""
    if complete:
        return steady(done, plan.pipeline) or done
    return done[1:] if plan.pipeline.overlaps_steps and count >= 2 else done


def simulate_fleet(fleet: Fleet, result: FleetResult, calib: Calibration, *,
                   iterations: int = 4, seed: int = 0, config: SimConfig | None = None,
                   job_time_limit_s: float = 5.0) -> FleetSimResult:
    """Every job of `result` side by side, then each alone (module docstring)."""
    if iterations < 1:
        raise SpecError(f"--iterations: must be at least 1 (got {iterations})")
    if seed < 0:
        raise SpecError(f"--seed: must be >= 0 (got {seed})")
    cfg = config or SimConfig()
    c = fleet.contention or Contention()
    pools = [p.name for p in fleet.cluster.pools]
    index = {fj.name: j for j, fj in enumerate(fleet.jobs)}
    # a CPU pool the allocation shares is shared here too, its nodes held by its first member
    tails = {(n, s.pool) for s in result.shared for n in s.jobs[1:]}
    tails |= {(m.job, e.pool) for e in result.engines for m in e.members[1:]}  # engines: once
    plans = [(index[jr.name], jr.plan, tuple(0 if (jr.name, p) in tails else jr.nodes.get(p, 0)
                                             for p in pools),
              tuple(jr.nodes.get(p, 0) for p in pools)) for jr in result.jobs]
    c = c.model_copy(update={"cpu_pools": [SharedCpuPool(jobs=s.jobs, nodes=s.nodes)
                                           for s in result.shared] + c.cpu_pools})
    for _, plan, _, _ in plans:
        check_size(plan.resolved(), iterations)
    planner = JobPlanner(fleet, calib, job_time_limit_s, seed) if c.preemptions else None
    together = _Sim(fleet, plans, calib, cfg, seed, iterations, c, planner)
    together.share_cpu(c.cpu_pools)
    together.share_engines([(e.pool, [m.job for m in e.members]) for e in result.engines])
    together.run(c.preemptions)
    alone_c = c.model_copy(update={"cpu_pools": [], "preemptions": []})
    jobs = []
    for js, jr in zip(together.jobs, result.jobs):
        own = tuple(jr.nodes.get(p, 0) for p in pools)  # alone: a shared pool its own
        solo = _Sim(fleet, [(js.index, jr.plan, own, own)], calib, cfg, seed,
                    iterations, alone_c, None)
        solo.run([])
        alone = median(solo.jobs[0].durations[0])
        ran = js.durations.get(0) or []  # its k-th run draws as alone: compare the same ones
        matched = median(solo.jobs[0].durations[0][:len(ran)]) if ran else None
        o = js.out
        kept = iterations if o.get("finish_s") is not None else o.get("kept", 0)
        last = max(js.durations, default=0)  # the plan it ran last
        jobs.append(JobSim(js.name, js.team, iterations, dict(jr.nodes), alone,
                           median(js.durations[0]) if js.durations.get(0) else None,
                           median(js.durations[last]) if last and js.durations[last] else None,
                           o.get("replanned_predicted_s"), o.get("nodes_after"),
                           o.get("preempted_at_s"), o["lost_s"], o["lost_iterations"],
                           o["restart_s"], o["checkpoints"], o["checkpoint_s"],
                           o["checkpoint_alone_s"], o.get("finish_s"), o.get("suspended"),
                           kept * alone, o.get("preemptions", 0), o.get("suspended_at_s"),
                           js.plan if last else None, matched))
    shared = [_pool_use(sp, shares) for sp, shares in together.shared_pools]
    after = _usage_after(fleet, result.usage, together)
    spine_gb = {k: v for k, v in together.fabric.gb_moved.items() if k.startswith("spine:")}
    end = max((j.finish_s for j in jobs if j.finish_s is not None), default=together.env.now)
    return FleetSimResult(fleet.name, seed, iterations, jobs, fleet.pool_nodes(), together.spans,
                          together.events, result.usage, after, shared, spine_gb, end)


def _pool_use(sp: SharedCpuPool, shares: dict[str, CorePool]) -> SharedPoolUse:
    """A shared CPU pool's calls and mean wait over its members, and each member's slots."""
    pools = list({id(p): p for p in shares.values()}.values())
    calls = sum(p.calls for p in pools)
    wait = sum(p.wait_s for p in pools)
    return SharedPoolUse(tuple(sp.jobs), pools[0].name, max(p.slots for p in pools), calls,
                         wait / calls if calls else 0.0, {n: p.slots for n, p in shares.items()})


def _usage_after(fleet: Fleet, usage: list[TeamUse], sim: _Sim) -> list[TeamUse]:
    """Each team's use once every preemption has happened (reclaimed nodes count for the
    lender)."""
    pools = [p.name for p in fleet.cluster.pools]
    out = []
    for u in usage:
        p = pools.index(u.pool)
        used = sum(js.vector[p] for js in sim.jobs if js.team == u.team)
        used += sum(n for ev in sim.events if ev.team == u.team and ev.pool == u.pool
                    for n in [*ev.taken.values(), ev.free])
        out.append(TeamUse(u.team, u.cohort, u.pool, u.nominal, u.cap, used))
    return out
