"""The placement ILP's slot memory terms (`placer.solve.ilp`): switch, parking, host memory.

Per slot of two or more roles, over_j (its members do not fit in memory together); not over_j =>
the members' resident memory plus any one parked optimizer fits a device and each parked member
pays its copies (`placer.cost.optpark`); over_j => every member pays its onload (SW_j) and the
host RAM of the slot's devices holds what they park (`hostmem.park_budget_gb`). A member the
job's framework switches every step while the actor and the rollout share the slot
(`FrameworkProfile.switches_every_step`: NeMo-RL's policy and engine) pays its onload there
whether or not the slot fits, unparked (`timing.slot_switch`'s rule). The notation and
the linearisation are the `placer.solve.ilp` docstring's (constraints `switch`, `parking`,
`host`); memory is in kB per device, host memory in MB over the slot's devices.
"""
from __future__ import annotations

from ortools.sat.python import cp_model

from placer.cost import optpark
from placer.cost.timing import onload_time
from placer.solve.candidates import Candidate
from placer.solve.ilp_vars import LinExpr, ModelVars
from placer.solve.problem import alone, budget_mb, host_mb, slot_devices
from placer.spec.frameworkrules import COLOCATED_INFERENCE


class SlotMemory(ModelVars):
    """`ModelVars` with each slot's memory rule and its switch and parking times (SW_j)."""

    SW: dict[str, LinExpr]
    SWN: dict[str, LinExpr]
    SWR: LinExpr

    def _mem_kb(self, c: Candidate) -> int:
        """kB per device the candidate holds on its slot's pool beside the slot's other members
        (a mixed rollout's: its shared part's; a parked optimizer left out: `optpark.resident_gb`)."""
        if alone(c) or self.p.res.device_of(c.pool).host_backed:
            return 0  # host-RAM slots never pay a switch (timing.slot_switch); a split role is alone
        return int(round(optpark.resident_gb(c.est.memory, c.est.par) * 1e6))

    def _park_kb(self, c: Candidate) -> int:
        return int(round(optpark.parked_gb(c.est.memory, c.est.par) * 1e6))

    def _switch(self, c: Candidate) -> int:
        if alone(c) or self.p.res.device_of(c.pool).host_backed:
            return 0
        dev = self.p.res.device_of(c.pool)
        once = onload_time(c.est.role, c.est.memory, dev, self.p.calib.for_device(dev),
                           self.p.res.job.sleep_level)
        return self.ti(once * self.p.px.onloads_per_step(c.est.role))

    def _park(self, c: Candidate) -> int:
        """Time units of the candidate's parked optimizer's copies out and back per RL step, as
        the job's framework moves it (`optpark.moved_gb`, as `timing.member_switch` prices it)."""
        if not c.est.par.park_optimizer:
            return 0
        dev = self.p.res.device_of(c.pool)
        eff = self.p.calib.for_device(dev)
        fw = self.p.res.job.profile.park_scheme
        return self.ti(optpark.park_time(optpark.moved_gb(c.est, fw), eff))

    def _memory(self) -> None:
        """not over_j => every member's resident memory plus any one member's parked optimizer
        fits (`optpark.slot_peak_gb`: one bound per member keeps the max linear) and each
        parked member pays its copy out and back; over_j => every member pays its onload."""
        m = self.m
        self.SW: dict[str, LinExpr] = {}
        # several agents' engines onload as their rollouts run, one after another: their
        # onloads add over slots (SWR); every other member's follow the slot rule (SWN_j)
        seq = set(self.p.px.sequential_rollouts())
        self.SWN: dict[str, LinExpr] = {}
        self.SWR: LinExpr = 0
        for j in self.roles:
            if len(self.members(j)) < 2:
                for c, x in zip(self.p.cands[j], self.x[j]):
                    if c.est.par.park_optimizer:  # alone it fits unparked: never worth it
                        m.add_implication(x, self.z[j, j].Not())
                self.SW[j] = self.SWN[j] = 0
                continue
            over = m.new_bool_var(f"over[{j}]")
            mm, sw, pk = [], [], {}
            every = self.p.res.job.profile.switches_every_step(self.members(j))
            shared = [self.z[q, j] for q in COLOCATED_INFERENCE] if every else []
            for r in self.members(j):
                a = m.new_int_var(0, max(self._mem_kb(c) for c in self.p.cands[r]), f"mm[{r},{j}]")
                m.add(a >= self.expr(r, self._mem_kb)).OnlyEnforceIf(self.z[r, j])
                mm.append(a)
                top = max(max(self._switch(c), self._park(c)) for c in self.p.cands[r])
                v = m.new_int_var(0, top, f"v[{r},{j}]")
                m.add(v >= self.expr(r, self._switch)).OnlyEnforceIf([self.z[r, j], over])
                if r in every:  # fit or not, while the actor and the rollout share the slot
                    m.add(v >= self.expr(r, self._switch)).OnlyEnforceIf(shared)
                    for c, x in zip(self.p.cands[r], self.x[r]):
                        if c.est.par.park_optimizer:  # its onload moves the optimizer anyway
                            m.add_bool_or([x.Not(), *(z.Not() for z in shared)])
                if any(self._park(c) for c in self.p.cands[r]):
                    m.add(v >= self.expr(r, self._park)).OnlyEnforceIf([self.z[r, j], over.Not()])
                    for c, x in zip(self.p.cands[r], self.x[r]):
                        if c.est.par.park_optimizer:  # a whole switch moves it anyway: the
                            # plan says so with the unparked twin, which prices the same
                            m.add_bool_or([x.Not(), self.z[r, j].Not(), over.Not()])
                    pk[r] = self._at_least(r, j, "pk", [self._park_kb(c) for c in self.p.cands[r]])
                sw.append(v)
                if r in seq:
                    self.SWR += v
            cap = sum(int(self.p.res.device_of(pl).memory_gb * 1e6) * self.on_pool(j, pl)
                      for pl in self.pools)
            m.add(sum(mm) <= cap).OnlyEnforceIf(over.Not())
            for p in pk.values():
                m.add(sum(mm) + p <= cap).OnlyEnforceIf(over.Not())
            if pk:
                self._over_only_if_over(j, over, mm, list(pk.values()), cap)
            self.SW[j] = sum(sw)
            self.SWN[j] = (self.SW[j] if not seq else
                           sum(v for r, v in zip(self.members(j), sw) if r not in seq))
            self._host(j, over)

    def _over_only_if_over(self, j: str, over: cp_model.IntVar, mm: list[cp_model.IntVar],
                           pk: list[cp_model.IntVar], cap: LinExpr) -> None:
        """over_j => the slot's peak exceeds the device, as `timing.slot_switch` decides it, so
        the solver never calls a slot that fits with a parked member over (its host-memory rule
        differs from a fitting slot's): the memory terms are pinned to their values (0 off the
        slot) and the peak's max is exact."""
        m = self.m
        for r, a in zip(self.members(j), mm):
            m.add(a <= self.expr(r, self._mem_kb)).OnlyEnforceIf(self.z[r, j])
            m.add(a == 0).OnlyEnforceIf(self.z[r, j].Not())
        owners = [r for r in self.members(j) if any(self._park(c) for c in self.p.cands[r])]
        for r, p in zip(owners, pk):
            m.add(p <= self.expr(r, self._park_kb)).OnlyEnforceIf(self.z[r, j])
            m.add(p == 0).OnlyEnforceIf(self.z[r, j].Not())
        top = max(self._park_kb(c) for r in owners for c in self.p.cands[r])
        peak = m.new_int_var(0, top, f"peak[{j}]")
        m.add_max_equality(peak, pk)
        m.add(sum(mm) + peak >= cap + 1).OnlyEnforceIf(over)
        # a parked twin only where its slot would not fit with every optimizer resident: else
        # it buys nothing and costs its copies (which a slower slot's switch can hide, a tie
        # the plan would then report as parking)
        whole = []
        for r in self.members(j):
            t = m.new_int_var(0, max(self._total_kb(c) for c in self.p.cands[r]), f"tot[{r},{j}]")
            m.add(t == self.expr(r, self._total_kb)).OnlyEnforceIf(self.z[r, j])
            m.add(t == 0).OnlyEnforceIf(self.z[r, j].Not())
            whole.append(t)
        for r in owners:
            for c, x in zip(self.p.cands[r], self.x[r]):
                if c.est.par.park_optimizer:
                    m.add(sum(whole) >= cap + 1).OnlyEnforceIf([x, self.z[r, j]])

    def _total_kb(self, c: Candidate) -> int:
        return self._mem_kb(c) + self._park_kb(c) if self._mem_kb(c) else 0

    def _host(self, j: str, over: cp_model.IntVar) -> None:
        """over_j => for every member r, the other members' parked state plus every member's
        offloaded optimizer (MB over each member's devices) fits `hostmem.park_budget_gb` per
        device of the slot: sum - min is the largest sum - h_r, so one bound per member keeps it
        linear; not over_j => the parked optimizers plus the offloaded ones fit it, with the
        parked state of any one member its framework switches every step. The slot's
        devices M_j are its largest member's (`assemble`): M_j >= every member's n and
        M_j <= the n of one member the solver names."""
        m, res = self.m, self.p.res
        budget = {pl: b for pl in self.pools if (b := budget_mb(res, pl)) is not None}
        if not budget:
            return
        members = self.members(j)
        top = max(slot_devices(c) for r in members for c in self.p.cands[r])
        size = m.new_int_var(0, top, f"M[{j}]")
        largest = {r: m.new_bool_var(f"largest[{r},{j}]") for r in members}
        park: dict[str, cp_model.IntVar] = {}
        held: list[cp_model.IntVar] = []
        opt: list[cp_model.IntVar] = []
        for r in members:
            n = self.expr(r, slot_devices)
            m.add(size >= n).OnlyEnforceIf(self.z[r, j])
            m.add(size <= n).OnlyEnforceIf(largest[r])
            m.add_implication(largest[r], self.z[r, j])
            parked, offloaded, opt_mb = zip(*(host_mb(res, c) for c in self.p.cands[r]))
            park[r] = self._at_least(r, j, "park", list(parked))
            held.append(self._at_least(r, j, "off", list(offloaded)))
            if any(opt_mb):
                opt.append(self._at_least(r, j, "opt", list(opt_mb)))
        m.add(sum(largest.values()) == self.z[j, j])  # one names the size of a slot in use
        for pl, b in budget.items():
            if not any(c.pool == pl for c in self.p.cands[j]):
                continue  # the slot is never on this pool
            here = m.new_bool_var(f"on[{j},{pl}]")
            m.add(self.on_pool(j, pl) == 1).OnlyEnforceIf(here)
            m.add(self.on_pool(j, pl) == 0).OnlyEnforceIf(here.Not())
            for r in park:
                others = sum(v for q, v in park.items() if q != r)
                m.add(others + sum(held) <= b * size).OnlyEnforceIf([self.z[r, j], over, here])
            if opt:
                m.add(sum(opt) + sum(held) <= b * size).OnlyEnforceIf([over.Not(), here])
            # a fitting slot whose framework switches members every step: one of them at a time
            # has its state on the host (`hostmem._parked_per_device`)
            every = self.p.res.job.profile.switches_every_step(members)
            shared = [self.z[q, j] for q in COLOCATED_INFERENCE] if every else []
            for r in every:
                m.add(park[r] + sum(opt) + sum(held) <= b * size).OnlyEnforceIf(
                    [over.Not(), here, *shared])

    def _at_least(self, r: str, j: str, name: str, values: list[int]) -> cp_model.IntVar:
        """A variable >= values[k] for role r's chosen candidate k while r sits in slot j."""
        v = self.m.new_int_var(0, max(values), f"{name}[{r},{j}]")
        self.m.add(v >= sum(a * x for a, x in zip(values, self.x[r]))).OnlyEnforceIf(self.z[r, j])
        return v
