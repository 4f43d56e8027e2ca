"""What a fleet's simulation reports (`simulator.fleet.simulate_fleet`): per job its iteration
time alone and beside the others, the slowdown, what a preemption cost it; the fleet's goodput;
and the node timeline the Gantt chart draws (`simulator.fleetplots`).

Goodput is the share of the jobs' time that makes progress at their own pace: per job, its
iterations times its iteration time alone, over the time it took to finish them in the fleet
(slowdown, lost work, restarts, the slower pace of a re-plan on fewer nodes and checkpoints all
lower it); the fleet's is the sum of the former over the sum of the latter. A suspended job's
iterations kept at its last checkpoint count as useful, over the time until the last job
finished.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from placer.fleet.result import TeamUse
from placer.solve.planfile import Plan


@dataclass(frozen=True)
class Span:
    """Node `node` of `pool` held by `holder` (a job, or a team that took it back) over time."""

    pool: str
    node: int
    holder: str
    start_s: float
    end_s: float
    reclaimed: bool = False  # a lending team's work on a node it took back
    restarting: bool = False  # the job re-planning and restarting after a preemption


@dataclass(frozen=True)
class PreemptionEvent:
    at_s: float
    team: str  # the lending team
    pool: str
    taken: dict[str, int]  # job -> nodes it lost
    free: int  # nodes the lender got without preempting anyone


@dataclass
class JobSim:
    name: str
    team: str
    iterations: int
    nodes: dict[str, int]  # as allocated
    alone_s: float  # median iteration time, the job alone on its allocation
    fleet_s: float | None  # median iteration time beside the others, on its allocation (None:
    # preempted before it finished one there)
    replanned_s: float | None = None  # after its last preemption, on what it kept (simulated
    # median; None: it ran no iteration there)
    replanned_predicted_s: float | None = None  # that re-plan's own prediction (None: none fits)
    nodes_after: dict[str, int] | None = None  # what it kept (the last preemption)
    preempted_at_s: float | None = None  # the last preemption
    lost_s: float = 0.0  # work since the last checkpoint that preemptions threw away
    lost_iterations: int = 0
    restart_s: float = 0.0  # re-planning and restarting (failures.restart_s per preemption)
    checkpoints: int = 0
    checkpoint_s: float = 0.0  # time spent writing checkpoints
    checkpoint_alone_s: float = 0.0  # the same checkpoints, storage to itself
    finish_s: float | None = None  # None: suspended (no plan fits what it kept)
    suspended: str | None = None  # why no plan fits what it kept
    useful_s: float = 0.0  # iterations kept x iteration time alone
    preemptions: int = 0  # times it lost nodes
    suspended_at_s: float | None = None
    replanned_plan: Plan | None = None  # the plan it ran last, when a preemption re-planned it
    # median alone over the iterations it completed beside the others on its allocation (the
    # same draws: a preempted job's few iterations against the same few, not against all)
    alone_matched_s: float | None = None

    @property
    def slowdown(self) -> float | None:
        if self.fleet_s is None:
            return None
        return self.fleet_s / (self.alone_matched_s or self.alone_s)

    @property
    def goodput(self) -> float:
        return self.useful_s / self.finish_s if self.finish_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "team": self.team, "iterations": self.iterations,
                "nodes": self.nodes, "alone_iteration_s": self.alone_s,
                "fleet_iteration_s": self.fleet_s, "slowdown": self.slowdown,
                "replanned_iteration_s": self.replanned_s,
                "replanned_predicted_s": self.replanned_predicted_s,
                "nodes_after_preemption": self.nodes_after,
                "preempted_at_s": self.preempted_at_s, "lost_work_s": self.lost_s,
                "lost_iterations": self.lost_iterations, "restart_s": self.restart_s,
                "checkpoints": self.checkpoints, "checkpoint_s": self.checkpoint_s,
                "checkpoint_alone_s": self.checkpoint_alone_s, "finish_s": self.finish_s,
                "preemptions": self.preemptions, "suspended": self.suspended,
                "suspended_at_s": self.suspended_at_s, "goodput": self.goodput,
                "replanned_plan": (None if self.replanned_plan is None
                                   else self.replanned_plan.model_dump(mode="json"))}

    def note(self) -> str:
        """What preemptions did to it, in words ('' when none did)."""
        if not self.preemptions:
            return ""
        lost = (f"{self.lost_iterations} iteration(s) lost ({self.lost_s:.1f} s since its last "
                "checkpoint)")
        if self.suspended:
            return (f"preempted at {self.preempted_at_s:.1f} s, {lost}; suspended: "
                    f"{self.suspended}")
        kept = ", ".join(f"{p} {n}" for p, n in (self.nodes_after or {}).items())
        pace = ("no iteration there" if self.replanned_s is None
                else f"{self.replanned_s:.2f} s/iter")
        predicted = ("" if self.replanned_predicted_s is None
                     else f", {self.replanned_predicted_s:.2f} predicted")
        return (f"preempted at {self.preempted_at_s:.1f} s, {lost}; re-planned on {kept} "
                f"and restarted ({self.restart_s:.0f} s): {pace}{predicted}")


@dataclass(frozen=True)
class SharedPoolUse:
    jobs: tuple[str, ...]
    pool: str
    slots: int  # tool calls the shared cores run at once (the most of any member's)
    calls: int
    mean_wait_s: float
    job_slots: dict[str, int] = field(default_factory=dict)  # per member: cores // cpu_per_call


@dataclass
class FleetSimResult:
    fleet: str
    seed: int
    iterations: int
    jobs: list[JobSim]
    pools: dict[str, int]  # pool -> nodes
    spans: list[Span]
    preemptions: list[PreemptionEvent]
    usage: list[TeamUse]  # as allocated
    usage_after: list[TeamUse]  # after every preemption
    cpu_pools: list[SharedPoolUse]
    spine_gb: dict[str, float]  # spine link -> GB that crossed it
    end_s: float

    @property
    def goodput(self) -> float:
        wall = sum(j.finish_s if j.finish_s is not None else self.end_s for j in self.jobs)
        return sum(j.useful_s for j in self.jobs) / wall if wall else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"fleet": self.fleet, "seed": self.seed, "iterations": self.iterations,
                "goodput": self.goodput, "end_s": self.end_s,
                "goodput_is": "sum over jobs of iterations x iteration time alone, over the sum "
                              "of the jobs' times to finish in the fleet",
                "jobs": [j.to_dict() for j in self.jobs],
                "preemptions": [{"at_s": p.at_s, "team": p.team, "pool": p.pool,
                                 "taken": p.taken, "free": p.free} for p in self.preemptions],
                "cpu_pools": [{"jobs": list(c.jobs), "pool": c.pool, "slots": c.slots,
                               "job_slots": c.job_slots, "calls": c.calls, "mean_wait_s": c.mean_wait_s}
                              for c in self.cpu_pools],
                "spine_gb": self.spine_gb,
                "teams_after_preemption": [u.to_dict() for u in self.usage_after]}

    def render(self) -> str:
        lines = [f"simulated {self.iterations} iterations of each job side by side (seed "
                 f"{self.seed}): fleet goodput {self.goodput:.1%}, last job done at "
                 f"{self.end_s:.1f} s", ""]
        w = max(3, *(len(j.name) for j in self.jobs))
        lines.append(f"{'job':<{w}}  {'alone s':>9} {'fleet s':>9} {'slowdown':>8} "
                     f"{'lost s':>8} {'goodput':>7}  note")
        for j in self.jobs:
            fleet_s = "-" if j.fleet_s is None else f"{j.fleet_s:.2f}"
            slow = "-" if j.slowdown is None else f"{j.slowdown:.2f}x"
            lines.append(f"{j.name:<{w}}  {j.alone_s:>9.2f} {fleet_s:>9} {slow:>8} "
                         f"{j.lost_s:>8.1f} {j.goodput:>7.1%}  {j.note()}")
        for p in self.preemptions:
            took = ", ".join(f"{n} from {job}" for job, n in p.taken.items())
            free = f"{p.free} free" if p.free else ""
            lines.append(f"at {p.at_s:.1f} s team {p.team} took back {sum(p.taken.values()) + p.free}"
                         f" {p.pool} node(s): {', '.join(x for x in (free, took) if x)}")
        for c in self.cpu_pools:
            lines.append(f"shared CPU pool ({', '.join(c.jobs)}) on {c.pool}: {c.slots} calls at "
                         f"once, {c.calls} calls, mean wait {c.mean_wait_s * 1e3:.1f} ms")
        for link, gb in self.spine_gb.items():
            lines.append(f"{link}: {gb:.1f} GB of weight syncs")
        return "\n".join(lines)
