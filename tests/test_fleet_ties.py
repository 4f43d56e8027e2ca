"""The fleet allocation's canonical tie-break (`placer.fleet.allocmodel._lexmin`,
`canonical_levels`): among allocations of one objective and node count, CP-SAT returns whichever
its search meets first; each round and the final pick then take, job by job, the earliest
vector in sorted order, so the allocation does not move with the solver's workers or seed."""
from __future__ import annotations

from fleet_oracle import random_fleet
from ortools.sat.python import cp_model

from placer.fleet.alloc import Vec, allocate
from placer.fleet.allocmodel import _lexmin, canonical_levels


def test_the_levels_pick_each_jobs_earliest_vector_in_order() -> None:
    # three jobs, every combination allowed except the first job's earliest vector (in sorted
    # order) together with the second's: the lexicographic minimum is job 0's (0, 1), job 1's
    # (1, 1) (its earliest, (0, 1), is barred with it) and job 2's earliest, (0, 3), whatever
    # allocation the search starts from
    m = cp_model.CpModel()
    vecs: list[list[Vec]] = [[(1, 0), (0, 1), (2, 0)], [(1, 1), (0, 1)],
                             [(3, 0), (0, 3), (1, 2)]]
    x = [{a: m.new_bool_var(f"x{j}{i}") for i, a in enumerate(vs)} for j, vs in enumerate(vecs)]
    for xs in x:
        m.add_exactly_one(xs.values())
    m.add_bool_or([x[0][(0, 1)].Not(), x[1][(0, 1)].Not()])
    start: list[Vec] = [(2, 0), (1, 1), (3, 0)]
    for seed in (0, 3):
        got = _lexmin(m.clone(), x, canonical_levels(x), start, 5.0, 1, seed)
        assert got == [(0, 1), (1, 1), (0, 3)]


def test_a_tied_fleet_allocates_alike_for_any_workers_and_seed() -> None:
    # a fleet of twin jobs whose allocation, before the tie-break, moved with the solver's
    # settings (random_fleet(9, twins), makespan): two settings held 6 nodes, two held 5
    got = set()
    for workers, seed in ((1, 0), (1, 7), (2, 3), (2, 11)):
        pr, _ = random_fleet(9, "makespan", twins=True)
        a = allocate(pr, workers=workers, seed=seed)
        got.add((tuple(a.vectors), a.objective))
    assert len(got) == 1, got
