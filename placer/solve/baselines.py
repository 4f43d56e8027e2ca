"""Baselines: how placements are chosen today, on the same cost table and the same `assemble`.

All of them work on the cluster's *training pool* (the training-capable GPU pool with the most
compute), as today's frameworks assume one homogeneous GPU pool; roles that cannot run there
(environments, rule rewards) go to their fastest pool, all such roles of a pool sharing one slot.

  colocated   every GPU role time-shares the training pool in one slot, each with its fastest
              config there (verl/OpenRLHF's hybrid engine, "colocate all").
  split       rollout engines on their own `ratio` share of the pool, every other GPU role
              colocated on the rest (fastest configs that fit each share).
  enumerate   HybridFlow's auto-mapping: every grouping of the GPU roles into colocated sets x every
              allocation of the pool's devices to the sets (candidate device counts, summing to at
              most the pool) x each role's fastest config within its set's allocation, scored
              analytically with `timing.iteration_time`; the best is kept. Homogeneous: it never
              looks at the other pools.
  hybridflow-split  HybridFlow's (verl's) common split placement: actor, rollout and reference
              colocated on one device set, critic and reward models on another, the pool's devices
              divided between the two sets by the best allocation (same scoring as `enumerate`).
              Needs a critic or reward model on the pool; without one it is `colocated`, and it
              is reported as not applicable rather than twice.
  standalone  HybridFlow's standalone placement: every GPU role on its own devices (no sharing),
              the best allocation of the pool's devices to the roles; not applicable when the
              pool cannot give every role its smallest configuration.
  current     the placement the job runs today (`job.current`, recorded by `placer import`),
              only when the job has one (`placer.solve.current`).

Each returns an `Assignment` (or None when it cannot place the job), so the ILP's search space
contains every baseline plan: the ILP can only be as good or better. A placement whose switching
slots park more than their nodes' host RAM holds (`problem.host_fits`) is no placement: the searching
baselines skip it, and a fixed rule (`colocated`, `split`) that leads to one cannot place the job;
nor can one that shares a slot between roles the framework keeps apart (`problem.keeps_apart`).
Baselines place every role on one pool: a candidate split over pools (`placer.cost.split`, pool
"a+b") is never chosen (`_fastest` skips them; the others match a real pool's name, which a split
candidate's never is).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator

from placer.base.roles import Role
from placer.solve.candidates import Candidate
from placer.solve.ilp_bound import score
from placer.solve.problem import Assignment, Problem, host_fits, keeps_apart, slot_names
from placer.spec.hardware import DeviceKind

BASELINES = ("colocated", "split", "enumerate", "hybridflow-split", "standalone")
HYBRID_FIRST = (Role.ACTOR, Role.ROLLOUT, Role.REFERENCE)  # hybridflow-split's first device set
SPLIT_RATIO = 0.5  # share of the training pool given to rollout engines in `split`
ENUMERATE_LIMIT = 2_000_000  # scored placements before `enumerate` gives up (it says so)


def training_pool(problem: Problem) -> str | None:
    """The training-capable GPU pool with the most peak compute."""
    res = problem.res
    pools = [p for p in res.cluster.pools
             if res.device_of(p).kind is DeviceKind.gpu and res.device_of(p).can_train]
    if not pools:
        return None
    return max(pools, key=lambda p: res.device_of(p).bf16_tflops * p.devices_per_node * p.nodes).name


def _fastest(cands: list[Candidate], pool: str | None = None, limit: int | None = None
             ) -> Candidate | None:
    """The fastest single-pool candidate (on `pool`, within `limit` devices): a baseline places
    every role on one pool, as today's frameworks do, so split candidates are never picked."""
    ok = [c for c in cands if not c.split and (pool is None or c.pool == pool)
          and (limit is None or c.devices <= limit)]
    return min(ok, key=lambda c: (c.time_s, c.devices), default=None)


def _complete(choice: dict[str, Candidate | None]) -> dict[str, Candidate] | None:
    """`choice` when every role has a candidate, else None."""
    found = {r: c for r, c in choice.items() if c is not None}
    return found if len(found) == len(choice) else None


def _elsewhere(problem: Problem, roles: list[str]) -> tuple[dict[str, Candidate], list[list[str]]]:
    """Roles that cannot use the training pool: fastest config anywhere, one slot per pool."""
    choice: dict[str, Candidate] = {}
    by_pool: dict[str, list[str]] = {}
    for r in roles:
        c = _fastest(problem.cands[r])
        assert c is not None  # build_problem guarantees a candidate per role
        choice[r] = c
        by_pool.setdefault(c.pool, []).append(r)
    return choice, list(by_pool.values())


def _split_roles(problem: Problem, pool: str) -> tuple[list[str], list[str]]:
    on = [r for r in problem.roles if any(c.pool == pool for c in problem.cands[r])]
    return on, [r for r in problem.roles if r not in on]


def _finish(problem: Problem, choice: dict[str, Candidate], groups: list[list[str]],
            rest: list[str]) -> Assignment:
    other, other_groups = _elsewhere(problem, rest)
    order = problem.roles
    all_groups = [sorted(g, key=order.index) for g in groups + other_groups if g]
    return Assignment({r: {**choice, **other}[r] for r in order}, slot_names(all_groups))


def colocated(problem: Problem) -> Assignment | None:
    pool = training_pool(problem)
    if pool is None:
        return None
    on, rest = _split_roles(problem, pool)
    choice = _complete({r: _fastest(problem.cands[r], pool) for r in on})
    assert choice is not None, "every role in `on` has a candidate on the pool"
    return _finish(problem, choice, [on], rest)


def split(problem: Problem, ratio: float = SPLIT_RATIO) -> Assignment | None:
    pool = training_pool(problem)
    if pool is None:
        return None
    on, rest = _split_roles(problem, pool)
    if Role.ROLLOUT not in on or len(on) < 2:
        return None
    cap = problem.capacity()[pool]
    roll = _fastest(problem.cands[Role.ROLLOUT], pool, max(int(cap * ratio), 1))
    if roll is None:
        return None
    others = [r for r in on if r != Role.ROLLOUT]
    choice = _complete({r: _fastest(problem.cands[r], pool, cap - roll.devices) for r in others})
    if choice is None:
        return None
    return _finish(problem, {**choice, Role.ROLLOUT: roll}, [[Role.ROLLOUT], others], rest)


def partitions(items: list[str]) -> Iterator[list[list[str]]]:
    """Every set partition (Bell number many: 15 for four roles, 52 for five)."""
    if not items:
        yield []
        return
    head, tail = items[0], items[1:]
    for part in partitions(tail):
        yield [[head], *part]
        for i in range(len(part)):
            yield [*part[:i], [head, *part[i]], *part[i + 1:]]


def _best_grouping(problem: Problem, groupings: Iterable[list[list[str]]]) -> Assignment | None:
    """The best-scoring placement over `groupings` (each a list of colocated role sets on the
    training pool) x every allocation of the pool's devices to the sets x each role's fastest
    config within its set's allocation (see `enumerate` in the module doc)."""
    pool = training_pool(problem)
    if pool is None:
        return None
    on, rest = _split_roles(problem, pool)
    cap = problem.capacity()[pool]
    best, best_val, scored = None, float("inf"), 0
    key = 0 if problem.objective == "time" else 1
    counts = sorted({c.devices for r in on for c in problem.cands[r] if c.pool == pool})
    under = {(r, n): _fastest(problem.cands[r], pool, n) for r in on for n in counts}
    for groups in groupings:
        sizes = [sorted({c.devices for r in g for c in problem.cands[r] if c.pool == pool})
                 for g in groups]
        for alloc in itertools.product(*sizes):
            if sum(alloc) > cap:
                continue
            choice = _complete({r: under[r, n] for g, n in zip(groups, alloc) for r in g})
            if choice is None:
                continue
            if any(max(choice[r].devices for r in g) != n for g, n in zip(groups, alloc)):
                continue  # the same choices under a smaller allocation: scored there
            a = _finish(problem, choice, groups, rest)
            if not host_fits(problem, a):
                continue  # its switching slots park more than a node's host RAM holds
            val = score(problem, a)[key]
            scored += 1
            if val < best_val:
                best, best_val = a, val
            if scored >= ENUMERATE_LIMIT:
                return best
    return best


def _on_pool(problem: Problem) -> list[str]:
    pool = training_pool(problem)
    return [] if pool is None else _split_roles(problem, pool)[0]


def enumerate_best(problem: Problem) -> Assignment | None:
    return _best_grouping(problem, partitions(_on_pool(problem)))


def hybridflow_split(problem: Problem) -> Assignment | None:
    on = _on_pool(problem)
    first = [r for r in on if r in HYBRID_FIRST]
    second = [r for r in on if r not in HYBRID_FIRST]
    if Role.ROLLOUT not in first or not second:
        return None  # nothing to split off: that plan is `colocated`
    return _best_grouping(problem, [[first, second]])


def standalone(problem: Problem) -> Assignment | None:
    on = _on_pool(problem)
    if len(on) < 2:
        return None  # one role on the pool: that plan is `colocated`
    return _best_grouping(problem, [[[r] for r in on]])


def baseline_assignments(problem: Problem) -> dict[str, Assignment | None]:
    """Every baseline by name (BASELINES order); None where it cannot place the job."""
    made = {name: a if a is None or (host_fits(problem, a) and keeps_apart(problem, a)) else None
            for name, fn in REGISTRY.items() for a in [fn(problem)]}
    out = {name: made[name] for name in BASELINES}
    if problem.res.job.current is not None:  # the run the job was imported from (placer import)
        from placer.solve.current import current_assignment
        out["current"] = current_assignment(problem)
    return out


# name -> baseline; `compare` and the what-if workflow run them all
REGISTRY: dict[str, Callable[[Problem], Assignment | None]] = {
    "colocated": colocated, "split": split, "enumerate": enumerate_best,
    "hybridflow-split": hybridflow_split, "standalone": standalone}
