"""Job plans of many allocations on one pricing memo, in worker processes that keep theirs.

Planning one job on many allocations walks the same engine replays again and again: a
`Pricer`'s `StepTerms` table (`placer.cost.context`) is keyed by value, not by the cluster or
the job, so one table serves every allocation of every job (`Pricers`), and each later plan
skips the lines and replays the earlier ones priced (about a third of a plan's time on the
bench fleet). `plan_on` and `least_devices` take one.

A process pool forgets the memo between tasks, so `KindWorkers` runs `workers` forked
processes that each keep their own `Pricers` for the life of the fleet's search: a kind's tasks
go to the worker that priced it first, and an idle worker takes another's queued task rather
than wait (its result is the same: the memo changes no price, only how soon it is found).
Workers are forked (a spawned one would re-run a caller's script) before the fleet's first
CP-SAT solve, and stopped by `close`.
"""
from __future__ import annotations

import math
import multiprocessing
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from placer.base.errors import Infeasible, SpecError
from placer.cost.batching import StepTerms
from placer.cost.context import TermsKey
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.split import PartTimer
from placer.fleet.floors import RoleTable, role_table
from placer.solve.candidates import Candidate, flat, single_candidates
from placer.solve.ilp_bound import tool_may_lower
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import with_nodes
from placer.spec.hardware import DeviceKind
from placer.spec.job import Job

Task = tuple[str, int, dict[str, int]]  # ("plan" | "least", kind, nodes)


@dataclass
class Pricers:
    """One pricing memo for every job planned here: each pricer made on it shares its
    `StepTerms` table, keyed by value (model, device, replica layout, factors; a replay by the
    job's lengths, environment and tail policy too), so jobs that share models and devices (a
    sweep's batch sizes) reuse each other's lines and replays, and none gets another's price."""

    calib: Calibration
    terms: dict[TermsKey, StepTerms] = field(default_factory=dict)

    def on(self, job: Job, nodes: dict[str, int]) -> Pricer:
        """A pricer of the job restricted to `nodes`, on the memo (SpecError, Infeasible: as
        `with_nodes`)."""
        return Pricer(with_nodes(job, nodes, job.name), self.calib, _terms=self.terms)


def plan_on(job: Job, nodes: dict[str, int], calib: Calibration, time_limit_s: float,
            seed: int, memo: Pricers | None = None, hint: Plan | None = None) -> Plan | str:
    """The job's plan on these nodes, or the first line of why it has none; priced on `memo`
    where given (the same plan, sooner). `hint`: a plan whose configs seed the solver where
    they still exist (a warm start)."""
    try:
        px = (memo or Pricers(calib)).on(job, nodes)
        return plan_job(px, time_limit_s=time_limit_s, hint=hint, workers=1, seed=seed)
    except (Infeasible, SpecError) as e:  # SpecError: a pin naming a pool given 0 nodes
        return str(e).split("\n")[0]


def least_devices(job: Job, nodes: dict[str, int], calib: Calibration,
                  memo: Pricers | None = None) -> RoleTable | None:
    """Per role of the job, its single-pool candidates on these nodes: their devices per pool
    (what the allocation grid is cut by) and times (`placer.fleet.floors`: a bound on the job's
    time on fewer nodes). None: the table cannot be built there; the planner will say why."""
    if not any(nodes.values()):
        return None
    try:
        px = (memo or Pricers(calib)).on(job, nodes)
        cands = flat(single_candidates(px))
    except (Infeasible, SpecError):
        return None
    cpu = frozenset(p.name for p in px.res.cluster.pools
                    if px.res.device_of(p.name).kind is DeviceKind.cpu)
    half = math.ceil(px.res.job.batch.samples / 2)
    timers = {r: PartTimer.of(px, r) for r in cands}

    def part(c: Candidate) -> float:
        """Its layout as a split part holding at least half the batch (a part's time never
        falls with more samples, `placer.cost.split`); 0 where that part does not fit."""
        est = timers[c.role](c.est, half)
        return 0.0 if est is None else est.time_s
    table = role_table(cands, px.res.job.profile.splits_roles, tool_may_lower(px.res.job), cpu,
                       part)
    if job.agents is not None:  # an agent's roles are named for it: bounded by none of them
        return replace(table, loose=frozenset(cands))
    return table


def run_task(task: Task, jobs: Sequence[Job], memo: Pricers, time_limit_s: float,
             seed: int) -> Any:
    """One task on `memo`: `jobs[kind]` planned on (or its table on) the task's nodes."""
    what, kind, nodes = task
    if what == "plan":
        return plan_on(jobs[kind], nodes, memo.calib, time_limit_s, seed, memo)
    return least_devices(jobs[kind], nodes, memo.calib, memo)


def _serve(conn: Connection, jobs: Sequence[Job], calib: Calibration, time_limit_s: float,
           seed: int) -> None:
    """A worker: tasks in, results out, one memo for its life; None stops it. An error is
    sent back to be raised by the caller."""
    memo = Pricers(calib)
    while (task := conn.recv()) is not None:
        try:
            conn.send((True, run_task(task, jobs, memo, time_limit_s, seed)))
        except Exception as e:  # noqa: BLE001 - re-raised in the caller
            conn.send((False, e))


@dataclass
class KindWorkers:
    """`n` forked workers, each with its own memo (module docstring). `jobs[kind]` is each
    kind's job as planned."""

    jobs: Sequence[Job]
    calib: Calibration
    time_limit_s: float
    seed: int
    n: int
    conns: list[Connection] = field(default_factory=list)
    procs: list[multiprocessing.process.BaseProcess] = field(default_factory=list)
    home: dict[int, int] = field(default_factory=dict)  # kind -> the worker that priced it

    def start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        for _ in range(self.n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, daemon=True,
                               args=(theirs, self.jobs, self.calib, self.time_limit_s,
                                     self.seed))
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)

    def close(self, stop: bool = False) -> None:
        """Stop the workers: each when done (`stop`: at once, as after an error, when
        others may still be busy)."""
        for conn, proc in zip(self.conns, self.procs):
            if stop:
                proc.terminate()
            else:
                conn.send(None)
        for conn, proc in zip(self.conns, self.procs):
            proc.join()
            conn.close()
        self.conns, self.procs = [], []

    def run(self, tasks: list[Task]) -> list[Any]:
        """Each task's result, in order: a kind's tasks on its worker, each worker busy while
        any task waits."""
        if not self.procs:
            self.start()
        queues: list[deque[int]] = [deque() for _ in range(self.n)]
        for i, (_, kind, _) in enumerate(tasks):
            w = self.home.setdefault(kind, len(self.home) % self.n)
            queues[w].append(i)
        out: list[Any] = [None] * len(tasks)
        busy: dict[int, int] = {}  # worker -> its task's index

        def feed(w: int) -> None:
            queue = queues[w] or max(queues, key=len)  # idle: take from the longest queue
            if queue:
                i = queue.popleft() if queue is queues[w] else queue.pop()
                self.conns[w].send(tasks[i])
                busy[w] = i

        for w in range(self.n):
            feed(w)
        while busy:
            for ready in wait([self.conns[w] for w in busy]):
                w = next(w for w in busy if self.conns[w] is ready)
                ok, got = self.conns[w].recv()
                if not ok:
                    self.close(stop=True)
                    raise got
                out[busy.pop(w)] = got
                feed(w)
        return out
