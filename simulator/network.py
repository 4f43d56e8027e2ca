"""Weight sync over shared links: the actor pushes its weights to every rollout replica.

Links are the ones the placer prices (`placer.timing.sync_links`):
  local  actor and rollout in one slot: each rank of a replica loads its shard (CUDA IPC);
  send   the actor's senders (one per pipeline stage), over the NIC or, inside one node, NVLink;
  recv   one rollout replica's links (every replica receives the broadcast in parallel);
  cross  between two pools, when the topology caps it: cross_pool_gbs per node x the fewer nodes.
Every rollout replica needs the full weights; they get them from one pipelined broadcast that
all of them join (an LPU placement is loaded once), so a refresh is one flow on its path.
A refresh is `timing.sync_calls` sequential calls per sender stream (buckets, or tensors when
unbucketed), each after the first paying `sync_call_s`, folded into the transfer's fixed cost.
Bandwidth is shared max-min fairly among the flows on a link (progressive filling: the most
constrained link splits evenly among its flows, the others take what is left), recomputed
whenever a transfer finishes. Each transfer also pays the setup latency, and LPU chips a reload,
as `costmodel.weight_sync_time` does: with one flow this is exactly the placer's figure,
bytes / (slowest link's achieved bandwidth) + latency.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.catalog import Resolved
from placer.costmodel import GB, Calibration, weight_bytes
from placer.planfile import Plan
from placer.roles import Role
from placer.spec import DeviceKind
from placer.timing import sync_calls, sync_links
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
    if Role.ACTOR not in plan.roles or Role.ROLLOUT not in plan.roles:
        return None
    a, r = plan.roles[Role.ACTOR], plan.roles[Role.ROLLOUT]
    r_dev = res.device_of(r.pool)
    eff = calib.for_device(r_dev)
    replica = r.devices if r_dev.kind is DeviceKind.lpu else r.tp * r.pp
    raw = sync_links(res, a.pool, a.devices, a.pp, r.pool, r.devices, replica, a.slot == r.slot,
                     eff)
    links = {k: v * eff.link_eff * cfg.bandwidth_factor * cfg.link_factors.get(k, 1.0)
             for k, v in raw.items()}
    m = res.arch_of(Role.ROLLOUT)
    gb = weight_bytes(m) / GB
    path = tuple(sorted(links))
    flows = [Flow("broadcast", gb, path)]  # one pipelined broadcast all replicas join
    calls = max(sync_calls(m, a.pp, eff) - 1, 0)  # the first call is in sync_latency_s
    fixed = (eff.sync_latency_s + calls * eff.sync_call_s
             + (eff.lpu_reload_s if r_dev.kind is DeviceKind.lpu else 0.0))
    return SyncPlan(links, flows, fixed, gb / min(links.values()))

