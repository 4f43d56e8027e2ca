"""The fleet allocation's problem: pools, team quotas, jobs with their grids, and the memo of
each job's iteration time T_j(a) at the allocation vectors the search has visited.

`AllocProblem` holds what the CP-SAT model (`placer.fleet.allocmodel`) and the lazy loop
(`placer.fleet.alloc`, whose docstring gives the notation) share: the jobs' time functions,
evaluated once per vector (one memo per kind of job), and the optimistic bounds on the vectors
not yet evaluated. More nodes never make a job's optimum slower, so T_j(a) >= T_j(b) for every
evaluated b >= a (`bound`).

A job plan that stops at its time limit is an incumbent, not an optimum: its own solver proves
only a lower bound L_j(a) <= T*_j(a) (`low_of`; the plan's `solver.gap`). The incumbent's time
T_j(a) is what the allocation is chosen on and reported with, and the lower bounds are what the
fleet's bound must use: the optimum on `a` is at least L_j(b) for every evaluated b >= a
(`lower`). With every job plan optimal L = T and the two agree.

Where no vector above `a` bounds it well (a vector far below the evaluated ones would otherwise
look as fast as the top), `floor_of` gives a proven bound on T*_j(a) without planning there,
from the job's cost table on its cap (`placer.fleet.floors`): `bound` and `lower` take the
larger of it and the evaluated vectors' bounds.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from placer.fleet.sharing import Choice, ShareGroup, charged

Vec = tuple[int, ...]


@dataclass(frozen=True)
class TeamQuota:
    """One team's quota per pool (in the pools' order), in nodes."""

    name: str
    cohort: str | None
    nominal: Vec
    cap: Vec


@dataclass(frozen=True)
class AllocJob:
    name: str
    team: str
    weight: float
    iterations: int
    grid: tuple[Vec, ...]
    max_iteration_s: float | None = None
    kind: int | None = None  # jobs of one kind are interchangeable (one time function)


@dataclass
class AllocProblem:
    """What the master model needs: pools, teams, jobs with grids, and the time function."""

    pools: tuple[str, ...]
    nodes: Vec
    teams: dict[str, TeamQuota]
    jobs: list[AllocJob]
    objective: str  # "throughput" | "makespan"
    time_of: Callable[[int, Vec], float | None]  # job index, vector -> seconds (None: no plan)
    # computes a batch of (job, vector) pairs ahead of `time_of` (in parallel, say)
    prefetch: Callable[[list[tuple[int, Vec]]], None] | None = None
    known: list[dict[Vec, float | None]] = field(default_factory=list)
    # job index, vector -> a proven lower bound on the job's optimum there (None: `time_of` is
    # exact); asked once per evaluated vector, after `time_of`
    low_of: Callable[[int, Vec], float] | None = None
    lows: list[dict[Vec, float]] = field(default_factory=list)  # per kind, as `known`
    # job index, vector -> a proven lower bound on the job's time there without planning it
    # (`placer.fleet.floors`; None or 0: none known)
    floor_of: Callable[[int, Vec], float | None] | None = None
    # wall seconds one more job plan is expected to take (None: no estimate yet): the search
    # leaves out a batch of plans it does not expect to finish within its time
    pace: Callable[[], float | None] | None = None
    not_monotone: int = 0  # evaluated pairs where fewer nodes were faster (the bound failed)
    shared: tuple[ShareGroup, ...] = ()  # pools several jobs share (one count, charged once)
    choices: tuple[Choice, ...] = ()  # shared pools the allocation may use or not
    forced: dict[int, bool] = field(default_factory=dict)  # choice -> fixed share or not

    def __post_init__(self) -> None:
        if not self.known:  # one memo per kind: an identical job's times are the same
            shared: dict[int, dict[Vec, float | None]] = {}
            self.known = [{} if job.kind is None else shared.setdefault(job.kind, {})
                          for job in self.jobs]
        if not self.lows:
            low: dict[int, dict[Vec, float]] = {}
            self.lows = [{} if job.kind is None else low.setdefault(job.kind, {})
                         for job in self.jobs]
        for j in self.optional():
            self.known[j][self.zero] = math.inf  # off: no time, no term in the objective

    @property
    def zero(self) -> Vec:
        return (0,) * len(self.pools)

    def optional(self) -> set[int]:
        """The jobs that may be off: both flavours of every choice's jobs."""
        return {j for c in self.choices for j in (*c.alone, *self.shared[c.group].members)}

    def options(self, j: int) -> tuple[Vec, ...]:
        """Job j's vectors: its grid, and the zero vector (off) for a choice's job."""
        grid = self.jobs[j].grid
        return grid + (self.zero,) if j in self.optional() else grid

    def evaluate(self, j: int, a: Vec) -> float | None:
        """T_j(a), memoised; counts each pair of evaluated vectors that breaks the monotone
        bound (fewer nodes faster, or placed where more nodes were not)."""
        if a not in self.known[j]:
            t = self.time_of(j, a)
            for b, tb in self.known[j].items():
                if tb is not None and math.isinf(tb):
                    continue  # off (a choice's zero vector): no plan to compare with
                if (_within(a, b) and _faster(t, tb)) or (_within(b, a) and _faster(tb, t)):
                    self.not_monotone += 1
            self.known[j][a] = t
            if t is not None and self.low_of is not None:
                self.lows[j][a] = min(self.low_of(j, a), t)
        return self.known[j][a]

    def fetch(self, pairs: list[tuple[int, Vec]]) -> None:
        """Evaluate these pairs (the new ones computed together first, by `prefetch`)."""
        new = [(j, a) for j, a in pairs if a not in self.known[j]]
        if self.prefetch is not None and len(new) > 1:
            self.prefetch(new)
        for j, a in new:
            self.evaluate(j, a)

    def fits_in(self, pairs: list[tuple[int, Vec]], left_s: float) -> bool:
        """Whether planning these pairs' new (kind, vector)s is expected within `left_s`
        seconds (`pace`; without an estimate, only while time is left)."""
        new = {(self.jobs[j].kind if self.jobs[j].kind is not None else ("job", j), a)
               for j, a in pairs if a not in self.known[j]}
        pace = self.pace() if self.pace is not None else None
        return left_s > 0 and (pace is None or pace * len(new) <= left_s)

    def evaluated(self) -> int:
        """Time functions evaluated: each kind's once (a choice's zero vector is none)."""
        return sum(1 for k in {id(k): k for k in self.known}.values() for t in k.values()
                   if t is None or not math.isinf(t))

    def bound(self, j: int, a: Vec) -> tuple[float | None, bool]:
        """(the optimistic time of `a`, whether it is exact); None: `a` cannot be placed."""
        if a in self.known[j]:
            return self.known[j][a], True
        best = self.floor(j, a)
        for b, t in self.known[j].items():
            if all(x <= y for x, y in zip(a, b)):
                if t is None:
                    return None, True
                best = max(best, t)
        return best, False

    def floor(self, j: int, a: Vec) -> float:
        """`floor_of` (0 where it knows none)."""
        return (self.floor_of(j, a) or 0.0) if self.floor_of is not None else 0.0

    def exact_low(self, j: int, a: Vec) -> float | None:
        """L_j(a) of an evaluated vector: its plan's proven lower bound, or its time."""
        t = self.known[j][a]
        return t if t is None else self.lows[j].get(a, t)

    def lower(self, j: int, a: Vec) -> float | None:
        """A lower bound on job j's optimum on `a` (module docstring); None: `a` cannot be
        placed. Below `bound` only where some job plan stopped before proving its optimum."""
        if a in self.known[j]:
            return self.exact_low(j, a)
        best = self.floor(j, a)
        for b, t in self.known[j].items():
            if all(x <= y for x, y in zip(a, b)):
                if t is None:
                    return None
                best = max(best, self.lows[j].get(b, t))
        return best

    def value(self, j: int, t: float) -> float:
        """Job j's term of the objective at iteration time t (infinite: off, no term)."""
        if math.isinf(t):
            return 0.0
        job = self.jobs[j]
        if t <= 0.0:  # a job plan's lower bound of 0: no bound on its throughput
            return math.inf if self.objective == "throughput" else 0.0
        return job.weight * 3600 / t if self.objective == "throughput" else job.iterations * t

    def demand(self, team: str, p: int) -> int:
        """The most nodes of pool p the team's jobs could use (a choice's job: the larger of
        its two flavours, counted once)."""
        flavour = {e: c.alone[i] for c in self.choices
                   for i, e in enumerate(self.shared[c.group].members)}
        most: dict[int, int] = {}
        for j, job in enumerate(self.jobs):
            if job.team == team:
                k = flavour.get(j, j)
                most[k] = max(most.get(k, 0), *(charged(self.shared, j, a)[p] for a in job.grid))
        return sum(most.values())

    def held(self, j: int, a: Vec) -> Vec:
        """The nodes job j's vector `a` is charged (a shared pool at its first member only)."""
        return charged(self.shared, j, a)


@dataclass
class Allocation:
    """The result: a vector per job, its time, the objective, the bound and the gap."""

    vectors: list[Vec]
    times: list[float]
    objective: float
    bound: float
    gap: float
    optimal: bool  # every chosen time evaluated, CP-SAT proved its model, the bound held
    not_monotone: int  # evaluated pairs that broke the monotone bound
    rounds: int
    evaluated: int
    solve_s: float


class NoAllocation(Exception):
    """The master model has no solution (over the optimistic bounds: truly none on the grids)."""


class Unsolved(NoAllocation):
    """One round's model found no solution in its time limit (not proof that none exists)."""


class OutOfTime(NoAllocation):
    """The time limit passed before any allocation whose times were all evaluated was found."""



def misses(job: AllocJob, t: float) -> bool:
    """Whether time t misses the job's deadline or minimum throughput (off never does)."""
    return job.max_iteration_s is not None and not math.isinf(t) and t > job.max_iteration_s


def _within(a: Vec, b: Vec) -> bool:
    """Whether `a` takes no more nodes of any pool than `b`."""
    return all(x <= y for x, y in zip(a, b))


def _faster(fewer: float | None, more: float | None) -> bool:
    """Whether the time on fewer nodes beats the time on more (beyond rounding)."""
    if fewer is None:
        return False
    return more is None or fewer < more * (1 - 1e-9)

