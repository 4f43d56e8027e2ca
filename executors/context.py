"""What the parts of the RL loop share: the run's settings, its state across steps, trace events.

`executors.loop.Loop` owns the step sequence and composes its parts, each a class with a narrow
interface over one `LoopContext`:
  calls      `executors.calls.Dispatcher`: a role's calls in parallel, with injected faults,
             per-call deadlines and re-runs of calls whose worker died;
  weights    `executors.weights.WeightSync`: the trainer's weights to the rollout workers;
  rollouts   `executors.rollouts.RolloutDriver`: a step's trajectories over rounds and turns,
             and `executors.rollouts.EnvironmentCalls`: answers run in the sandbox;
  tails      `executors.tails.TailPolicies`: overprovision, partial rollouts and their carry;
  training   `executors.training.Training`: score, advantages, train; and
             `executors.training.Checkpoints`: save, restore (with the carry);
  recovery   `executors.recovery.Recovery`: a lost training process, a changed cluster.
The context holds only what several of them read or write: the run plan and the runtime that runs
it (a cluster recovery replaces both), the workers by role, the ledger, the trace, the weight
version each rollout worker holds, the workers busy with abandoned calls, the answers of samples
not trained yet and the current step's counters. Everything else belongs to one part.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from executors.elastic import Elastic
from executors.ledger import Ledger
from executors.placement import Member
from executors.roles import RunConfig
from executors.runplan import JobFacts, RunPlan
from executors.runtime import Runtime
from executors.stragglers import Busy
from executors.task import Target
from placer.base.roles import Role
from placer.spec.pipeline import MODES, PipelineMode
from traces.schema import Trace


@dataclass(frozen=True)
class Fault:
    """Kill a worker right after its work of `step` was dispatched (`kind`: ray.kill | signal)."""

    step: int
    role: str
    kind: str = "ray.kill"
    rank: int = 0


@dataclass
class LoopConfig:
    steps: int
    out_dir: Path
    mode: str = "sync"
    max_staleness: int = 0
    checkpoint_every: int = 1
    retries: int = 3
    faults: list[Fault] = field(default_factory=list)
    deadlines: dict[str, float] = field(default_factory=dict)  # role -> per-call deadline (s)
    start: int = 0  # first step; > 0 resumes from the checkpoint of step `start - 1`

    @property
    def pipeline(self) -> PipelineMode:
        """What the mode does (`placer.spec.pipeline`)."""
        return MODES[self.mode](self.max_staleness)


@dataclass
class StepStat:
    """One step's figures. Per role, two times that answer different questions:
    `role_wall_s`  the wall time within the step that the role had a call running (the union
                   of its calls' intervals, cut to the step): what the step spent on it, never
                   more than `step_s`;
    `role_rank_s`  its calls' seconds summed over its ranks (rank-seconds): the work done, as
                   large as `role_wall_s` times the ranks busy at once;
    `role_device_s` the rank-seconds times the devices each rank holds in the plan
                   (`RunPlan.devices_per_rank`: an engine replica its TP group): the
                   device-seconds the step booked.
    `rl` holds the step's RL statistics (`executors.loop.rl_stats`): the trainer's clip and
    truncation fractions, KL, entropy and gradient norm, and the samples' response lengths
    and rewards (mean, min, max)."""

    step: int
    reward: float
    exact: float
    step_s: float
    role_wall_s: dict[str, float]
    role_rank_s: dict[str, float]
    role_device_s: dict[str, float]
    versions: list[int]
    loss: float
    reruns: int = 0
    rl: dict[str, float] = field(default_factory=dict)


class TrainingLost(RuntimeError):
    """A trainer or critic rank died; the loop rolls back to the last checkpoint."""


Span = tuple[float, float]  # (start, seconds) of one call, on the wall clock (time.time())


@dataclass
class StepCounters:
    """The current step's calls per role, as (start, seconds) of each rank's call, and
    re-runs. A call that began before the step (async mode: the next step's rollout, launched
    during this one) counts its whole length in rank-seconds, only its part in the step in
    wall time."""

    calls: defaultdict[str, list[Span]] = field(default_factory=lambda: defaultdict(list))
    reruns: int = 0

    def busy(self, role: str, spans: list[Span]) -> None:
        """The role's calls of one batch (one span per rank's call)."""
        self.calls[str(role)] += [(float(t0), max(float(d), 0.0)) for t0, d in spans]

    def rank_s(self) -> dict[str, float]:
        return {r: sum(d for _, d in spans) for r, spans in self.calls.items()}

    def wall_s(self, start: float, end: float) -> dict[str, float]:
        """Per role, the length of the union of its calls' intervals within [start, end]."""
        out = {}
        for role, spans in self.calls.items():
            total, reach = 0.0, start
            for t0, d in sorted(spans):
                lo, hi = max(t0, reach), min(t0 + d, end)
                if hi > lo:
                    total += hi - lo
                reach = max(reach, min(t0 + d, end))
            out[role] = total
        return out


@dataclass
class LoopContext:
    """The state the loop's parts share (see the module docstring for who reads what)."""

    run: RunPlan
    rt: Runtime
    cfg: RunConfig
    lc: LoopConfig
    trace: Trace
    elastic: Elastic | None = None
    ledger: Ledger = field(default_factory=Ledger)
    t0: float = field(default_factory=time.time)  # trace timestamps count from here
    known: dict[int, int | None] = field(default_factory=dict)  # rollout rank -> its version
    synced: int | None = None  # the version the last weight sync sent
    busy: Busy = field(default_factory=Busy)
    targets: dict[str, Target] = field(default_factory=dict)  # sample id -> answer, until trained
    counters: StepCounters = field(default_factory=StepCounters)
    step_began: dict[int, float] = field(default_factory=dict)  # step -> its first stage's start
    optimizer_steps: int = 0  # the trainer's optimizer steps over the run (mini-batches)
    by_role: defaultdict[str, list[Member]] = field(init=False)
    # The job of the plan the run started with: a re-plan changes the cluster, never the batch,
    # the lengths or the tail policy the loop reads from it.
    job: JobFacts = field(init=False)

    def __post_init__(self) -> None:
        self.job = self.run.job
        self.by_role = self._index(self.rt)

    @staticmethod
    def _index(rt: Runtime) -> defaultdict[str, list[Member]]:
        by_role: defaultdict[str, list[Member]] = defaultdict(list)
        for m in sorted(rt.members, key=lambda m: (m.role, m.rank)):
            by_role[m.role].append(m)
        return by_role

    def workers(self, role: Role) -> list[Member]:
        """The role's workers by rank; none when the plan has no such role."""
        return self.by_role.get(role) or []

    def replace_world(self, run: RunPlan, rt: Runtime) -> None:
        """A rebuilt cluster: new workers hold no weights and run no abandoned calls."""
        self.run, self.rt = run, rt
        self.by_role = self._index(rt)
        self.busy, self.known = Busy(), {}

    def new_step(self) -> None:
        self.counters = StepCounters()

    def event(self, name: str, cat: str, ts: float, dur: float, m: Member | None, step: int,
              **args: object) -> None:
        """A trace event on the worker's track (the driver's when `m` is None).

        The driver's `step N` slice spans the step's own stages: it starts where the step's
        first stage (its weight sync) started, which the loop passed before it began timing
        the step, so the stages nest inside it. In async mode step N+1's sync and rollout run
        during step N: consecutive steps go on two driver tracks (loop0, loop1) so that each
        track's slices still nest."""
        if m is None:
            tid = f"loop{step % 2}" if self.lc.pipeline.overlaps_steps else "loop"
            if cat == "stage":
                self.step_began.setdefault(step, ts)
            elif cat == "restart":  # the step is redone: its slice starts with the redo
                self.step_began.clear()
            elif cat == "step":
                began = min(self.step_began.pop(step, ts), ts)
                ts, dur = began, dur + (ts - began)
        pid, tid = (m.trace_pid, f"{m.role}{m.rank}") if m else ("driver", tid)
        if m is not None:
            args.setdefault("role", m.role)
            args.setdefault("devices", m.device_ids)
            if m.part is not None:  # a split role: calibration prices each part's device type
                args.setdefault("pool", m.bundle.pool)
                args.setdefault("part", m.part)
        self.trace.add(name, cat, max(ts - self.t0, 0.0), max(dur, 0.0), pid, tid, step=step,
                       **args)

    def check_cluster(self) -> None:
        """Raise ClusterChanged when nodes died or joined (only a re-plan helps then)."""
        change = self.elastic.changed() if self.elastic is not None else None
        if change is not None:
            raise change
