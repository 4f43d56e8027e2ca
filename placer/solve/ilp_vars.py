"""The placement ILP's decision variables and their accessors (`placer.solve.ilp`).

x_rk (role r runs candidate k, one each), z_rj (role r sits in slot j <= r, the slot named by
its lowest role: one representation per partition) with the pool and colocation rules that tie
them, and D_jp (devices slot j holds on pool p) under the pools' capacities, with the price rate
they make. The notation, objective and linearisation are the `placer.solve.ilp` docstring's;
`placer.solve.ilp_memory` and `ilp._Model` add the slots' memory and the time terms on top.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

from ortools.sat.python import cp_model

from placer.solve.candidates import Candidate
from placer.solve.pricing import device_price
from placer.solve.problem import Problem

# A CP-SAT linear expression, or a plain int (an empty sum): the solver takes either.
LinExpr = cp_model.LinearExpr | int


def _devices_on(c: Candidate, pool: str) -> int:
    return c.pool_devices().get(pool, 0)


def _devices(c: Candidate) -> int:
    return c.devices


class ModelVars:
    """The variables of one `Problem`'s CP-SAT model and the expressions over them."""

    def __init__(self, problem: Problem, unit_s: float) -> None:
        self.p, self.unit = problem, unit_s
        self.m = cp_model.CpModel()
        self.roles = problem.roles
        self.pools = [pl.name for pl in problem.res.cluster.pools]
        self._choices()
        self._slots()
        self._capacity()

    def ti(self, seconds: float) -> int:
        return int(round(seconds / self.unit))

    def _choices(self) -> None:
        m = self.m
        self.x = {r: [m.new_bool_var(f"x[{r},{i}]") for i in range(len(self.p.cands[r]))]
                  for r in self.roles}
        for r in self.roles:
            m.add_exactly_one(self.x[r])

    def on_pool(self, r: str, pool: str) -> LinExpr:
        """1 when role `r`'s chosen candidate is on `pool` (what it counts there is `expr`'s)."""
        return sum(v for c, v in zip(self.p.cands[r], self.x[r]) if c.pool == pool)

    def expr(self, r: str, coef: Callable[[Candidate], int]) -> LinExpr:
        return sum(coef(c) * v for c, v in zip(self.p.cands[r], self.x[r]))

    def _slots(self) -> None:
        m, R = self.m, self.roles
        self.z = {(r, j): m.new_bool_var(f"z[{r},{j}]") for i, r in enumerate(R) for j in R[:i + 1]}
        for i, r in enumerate(R):
            m.add_exactly_one(self.z[r, j] for j in R[:i + 1])
            for c, v in zip(self.p.cands[r], self.x[r]):
                if c.colocated:  # not alone: it shares its slot (on its first part's pool)
                    m.add_bool_or([v.Not(), self.z[r, r].Not(),
                                   *(self.z[later, r] for later in R[i + 1:])])
                elif c.split:  # alone in its own slot
                    m.add_implication(v, self.z[r, r])
                    for later in R[i + 1:]:
                        m.add_implication(self.z[later, r], v.Not())
            for j in R[:i]:
                m.add_implication(self.z[r, j], self.z[j, j])
                for pool in self.pools:  # a slot is on one pool: its members follow its leader
                    m.add(self.on_pool(r, pool) == self.on_pool(j, pool)).OnlyEnforceIf(self.z[r, j])
        for group in self.p.px.colocated_roles():  # shared engines: one slot, the first's
            first, *rest = [r for r in group if r in R]
            for r in rest:
                for j in R[:R.index(first) + 1]:
                    m.add(self.z[r, j] == self.z[first, j])
        apart = [r for r in self.p.px.apart_roles() if r in R]
        for j in R if len(apart) > 1 else []:  # a framework's rule: no two of these in one slot
            m.add_at_most_one(self.z[r, j] for r in apart if (r, j) in self.z)
        for group in self.p.px.same_devices_roles():  # one engine over one device set
            first, *rest = [r for r in group if r in R]
            for r in rest:
                m.add(self.expr(r, _devices) == self.expr(first, _devices))

    def members(self, j: str) -> list[str]:
        return [r for r in self.roles if (r, j) in self.z]

    def _capacity(self) -> None:
        m, cap = self.m, self.p.capacity()
        self.D: dict[tuple[str, str], cp_model.IntVar] = {}
        for j in self.roles:  # a mixed rollout's slot holds devices on its parts' pools too
            for pool in sorted({p for c in self.p.cands[j] for p in c.pool_devices()}
                               | {p for r in self.members(j) for c in self.p.cands[r]
                                  if c.colocated for p in c.pool_devices()}):
                d = self.D[j, pool] = m.new_int_var(0, cap[pool], f"D[{j},{pool}]")
                for r in self.members(j):
                    m.add(d >= self.expr(r, partial(_devices_on, pool=pool))
                          ).OnlyEnforceIf(self.z[r, j])
        for pool in self.pools:
            m.add(sum(d for (j, pl), d in self.D.items() if pl == pool) <= cap[pool])
        price = {pl: int(device_price(self.p.res, pl, units=True)) for pl in self.pools}
        self.price = price
        self.rate = sum(price[pl] * d for (j, pl), d in self.D.items())
        self.rate_max = sum(price[pl] * cap[pl] for pl in self.pools)
        self.devices = sum(self.D.values())
