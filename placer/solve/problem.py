"""The placement problem as the ILP (`placer.solve.ilp`) and its drivers read it.

`Problem` is the cost table (per role, candidates with their `Estimate`) plus the pair terms
`timing` prices (weight sync, tool-call queueing); `Assignment` a placement (a candidate per role
and a slot per role); `Solution` the solver's answer with its bound; `Hint` a previous placement
to warm-start from, compared by `layout_key`. The host-memory rule the model keeps
(`host_fits`) is here too, so that heuristic plans and baselines are checked against the same
rule without building a model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from placer.cost import optpark
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.cost.timing import Placed
from placer.solve import hostmem
from placer.solve.candidates import Candidate
from placer.solve.planfile import SearchSpace
from placer.spec.catalog import Resolved


@dataclass(frozen=True)
class Problem:
    """The cost table and what the solver needs besides it."""

    px: Pricer  # the job and its factors: every time below comes from it
    cands: dict[str, list[Candidate]]
    objective: str = "time"  # "time" | "cost"
    # (rollout, environment) tool terms already priced, by the candidates' ids (the pair kept
    # too, so an id is never read for another object): shared by the problems pruned or
    # re-objectived from this one, whose models (the cost walk builds one per step) reuse them
    tools: dict[tuple[int, int], tuple[Candidate, Candidate, float]] = field(
        default_factory=dict, compare=False, repr=False)
    # (actor, rollout) weight syncs already priced, (same slot, apart), kept as `tools` is
    syncs: dict[tuple[int, int], tuple[Candidate, Candidate, tuple[float, float]]] = field(
        default_factory=dict, compare=False, repr=False)
    # rollout candidate -> its `Pricer.validation_terms`, kept as `tools` is
    validations: dict[int, tuple[Candidate, tuple[float, float]]] = field(
        default_factory=dict, compare=False, repr=False)
    # what the table was built from (`placer.solve.planner.build_problem`); None when built by hand
    space: SearchSpace | None = field(default=None, compare=False, repr=False)

    @property
    def res(self) -> Resolved:
        return self.px.res

    @property
    def calib(self) -> Calibration:
        return self.px.calib

    @property
    def roles(self) -> list[str]:
        job = self.res.job
        order = job.roles() if job.agents is None else job.role_names()
        return [r for r in order if r in self.cands]

    def capacity(self) -> dict[str, int]:
        return {p.name: p.devices_per_node * p.nodes for p in self.res.cluster.pools}

    def sync_s(self, a: Candidate, k: Candidate) -> tuple[float, float]:
        """`timing.sync_time` of actor candidate `a` to rollout candidate `k`: (in the actor's
        slot, 0 unless on its pool; in a slot of its own)."""
        hit = self.syncs.get((id(a), id(k)))
        if hit is not None and hit[0] is a and hit[1] is k:
            return hit[2]
        diff = self.px.sync_time(Placed("a", a.est), Placed("r", k.est))
        same = (self.px.sync_time(Placed("a", a.est), Placed("a", k.est))
                if a.pool == k.pool else 0.0)
        self.syncs[id(a), id(k)] = (a, k, (same, diff))
        return same, diff

    def validate_s(self, k: Candidate) -> tuple[float, float]:
        """`Pricer.validation_terms` of rollout candidate `k`: a periodic validation's
        generation per step, and the engines' sleep and wake per step where their slot is
        shared ((0, 0) without a `validation` section)."""
        if self.res.job.validation is None:
            return 0.0, 0.0
        hit = self.validations.get(id(k))
        if hit is not None and hit[0] is k:
            return hit[1]
        terms = self.px.validation_terms(k.est)
        self.validations[id(k)] = (k, terms)
        return terms

    def has_tool(self, k: Candidate, e: Candidate) -> bool:
        hit = self.tools.get((id(k), id(e)))
        return hit is not None and hit[0] is k and hit[1] is e

    def tool_s(self, k: Candidate, e: Candidate) -> float:
        """`timing.rollout_tool_time` of rollout candidate `k` with environment candidate `e`."""
        hit = self.tools.get((id(k), id(e)))
        if hit is not None and hit[0] is k and hit[1] is e:
            return hit[2]
        t = self.px.tool_time(Placed("r", k.est), Placed("e", e.est))
        self.tools[id(k), id(e)] = (k, e, t)
        return t


@dataclass(frozen=True)
class Assignment:
    """A placement: the candidate of every role and its slot (named by the slot's roles)."""

    choice: dict[str, Candidate]
    slot_of: dict[str, str]

    def placed(self) -> list[Placed]:
        return [Placed(self.slot_of[r], c.est) for r, c in self.choice.items()]


@dataclass(frozen=True)
class Solution:
    assignment: Assignment
    status: str
    objective: float  # seconds (time) or USD per sample (cost), incl. any movement cost
    bound: float
    gap: float
    solve_s: float


# pool, tp, pp, dp, cp, ep, etp, offload, HSDP shard (0: none), data-parallel attention,
# micro-batch (0: token-budgeted), optimizer parked, a frozen model's weights sharded, and the
# bytes a parameter of its host copy when streamed (0: on the GPU)
Layout = tuple[str, int, int, int, int, int, int, bool, int, int, int, bool, bool, float]
# a role's layout; a split role's: one per part
LayoutKey = Layout | tuple[Layout, ...]


def layout_key(pool: str, par: Parallel) -> Layout:
    """What a role keeps when it does not move: its pool, its parallel layout, the trainer's
    choices priced with it (micro-batch, optimizer parked) and how a frozen model holds its
    weights (sharded or whole, streamed from the host or resident). A candidate and its parked
    twin (`placer.solve.parktwins`), or its streamed twin (`placer.solve.layouts`), differ only
    there, and `placer.solve.moves` reports a change of any of them."""
    return (pool, par.tp, par.pp, par.dp, par.cp, par.ep, par.etp, par.offload,
            par.shard_dp if par.hsdp else 0, par.attn_dp, par.micro_batch, par.park_optimizer,
            par.sharded_weights, par.stream_params_bytes)


def candidate_key(c: Candidate) -> LayoutKey:
    """`layout_key` of a candidate; of a split one, its parts' keys (the shares may move)."""
    if c.split:
        return tuple(layout_key(p.est.pool, p.est.par) for p in c.est.parts)
    return layout_key(c.pool, c.est.par)


@dataclass(frozen=True)
class Hint:
    """A previous placement to warm-start from; `move_cost_s` is charged per role that changes
    its layout (`layout_key`) or its colocation group."""

    choice: dict[str, LayoutKey]  # role -> its layout_key
    groups: list[list[str]]
    move_cost_s: float = 0.0


class Unsolved(Exception):
    """No solution within the limits (infeasible, or the time limit hit before any solution)."""


# ------------------------------------------------------------------------------------ scoring
def slot_names(groups: list[list[str]]) -> dict[str, str]:
    return {r: "+".join(g) for g in groups for r in g}


# -------------------------------------------------------------------------------- host memory
def host_mb(res: Resolved, c: Candidate) -> tuple[int, int, int]:
    """(parked when its slot switches, held for the job: a host-stepped optimizer's state and
    streamed weights, parked states when it does not switch) host MB of
    candidate `c` over all its devices in its slot (a mixed rollout's: its part on the slot's
    pool)."""
    if alone(c) or res.device_of(c.pool).host_backed:
        return 0, 0, 0
    n, role, framework = slot_devices(c), c.est.role, res.job.profile.park_scheme
    mem, par = c.est.memory, c.est.par
    return (int(round(hostmem.parked_gb(mem, role, framework, res.job.sleep_level) * n * 1e3)),
            int(round(hostmem.held_gb(res, role, par) * n * 1e3)),
            int(round(hostmem.parked_states_gb(mem, role, par, framework) * n * 1e3)))


def alone(c: Candidate) -> bool:
    """A split that sits alone in its slot (a mixed one shares its slot: `Candidate.colocated`)."""
    return c.split and not c.colocated


def slot_devices(c: Candidate) -> int:
    """Devices `c` holds on its slot's pool: all of them, or a mixed rollout's shared part's."""
    return c.pool_devices().get(c.pool, c.devices)


def budget_mb(res: Resolved, pool: str) -> int | None:
    b = hostmem.park_budget_gb(res, pool)
    return None if b is None else max(int(b * 1e3), 0)


def keeps_groups(problem: Problem, a: Assignment) -> bool:
    """Whether a placement keeps every group of roles that must share a slot in one slot
    (`Pricer.colocated_roles`), each group that must run over one device set on one count
    (`Pricer.same_devices_roles`), and the roles kept apart in slots of their own
    (`keeps_apart`); a heuristic plan bounds the optimum only when it does."""
    return (all(len({a.slot_of[r] for r in g if r in a.slot_of}) <= 1
                for g in problem.px.colocated_roles())
            and all(len({a.choice[r].devices for r in g if r in a.choice}) <= 1
                    for g in problem.px.same_devices_roles())
            and keeps_apart(problem, a))


def keeps_apart(problem: Problem, a: Assignment) -> bool:
    """Whether a placement gives every role its framework keeps apart a slot of its own
    (`Pricer.apart_roles`: NeMo-RL's async policy and vLLM generation); a baseline or heuristic
    plan that does not is no placement the framework runs."""
    slots = [a.slot_of[r] for r in problem.px.apart_roles() if r in a.slot_of]
    return len(set(slots)) == len(slots)


def host_fits(problem: Problem, a: Assignment) -> bool:
    """Whether a placement keeps to the model's host-memory rule (`SlotMemory._host`): every slot
    whose members do not fit on its devices together parks all but its smallest member, plus
    its members' offloaded optimizer state, within `hostmem.park_budget_gb` per slot device
    (each member spread over the slot's devices, its largest member's count, as
    `hostmem.plan_nodes` counts it). A heuristic plan bounds the optimum only when it does."""
    res = problem.res
    slots: dict[str, list[Candidate]] = {}
    for r, c in a.choice.items():
        slots.setdefault(a.slot_of[r], []).append(c)
    for members in slots.values():
        pool = members[0].pool
        budget = budget_mb(res, pool)
        if len(members) < 2 or budget is None or res.device_of(pool).host_backed:
            continue
        mb = [host_mb(res, c) for c in members]
        rows = [(c.est.memory.total, optpark.parked_gb(c.est.memory, c.est.par)) for c in members]
        if optpark.slot_peak_gb(rows) <= res.device_of(pool).memory_gb:
            need = sum(k[2] + k[1] for k in mb)  # they fit together: only optimizers are parked
        else:
            need = sum(k[0] for k in mb) - min(k[0] for k in mb) + sum(k[1] for k in mb)
        if need > budget * max(slot_devices(c) for c in members):
            return False
    return True
