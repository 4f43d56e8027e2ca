"""Weight sync over shared links: the actor pushes its weights to every rollout replica.

Links are the ones the placer prices (`placer.timing.sync_bandwidth`):
  local  actor and rollout in one slot: a reshard over the scale-up link (intra_link x devices);
  send   the actor's NICs (nic x actor devices);
  recv   the rollout devices' NICs (nic x rollout devices);
  cross  between two pools, when the topology caps it: cross_pool_gbs per node x the fewer nodes.
Every rollout replica needs the full weights (an LPU placement is loaded once, as the placer
prices it), so R transfers start together and share every link on their path. Bandwidth is
shared max-min fairly (progressive filling: the most constrained link splits evenly among its
flows, the others take what is left), recomputed whenever a transfer finishes. Each transfer also
pays the setup latency, and LPU chips a reload, as `costmodel.weight_sync_time` does. With equal
transfers this is exactly the placer's figure: bytes / (aggregate bandwidth / R).
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.catalog import Resolved
from placer.costmodel import GB, Calibration, weight_bytes
from placer.plan import Plan
from placer.spec import DeviceKind
from simulator.config import Network as NetworkConfig


@dataclass(frozen=True)
class Flow:
    name: str
    gb: float  # gigabytes to move
    path: tuple[str, ...]


def max_min_durations(links: dict[str, float], flows: list[Flow]) -> list[float]:
    """Seconds each flow takes when all start at once, links in GB/s, max-min fair sharing."""
    left = {i: f.gb for i, f in enumerate(flows)}
    done = [0.0] * len(flows)
    t = 0.0
    while left:
        rate = _fair_rates(links, {i: flows[i].path for i in left})
        dt = min(left[i] / rate[i] for i in left)
        t += dt
        for i in list(left):
            left[i] -= rate[i] * dt
            if left[i] <= 1e-12 * flows[i].gb:
                done[i] = t
                del left[i]
    return done


def _fair_rates(links: dict[str, float], paths: dict[int, tuple[str, ...]]) -> dict[int, float]:
    cap = dict(links)
    unfixed = set(paths)
    rate: dict[int, float] = {}
    while unfixed:
        share = {}
        for link, c in cap.items():
            users = [i for i in unfixed if link in paths[i]]
            if users:
                share[link] = c / len(users)
        if not share:  # flows on no link at all: unconstrained (never in practice)
            for i in unfixed:
                rate[i] = float("inf")
            break
        link = min(share, key=lambda k: (share[k], k))
        fixed = [i for i in unfixed if link in paths[i]]
        for i in fixed:
            rate[i] = share[link]
            for other in paths[i]:
                cap[other] -= share[link]
        unfixed -= set(fixed)
    return rate


@dataclass(frozen=True)
class SyncPlan:
    links: dict[str, float]  # effective GB/s (link efficiency and config factors applied)
    flows: list[Flow]
    fixed_s: float  # per-transfer latency (+ LPU reload)
    alone_s: float  # one transfer alone on its path (for the contention attribution)


def sync_plan(res: Resolved, plan: Plan, calib: Calibration, cfg: NetworkConfig) -> SyncPlan | None:
    """The links and transfers of one weight sync, or None when there is nothing to sync."""
    if "actor" not in plan.roles or "rollout" not in plan.roles:
        return None
    a, r = plan.roles["actor"], plan.roles["rollout"]
    a_dev, r_dev = res.device_of(a.pool), res.device_of(r.pool)
    eff = calib.for_device(r_dev)
    if a.slot == r.slot:
        raw = {"local": a_dev.intra_link_gbs * a.devices}
    else:
        raw = {"send": a_dev.nic_gbs * a.devices, "recv": r_dev.nic_gbs * r.devices}
        cross = res.cluster.topology.cross_pool_gbs
        if a.pool != r.pool and cross is not None:
            nodes = min(_nodes(res, a.pool, a.devices), _nodes(res, r.pool, r.devices))
            raw["cross"] = cross * nodes
    links = {k: v * eff.link_eff * cfg.bandwidth_factor * cfg.link_factors.get(k, 1.0)
             for k, v in raw.items()}
    replicas = 1 if r_dev.kind is DeviceKind.lpu else max(r.dp, 1)
    gb = weight_bytes(res.model_of("rollout")) / GB
    path = tuple(sorted(links))
    flows = [Flow(f"replica{k}", gb, path) for k in range(replicas)]
    fixed = eff.sync_latency_s + (eff.lpu_reload_s if r_dev.kind is DeviceKind.lpu else 0.0)
    return SyncPlan(links, flows, fixed, gb / min(links.values()))


def _nodes(res: Resolved, pool: str, devices: int) -> int:
    per = res.cluster.pool(pool).devices_per_node
    return -(-devices // per)
