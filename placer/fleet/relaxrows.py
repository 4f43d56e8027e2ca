"""The rows of the fleet's Lagrangian relaxation (`placer.fleet.relax`): per unit of choice, the
vectors it may take, the nodes each uses of every constrained sum, and its objective term at its
proven lower bound.

A unit is a job, or a sharing choice's job with its shared flavour (`placer.fleet.sharing.Choice`:
exactly one of the two is on in any allocation, so the unit picks one row among both flavours'
vectors). The constrained sums (columns) are, per pool p: the pool's capacity N_p; each team's
quota (its cap c_tp in a cohort, its nominal n_tp alone, as `placer.fleet.allocmodel` writes
them); each cohort's nominal sum.

A shared pool's count is charged to its group's first member only (`sharing.charged`), and every
member holds the same count n. A column that counts the first member is charged n in any
allocation; spread over the members it counts, n / m each, it is charged the same n wherever
the members agree, and the relaxation, which drops that they agree, is tighter than with the
whole count on the first member (which the others could then undercut for free). A column that
does not count the first member is charged nothing for the pool, as in the model. A job in two
groups keeps the model's own charging (`AllocProblem.held`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placer.fleet.allocproblem import AllocProblem, Vec, misses


@dataclass(frozen=True)
class Rows:
    """Rows grouped by unit (unit u's rows from `starts[u]`, `unit` each row's): `b` the
    constrained sums' limits, `value` each row's objective term (throughput: w 3600 / L;
    makespan: I L), and the nodes each row uses of each sum, `h` = a_r W_job(r): `vec` its
    vector (pools), `job` its job, `weight` per job how a node of each pool counts in each sum
    (pools x sums). The products go through the factors (a row has few pools), `h` is kept for
    the per-column minima."""

    vec: np.ndarray
    job: np.ndarray
    weight: np.ndarray
    b: np.ndarray
    value: np.ndarray
    starts: np.ndarray
    unit: np.ndarray
    h: np.ndarray
    seg_job: np.ndarray  # the rows as runs of one job: each run's job and length
    seg_len: np.ndarray

    def price(self, y: np.ndarray) -> np.ndarray:
        """Per row, h_r . y."""
        return np.einsum("rp,rp->r", self.vec,
                         np.repeat((self.weight @ y)[self.seg_job], self.seg_len, axis=0))

    def used(self, k: np.ndarray) -> np.ndarray:
        """Per sum, what rows `k` use together."""
        return np.einsum("rp,rpc->c", self.vec[k], self.weight[self.job[k]])

    def unit_min(self, x: np.ndarray) -> np.ndarray:
        """Per unit, the least of x over its rows (x: per row, or rows x columns)."""
        return np.minimum.reduceat(x, self.starts, axis=0)

    def argbest(self, x: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
        """Per unit, the index of a row where x (per row) is best by `ufunc` (np.maximum or
        np.minimum)."""
        best = ufunc.reduceat(x, self.starts)
        hit = np.flatnonzero(x == best[self.unit])
        units = self.unit[hit]  # ascending: rows are grouped by unit
        first = np.ones(hit.size, dtype=bool)
        first[1:] = units[1:] != units[:-1]
        return hit[first]


def rows_of(pr: AllocProblem) -> Rows | None:
    """The relaxation's rows (module docstring); None where some unit has no vector that may
    place it within its limits, or a throughput row is unbounded (a lower bound of 0)."""
    teams = sorted(pr.teams)
    cohorts = sorted({tq.cohort for tq in pr.teams.values() if tq.cohort is not None})
    pools = len(pr.pools)
    cols = _Columns(teams, cohorts, pools)
    weights = _weights(pr, cols)
    lows = _lows(pr)
    vec: list[Vec] = []
    value: list[float] = []
    job_of: list[int] = []
    unit: list[int] = []
    starts: list[int] = []
    for u, members in enumerate(_units(pr)):
        starts.append(len(value))
        for j in members:
            if pr.objective == "throughput" and any(lo <= 0.0 for _, lo in lows[j]):
                return None
            vec += [a if weights[j] is not None else pr.held(j, a) for a, _ in lows[j]]
            value += [pr.value(j, lo) for _, lo in lows[j]]
            job_of += [j] * len(lows[j])
            unit += [u] * len(lows[j])
        if len(value) == starts[-1]:
            return None
    b = np.concatenate([np.array(pr.nodes, dtype=float),
                        np.array([pr.teams[t].cap if pr.teams[t].cohort is not None
                                  else pr.teams[t].nominal for t in teams], dtype=float).ravel(),
                        np.array([[sum(pr.teams[t].nominal[p] for t in teams
                                       if pr.teams[t].cohort == k) for p in range(pools)]
                                  for k in cohorts], dtype=float).ravel()])
    weight = np.stack([cols.spread(pr, j) if w is None else w for j, w in enumerate(weights)])
    a, jobs = np.array(vec, dtype=float), np.array(job_of)
    runs = np.flatnonzero(np.diff(jobs)) + 1
    return Rows(a, jobs, weight, b, np.array(value, dtype=float), np.array(starts),
                np.array(unit), np.einsum("rp,rpc->rc", a, weight[jobs]),
                jobs[np.r_[0, runs]], np.diff(np.r_[0, runs, jobs.size]))


@dataclass(frozen=True)
class _Columns:
    """The constrained sums' layout: capacity per pool, then quota per team and pool, then
    nominal sum per cohort and pool."""

    teams: list[str]
    cohorts: list[str]
    pools: int

    @property
    def size(self) -> int:
        return self.pools * (1 + len(self.teams) + len(self.cohorts))

    def spread(self, pr: AllocProblem, j: int, share: np.ndarray | None = None,
               team_share: np.ndarray | None = None, cohort_share: np.ndarray | None = None
               ) -> np.ndarray:
        """Pools x columns: how a node of each pool of job j's vector counts in each column
        (1 where the column counts the job; the given shares per pool in their place)."""
        out = np.zeros((self.pools, self.size))
        eye = np.eye(self.pools)
        t = self.teams.index(pr.jobs[j].team)
        k = pr.teams[pr.jobs[j].team].cohort
        out[:, :self.pools] = eye * (1.0 if share is None else share)
        at = self.pools * (1 + t)
        out[:, at:at + self.pools] = eye * (1.0 if team_share is None else team_share)
        if k is not None:
            at = self.pools * (1 + len(self.teams) + self.cohorts.index(k))
            out[:, at:at + self.pools] = eye * (1.0 if cohort_share is None else cohort_share)
        return out


def _weights(pr: AllocProblem, cols: _Columns) -> list[np.ndarray | None]:
    """Per job, pools x columns with its shared pools' counts spread (module docstring); None:
    no shared pool, or two (the model's own charging, `held`, then)."""
    groups: dict[int, list[int]] = {}
    for g_i, g in enumerate(pr.shared):
        for j in g.members:
            groups.setdefault(j, []).append(g_i)
    out: list[np.ndarray | None] = [None] * len(pr.jobs)
    for j, gs in groups.items():
        if len(gs) != 1:
            continue
        g = pr.shared[gs[0]]
        first = pr.jobs[g.members[0]]
        team_of = [pr.jobs[m].team for m in g.members]
        cohort_of = [pr.teams[t].cohort for t in team_of]
        job = pr.jobs[j]
        cohort = pr.teams[job.team].cohort
        share, team_share, cohort_share = (np.ones(cols.pools) for _ in range(3))
        share[g.pool] = 1.0 / len(g.members)
        team_share[g.pool] = (1.0 / team_of.count(first.team) if job.team == first.team
                              else 0.0)
        first_cohort = pr.teams[first.team].cohort
        cohort_share[g.pool] = (1.0 / cohort_of.count(cohort)
                                if cohort is not None and cohort == first_cohort else 0.0)
        out[j] = cols.spread(pr, j, share, team_share, cohort_share)
    return out


def _units(pr: AllocProblem) -> list[tuple[int, ...]]:
    """Each job alone, a choice's job with its shared flavour (in the jobs' order)."""
    pair = {j: e for c in pr.choices for j, e in zip(c.alone, pr.shared[c.group].members)}
    flavours = set(pair.values())
    return [(j, pair[j]) if j in pair else (j,) for j in range(len(pr.jobs))
            if j not in flavours]


def _lows(pr: AllocProblem) -> list[list[tuple[Vec, float]]]:
    """Per job, its nonzero vectors that may place it within its limits, each with its proven
    lower bound (one kind's computed once)."""
    out: list[list[tuple[Vec, float]]] = []
    seen: dict[tuple[object, ...], list[tuple[Vec, float]]] = {}
    for j, job in enumerate(pr.jobs):
        key = (id(pr.known[j]), job.grid, job.max_iteration_s)  # one kind's memo
        if job.kind is not None and key in seen:
            out.append(seen[key])
            continue
        got = [(a, lo) for a in job.grid if any(a)
               and (lo := pr.lower(j, a)) is not None and not misses(job, lo)]
        out.append(got)
        seen[key] = got
    return out
