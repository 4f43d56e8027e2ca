"""A bound on the fleet's objective with no CP-SAT round: the Lagrangian relaxation of the pools'
capacities and the teams' quotas over every job's proven lower bounds, for throughput and for
makespan, with shared pools and sharing choices relaxed.

On a large fleet the first job plans can use up the search's time before one round of the
allocation model is solved, and the bound was then every job at its fastest at once, whatever the
pools hold. This one prices the nodes instead. Rows: each job's vectors a that may still place it
within its limits, with L_j(a) its proven lower bound there (`AllocProblem.lower`: a planned
vector's bound, the floor and every planned vector above it) and h(a) the nodes it uses of each
constrained sum (`placer.fleet.relaxrows`). Every allocation respects
  capacity   sum_j h_p(x_j) <= N_p,   quota   sum_{j of t} h_p(x_j) <= c_tp (n_tp alone),
  cohort     sum_{j of cohort k} h_p(x_j) <= sum_{t in k} n_tp,
written H x <= b. The fairness rule is dropped (dropping constraints keeps a bound).

Throughput. For any prices y >= 0,
  sum_j v_j(x_j) <= sum_j max_a [v_j(a) - h(a) . y] + y . b,   v_j(a) = w_j 3600 / L_j(a).
The prices are improved by a projected subgradient method from zero; every iterate is a bound
and the least is kept, so the method's convergence decides only how tight it is. Given an
incumbent, Polyak's steps (sized by it) and the diminishing ones are both run and the least of
either kept: far above the incumbent (a large fleet's first allocation) Polyak's steps overshoot
and stall, where the diminishing ones keep descending (on the 64-job bench fleet 10,332 against
10,620 weighted iterations per hour).

Makespan. The optimum M* = max_j I_j T_j(x_j) is at least M_L = max_j I_j L_j(x_j) over its own
vectors, which are all among the rows with I_j L_j(a) <= M_L. A time M is infeasible if for some
y >= 0 no choice of rows with I_j L_j(a) <= M fits:
  sum_j min_{a: I_j L_j(a) <= M} h(a) . y > y . b   (any choice that fits gives <=).
Such a certificate for M holds for every M' < M (fewer rows, each minimum no smaller), so the
bound is the least candidate time (a row's I_j L_j(a)) above the largest one certified
infeasible, found by bisection over the candidates; each test tries the unit prices (one
constraint at a time), then a subgradient ascent of the certificate on the simplex, started
from the last certificate found. A test that finds none only leaves the bound lower.

Sharing. A shared pool's members hold one count of it, charged once (`placer.fleet.sharing`);
dropping that equality keeps a bound, and spreading the count evenly over the members a
constraint counts (`relaxrows`) changes no allocation that keeps it. A sharing choice's job is
one unit with both flavours' rows (its own vectors and its shared flavour's, exactly one of
which is on in any allocation); dropping that a choice's jobs share together keeps a bound, so
sharing helps the bound by at most what each job's shared flavour saves at its optimistic time.
"""
from __future__ import annotations

import math

import numpy as np

from placer.fleet.allocproblem import AllocProblem
from placer.fleet.relaxrows import Rows, rows_of

ITERATIONS = 200
TOL = 1e-9  # relative to the largest limit: a certificate must beat y . b by more than rounding


def lagrange_bound(pr: AllocProblem, target: float | None = None,
                   iterations: int = ITERATIONS) -> float | None:
    """The relaxation's bound on the fleet's objective (module docstring): an upper bound on
    throughput, a lower bound on makespan; None where some job has no vector left (or, for
    throughput, one is unbounded: a lower bound of 0 on its time). `target`: a throughput some
    allocation reaches (the incumbent's), which sizes the steps (Polyak's rule) of a second
    descent beside the one whose steps shrink as 1 / sqrt(i). A makespan test takes a fifth of
    `iterations` steps."""
    rows = rows_of(pr)
    if rows is None:
        return None
    if pr.objective == "throughput":
        return min(_throughput(rows, t, iterations) for t in {None, target})
    return _makespan(rows, max(iterations // 5, 1))


def _throughput(rows: Rows, target: float | None, iterations: int) -> float:
    """The least of sum_u max_r (v_r - h_r . y) + y . b over the prices tried."""
    y = np.zeros(rows.b.size)
    best = math.inf
    top = max(float(rows.b.max()), 1.0)
    scale = float(rows.value.max()) / top
    for it in range(iterations):
        reduced = rows.value - rows.price(y)
        k = rows.argbest(reduced, np.maximum)
        total = float(y @ rows.b + reduced[k].sum())
        best = min(best, total)
        g = rows.used(k) - rows.b
        norm = float(g @ g)
        if norm == 0.0:
            break  # every constraint tight at these prices: the bound is the relaxation's least
        step = ((total - target) / norm if target is not None and total > target
                else scale / (1 + it) ** 0.5 / top)
        y = np.maximum(y + step * g, 0.0)
    return best


def _makespan(rows: Rows, iterations: int) -> float:
    """The least candidate time above the largest one certified infeasible (module
    docstring)."""
    least = float(rows.unit_min(rows.value).max())  # every unit needs a row
    cand = np.unique(rows.value[rows.value >= least])
    lo, hi = -1, cand.size - 1  # cand[lo] certified infeasible (-1: none yet)
    y = np.full(rows.b.size, 1.0 / rows.b.size)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = _certificate(rows, float(cand[mid]), y, iterations)
        if found is None:
            hi = mid
        else:
            lo, y = mid, found
    return float(cand[hi])  # the top is not tested: were it infeasible, any bound would hold


def _certificate(rows: Rows, t: float, start: np.ndarray, iterations: int
                 ) -> np.ndarray | None:
    """Prices y >= 0 under which the rows of time <= t cannot fit (module docstring), or None
    where none was found: the unit prices first, then a subgradient ascent from `start`."""
    allowed = rows.value <= t
    least = rows.unit_min(np.where(allowed[:, None], rows.h, math.inf))  # per unit and column
    slack = least.sum(axis=0) - rows.b
    tol = TOL * max(float(rows.b.max()), 1.0)
    if np.isinf(slack).any() or (slack > tol).any():
        y = np.zeros(rows.b.size)
        y[int(np.argmax(slack))] = 1.0
        return y
    y = start.copy()
    barred = np.where(allowed, 0.0, math.inf)
    for it in range(iterations):
        k = rows.argbest(rows.price(y) + barred, np.minimum)
        g = rows.used(k) - rows.b  # the certificate's excess at y is g . y
        if float(g @ y) > tol * float(y.sum()):
            return y
        norm = math.sqrt(float(g @ g))
        if norm == 0.0:
            return None
        y = np.maximum(y + g / norm / (1 + it) ** 0.5, 0.0)
        total = float(y.sum())
        if total == 0.0:
            return None
        y /= total
    return None
