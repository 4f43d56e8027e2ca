"""Candidate configs: every memory-feasible, parallelism-valid way to run a role on a pool.

For each (role, pool) that may host the role, the layouts of `placer.solve.layouts` (device
counts x TP/PP/DP/CP/EP, as the job's framework runs them, with the job's pins) are priced by the
one cost model; a trained role at its fastest micro-batch that fits (`micro_batches`), with
optimizer offload where nothing fits without it. Each candidate carries its `Estimate`.
Dominated candidates (another one on the same pool with no more devices and no more time in
every stage, and no more memory) are pruned. Trained roles get parked-optimizer twins
(`placer.solve.parktwins`) and roles that may split over two pools their split candidates
(`placer.cost.split`).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from placer.base.roles import TRAINING_ROLES, Role
from placer.cost.estimate import can_host
from placer.cost.pricer import AgentPricer, Pricer
from placer.cost.roleestimate import Estimate
from placer.cost.sharding import Parallel
from placer.cost.split import SplitKeep, SplitSpace, colocated, kept_as
from placer.solve.layouts import framework_layouts, layouts
from placer.solve.parktwins import park_twins
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind, Pool
from placer.spec.job import pinned_layouts


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

    @property
    def split(self) -> bool:
        """Split over pools (`placer.cost.split`): `pool` then joins the parts' pools by "+"."""
        return bool(self.est.parts)

    @property
    def colocated(self) -> bool:
        """A mixed rollout (`placer.cost.split.colocated`): split over pools, its first part
        time-sharing a slot on `pool` with other roles, the others on pools of their own."""
        return self.split and self.pool in self.est.pool_devices()

    def pool_devices(self) -> dict[str, int]:
        return self.est.pool_devices()


def role_candidates(px: Pricer, role: str, pool: Pool, limit: int | None = None,
                    prune: bool = True) -> list[Candidate]:
    """Feasible candidates of one role on one pool, fastest first per device count (an agent's
    role `AGENT.ROLE`: its agent's own, under that name)."""
    if isinstance(px, AgentPricer):
        sub, base = px.sub_of(role)
        return [Candidate(role, c.pool, px.qualify(role, c.est))
                for c in role_candidates(sub, base, pool, limit, prune)]
    res = px.res
    if not can_host(res, role, pool):
        return []
    cands = []
    dev = res.device_of(pool)  # on a host-RAM device an offload frees nothing
    trained = role in TRAINING_ROLES and dev.kind is DeviceKind.gpu
    offload = trained and not dev.host_backed
    for par in framework_layouts(res, role, dev, pinned_layouts(res.job, role, pool.name,
                                                                  layouts(px, role, pool, limit))):
        est = _micro_batched(px, role, pool, par) if trained else px.estimate(role, pool, par)
        if not est.feasible and offload:
            # optimizer state on the host: slower, so only worth it where nothing else fits
            est = _micro_batched(px, role, pool, replace(par, offload=True))
        if est.feasible:
            cands.append(Candidate(role, pool.name, est))
    return prune_dominated(cands) if prune else cands


# Micro-batch sizes (sequences per device) a trained role is priced with. A larger one runs
# its GEMMs on more tokens at once (`roofline.gemm_eff`) and issues fewer layer collectives and
# ZeRO-3 gathers (`layercomm.layer_comm`, `zero3_gathers`: once per micro-batch); it holds more
# activations (`model.train_memory`) and, with pipeline stages, leaves fewer micro-batches to
# fill the 1F1B bubble (`model.train_time`).
MICRO_BATCH_CHOICES = (8, 4, 2, 1)


def micro_batches(res: Resolved, par: Parallel) -> list[int]:
    """The micro-batch sizes to try for a trained layout, largest first: those of
    `MICRO_BATCH_CHOICES` that divide a data-parallel rank's share of one mini-batch (verl,
    OpenRLHF and NeMo-RL cut each rank's share into whole micro-batches), 1 at least."""
    batch = res.job.batch
    share = batch.samples // max(batch.mini_batches, 1) // max(par.dp, 1)
    return [k for k in MICRO_BATCH_CHOICES if k <= share and share % k == 0] or [1]


def _micro_batched(px: Pricer, role: str, pool: Pool, par: Parallel) -> Estimate:
    """The trained role's estimate at its fastest micro-batch of `micro_batches` that fits the
    device, else the smallest's (infeasible) estimate. Without pipeline stages the time never
    rises with the micro-batch (every term above falls or stays), so the largest that fits is
    taken without pricing the rest; with stages the bubble grows with it, so each that fits is
    priced. One candidate per layout either way. A layout that sets its own (`micro_batch` > 0:
    a pin or an imported run) is priced as it is."""
    if par.micro_batch > 0:
        return px.estimate(role, pool, par)
    best: Estimate | None = None
    est = None
    for k in micro_batches(px.res, par):
        est = px.estimate(role, pool, replace(par, micro_batch=k))
        if not est.feasible:
            continue
        if best is None or est.time_s < best.time_s:
            best = est
        if par.pp == 1:
            break
    if best is not None:
        return best
    assert est is not None  # micro_batches is never empty
    return est


def prune_dominated(cands: list[Candidate]) -> list[Candidate]:
    """Keep, for every device count, the fastest config (and the fastest HSDP one apart: its
    larger state shard costs more to switch in a colocated slot, so the ILP weighs the two; and
    a frozen model's fastest whole copy apart from its fastest sharded one, whose smaller
    weights leave more room beside the roles it shares devices with, and from its fastest
    streamed one, which keeps no weights on the GPU at all); drop a candidate that
    another with no more devices dominates.

    Safe for the ILP: a candidate with more devices, no less time in any stage and no less memory
    than another on the same pool can never be needed in an optimal plan.
    """
    best: dict[tuple[int, bool, bool, bool], Candidate] = {}
    for c in cands:
        key = (c.devices, c.est.par.hsdp, c.est.par.sharded_weights,
               c.est.par.stream_params_bytes > 0)
        cur = best.get(key)
        if cur is None or (c.time_s, c.est.memory.total) < (cur.time_s, cur.est.memory.total):
            best[key] = c
    kept: list[Candidate] = []
    for key in sorted(best):
        c = best[key]
        if any(_dominates(k, c) for k in kept):
            continue
        kept.append(c)
    return kept


def _dominates(a: Candidate, b: Candidate) -> bool:
    stages = set(a.est.stage_s) | set(b.est.stage_s)
    return (a.devices <= b.devices and a.est.memory.total <= b.est.memory.total
            and all(a.est.stage_s.get(s, 0.0) <= b.est.stage_s.get(s, 0.0) for s in stages))


# role -> pool -> the role's candidates on that pool
PerPool = dict[str, dict[str, list[Candidate]]]


def all_candidates(px: Pricer, limit: int | None = None) -> dict[str, list[Candidate]]:
    """Role -> candidates over every pool that may host it, then those split over two pools
    (`placer.cost.split`)."""
    return with_splits(px, single_candidates(px, limit))


# Clusters of at least this many devices price their single-pool candidates in worker processes
# (when the caller grants more than one): there a rollout's tail-aware replays take seconds per
# pool, while starting a worker (a fresh interpreter importing the planner) takes ~0.5 s.
PARALLEL_DEVICES = 4096


def single_candidates(px: Pricer, limit: int | None = None, workers: int = 1) -> PerPool:
    """Role -> pool -> the role's candidates on that one pool. On a large cluster
    (`PARALLEL_DEVICES`) with `workers` > 1 each (role, pool) is priced in one of `workers`
    processes; the table is the same either way (each pair is priced on its own)."""
    res = px.res
    tasks: list[tuple[str, Pool]] = [(role, pool) for role in res.job.roles()
                                     for pool in res.cluster.pools]
    devices = sum(p.devices_per_node * p.nodes for p in res.cluster.pools)
    if workers > 1 and devices >= PARALLEL_DEVICES and not mp.current_process().daemon:
        found = _priced_apart(px, limit, tasks, workers)
    else:
        found = {(r, p.name): role_candidates(px, r, p, limit) for r, p in tasks}
    return {role: {pool.name: with_park_twins(res, found[role, pool.name])
                   for pool in res.cluster.pools} for role in res.job.roles()}


def with_park_twins(res: Resolved, cands: list[Candidate]) -> list[Candidate]:
    """`cands` and the parked-optimizer twins of its fastest (`parktwins.park_twins`)."""
    return cands + [Candidate(c.role, c.pool, est) for c, est in park_twins(res, cands)]


def _priced_apart(px: Pricer, limit: int | None, tasks: list[tuple[str, Pool]], workers: int
                  ) -> dict[tuple[str, str], list[Candidate]]:
    """`role_candidates` of every task in `workers` worker processes (`placer.solve.tablework`).
    The rollout's tasks on accelerators dominate (tail-aware replays), so they are dealt out
    first, one per worker in turn, then the rest; a worker that fails leaves its share to be
    priced here (where any error in the job surfaces as it would without workers). A worker
    prices on its own `Pricer` of the same job and factors."""
    heavy = [t for t in tasks if t[0] == Role.ROLLOUT and px.res.device_of(t[1]).kind is not
             DeviceKind.cpu]
    order = heavy + [t for t in tasks if t not in heavy]
    shares = [order[i::workers] for i in range(workers) if order[i::workers]]
    found: dict[tuple[str, str], list[Candidate]] = {}
    with tempfile.TemporaryDirectory(prefix="placer-table-") as tmp:
        procs = []
        for i, share in enumerate(shares):
            src, dst = Path(tmp) / f"in{i}", Path(tmp) / f"out{i}"
            src.write_bytes(pickle.dumps((px.res, px.given, limit,
                                          [(r, p.name) for r, p in share])))
            procs.append((share, dst, subprocess.Popen(
                [sys.executable, "-m", "placer.solve.tablework", str(src), str(dst)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_child_env())))
        for share, dst, proc in procs:
            if proc.wait() == 0 and dst.exists():
                found.update(pickle.loads(dst.read_bytes()))
            else:
                found.update({(r, p.name): role_candidates(px, r, p, limit) for r, p in share})
    return found


def _child_env() -> dict[str, str]:
    """The environment with this interpreter's import path, so a worker imports this placer."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def flat(per_pool: PerPool) -> dict[str, list[Candidate]]:
    return {role: [c for cs in pools.values() for c in cs] for role, pools in per_pool.items()}


def with_splits(px: Pricer, per_pool: PerPool,
                keep: Callable[[str], SplitKeep] | None = None, space: SplitSpace | None = None
                ) -> dict[str, list[Candidate]]:
    """Role -> its single-pool candidates, then those split over two pools (`placer.cost.split`);
    `keep(role)` says which splits are worth pricing (`placer.solve.ilp_bound.split_keep`);
    `space` counts the splits searched, pruned and kept.

    Each split is a candidate alone in its slot and, in sync mode, a mixed one per pool of its
    parts where another role may run (`shared_pools`): that part time-shares the slot there
    (`placer.cost.split.colocated`), the other runs alongside on its own pool. The ILP prices
    both from the same table; `keep` drops either where it cannot be in a better plan."""
    out: dict[str, list[Candidate]] = {}
    splits_roles = px.res.job.profile.splits_roles  # a framework that runs a role on one pool
    for role, pools in per_pool.items():
        if not splits_roles:
            out[role] = [c for cs in pools.values() for c in cs]
            continue
        shared = shared_pools(px, per_pool, role)
        rule = keep(role) if keep is not None else None
        splits = px.split_estimates(role, {p: [c.est for c in cs] for p, cs in pools.items()},
                                    rule, space, shared)
        found: list[Candidate] = []
        for e in splits:
            for way in kept_as(rule, tuple(p.est for p in e.parts), e.time_s, shared):
                found.append(Candidate(role, e.pool, e) if way is None
                             else Candidate(role, way, colocated(e, way)))
        out[role] = [c for cs in pools.values() for c in cs] + found
    return out


def shared_pools(px: Pricer, per_pool: PerPool, role: str) -> frozenset[str]:
    """Pools where a part of a split `role` may time-share a slot with other roles: in sync
    mode (the phases run in turn, so the shared devices serve each in its stage), accelerator
    pools where another role has candidates; none in async mode, where the part would wait on
    the slot's training while its other part runs on."""
    if px.res.job.pipeline.mechanism.overlaps_steps:
        return frozenset()
    return frozenset(p for r, pools in per_pool.items() if r != role
                     for p, cs in pools.items()
                     if cs and not px.res.device_of(p).host_backed
                     and px.res.device_of(p).kind is not DeviceKind.cpu)


def memory_floor_gb(res: Resolved, role: str) -> float:
    """State the role must hold somewhere, whatever the sharding: 16 B/param to train, 2 to serve."""
    m = res.model_of(role)
    if m is None:
        return 0.0
    return m.params() * (16 if role in TRAINING_ROLES else 2) / 1e9


def min_devices(px: Pricer, role: str, pool: Pool) -> int | None:
    """Fewest devices of `pool` on which the role fits, or None if it cannot run there."""
    cands = role_candidates(px, role, pool, prune=False)
    return min((c.devices for c in cands), default=None)
