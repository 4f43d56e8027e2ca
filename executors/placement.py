"""From a plan's bundles to Ray placement groups and role actors, and a check that they landed.

One placement group per slot, its bundles in the plan's bundle order (stable: bundle k of a slot
is always the plan's k-th bundle of that slot, so a tensor-parallel group never moves between
runs). Strategy: STRICT_PACK when the plan puts all of a slot's bundles on one node (a TP group
must share a node), SPREAD for environment workers on CPU pools, PACK otherwise. Every bundle also
asks for its plan node's key (`cluster.node_key`), so it can only land on that node.

Actors per role: the actor (trainer) role gets one actor per device of its layout (dp x tp x pp,
`executors.trainer`), the rollout and reference roles one per data-parallel rank, the others one
each, environments one per bundle. A role's ranks are laid over its slot's bundles in
order; roles that share a slot (colocation) share a bundle's resources in equal parts.

A role split over pools (`placer.cost.split`: a rollout whose engines run on several device types)
sits alone in its slot, whose bundles come part by part (`placer.solve.mapping`: each part's devices,
one bundle per node of the part's pool). Its ranks run part by part too: part i's `dp` engine
replicas get the ranks after part i-1's, each in the bundle holding its first device (replica k
of a part with tensor parallelism t starts at the part's device k * t), so every engine sits on
its own part's pool with that pool's resources (`Member.part`).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from executors.cluster import node_key
from placer.base.roles import Role
from placer.solve.moves import role_counts
from placer.solve.planfile import Bundle, Plan


class PlacementError(RuntimeError):
    """An actor is not where the plan says."""


@dataclass
class Member:
    role: str
    rank: int
    slot: str
    bundle: Bundle
    bundle_pos: int  # index of the bundle inside its slot's placement group
    sharers: int = 1
    part: int | None = None  # index in the role's `parts` when the role is split over pools
    handle: Any = None
    where: dict[str, Any] = field(default_factory=dict)

    @property
    def device_ids(self) -> list[str]:
        return [f"{self.bundle.pool}:{self.bundle.node}:{d}" for d in self.bundle.devices]

    @property
    def trace_pid(self) -> str:
        return f"{self.bundle.pool}:{self.bundle.node}"


def slot_bundles(plan: Plan) -> dict[str, list[Bundle]]:
    by: dict[str, list[Bundle]] = defaultdict(list)
    for b in sorted(plan.bundles, key=lambda b: b.index):
        by[b.slot].append(b)
    return dict(by)


def member_counts(plan: Plan) -> dict[str, int]:
    """Actors per role: `placer.solve.moves.role_counts`, but training runs one process per device
    of its layout (its TP ranks are processes of one torch.distributed group), and a split role
    runs every part's replicas."""
    counts = role_counts(plan)
    actor = plan.roles.get(Role.ACTOR)
    if actor is not None and Role.ACTOR in counts:
        counts[Role.ACTOR] *= actor.tp * actor.pp
    for role, r in plan.roles.items():
        if r.parts:
            counts[role] = sum(p.dp for p in r.parts)
    return counts


def part_bundles(plan: Plan, role: str) -> list[list[tuple[int, Bundle]]]:
    """Per part of a split role, its (position in the slot's group, bundle) pairs: the slot's
    bundles in order, each part taking its own device count; PlacementError when they do not
    match the parts (another pool, too few or too many devices)."""
    r = plan.roles[role]
    bs = list(enumerate(slot_bundles(plan).get(r.slot, [])))
    out: list[list[tuple[int, Bundle]]] = []
    for i, p in enumerate(r.parts):
        got, have = [], 0
        while have < p.devices and bs and bs[0][1].pool == p.pool:
            got.append(bs.pop(0))
            have += len(got[-1][1].devices)
        if have != p.devices:
            raise PlacementError(f"roles.{role}.parts.{i}: {p.devices} device(s) of pool {p.pool}"
                                 f", but slot {r.slot}'s bundles give it {have} there")
        out.append(got)
    if bs:
        raise PlacementError(f"slot {r.slot} of split role {role} has bundles beyond its parts "
                             f"(first: pool {bs[0][1].pool} node {bs[0][1].node})")
    return out


def _split_members(plan: Plan, role: str) -> list[Member]:
    """A split role's ranks, part by part (see the module docstring)."""
    r, members, rank = plan.roles[role], [], 0
    for i, (p, bs) in enumerate(zip(r.parts, part_bundles(plan, role))):
        per = p.tp * p.pp  # devices of one engine replica
        starts = [0]
        for _, b in bs:
            starts.append(starts[-1] + len(b.devices))
        for k in range(p.dp):
            first = min(k * per, p.devices - 1)
            pos, b = bs[max(j for j in range(len(bs)) if starts[j] <= first)]
            members.append(Member(role, rank, r.slot, b, pos, part=i))
            rank += 1
    return members


def assign(plan: Plan) -> list[Member]:
    """Every role rank with the bundle it runs in."""
    bundles = slot_bundles(plan)
    members = []
    for role, n in member_counts(plan).items():
        if plan.roles[role].parts:
            members += _split_members(plan, role)
            continue
        slot = plan.roles[role].slot
        bs = bundles.get(slot)
        if not bs:
            raise PlacementError(f"slot {slot} of role {role} has no bundles in the plan")
        for rank in range(n):
            pos = rank * len(bs) // n
            members.append(Member(role, rank, slot, bs[pos], pos))
    count: dict[int, int] = defaultdict(int)
    for m in members:
        count[m.bundle.index] += 1
    for m in members:
        m.sharers = count[m.bundle.index]
    return members


def strategy(plan: Plan, slot: str, bundles: list[Bundle]) -> str:
    roles = next(s.roles for s in plan.slots if s.name == slot)
    kinds = {plan.resolved().device_of(bundles[0].pool).kind.value}
    if "environment" in roles and kinds == {"cpu"}:
        return "SPREAD"
    # node numbers count within a pool: a split role's bundles on node 0 of two pools are on
    # two machines
    return "STRICT_PACK" if len({(b.pool, b.node) for b in bundles}) == 1 else "PACK"


def bundle_request(b: Bundle, pinned: bool) -> dict[str, float]:
    req = dict(b.resources)
    if pinned:
        req[node_key(b.pool, b.node)] = 1.0
    return req


def _share(amount: float, k: int) -> float:
    """Ray takes fractions only below 1 (above, whole units) and counts in 1e-4 steps: round
    down, or k shares of a bundle could add up to more than the bundle and never schedule."""
    s = amount / k
    return math.floor(s * 1e4) / 1e4 if s <= 1 else float(math.floor(s))


def _gpu_share(gpus: float, k: int) -> float:
    """Ray hands out GPUs as unit instances and a fraction must fit inside one GPU: k sharers
    of g GPUs take g//k each, or, when more sharers than GPUs, 1/ceil(k/g) of one GPU each."""
    g = int(gpus)
    if k <= g:
        return float(g // k)
    return math.floor(1e4 / math.ceil(k / max(g, 1))) / 1e4


def actor_options(m: Member, pg: Any, pinned: bool) -> dict[str, Any]:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # lazy: Ray run only
    req = {k: _gpu_share(v, m.sharers) if k == "GPU" else _share(v, m.sharers)
           for k, v in bundle_request(m.bundle, pinned).items()}
    opts: dict[str, Any] = {"num_cpus": req.pop("CPU", 0.0), "num_gpus": req.pop("GPU", 0.0),
                            "resources": req,
                            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                                pg, placement_group_bundle_index=m.bundle_pos)}
    return opts


def create_groups(plan: Plan, pinned: bool, timeout_s: float = 120.0,
                  skip: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """One ready placement group per slot (but the `skip` slots: a rebuild keeps their groups)."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
    from ray.util.placement_group import placement_group  # lazy: Ray run only
    groups = {}
    for slot, bs in slot_bundles(plan).items():
        if slot in skip:
            continue
        pg = placement_group([bundle_request(b, pinned) for b in bs],
                             strategy=strategy(plan, slot, bs), name=f"placer-{slot}")
        groups[slot] = pg
    for slot, pg in groups.items():
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise PlacementError(f"placement group for slot {slot} not ready after {timeout_s:.0f}s:"
                                 f" the cluster lacks {[b.resources for b in slot_bundles(plan)[slot]]}"
                                 ) from None
    return groups


def verify(plan: Plan, members: list[Member], groups: dict[str, Any]) -> list[dict[str, Any]]:
    """Each actor's node has its plan node's key, and it holds its own bundle of its slot's group."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
    wheres = ray.get([m.handle.where.remote() for m in members])
    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n.get("Alive")}
    rows = []
    for m, w in zip(members, wheres):
        m.where = w
        pg_hex = groups[m.slot].id.hex()
        key = node_key(m.bundle.pool, m.bundle.node)
        on_node = key in nodes.get(w.get("node_id"), {})
        table = ray.util.placement_group_table(groups[m.slot])
        bundle_node = table.get("bundles_to_node_id", {}).get(m.bundle_pos)
        in_bundle = w.get("placement_group") == pg_hex and bundle_node == w.get("node_id")
        rows.append({"role": m.role, "rank": m.rank, "slot": m.slot, "bundle": m.bundle.index,
                     "pool": m.bundle.pool, "node": m.bundle.node, "ray_node": w.get("node_id"),
                     "pid": w.get("pid"), "on_plan_node": on_node, "in_bundle": in_bundle,
                     **({"part": m.part} if m.part is not None else {})})
    return rows


def check(rows: list[dict[str, Any]], pinned: bool) -> None:
    bad = [r for r in rows if not r["in_bundle"] or (pinned and not r["on_plan_node"])]
    if bad:
        r = bad[0]
        raise PlacementError(f"{r['role']}[{r['rank']}] is not on {r['pool']}:{r['node']} bundle "
                             f"{r['bundle']} as the plan says ({len(bad)} actor(s) misplaced)")
