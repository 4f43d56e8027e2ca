"""Mapping slots onto concrete nodes and devices, and the network topology they sit in.

Topology (networkx): every node `pool:i` hangs off its rack switch `pool/rack:r` with the node's
NIC bandwidth (devices x per-device NIC); racks hang off one spine with `topology.spine_gbs`; a
pool-to-pool cap (`cross_pool_gbs`, per node) limits the path between pools. Path bandwidth is the
narrowest edge on the path.

Mapping rules: a slot of at least one node takes whole nodes; a smaller slot is packed into the
first node with enough free devices, so its tensor-parallel groups never straddle nodes. Slots
that hold training roles are placed first (they are the largest and need NVLink). Environment
slots on CPU pools are spread one bundle per node.
"""
from __future__ import annotations

from collections import defaultdict

import networkx as nx

from placer.catalog import Resolved
from placer.plan import Bundle, RolePlacement, SlotPlan, SyncRoute
from placer.spec import DeviceKind, SpecError

SPINE = "spine"


def topology(res: Resolved, nodes_used: dict[str, set[int]] | None = None) -> nx.Graph:
    """The cluster's graph; with `nodes_used`, only those nodes (identical others add nothing)."""
    g = nx.Graph()
    g.add_node(SPINE, kind="switch")
    topo = res.cluster.topology
    for pool in res.cluster.pools:
        dev = res.device_of(pool)
        node_bw = dev.nic_gbs * pool.devices_per_node
        if topo.cross_pool_gbs is not None:
            node_bw = min(node_bw, topo.cross_pool_gbs)
        idx = sorted(nodes_used.get(pool.name, ())) if nodes_used is not None else range(pool.nodes)
        for i in idx:
            rack = f"{pool.name}/rack:{i // pool.nodes_per_rack}"
            if rack not in g:
                g.add_node(rack, kind="switch")
                g.add_edge(rack, SPINE, gbs=topo.spine_gbs)
            g.add_node(f"{pool.name}:{i}", kind="node", pool=pool.name)
            g.add_edge(f"{pool.name}:{i}", rack, gbs=node_bw)
    return g


def path_bandwidth(g: nx.Graph, src: str, dst: str) -> tuple[float, list[str]]:
    """Bandwidth (GB/s) of the widest-narrowest path and its hops."""
    if src == dst:
        return float("inf"), [src]
    path = nx.shortest_path(g, src, dst)
    return min(g.edges[a, b]["gbs"] for a, b in zip(path, path[1:])), path


def _bundle_resources(res: Resolved, pool_name: str, n: int) -> dict[str, float]:
    dev = res.device_of(pool_name)
    key = {DeviceKind.gpu: "GPU", DeviceKind.lpu: "LPU", DeviceKind.cpu: "CPU"}[dev.kind]
    amount = n * dev.cores if dev.kind is DeviceKind.cpu else n
    return {key: float(amount), f"pool_{pool_name}": float(n)}


def map_to_nodes(res: Resolved, slots: list[SlotPlan], roles: dict[str, RolePlacement]
                 ) -> tuple[list[SlotPlan], list[Bundle], list[SyncRoute]]:
    """Give every slot nodes and devices; return slots (with nodes), bundles and sync routes."""
    free: dict[str, list[int]] = {p.name: [p.devices_per_node] * p.nodes for p in res.cluster.pools}
    training = {"actor", "critic"}
    order = sorted(slots, key=lambda s: (not (set(s.roles) & training), -s.devices))
    bundles: list[Bundle] = []
    placed: dict[str, SlotPlan] = {}
    for slot in order:
        pool = res.cluster.pool(slot.pool)
        per = pool.devices_per_node
        spread = "environment" in slot.roles and res.device_of(pool).kind is DeviceKind.cpu
        tp = max((roles[r].tp for r in slot.roles if r in roles), default=1)
        chunks = _chunks(slot.devices, per, spread)
        nodes = []
        for size in chunks:
            node = _first_fit(free[pool.name], size)
            if node is None:
                raise SpecError(f"slots.{slot.name}: pool {pool.name} has no node with {size} "
                                f"free devices left")
            start = per - free[pool.name][node]
            free[pool.name][node] -= size
            devs = list(range(start, start + size))
            bundles.append(Bundle(index=len(bundles), slot=slot.name, pool=pool.name, node=node,
                                  devices=devs, resources=_bundle_resources(res, pool.name, size),
                                  group=f"{slot.name}/tp{tp}@{node}"))
            nodes.append(node)
        placed[slot.name] = slot.model_copy(update={"nodes": nodes})
    out_slots = [placed[s.name] for s in slots]
    return out_slots, bundles, _sync_routes(res, out_slots, roles)


def _chunks(devices: int, per_node: int, spread: bool) -> list[int]:
    if spread:
        return [1] * devices if per_node == 1 else [min(per_node, devices)] * (devices // per_node) \
            + ([devices % per_node] if devices % per_node else [])
    full, rest = divmod(devices, per_node)
    return [per_node] * full + ([rest] if rest else [])


def _first_fit(free: list[int], size: int) -> int | None:
    for i, f in enumerate(free):
        if f >= size:
            return i
    return None


def _sync_routes(res: Resolved, slots: list[SlotPlan], roles: dict[str, RolePlacement]
                 ) -> list[SyncRoute]:
    """Actor's first node to every node of the rollout slot, over the topology."""
    if "actor" not in roles or "rollout" not in roles:
        return []
    by_name = {s.name: s for s in slots}
    a, r = by_name[roles["actor"].slot], by_name[roles["rollout"].slot]
    used: dict[str, set[int]] = defaultdict(set)
    for s in (a, r):
        used[s.pool].update(s.nodes)
    g = topology(res, used)
    src = f"{a.pool}:{a.nodes[0]}"
    routes = []
    for n in sorted(set(r.nodes)):
        dst = f"{r.pool}:{n}"
        if dst == src:
            local = res.device_of(a.pool).intra_link_gbs * res.cluster.pool(a.pool).devices_per_node
            routes.append(SyncRoute(src=src, dst=dst, gbs=local, hops=[src]))
            continue
        bw, hops = path_bandwidth(g, src, dst)
        routes.append(SyncRoute(src=src, dst=dst, gbs=bw, hops=hops))
    return routes
