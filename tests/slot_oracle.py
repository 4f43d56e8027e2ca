"""A brute-force oracle for the placement ILP: every candidate choice x every grouping of the
roles into slots that the ILP's rules allow, written out here on their own (not through the
CP-SAT model): a slot on one pool; a split role alone in its slot and a mixed one sharing its
slot; each pool's slots within its devices; the groups a framework keeps in one slot
(`Pricer.colocated_roles`) kept, and those it runs over one device set
(`Pricer.same_devices_roles`) on one count; scored by the rule the ILP minimises
(`placer.solve.ilp_bound.score`)."""
from __future__ import annotations

import itertools

from placer.solve.baselines import partitions
from placer.solve.candidates import Candidate
from placer.solve.ilp_bound import score
from placer.solve.problem import Assignment, Problem, slot_names


def brute_force(problem: Problem) -> float:
    """Best objective (time, or cost per sample) over every allowed placement."""
    key = 0 if problem.objective == "time" else 1
    best = float("inf")
    roles = problem.roles
    for combo in itertools.product(*(problem.cands[r] for r in roles)):
        choice = dict(zip(roles, combo))
        if not _same_counts(problem, choice):
            continue
        for groups in partitions(roles):
            if _allowed(problem, choice, groups):
                best = min(best, score(problem, Assignment(choice, slot_names(groups)))[key])
    return best


def _same_counts(problem: Problem, choice: dict[str, Candidate]) -> bool:
    return all(len({choice[r].devices for r in g if r in choice}) <= 1
               for g in problem.px.same_devices_roles())


def _allowed(problem: Problem, choice: dict[str, Candidate], groups: list[list[str]]) -> bool:
    if any(len({choice[r].pool for r in g}) > 1 for g in groups):
        return False  # a slot is on one pool
    if any(len(g) > 1 and any(choice[r].split and not choice[r].colocated for r in g)
           for g in groups):
        return False  # a split role sits alone
    if any(len(g) == 1 and choice[g[0]].colocated for g in groups):
        return False  # a mixed rollout shares its slot
    slot = slot_names(groups)
    if any(len({slot[r] for r in g if r in slot}) > 1 for g in problem.px.colocated_roles()):
        return False
    used: dict[str, int] = {}
    for g in groups:
        for pool in {p for r in g for p in choice[r].pool_devices()}:
            used[pool] = used.get(pool, 0) + max(choice[r].pool_devices().get(pool, 0) for r in g)
    cap = problem.capacity()
    return all(n <= cap[p] for p, n in used.items())
