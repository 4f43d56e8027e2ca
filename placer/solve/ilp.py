"""The placement ILP (OR-Tools CP-SAT): one config per role, colocation slots, pool capacities.

The cost table (`Problem.cands`: per role, candidates with their `Estimate`) is the only input;
the chosen placement goes back through `assemble`, which re-prices it with
`timing.iteration_time`. The model is exact for that timing rule (up to the integer time unit),
so the solver's objective and the plan's predicted time agree. Identical nodes are a count: the
model's size depends on the candidates (log of the cluster), never on the node count.

Data: candidate k of role r has devices n_k (n_kp per pool when split), stage times t_ks, memory
per device m_k and onload sw_k; two pair terms come from `timing` itself: the weight sync W_ak
(actor a -> rollout k, same slot or not) and the tool calls' queueing V_ke (rollout k on
environment e's cores). t_k of a rollout is tail-aware (`placer.cost.rollout_tail`).
Variables: x_rk (role r runs k, one each); z_rj (role r sits in slot j <= r, the slot named by
its lowest role: one representation per partition); D_jp (devices slot j holds on pool p);
over_j (slot j's members do not fit in memory together); T.
Constraints (products of binaries by enforcement literals, no big-M):
  pool        a slot is on one pool; a split candidate sits alone in its slot, a mixed one
              (`Candidate.colocated`) in another role's slot on its shared part's pool, its
              other part's devices held by that slot on their own pool (D_jq)
  capacity    D_jp >= every member's n_kp;  sum_j D_jp <= cap_p
  engines     a framework's shared engine (`Pricer.colocated_roles`) is one slot: z_rj = z_fj
              for its roles r and its first f; a hybrid engine that runs its roles over one
              device set (`Pricer.same_devices_roles`: EasyR1's) also n_r = n_f
  stage work  S_js = sum of the members' t_ks;  memory: not over_j => the members' m_k fit
  switch      over_j => every member pays sw_k (SW_j)
  parking     not over_j => the members' resident memory plus any one parked optimizer fits,
              each parked member pays its copies (`placer.cost.optpark`); a parked twin only
              where the slot would not fit unparked (else its unparked twin, which the table
              always holds, is no worse) and not in a slot that switches whole
  host        over_j => for every member r, the other members' parked state plus every member's
              offloaded optimizer fits the host RAM of the slot's M_j devices (M_j: its largest
              member's; `hostmem.park_budget_gb` each): sum - min is the largest sum - h_r
  sync        Y >= W_ak^same or W_ak^diff, by whether the rollout shares the actor's slot 0
  tools       the rollout's slot's rollout stage gets V (negative where over-provisioning's kept
              samples finish sooner on the queue)
  validate    a job's periodic validation (`placer.cost.validation`) is a work stage of the
              rollout's slot: the rollout candidate's generation per step (its own work, from
              the table: `Problem.validate_s`), + Y / every, + its engines' sleep and wake per
              step where another role shares the slot (a lower-bounded `shared` literal)
  sync mode   T = Y + sum_s max_j S_js + max_j SW_j   (stages in sequence, slots overlap)
  async mode  T >= every slot's total work (+ Y on the rollout's), and (s + 1) T >= the
              sync-mode chain (staleness s: `timing`'s rule)
Lower bounds suffice: every bounded quantity only raises the objective, so they are tight at an
optimum. The objectives (time, cost per sample, the sweep): `placer.solve.ilp_solve`.
Ties: many plans share the optimal T (a role whose stage has slack in its slot runs as well on
any device count the slot already holds), and CP-SAT returns whichever its search meets first,
which moves with the workers, the seed and the machine's load. The drivers therefore minimise
lexicographically, each level a solve with the levels before it held at their optimum (the
primary objective and its optimality are untouched):
  1. T (+ moves), as above
  2. tie_breaker = rate (N + 1) + sum_jp D_jp, rate = sum_p price_p sum_j D_jp, N = sum_p cap_p:
     the devices held are at most N, so one unit of rate outweighs any device count
  3. the canonical plan: kappa_r = rank_r (i_r + 1) + lambda_r per role r (index i_r), rank_r
     its candidate's place in `canonical_order` (fastest first: the slot's devices are paid for
     already, so a role uses them for slack), lambda_r the index of its slot's leader. kappa_r
     < R_r = |K_r| (i_r + 1) names (x_r, z_r); the roles in order are packed as
     sum_r kappa_r W_r, W_r = the product of the later roles' R, within 2^40 per objective
     (more objectives, still in role order, where the ranges are wider): later roles add at
     most W_r - 1, below one step of kappa_r, so the minimum is the lexicographic one.
Level 3 names one assignment, so a plan whose levels are all proven optimal is the same for any
number of workers, seed or load.
Candidates slower or dearer than a feasible plan are dropped before the model is built
(`placer.solve.ilp_bound`). The time unit is the heuristic plan's time / 1e6; memory is in kB.
The variables x, z, D and capacity are built in `placer.solve.ilp_vars`; memory, switch, parking
and host in `placer.solve.ilp_memory`; the rest here.
"""
from __future__ import annotations

from functools import partial

from ortools.sat.python import cp_model

from placer.base.roles import Role
from placer.solve.candidates import Candidate
from placer.solve.ilp_memory import SlotMemory
from placer.solve.ilp_vars import LinExpr
from placer.solve.problem import Assignment, Problem, slot_names

WORK_STAGES = ("rollout", "score", "train", "validate")
TIME_STEPS = 1_000_000  # integer time units per upper bound: relative resolution 1e-6


# ------------------------------------------------------------------------------------- model
class _Model(SlotMemory):
    """The CP-SAT model of one `Problem` (see the module docstring for the formulation): the
    variables (`ilp_vars`), the slots' memory (`ilp_memory`), the stage work, the weight sync,
    the tool calls and the iteration time."""

    def __init__(self, problem: Problem, unit_s: float, lazy_tools: bool = False) -> None:
        self.lazy_tools = lazy_tools
        self.tool_top = 0
        super().__init__(problem, unit_s)
        self._work()
        self._memory()
        self._sync()
        self._tools()
        self._validate()
        self._iteration()

    def _work(self) -> None:
        m = self.m
        self.S: dict[tuple[str, str], LinExpr] = {}
        for j in self.roles:
            for s in WORK_STAGES:
                terms = []
                for r in self.members(j):
                    top = max(self._stage_units(s, c) for c in self.p.cands[r])
                    if top == 0:
                        continue
                    w = m.new_int_var(0, top, f"w[{r},{j},{s}]")
                    m.add(w >= self.expr(r, partial(self._stage_units, s))
                          ).OnlyEnforceIf(self.z[r, j])
                    terms.append(w)
                self.S[j, s] = sum(terms)

    def _stage_units(self, stage: str, c: Candidate) -> int:
        """Candidate `c`'s own work in `stage`: its estimate's, and for a rollout's `validate`
        the validation's generation per step (`Problem.validate_s`; 0 without one)."""
        if stage == "validate":
            return self.ti(self.p.validate_s(c)[0]) if c.role == Role.ROLLOUT else 0
        return self.ti(c.est.stage_s.get(stage, 0.0))

    def _sync(self) -> None:
        """Y >= the weight-sync time of every chosen (actor, rollout) pair, same slot or not
        (one pair per trained agent; several add: `placer.cost.agents`)."""
        self.Y: LinExpr = 0
        self.y_top = 0
        self.Ys: dict[str, LinExpr] = {}  # rollout -> its sync
        pairs = [(a, r) for a, r in self.p.px.sync_pairs() if a in self.roles and r in self.roles]
        for actor, rollout in pairs:
            self.Ys[rollout] = self._pair_sync(actor, rollout,
                                               "Y" if len(pairs) == 1 else f"Y[{rollout}]")
        ys = list(self.Ys.values())
        self.Y = ys[0] if len(ys) == 1 else sum(ys)

    def _pair_sync(self, actor: str, rollout: str, name: str) -> cp_model.IntVar:
        A, Rc = self.p.cands[actor], self.p.cands[rollout]
        same_slot = self._same_slot(actor, rollout)
        table = {}
        for a in A:
            for k in Rc:
                same, diff = self.p.sync_s(a, k)
                table[id(a), id(k)] = (self.ti(same), self.ti(diff))
        top = max(max(v) for v in table.values())
        self.y_top += top
        y = self.m.new_int_var(0, top, name)
        for a, xa in zip(A, self.x[actor]):
            for i, lit in ((0, same_slot), (1, same_slot.Not())):
                self.m.add(y >= sum(table[id(a), id(k)][i] * xk
                                    for k, xk in zip(Rc, self.x[rollout]))).OnlyEnforceIf([xa, lit])
        return y

    def _same_slot(self, actor: str, rollout: str) -> cp_model.IntVar:
        """1 when the two roles share a slot: the actor's own when it leads every slot it is
        in (the first role); else one of the slots both may sit in (another agent's role may
        lead it)."""
        R = self.roles
        if R.index(actor) == 0:
            return self.z[rollout, actor]
        same = self.m.new_bool_var(f"same[{actor},{rollout}]")
        both = []
        for j in R[:R.index(actor) + 1]:
            b = self.m.new_bool_var(f"both[{actor},{rollout},{j}]")
            self.m.add_bool_and([self.z[actor, j], self.z[rollout, j]]).OnlyEnforceIf(b)
            self.m.add_bool_or([self.z[actor, j].Not(), self.z[rollout, j].Not()]
                               ).OnlyEnforceIf(b.Not())
            both.append(b)
        self.m.add(sum(both) == same)
        return same

    def _tools(self) -> None:
        """Tool waits of the rollout engines: a (rollout, environment) pair term added to the
        rollout slot's rollout stage (`timing.rollout_tool_time`)."""
        if Role.ROLLOUT not in self.roles or Role.ENVIRONMENT not in self.roles:
            return
        R, E = self.p.cands[Role.ROLLOUT], self.p.cands[Role.ENVIRONMENT]
        table = {(id(k), id(e)): self.ti(self.p.tool_s(k, e) if self.priced(k, e) else 0.0)
                 for k in R for e in E}
        top = max(max(table.values()), 0)
        low = min(min(table.values()), 0)  # < 0: the queue ends an over-provisioned stage sooner
        if top == 0 and low == 0:
            return
        tool = self.m.new_int_var(low, top, "tool")
        for k, xk in zip(R, self.x[Role.ROLLOUT]):
            self.m.add(tool >= sum(table[id(k), id(e)] * xe for e, xe in
                                   zip(E, self.x[Role.ENVIRONMENT]))).OnlyEnforceIf(xk)
        for j in self.roles:
            if (Role.ROLLOUT, j) in self.z:
                tq = self.m.new_int_var(low, top, f"tool[{j}]")
                self.m.add(tq >= tool).OnlyEnforceIf(self.z[Role.ROLLOUT, j])
                if low < 0:  # a slot without the rollout gets none (0 is the least otherwise)
                    self.m.add(tq == 0).OnlyEnforceIf(self.z[Role.ROLLOUT, j].Not())
                self.S[j, "rollout"] = self.S[j, "rollout"] + tq
        self.tool_top = top

    def _validate(self) -> None:
        """A periodic validation's pair terms on the rollout's slot's `validate` stage (its
        generation is the candidates' own work, `_stage_units`): the refit, Y / every (rounded
        up to the unit), and the engines' sleep and wake where the slot holds another role
        (`timing._validation`). `shared` is a lower bound: 1 whenever another role sits in the
        rollout's slot."""
        val = self.p.res.job.validation
        self.v_top = 0
        if val is None or Role.ROLLOUT not in self.roles:
            return
        m, R = self.m, self.p.cands[Role.ROLLOUT]
        vy = m.new_int_var(0, -(-self.y_top // val.every), "V[sync]")
        m.add(val.every * vy >= self.Y)
        swaps = [self.ti(self.p.validate_s(k)[1]) for k in R]
        vs: LinExpr = 0
        if max(swaps) > 0:
            shared = m.new_bool_var("V[shared]")
            for j in self.roles:
                if (Role.ROLLOUT, j) not in self.z:
                    continue
                for r in self.members(j):
                    if r != Role.ROLLOUT:
                        m.add(shared >= self.z[Role.ROLLOUT, j] + self.z[r, j] - 1)
            vs = m.new_int_var(0, max(swaps), "V[swap]")
            m.add(vs >= sum(u * xk for u, xk in zip(swaps, self.x[Role.ROLLOUT]))
                  ).OnlyEnforceIf(shared)
        self.v_top = -(-self.y_top // val.every) + max(swaps)
        for j in self.roles:
            if (Role.ROLLOUT, j) in self.z:
                vj = m.new_int_var(0, self.v_top, f"V[{j}]")
                m.add(vj >= vy + vs).OnlyEnforceIf(self.z[Role.ROLLOUT, j])
                self.S[j, "validate"] = self.S[j, "validate"] + vj

    def priced(self, k: Candidate, e: Candidate) -> bool:
        """Whether the model prices the tool term of rollout `k` with environment `e`: always,
        unless `lazy_tools` and `k` is a split whose term is not priced yet; that term is then
        0, a lower bound (`timing._split_tool_time` is never negative), so the model's optimum
        bounds the true one from below (`placer.solve.ilp_solve` prices what it chose, and
        re-solves until its choice is priced)."""
        return not (self.lazy_tools and k.split) or self.p.has_tool(k, e)

    def _iteration(self) -> None:
        m = self.m
        top = (sum(max(self.ti(c.time_s) for c in self.p.cands[r]) for r in self.roles)
               + self.y_top + self.tool_top + self.v_top + self._validate_gen_top()
               + sum(self._switch_max(r) for r in self.roles) + 1)
        self.t_top = top
        self.T = m.new_int_var(0, top, "T")
        maxes = []
        for s in WORK_STAGES:
            ms = m.new_int_var(0, top, f"M[{s}]")
            for j in self.roles:
                m.add(ms >= self.S[j, s])
            maxes.append(ms)
        seq = [r for r in self.p.px.sequential_rollouts() if r in self.roles]
        if seq:  # several agents' engines: their rollouts add wherever they sit
            m.add(maxes[WORK_STAGES.index("rollout")] >= sum(
                self.expr(r, partial(self._stage_units, "rollout")) for r in seq))
        msw = m.new_int_var(0, top, "M[switch]")
        for j in self.roles:
            m.add(msw >= self.SWN[j])
        chain = self.Y + sum(maxes) + msw  # one step's stages in sequence
        if seq:
            chain = chain + self.SWR
        mode = self.p.res.job.pipeline.mechanism
        if not mode.overlaps_steps:
            m.add(self.T >= chain)
            return
        for j in self.roles:
            q: LinExpr = 0
            for r, y in self.Ys.items():  # each rollout's slot does its own refresh
                if self.y_top and (r, j) in self.z:
                    qr = m.new_int_var(0, top, f"q[{j}]" if len(self.Ys) == 1 else f"q[{r},{j}]")
                    m.add(qr >= y).OnlyEnforceIf(self.z[r, j])
                    q = q + qr if len(self.Ys) > 1 else qr
            m.add(self.T >= sum(self.S[j, s] for s in WORK_STAGES) + self.SW[j] + q)
        m.add((mode.staleness + 1) * self.T >= chain)  # `PipelineMode.chain_bound_s`

    def _validate_gen_top(self) -> int:
        if Role.ROLLOUT not in self.roles:
            return 0
        return max(self._stage_units("validate", c) for c in self.p.cands[Role.ROLLOUT])

    def _switch_max(self, r: str) -> int:
        return max(self._switch(c) for c in self.p.cands[r])

    def tie_breaker(self) -> LinExpr:
        """Cheapest first, then fewest devices (lexicographic: rate dominates, as the devices
        held never exceed the clusters' sum N)."""
        return self.rate * (sum(self.p.capacity().values()) + 1) + self.devices

    def canonical_keys(self) -> list[tuple[LinExpr, int]]:
        """Per role in role order, kappa_r = rank_r * (i_r + 1) + lambda_r and its range
        |K_r| (i_r + 1): rank_r the chosen candidate's place in `canonical_order`, lambda_r the
        index of its slot's leader (i_r: the role's index). kappa_r names (x_r., z_r.) exactly,
        so the lexicographic minimum of the kappas is one assignment."""
        out: list[tuple[LinExpr, int]] = []
        for i, r in enumerate(self.roles):
            cands = self.p.cands[r]
            rank = {k: n for n, k in enumerate(canonical_order(cands))}
            key = (sum(rank[k] * (i + 1) * v for k, v in enumerate(self.x[r]))
                   + sum(n * self.z[r, j] for n, j in enumerate(self.roles[:i + 1])))
            out.append((key, len(cands) * (i + 1)))
        return out

    # ------------------------------------------------------------------------ hints, reading
    def hint(self, a: Assignment) -> None:
        groups = _groups(a.slot_of, self.roles)
        leader = {r: g[0] for g in groups for r in g}
        for r in self.roles:
            for c, v in zip(self.p.cands[r], self.x[r]):
                self.m.add_hint(v, c is a.choice[r])
            for j in self.roles[:self.roles.index(r) + 1]:
                self.m.add_hint(self.z[r, j], leader[r] == j)

    def read(self, solver: cp_model.CpSolver) -> Assignment:
        choice = {r: next(c for c, v in zip(self.p.cands[r], self.x[r]) if solver.Value(v))
                  for r in self.roles}
        groups = [[r for r in self.members(j) if solver.Value(self.z[r, j])]
                  for j in self.roles if solver.Value(self.z[j, j])]
        return Assignment(choice, slot_names(groups))


def canonical_order(cands: list[Candidate]) -> list[int]:
    """The candidates' indices, fastest first, then fewest devices, then least memory per
    device, then their place in the cost table (which is built deterministically)."""
    return sorted(range(len(cands)), key=lambda k: (cands[k].time_s, cands[k].devices,
                                                    cands[k].est.memory.total, k))


def _groups(slot_of: dict[str, str], roles: list[str]) -> list[list[str]]:
    out: dict[str, list[str]] = {}
    for r in roles:
        out.setdefault(slot_of[r], []).append(r)
    return list(out.values())
