"""Where every actor of a plan sits: its role's ranks laid over its slot's bundles (`Seat`).

Actors per role (`executors.runplan.actor_counts`): the actor (trainer) role gets one actor per
device of its layout (dp x cp x tp x pp, `executors.trainer`), the rollout and reference roles one
per data-parallel rank, a critic with context parallelism one per CP rank (`executors.critic`),
the others one each, environments one per bundle. A role's ranks are
laid over its slot's bundles in order; roles that share a slot (colocation) share a bundle's
resources in equal parts (`Seat.sharers`).

A role split over pools (`placer.cost.split`: a rollout whose engines run on several device
types) sits alone in its slot, whose bundles come part by part (`placer.solve.mapping`: each
part's devices, one bundle per node of the part's pool). Its ranks run part by part too: part
i's `dp` engine replicas get the ranks after part i-1's, each in the bundle holding its first
device (replica k of a part with tensor parallelism t starts at the part's device k * t), so
every engine sits on its own part's pool with that pool's resources (`Seat.part`).

A mixed rollout (`placer.cost.split.colocated`) shares its slot with other roles (the actor's,
in sync mode): the slot's bundles on its first part's pool hold the larger of that part's and
the other roles' devices (`placer.solve.assemble.slot_plans`). The other roles sit on those
bundles alone, and the rollout's first part takes all of them (its engines from the first
device on, beside the trainer's ranks); its other parts take the bundles on their own pools.

The placement group of a slot (`strategy`): STRICT_PACK when all its bundles are on one node
(a TP group must share a node), SPREAD for environment workers on CPU pools, PACK otherwise.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.solve.planfile import Bundle, RolePlacement


@dataclass(frozen=True)
class Seat:
    """One actor of a role and the bundle it runs in."""

    role: str
    rank: int
    slot: str
    bundle: Bundle
    bundle_pos: int  # index of the bundle inside its slot's placement group
    sharers: int = 1  # actors in the same bundle (colocation): they share its resources
    part: int | None = None  # index in the role's `parts` when the role is split over pools


def part_bundles(role: str, r: RolePlacement, bundles: Sequence[Bundle], mixed: bool = False
                 ) -> list[list[tuple[int, Bundle]]]:
    """Per part of split role `role` (`r`), its (position in the slot's group, bundle) pairs:
    the slot's `bundles` in order, each part taking its own device count; SpecError when they
    do not match the parts (another pool, too few or too many devices). `mixed`: the role
    shares its slot (a mixed rollout), and its first part takes every leading bundle on its
    pool, which may hold more devices than it uses (the other roles' there)."""
    bs = list(enumerate(bundles))
    out: list[list[tuple[int, Bundle]]] = []
    for i, p in enumerate(r.parts):
        got, have = [], 0
        while (have < p.devices or (mixed and i == 0)) and bs and bs[0][1].pool == p.pool:
            got.append(bs.pop(0))
            have += len(got[-1][1].devices)
        if have != p.devices and not (mixed and i == 0 and have > p.devices):
            raise SpecError(f"plan: roles.{role}.parts.{i}: {p.devices} device(s) of pool "
                            f"{p.pool}, but slot {r.slot}'s bundles give it {have} there")
        out.append(got)
    if bs:
        raise SpecError(f"plan: slot {r.slot} of split role {role} has bundles beyond its parts "
                        f"(first: pool {bs[0][1].pool} node {bs[0][1].node})")
    return out


# (role, rank, slot, bundle, position in the slot's group, part)
_Rank = tuple[str, int, str, Bundle, int, "int | None"]


def _split_ranks(role: str, r: RolePlacement, parts: list[list[tuple[int, Bundle]]]
                 ) -> list[_Rank]:
    """A split role's ranks, part by part (see the module docstring)."""
    rank = 0
    out: list[_Rank] = []
    for i, (p, bs) in enumerate(zip(r.parts, parts)):
        per = p.tp * p.pp  # devices of one engine replica
        starts = [0]
        for _, b in bs:
            starts.append(starts[-1] + len(b.devices))
        for k in range(p.dp):
            first = min(k * per, p.devices - 1)
            pos, b = bs[max(j for j in range(len(bs)) if starts[j] <= first)]
            out.append((role, rank, r.slot, b, pos, i))
            rank += 1
    return out


def place(roles: Mapping[str, RolePlacement], slot_bundles: Mapping[str, Sequence[Bundle]],
          counts: Mapping[str, int]
          ) -> tuple[tuple[Seat, ...], dict[str, tuple[tuple[int, ...], ...]]]:
    """Every rank of each role (`counts` of them) with the bundle it runs in; and per split
    role, each part's bundle positions. SpecError when a role's slot has no bundles, or a split
    role's do not match its parts."""
    ranks: list[_Rank] = []
    split: dict[str, tuple[tuple[int, ...], ...]] = {}
    mixed = _mixed_slots(roles, counts)
    for role, n in counts.items():
        slot = roles[role].slot
        bs = list(slot_bundles.get(slot, []))
        if roles[role].parts:
            parts = part_bundles(role, roles[role], bs, slot in mixed)
            split[role] = tuple(tuple(pos for pos, _ in got) for got in parts)
            ranks += _split_ranks(role, roles[role], parts)
            continue
        if slot in mixed and bs:  # beside a mixed rollout: on its first part's pool only
            bs = [b for b in bs if b.pool == bs[0].pool]
        if not bs:
            raise SpecError(f"plan: slot {slot} of role {role} has no bundles in the plan")
        ranks += [(role, rank, slot, bs[rank * len(bs) // n], rank * len(bs) // n, None)
                  for rank in range(n)]
    sharers: dict[int, int] = defaultdict(int)
    for r in ranks:
        sharers[r[3].index] += 1
    seats = tuple(Seat(role, rank, slot, b, pos, sharers[b.index], part)
                  for role, rank, slot, b, pos, part in ranks)
    return seats, split


def _mixed_slots(roles: Mapping[str, RolePlacement], counts: Mapping[str, int]) -> set[str]:
    """The slots where a role split over pools shares its slot with another role (a mixed
    rollout)."""
    placed = [name for name in counts if name in roles]
    return {roles[a].slot for a in placed if roles[a].parts
            and any(roles[b].slot == roles[a].slot for b in placed if b != a)}


def strategy(roles: Sequence[str], bundles: Sequence[Bundle], kinds: Mapping[str, str]) -> str:
    """The placement group strategy of a slot (see the module docstring); `kinds`: pool ->
    device kind."""
    if Role.ENVIRONMENT in roles and kinds[bundles[0].pool] == "cpu":
        return "SPREAD"
    # node numbers count within a pool: a split role's bundles on node 0 of two pools are on
    # two machines
    return "STRICT_PACK" if len({(b.pool, b.node) for b in bundles}) == 1 else "PACK"
