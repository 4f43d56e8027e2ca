"""Candidate configs: every memory-feasible, parallelism-valid way to run a role on a pool.

For each (role, pool) that may host the role, enumerate device counts (powers of two, and whole
multiples of a node, up to the pool's size) and parallel layouts:
  training (GPU, can_train): TP in powers of two inside one NVLink domain, PP dividing the layers,
      DP the rest, ZeRO-3 sharding, activation recomputation on, optimizer offload on or off;
  generation / forward on GPUs: TP inside a node, DP replicas;
  LPUs: replicas of `lpu_chips` chips (the weights must sit in SRAM);
  CPU pools: a number of nodes (environments, rule rewards, tiny models).
Each candidate carries its `Estimate` from the one cost model. Dominated candidates (another one on
the same pool with no more devices and no more time in every stage, and no more memory) are pruned.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.catalog import Resolved
from placer.costmodel import Calibration, Parallel, lpu_chips
from placer.estimate import Estimate, can_host, estimate
from placer.roles import TRAINING_ROLES
from placer.spec import DeviceKind, Pool


@dataclass(frozen=True)
class Candidate:
    role: str
    pool: str
    est: Estimate

    @property
    def devices(self) -> int:
        return self.est.devices

    @property
    def time_s(self) -> float:
        return self.est.time_s


def device_counts(total: int, per_node: int, step: int = 1, limit: int | None = None) -> list[int]:
    """Counts that are multiples of `step`: powers of two and whole-node multiples up to `total`."""
    top = min(total, limit or total)
    out = set()
    k = step
    while k <= top:
        out.add(k)
        k *= 2
    n = per_node
    while n <= top:
        if n % step == 0:
            out.add(n)
        n = n * 2 if n >= 8 * per_node else n + per_node
    if top % step == 0 and top >= step:
        out.add(top)
    return sorted(out)


def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def layouts(res: Resolved, role: str, pool: Pool, calib: Calibration,
            limit: int | None = None) -> list[Parallel]:
    """Parallel layouts to try for `role` on `pool` (not yet checked for memory)."""
    dev = res.device_of(pool)
    total = pool.devices_per_node * pool.nodes
    m = res.model_of(role)
    if dev.kind is DeviceKind.cpu or m is None:
        return [Parallel(dp=n) for n in device_counts(total, pool.devices_per_node, 1, limit)]
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, calib.for_device(dev))
        return [Parallel(dp=n) for n in device_counts(total, pool.devices_per_node, chips, limit)
                if n >= chips]
    domain = min(pool.nvlink_domain or pool.devices_per_node, total)
    tps = [t for t in _pow2_upto(domain) if m.heads % t == 0]
    offloads: tuple[bool, ...]
    if role in TRAINING_ROLES:
        pps = [p for p in _pow2_upto(8) if m.layers % p == 0]
        offloads = (False, True)
    else:
        pps, offloads = [1], (False,)
    out = []
    for n in device_counts(total, pool.devices_per_node, 1, limit):
        for tp in tps:
            for pp in pps:
                if n % (tp * pp):
                    continue
                for off in offloads:
                    out.append(Parallel(tp=tp, pp=pp, dp=n // (tp * pp), offload=off))
    return out


def role_candidates(res: Resolved, role: str, pool: Pool, calib: Calibration,
                    limit: int | None = None, prune: bool = True) -> list[Candidate]:
    """Feasible candidates of one role on one pool, fastest first per device count."""
    if not can_host(res, role, pool):
        return []
    cands = []
    for par in layouts(res, role, pool, calib, limit):
        est = estimate(res, role, pool, par, calib)
        if est.feasible:
            cands.append(Candidate(role, pool.name, est))
    return prune_dominated(cands) if prune else cands


def prune_dominated(cands: list[Candidate]) -> list[Candidate]:
    """Keep, for every device count, the fastest config; drop a count no faster than a smaller one.

    Safe for the ILP: a candidate with more devices, no less time in any stage and no less memory
    than another on the same pool can never be needed in an optimal plan.
    """
    best: dict[int, Candidate] = {}
    for c in cands:
        cur = best.get(c.devices)
        if cur is None or (c.time_s, c.est.memory.total) < (cur.time_s, cur.est.memory.total):
            best[c.devices] = c
    kept: list[Candidate] = []
    for n in sorted(best):
        c = best[n]
        if any(_dominates(k, c) for k in kept):
            continue
        kept.append(c)
    return kept


def _dominates(a: Candidate, b: Candidate) -> bool:
    stages = set(a.est.stage_s) | set(b.est.stage_s)
    return (a.devices <= b.devices and a.est.memory.total <= b.est.memory.total
            and all(a.est.stage_s.get(s, 0.0) <= b.est.stage_s.get(s, 0.0) for s in stages))


def all_candidates(res: Resolved, calib: Calibration,
                   limit: int | None = None) -> dict[str, list[Candidate]]:
    """Role -> candidates over every pool that may host it."""
    return {role: [c for pool in res.cluster.pools
                   for c in role_candidates(res, role, pool, calib, limit)]
            for role in res.job.roles()}


def memory_floor_gb(res: Resolved, role: str) -> float:
    """State the role must hold somewhere, whatever the sharding: 16 B/param to train, 2 to serve."""
    m = res.model_of(role)
    if m is None:
        return 0.0
    return m.params() * (16 if role in TRAINING_ROLES else 2) / 1e9


def min_devices(res: Resolved, role: str, pool: Pool, calib: Calibration) -> int | None:
    """Fewest devices of `pool` on which the role fits, or None if it cannot run there."""
    cands = role_candidates(res, role, pool, calib, prune=False)
    return min((c.devices for c in cands), default=None)
