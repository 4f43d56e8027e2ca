"""Mapping slots onto concrete nodes and devices, and the network topology they sit in.

Topology (networkx): every node `pool:i` hangs off its rack switch `pool/rack:r` with the node's
NIC bandwidth (devices x per-device NIC, capped by `cross_pool_gbs` when the topology sets one);
racks hang off one spine with `topology.spine_gbs`. Path bandwidth is the narrowest edge on the
path. Only the nodes a plan uses are built: identical unused nodes add nothing.

Mapping rules (the ILP counts devices per pool; this second, small problem names them):
  * slots are packed largest first (first-fit decreasing): a slot takes whole free nodes for its
    whole-node part and the best-fitting node for the rest; since candidate device counts are
    powers of two or node multiples, this never fragments a pool whose node size is a power of two;
  * a remainder that no single node can hold is split across nodes in whole tensor-parallel groups
    (LPU replicas and CPU work have no such group, so any split works), so a TP group never
    straddles two nodes; each bundle records its group id;
  * environment slots on CPU pools are spread round-robin over the most-free nodes, one bundle per
    node, so tool calls never pile onto one host;
  * weight-sync routes: every rollout node pulls from the actor node with the widest path to it
    (the same node, then the same rack, then across the spine).
"""
from __future__ import annotations

from collections import defaultdict

import networkx as nx

from placer.base.errors import SpecError
from placer.base.roles import Role, is_training
from placer.solve.planfile import Bundle, RolePlacement, SlotPlan, SyncRoute
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind, DeviceType

SPINE = "spine"


def topology(res: Resolved, nodes_used: dict[str, set[int]] | None = None) -> nx.Graph:
    """The cluster's graph; with `nodes_used`, only those nodes (identical others add nothing)."""
    g = nx.Graph()
    g.add_node(SPINE, kind="switch")
    topo = res.cluster.topology
    for pool in res.cluster.pools:
        idx = sorted(nodes_used.get(pool.name, ())) if nodes_used is not None else range(pool.nodes)
        for i in idx:
            rack = rack_of(res, pool.name, i)
            if rack not in g:
                g.add_node(rack, kind="switch")
                g.add_edge(rack, SPINE, gbs=topo.spine_gbs)
            g.add_node(f"{pool.name}:{i}", kind="node", pool=pool.name)
            g.add_edge(f"{pool.name}:{i}", rack, gbs=node_bandwidth(res, pool.name))
    return g


def node_bandwidth(res: Resolved, pool_name: str) -> float:
    pool = res.cluster.pool(pool_name)
    bw = res.device_of(pool).nic_gbs * pool.devices_per_node
    cross = res.cluster.topology.cross_pool_gbs
    return min(bw, cross) if cross is not None else bw


def rack_of(res: Resolved, pool_name: str, node: int) -> str:
    return f"{pool_name}/rack:{node // res.cluster.pool(pool_name).nodes_per_rack}"


def path_bandwidth(g: nx.Graph, src: str, dst: str) -> tuple[float, list[str]]:
    """Bandwidth (GB/s) of the shortest path (the narrowest edge on it) and its hops."""
    if src == dst:
        return float("inf"), [src]
    path = nx.shortest_path(g, src, dst)
    return min(g.edges[a, b]["gbs"] for a, b in zip(path, path[1:])), path


# The Ray resource each device kind is counted in; a CPU device is a node's cores (`cores`).
RAY_RESOURCE = {DeviceKind.gpu: "GPU", DeviceKind.lpu: "LPU", DeviceKind.cpu: "CPU"}


def device_resources(dev: DeviceType, n: int) -> dict[str, float]:
    """The Ray resource `n` devices of type `dev` are: GPUs, LPUs, or CPU cores. One table for
    the plan's bundles (here) and the nodes the executor advertises (`executors.cluster`)."""
    amount = n * dev.cores if dev.kind is DeviceKind.cpu else n
    return {RAY_RESOURCE[dev.kind]: float(amount)}


def _bundle_resources(res: Resolved, pool_name: str, n: int) -> dict[str, float]:
    return {**device_resources(res.device_of(pool_name), n), f"pool_{pool_name}": float(n)}


def _group_unit(res: Resolved, slot: SlotPlan, roles: dict[str, RolePlacement]) -> int:
    """Devices that must share a node: the largest TP degree of the slot's roles (GPUs only)."""
    if res.device_of(slot.pool).kind is not DeviceKind.gpu:
        return 1
    per = res.cluster.pool(slot.pool).devices_per_node
    tp = max((roles[r].tp for r in slot.roles if r in roles), default=1)
    return min(tp, per)


def map_to_nodes(res: Resolved, slots: list[SlotPlan], roles: dict[str, RolePlacement]
                 ) -> tuple[list[SlotPlan], list[Bundle], list[SyncRoute]]:
    """Give every slot nodes and devices; return slots (with nodes), bundles and sync routes.
    A split role's slot is mapped part by part, each on its own pool (a mixed rollout's first
    part with the slot's other roles, in groups of their largest TP)."""
    free: dict[str, list[int]] = {p.name: [p.devices_per_node] * p.nodes for p in res.cluster.pools}
    order = sorted(slots, key=lambda s: (-s.devices, not any(map(is_training, s.roles)),
                                         s.name))
    bundles: list[Bundle] = []
    placed: dict[str, SlotPlan] = {}
    for slot in order:
        if not slot.parts:
            nodes = _place(res, slot, slot.pool, slot.devices, _group_unit(res, slot, roles),
                           free, bundles)
            placed[slot.name] = slot.model_copy(update={"nodes": nodes})
            continue
        # the slot's split role (a mixed rollout shares the first part's pool with the others)
        role = next(roles[r] for r in slot.roles if r in roles and roles[r].parts)
        parts = []
        for i, (sp, rp) in enumerate(zip(slot.parts, role.parts)):
            tp = max([rp.tp] + ([roles[r].tp for r in slot.roles if r in roles
                                 and not roles[r].parts] if i == 0 else []))
            unit = (min(tp, res.cluster.pool(sp.pool).devices_per_node)
                    if res.device_of(sp.pool).kind is DeviceKind.gpu else 1)
            nodes = _place(res, slot, sp.pool, sp.devices, unit, free, bundles)
            parts.append(sp.model_copy(update={"nodes": nodes}))
        placed[slot.name] = slot.model_copy(update={"nodes": parts[0].nodes, "parts": parts})
    out_slots = [placed[s.name] for s in slots]
    return out_slots, bundles, _sync_routes(res, out_slots, roles)


def _place(res: Resolved, slot: SlotPlan, pool: str, devices: int, unit: int,
           free: dict[str, list[int]], bundles: list[Bundle]) -> list[int]:
    """Take `devices` of `pool` for `slot` (appending its bundles); the nodes used."""
    per = res.cluster.pool(pool).devices_per_node
    spread = Role.ENVIRONMENT in slot.roles and res.device_of(pool).kind is DeviceKind.cpu
    pieces = (_spread(free[pool], devices) if spread else _pack(free[pool], devices, per, unit))
    if pieces is None:
        raise SpecError(f"slots.{slot.name}: pool {pool} has no room left for "
                        f"{devices} devices in groups of {unit}")
    tag = f"{slot.name}/{pool}" if slot.parts else slot.name
    nodes = []
    for node, size in pieces:
        start = per - free[pool][node]
        free[pool][node] -= size
        bundles.append(Bundle(index=len(bundles), slot=slot.name, pool=pool, node=node,
                              devices=list(range(start, start + size)),
                              resources=_bundle_resources(res, pool, size),
                              group=f"{tag}/tp{unit}@{node}"))
        nodes.append(node)
    return nodes


def _pack(free: list[int], devices: int, per: int, unit: int) -> list[tuple[int, int]] | None:
    """(node, devices) pieces: whole empty nodes first, then best fit, then TP-group splits."""
    full, rest = divmod(devices, per)
    empty = [i for i, f in enumerate(free) if f == per]
    if len(empty) < full:
        return None
    pieces = [(i, per) for i in empty[:full]]
    taken = {i for i, _ in pieces}
    if rest:
        fits = [(free[i], i) for i in range(len(free)) if i not in taken and free[i] >= rest]
        if fits:
            pieces.append((min(fits)[1], rest))
        else:
            left = rest
            for i in range(len(free)):
                if i in taken or left == 0:
                    continue
                take = min(left, free[i] // unit * unit)
                if take:
                    pieces.append((i, take))
                    left -= take
            if left:
                return None
    return pieces


def _spread(free: list[int], devices: int) -> list[tuple[int, int]] | None:
    """Round-robin over the nodes with the most free devices: one bundle per node."""
    if sum(free) < devices:
        return None
    share: dict[int, int] = defaultdict(int)
    left = list(free)
    for _ in range(devices):
        i = max(range(len(left)), key=lambda k: (left[k], -k))
        share[i] += 1
        left[i] -= 1
    return sorted(share.items())


def _sync_routes(res: Resolved, slots: list[SlotPlan], roles: dict[str, RolePlacement]
                 ) -> list[SyncRoute]:
    """Each rollout node pulls the weights from the actor node with the widest path to it; a
    multi-agent job's every trained agent from its own actor (`AGENT.actor` -> `AGENT.rollout`)."""
    pairs = ([(Role.ACTOR.value, Role.ROLLOUT.value)] if res.job.agents is None else
             [(f"{a}.{Role.ACTOR}", f"{a}.{Role.ROLLOUT}") for a in res.job.agents.members])
    return [route for actor, rollout in pairs if actor in roles and rollout in roles
            for route in _pair_routes(res, slots, roles, actor, rollout)]


def _pair_routes(res: Resolved, slots: list[SlotPlan], roles: dict[str, RolePlacement],
                 actor: str, rollout: str) -> list[SyncRoute]:
    by_name = {s.name: s for s in slots}
    a, r = by_name[roles[actor].slot], by_name[roles[rollout].slot]
    used: dict[str, set[int]] = defaultdict(set)
    used[a.pool].update(a.nodes)
    targets = [(p.pool, p.nodes) for p in r.parts] or [(r.pool, r.nodes)]
    for pool, nodes in targets:
        used[pool].update(nodes)
    g = topology(res, used)
    actor_nodes = sorted(set(a.nodes))
    by_rack: dict[str, int] = {}
    for n in actor_nodes:
        by_rack.setdefault(rack_of(res, a.pool, n), n)
    return [route for pool, nodes in targets
            for route in _routes_to(res, g, a, actor_nodes, by_rack, pool, nodes)]


def _routes_to(res: Resolved, g: nx.Graph, a: SlotPlan, actor_nodes: list[int],
               by_rack: dict[str, int], pool: str, nodes: list[int]) -> list[SyncRoute]:
    routes = []
    for n in sorted(set(nodes)):
        dst = f"{pool}:{n}"
        if a.pool == pool and n in actor_nodes:
            local = res.device_of(a.pool).intra_link_gbs * res.cluster.pool(a.pool).devices_per_node
            routes.append(SyncRoute(src=dst, dst=dst, gbs=local, hops=[dst]))
            continue
        same_rack = by_rack.get(rack_of(res, pool, n)) if a.pool == pool else None
        src = f"{a.pool}:{same_rack if same_rack is not None else actor_nodes[0]}"
        bw, hops = path_bandwidth(g, src, dst)
        routes.append(SyncRoute(src=src, dst=dst, gbs=bw, hops=hops))
    return routes
