"""A bound on the fleet's throughput with no CP-SAT round: the Lagrangian relaxation of the pools'
capacities and the teams' quotas over every job's proven lower bounds.

On a large fleet the first job plans can use up the search's time before one round of the
allocation model is solved, and the bound was then every job at its fastest at once, whatever the
pools hold. This one prices the nodes instead. For every allocation x the optimum respects
  capacity   sum_j a_p(x_j) <= N_p,   quota   sum_{j of t} a_p(x_j) <= c_tp,
  cohort     sum_{j of cohort k} a_p(x_j) <= sum_{t in k} n_tp,
so for any prices lam_p, mu_tp, nu_kp >= 0 (all nodes held, `AllocProblem.held`)
  sum_j v_j(x_j) <= sum_j max_a [v_j(a) - a . (lam + mu_t(j) + nu_k(j))] + lam . N + mu . c + nu . n
where v_j(a) = w_j 3600 / L_j(a) is the throughput at the job's proven lower bound on its time
there (`AllocProblem.lower`: a planned vector's bound, the floor and every planned vector above
it), and the maximum is over the vectors of its grid that may still place it within its limits.
The fairness rule is dropped (dropping constraints keeps a bound). The prices are improved by a
projected subgradient method from zero; every iterate is a bound and the least is kept, so the
method's convergence decides only how tight it is. Throughput without shared pools or sharing
choices only (None otherwise): a shared pool is charged once and a choice may leave a job off.
"""
from __future__ import annotations

import math

import numpy as np

from placer.fleet.allocproblem import AllocProblem, misses

ITERATIONS = 200


def lagrange_bound(pr: AllocProblem, target: float | None = None,
                   iterations: int = ITERATIONS) -> float | None:
    """The least of the relaxation's bounds over the prices tried (module docstring); None where
    it does not apply or some job has no vector left. `target`: a value some allocation reaches
    (the incumbent's), which sizes the steps (Polyak's rule); else they shrink as 1 / sqrt(i)."""
    if pr.objective != "throughput" or pr.shared or pr.choices:
        return None
    rows = _rows(pr)
    if rows is None:
        return None
    teams = sorted(pr.teams)
    cohorts = sorted({tq.cohort for tq in pr.teams.values() if tq.cohort is not None})
    pools = len(pr.pools)
    cap = np.array([pr.teams[t].cap for t in teams], dtype=float)
    nominal = np.array([[sum(pr.teams[t].nominal[p] for t in teams if pr.teams[t].cohort == k)
                         for p in range(pools)] for k in cohorts], dtype=float).reshape(-1, pools)
    nodes = np.array(pr.nodes, dtype=float)
    team_of = [teams.index(job.team) for job in pr.jobs]
    cohort_of = [cohorts.index(c) if (c := pr.teams[job.team].cohort) is not None else -1
                 for job in pr.jobs]
    lam, mu, nu = np.zeros(pools), np.zeros((len(teams), pools)), np.zeros((len(cohorts), pools))
    best = math.inf
    scale = max(float(np.max(v)) for _, v in rows) / max(float(nodes.max()), 1.0)
    for it in range(iterations):
        used = np.zeros(pools)
        by_team, by_cohort = np.zeros_like(mu), np.zeros_like(nu)
        total = float(lam @ nodes + (mu * cap).sum() + (nu * nominal).sum())
        for j, (held, vals) in enumerate(rows):
            price = lam + mu[team_of[j]] + (nu[cohort_of[j]] if cohort_of[j] >= 0 else 0.0)
            reduced = vals - held @ price
            k = int(np.argmax(reduced))
            total += float(reduced[k])
            used += held[k]
            by_team[team_of[j]] += held[k]
            if cohort_of[j] >= 0:
                by_cohort[cohort_of[j]] += held[k]
        best = min(best, total)
        g = (used - nodes, by_team - cap, by_cohort - nominal)
        norm = sum(float((x * x).sum()) for x in g)
        if norm == 0.0:
            break  # every constraint tight at these prices: the bound is the relaxation's least
        step = ((total - target) / norm if target is not None and total > target
                else scale / (1 + it) ** 0.5 / max(float(nodes.max()), 1.0))
        lam = np.maximum(lam + step * g[0], 0.0)
        mu = np.maximum(mu + step * g[1], 0.0)
        nu = np.maximum(nu + step * g[2], 0.0)
    return best


def _rows(pr: AllocProblem) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Per job, its vectors that may still place it within its limits (nodes held per pool) and
    its throughput at each one's lower bound; None where some job has none (or one is
    unbounded: a lower bound of 0)."""
    out = []
    seen: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
    for j, job in enumerate(pr.jobs):
        key = (id(pr.known[j]), job.grid, job.max_iteration_s, job.weight)  # one kind's memo
        if job.kind is not None and key in seen:
            out.append(seen[key])
            continue
        held, vals = [], []
        for a in job.grid:
            lo = pr.lower(j, a)
            if lo is None or misses(job, lo):
                continue
            if lo <= 0.0:
                return None
            held.append(pr.held(j, a))
            vals.append(pr.value(j, lo))
        if not vals:
            return None
        out.append((np.array(held, dtype=float), np.array(vals, dtype=float)))
        seen[key] = out[-1]
    return out
