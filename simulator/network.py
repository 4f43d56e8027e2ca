"""Weight sync over shared links: the actor pushes its weights to every rollout replica.

Links are the ones the placer prices (`placer.cost.timing.sync_links`):
  local  actor and rollout in one slot: each rank of a replica loads its shard (CUDA IPC);
  send   the actor's senders (one per pipeline stage), over the NIC or, inside one node, NVLink;
  recv   one rollout replica's links (every replica receives the broadcast in parallel);
  cross  between two pools, when the topology caps it: cross_pool_gbs per node x the fewer nodes.
Every rollout replica needs the full weights; they get them from one pipelined broadcast that
all of them join (an LPU placement is loaded once), so a refresh is one flow on its path.
A refresh is `timing.sync_calls` sequential calls per sender stream (buckets, or tensors when
unbucketed), each after the first paying `costmodel.sync_call_cost`, folded into the transfer's fixed cost.
Bandwidth is shared max-min fairly among the flows on a link (progressive filling: the most
constrained link splits evenly among its flows, the others take what is left), recomputed
whenever a transfer finishes. Each transfer also pays the setup latency, and LPU chips a reload,
as `costmodel.weight_sync_time` does: with one flow this is exactly the placer's figure,
bytes / (slowest link's achieved bandwidth) + latency.

A rollout split over pools (`placer.cost.split`): every part's replicas join the same pipelined
broadcast, each part over its own links (`sync_links` of the actor and that part, named
"recv@h20", "send@h20", ...: a part in the actor's node gets NVLink, one in another pool the NIC
and the cross-pool cap). The one stream crosses every part's links, so it moves at the slowest
of them all (the max over parts of each part's own transfer, `placer.cost.timing.sync_time`); each
part then pays its own fixed cost (its device's latency, call count and an LPU's reload), and
the refresh ends when the last part is done.

A paired transport (the job's `weight_sync`: NIXL or NCCL point-to-point, `placer.cost.refit`)
is one stream per engine rank, all alike: one flow per rollout part stands for its streams, on
that part's links ("stream", "local", "cross"), after the trainer's export. A framework's own
colocated refit (NeMo-RL's CUDA-IPC stream, `placer.cost.refit.COLOCATED_REFITS`) is priced the
same way: one flow on the GPU's "local" link, after the export and the per-tensor walk.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.base.roles import Role
from placer.cost.context import PriceContext
from placer.cost.model import sync_call_cost
from placer.cost.refit import paired_route, streams_colocated
from placer.cost.roofline import GB, weight_bytes
from placer.cost.timing import sync_calls, sync_links
from placer.solve.planfile import Plan, RolePlacement
from placer.spec.hardware import DeviceKind
from simulator.config import Network as NetworkConfig
from simulator.recorder import Recorder


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
    fixed_s: float  # per-transfer latency (+ LPU reload): the largest over the receivers
    alone_s: float  # one transfer alone on its path (for the contention attribution)
    receivers: tuple[tuple[str, float], ...] = ()  # (pool, its fixed seconds) per rollout part


def sync_plan(px: PriceContext, plan: Plan, cfg: NetworkConfig) -> SyncPlan | None:
    """The links and transfers of one weight sync, or None when there is nothing to sync."""
    if Role.ACTOR not in plan.roles or Role.ROLLOUT not in plan.roles:
        return None
    res, calib = px.res, px.calib
    a, r = plan.roles[Role.ACTOR], plan.roles[Role.ROLLOUT]
    m = res.arch_of(Role.ROLLOUT)
    if res.job.weight_sync.mechanism.paired or (
            not r.parts and streams_colocated(res, a.slot == r.slot)):
        return _paired_plan(px, plan, cfg)  # paired streams, or the framework's colocated refit
    links: dict[str, float] = {}
    receivers = []
    targets = ([(q.pool, q.devices, q.tp * q.pp) for q in r.parts] if r.parts
               else [(r.pool, r.devices, r.tp * r.pp)])
    for pool, devices, replica in targets:
        r_dev = res.device_of(pool)
        eff = calib.for_device(r_dev)
        if r_dev.kind is DeviceKind.lpu:
            replica = devices  # an LPU placement is loaded once, over all of its chips
        raw = sync_links(res, a.pool, a.devices, a.pp, pool, devices, replica,
                         _in_actor_slot(a, r, pool), eff)
        suffix = f"@{pool}" if r.parts else ""  # each part's own links
        links.update({k + suffix: v * eff.link_eff * cfg.bandwidth_factor
                      * cfg.link_factors.get(k, 1.0) for k, v in raw.items()})
        calls = max(sync_calls(m, a.pp, eff) - 1, 0)  # the first call is in sync_latency_s
        receivers.append((pool, eff.sync_latency_s + calls * sync_call_cost(m, eff)
                          + (eff.lpu_reload_s if r_dev.kind is DeviceKind.lpu else 0.0)))
    gb = weight_bytes(m) / GB
    path = tuple(sorted(links))
    flows = [Flow("broadcast", gb, path)]  # one pipelined broadcast all replicas join
    return SyncPlan(links, flows, max(f for _, f in receivers), gb / min(links.values()),
                    tuple(receivers))



def _in_actor_slot(a: RolePlacement, r: RolePlacement, pool: str) -> bool:
    """Whether the rollout's engines on `pool` share the actor's slot: the whole rollout in it,
    or a mixed rollout's first part, on the slot's pool (`placer.cost.timing._part_slot`)."""
    return a.slot == r.slot and pool == (r.parts[0].pool if r.parts else r.pool)


def _paired_plan(px: PriceContext, plan: Plan, cfg: NetworkConfig) -> SyncPlan:
    """A paired refit (`placer.cost.refit`): every engine rank's stream alike, so one flow per
    rollout part stands for its streams, on that part's own links; each part pays the export,
    its per-item costs, latency and calls (the placer's `paired_time` with one part)."""
    res = px.res
    a, r = plan.roles[Role.ACTOR], plan.roles[Role.ROLLOUT]
    m = res.arch_of(Role.ROLLOUT)
    targets = ([(q.pool, q.devices, q.par) for q in r.parts] if r.parts
               else [(r.pool, r.devices, r.par)])
    links: dict[str, float] = {}
    flows, receivers = [], []
    for pool, devices, par in targets:
        r_dev = res.device_of(pool)
        eff = px.calib.for_device(r_dev)
        route = paired_route(res, m, a.pool, a.devices, pool, devices, par,
                             _in_actor_slot(a, r, pool), eff, a.par.pp)
        suffix = f"@{pool}" if r.parts else ""
        own = {k + suffix: v * eff.link_eff * cfg.bandwidth_factor * cfg.link_factors.get(k, 1.0)
               for k, v in route.links.items()}
        links.update(own)
        flows.append(Flow(f"paired{suffix}", route.gb, tuple(sorted(own))))
        receivers.append((pool, route.export_s + route.fixed_s + eff.sync_latency_s
                          + max(route.calls - 1, 0) * route.call_s
                          + (eff.lpu_reload_s if r_dev.kind is DeviceKind.lpu else 0.0)))
    alone = max(f.gb / min(links[k] for k in f.path) for f in flows)
    return SyncPlan(links, flows, max(f for _, f in receivers), alone, tuple(receivers))


def record_sync(sync: SyncPlan, rec: Recorder, t: float, slot: str, step: int, version: int,
                **marker: bool) -> float:
    """Record one weight sync starting at `t` (each flow's transfer to every rollout part's
    pool, on the slot's `sync` track; `marker`: extra event args, as a validation's) and
    return its seconds: the receivers' fixed time plus the slowest flow under max-min
    sharing of the links."""
    durs = max_min_durations(sync.links, sync.flows)
    for f, d in zip(sync.flows, durs):
        for pool, fixed in sync.receivers:  # every part's replicas, on its pool
            rec.add("weight sync", "transfer", t, fixed + d, pool, f"{slot}/sync",
                    role=Role.ROLLOUT, step=step, policy_version=version, tokens=0, gb=f.gb,
                    links=list(f.path), replica=f.name, **marker)
    return sync.fixed_s + max(durs)
