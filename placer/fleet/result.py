"""A fleet's plan: each job's nodes, its own plan on them, each team's usage against its quota.

`FleetResult.to_dict()` is `placer fleet --json`'s document (with each job's plan, `Plan`'s
JSON, under `jobs[].plan`: the file `placer simulate` and `placer export` read); `render()` is its
table; `explain()` lists, per team and pool, nominal, cap, use and what is borrowed or lent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from placer.fleet.sharing import ShareGroup, charged, groups_of
from placer.fleet.spec import Fleet, FleetJobSpec
from placer.solve.planfile import Plan


@dataclass(frozen=True)
class JobResult:
    name: str
    team: str
    weight: float
    nodes: dict[str, int]  # pool -> nodes allocated (0 left out)
    iteration_s: float
    iterations: int | None
    plan: Plan
    shared_pool: str | None = None  # the CPU pool its environment shares (`placer.fleet.sharing`)
    alone_iteration_s: float | None = None  # on the same nodes with the pool to itself
    rollout_pool: str | None = None  # the pool of the rollout engines it shares (`rolloutpool`)

    @classmethod
    def of(cls, fj: FleetJobSpec, nodes: dict[str, int], plan: Plan) -> JobResult:
        return cls(fj.name, fj.team, fj.weight, {p: n for p, n in nodes.items() if n},
                   plan.predicted_iteration_s, fj.iterations, plan)

    @property
    def iterations_per_hour(self) -> float:
        return 3600 / self.iteration_s

    def finish_h(self) -> float | None:
        return None if self.iterations is None else self.iterations * self.iteration_s / 3600

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "team": self.team, "weight": self.weight, "nodes": self.nodes,
                "iteration_s": self.iteration_s, "iterations_per_hour": self.iterations_per_hour,
                "iterations": self.iterations, "finish_h": self.finish_h(),
                "plan_gap": self.plan.solver.gap, "shared_pool": self.shared_pool,
                "alone_iteration_s": self.alone_iteration_s, "rollout_pool": self.rollout_pool,
                "plan": self.plan.model_dump(mode="json")}


@dataclass(frozen=True)
class TeamUse:
    team: str
    cohort: str | None
    pool: str
    nominal: int
    cap: int
    used: int

    @property
    def borrowed(self) -> int:
        return max(self.used - self.nominal, 0)

    @property
    def unused(self) -> int:
        return max(self.nominal - self.used, 0)

    def to_dict(self) -> dict[str, Any]:
        return {"team": self.team, "cohort": self.cohort, "pool": self.pool,
                "nominal": self.nominal, "cap": self.cap, "used": self.used,
                "borrowed": self.borrowed}


@dataclass(frozen=True)
class SharedUse:
    """A CPU pool shared by jobs: its nodes, and each member's iteration time shared and alone."""

    pool: str
    nodes: int
    jobs: list[str]
    iteration_s: list[float]  # each member's, priced on the shared pool
    alone_iteration_s: list[float | None]  # each member's on the same nodes, the pool its own

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "nodes": self.nodes, "jobs": self.jobs,
                "iteration_s": self.iteration_s, "alone_iteration_s": self.alone_iteration_s}

    def render(self) -> str:
        costs = ", ".join(f"{n} {t:.2f} s/iter (alone {'-' if a is None else f'{a:.2f}'})"
                          for n, t, a in zip(self.jobs, self.iteration_s,
                                             self.alone_iteration_s))
        return f"shared {self.pool} x{self.nodes}: {costs}"


@dataclass(frozen=True)
class EngineShare:
    """One member of a shared rollout pool: its generation on the engines, its queueing behind
    the others' generation and swaps, and its iteration shared and with the engines its own."""

    job: str
    generation_s: float
    queue_s: float
    iteration_s: float
    alone_iteration_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "generation_s": self.generation_s, "queue_s": self.queue_s,
                "iteration_s": self.iteration_s, "alone_iteration_s": self.alone_iteration_s}


@dataclass(frozen=True)
class SharedRolloutUse:
    """Inference engines time-shared by jobs rolling out one model (`placer.fleet.rolloutpool`)."""

    pool: str
    nodes: int
    team: str  # whose quota the engines' nodes count against
    swap_s: float  # one weight swap into the engines
    members: list[EngineShare]

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "nodes": self.nodes, "team": self.team, "swap_s": self.swap_s,
                "jobs": [m.to_dict() for m in self.members]}

    def render(self) -> str:
        rows = ", ".join(f"{m.job} {m.iteration_s:.2f} s/iter (generates {m.generation_s:.2f} s, "
                         f"queues {m.queue_s:.2f} s; engines alone {m.alone_iteration_s:.2f})"
                         for m in self.members)
        return (f"shared rollout engines {self.pool} x{self.nodes} (team {self.team}'s quota; "
                f"each swap {self.swap_s:.2f} s): {rows}")


@dataclass(frozen=True)
class SharingChoice:
    """A shared pool the allocation chose to use or not, with the other option priced."""

    pool: str
    jobs: list[str]
    shared: bool  # what the allocation chose
    value: float  # the fleet's objective as chosen
    alternative: float | None  # the best objective with the other option (None: none fits)
    kind: str = "rollout engines"  # or "CPU nodes"

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "jobs": self.jobs, "shared": self.shared,
                "value": self.value, "alternative": self.alternative, "kind": self.kind}

    def render(self, objective: str) -> str:
        chose, other = ("share", "not sharing") if self.shared else ("do not share", "sharing")
        alt = "does not fit" if self.alternative is None else f"{self.alternative:.4g}"
        return (f"choice: {', '.join(self.jobs)} {chose} {self.kind} on {self.pool} "
                f"({objective} {self.value:.4g}; {other}: {alt})")


def team_usage(fleet: Fleet, vectors: list[tuple[int, ...]],
               groups: tuple[ShareGroup, ...] | None = None) -> list[TeamUse]:
    """Every (team, pool) the team has a quota on, with the nodes its jobs hold there (a shared
    pool's nodes counted once, at its first member)."""
    pools = [p.name for p in fleet.cluster.pools]
    names = [fj.name for fj in fleet.jobs]
    if groups is None:  # every declared group shares
        groups = groups_of(fleet.shared, pools, names, {fj.name: fj.team for fj in fleet.jobs})
    vectors = [charged(groups, j, v) for j, v in enumerate(vectors)]
    out = []
    for team, t in fleet.teams.items():
        for i, pool in enumerate(pools):
            if pool not in t.quota:
                continue
            used = sum(v[i] for fj, v in zip(fleet.jobs, vectors) if fj.team == team)
            out.append(TeamUse(team, t.cohort, pool, t.quota[pool].nominal,
                               fleet.team_cap(team, pool), used))
    return out


@dataclass(frozen=True)
class FleetResult:
    name: str
    objective: str  # "throughput" (iterations per hour, weighted) | "makespan" (seconds)
    jobs: list[JobResult]
    usage: list[TeamUse]
    value: float
    bound: float
    gap: float  # relative to the allocation grids; job plans at their bounds (placer.fleet.alloc)
    optimal: bool
    not_monotone: int  # job plans where fewer nodes were faster: the bound did not hold there
    plan_gap: float  # the largest gap of the jobs' own plans
    rounds: int
    plans_priced: int
    grid_size: int
    solve_s: float
    shared: list[SharedUse] = field(default_factory=list)
    engines: list[SharedRolloutUse] = field(default_factory=list)
    choices: list[SharingChoice] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"fleet": self.name, "objective": self.objective, "value": self.value,
                "bound": self.bound, "gap": self.gap, "optimal": self.optimal,
                "not_monotone": self.not_monotone,
                "gap_relative_to": "the allocation grids (0, powers of two and the cap per pool), "
                                   "each job plan counted at its own proven bound",
                "plan_gap": self.plan_gap, "rounds": self.rounds,
                "plans_priced": self.plans_priced, "grid_size": self.grid_size,
                "solve_s": self.solve_s, "jobs": [j.to_dict() for j in self.jobs],
                "teams": [u.to_dict() for u in self.usage],
                "shared": [s.to_dict() for s in self.shared],
                "shared_rollout": [e.to_dict() for e in self.engines],
                "sharing_choices": [c.to_dict() for c in self.choices]}

    def render(self) -> str:
        head = (f"throughput {self.value:.4g} weighted iterations/h"
                if self.objective == "throughput" else f"makespan {self.value:.4g} s")
        status = "optimal" if self.optimal else f"gap {self.gap:.1%}"
        if self.not_monotone:
            status += (f"; {self.not_monotone} pairs of job plans ran faster on fewer nodes, so "
                       "the bound, and the gap, may not hold")
        lines = [f"fleet {self.name}: {head} ({status} over the allocation grids; bound "
                 f"{self.bound:.4g}; job plans' largest gap {self.plan_gap:.1%}); "
                 f"{self.plans_priced} of {self.grid_size} allocations planned in {self.rounds} "
                 f"rounds, {self.solve_s:.1f} s", ""]
        w = max(3, *(len(j.name) for j in self.jobs))
        lines.append(f"{'job':<{w}}  {'team':<12} {'weight':>6} {'s/iter':>9} {'iter/h':>8} "
                     f"{'done h':>7}  nodes")
        for j in self.jobs:
            nodes = ", ".join(f"{p} {n}{' shared' * (p in (j.shared_pool, j.rollout_pool))}"
                              for p, n in j.nodes.items())
            done = j.finish_h()
            lines.append(f"{j.name:<{w}}  {j.team:<12} {j.weight:>6g} {j.iteration_s:>9.2f} "
                         f"{j.iterations_per_hour:>8.1f} {'-' if done is None else f'{done:.2f}':>7}"
                         f"  {nodes}")
        lines += [s.render() for s in self.shared]
        lines += [e.render() for e in self.engines]
        lines += [c.render(self.objective) for c in self.choices]
        return "\n".join(lines)

    def explain(self) -> str:
        lines = ["", f"{'team':<12} {'cohort':<10} {'pool':<8} {'nominal':>7} {'cap':>4} "
                     f"{'used':>4}  note"]
        for u in self.usage:
            note = (f"borrows {u.borrowed}" if u.borrowed
                    else f"{u.unused} unused, lendable" if u.unused and u.cohort else "")
            lines.append(f"{u.team:<12} {u.cohort or '-':<10} {u.pool:<8} {u.nominal:>7} "
                         f"{u.cap:>4} {u.used:>4}  {note}")
        lines.append("")
        for j in self.jobs:
            roles = ", ".join(f"{r} on {p.pool} x{p.devices}" for r, p in j.plan.roles.items())
            lines.append(f"{j.name}: {roles}")
        return "\n".join(lines)
