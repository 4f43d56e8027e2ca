"""Candidate configs: every memory-feasible, parallelism-valid way to run a role on a pool.

For each (role, pool) that may host the role, enumerate device counts (every count inside one
node, powers of two, and whole multiples of a node, up to the pool's size) and parallel layouts
(`placer.cost.sharding` says what each dimension splits):
  training (GPU, can_train): TP in powers of two inside one NVLink domain, PP stages from
      `PP_CHOICES`, CP for sequences longer than a micro-batch, EP for a mixture of experts
      (ETP 1), DP the rest, ZeRO-3 sharding (and, where dp spans nodes, HSDP with one node's
      shard group: `hsdp_layouts`), activation recomputation on, optimizer offload where
      nothing fits without it;
  generation / forward on GPUs: TP inside a node, PP stages across whole nodes (engines larger
      than a node), EP = TP for a mixture of experts, DP replicas;
  LPUs: replicas of `lpu_chips` chips (the weights must sit in SRAM);
  CPU pools: a number of nodes (environments, rule rewards, tiny models).
Each candidate carries its `Estimate` from the one cost model. Dominated candidates (another one on
the same pool with no more devices and no more time in every stage, and no more memory) are pruned.
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
from placer.cost.estimate import Estimate, can_host
from placer.cost.generation import lpu_chips
from placer.cost.layercomm import MICRO_TOKENS, NODE_DEVICES
from placer.cost.pricer import AgentPricer, Pricer
from placer.cost.roofline import GB, weight_bytes
from placer.cost.sharding import Parallel
from placer.cost.split import SplitKeep, SplitSpace, colocated, kept_as
from placer.solve.parktwins import park_twins
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind, DeviceType, Pool
from placer.spec.job import pin_of, pinned_layouts


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


def device_counts(total: int, per_node: int, step: int = 1, limit: int | None = None) -> list[int]:
    """Counts that are multiples of `step`: every multiple inside one node (DP replicas need not
    be a power of two), powers of two, and whole-node multiples up to `total`."""
    top = min(total, limit or total)
    out = set(range(step, min(per_node, top) + 1, step))
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


# Pipeline stages tried. Not only powers of two: a stage count need not divide the layers
# (Megatron-Core places uneven first and last stages; the cost model prices the mean stage).
PP_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)
# Context parallelism is tried for jobs whose longest sequence exceeds one micro-batch of
# `MICRO_TOKENS` (the activations of one sequence no longer fit the usual per-device budget).
CP_CHOICES = (1, 2, 4)
EP_CHOICES = (1, 2, 4, 8)  # expert parallelism, inside one NVLink domain (all-to-all on NVLink)


def _pps(layers: int, cap: int, per_stage: int = 2) -> list[int]:
    """Stage counts of at most `cap` with at least `per_stage` decoder layers per stage. The
    search keeps two (a one-layer stage is rarely worth its pipeline bubble); a job that pins
    `pp` may ask for one layer per stage, which the executor runs (executors/pipeline.py)."""
    return [p for p in PP_CHOICES if p == 1 or (p <= cap and per_stage * p <= layers)]


def _eps(m: ModelArch, ranks: int, domain: int) -> list[int]:
    """EP degrees for `ranks` non-pipeline ranks: none, and the largest of `EP_CHOICES` that
    divides the experts and the ranks inside one NVLink domain (a smaller one moves the same
    all-to-all bytes per rank over fewer ranks and leaves bigger expert shards and ZeRO
    gathers, so it is not tried)."""
    if not m.moe:
        return [1]
    ok = [e for e in EP_CHOICES if m.experts % e == 0 and ranks % e == 0 and e <= domain]
    return sorted({1, max(ok)})


def _training_layouts(m: ModelArch, counts: list[int], tps: list[int], domain: int,
                      cps: tuple[int, ...], per_stage: int = 2) -> list[Parallel]:
    """TP x CP x PP x DP (x EP for a mixture of experts, ETP 1); optimizer offload is tried by
    `role_candidates` only where a layout does not fit without it."""
    out = []
    for n in counts:
        for tp in tps:
            for cp in cps:
                for pp in _pps(m.layers, 16, per_stage):
                    if n % (tp * cp * pp):
                        continue
                    dp = n // (tp * cp * pp)
                    for ep in _eps(m, tp * cp * dp, domain):
                        out.append(Parallel(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep))
    return out


# An engine spans nodes (PP stages) only when one node's devices, TP over all of them, would
# spend more than this share of their memory on weights: pipeline stages do not shorten a
# decode step (`generation._decode_terms`), they only make room for weights and KV.
MULTI_NODE_WEIGHT_SHARE = 0.5


def _inference_layouts(m: ModelArch, dev: DeviceType, counts: list[int], tps: list[int],
                       domain: int, nodes: int, engine: bool) -> list[Parallel]:
    """Replicas of TP inside a node, PP stages across whole nodes when a node is tight (an
    engine larger than a node: vLLM's and SGLang's multi-node serving), EP = TP for a mixture
    of experts (vLLM's --enable-expert-parallel), DP replicas of that; for a rollout `engine`
    on a multi-node pool also the wide-EP engines (`_wide_ep_layouts`)."""
    tight = weight_bytes(m) / domain > MULTI_NODE_WEIGHT_SHARE * dev.memory_gb * GB
    out = []
    for n in counts:
        for tp in tps:
            # a stage of fewer than a node's devices gains nothing from crossing nodes
            pps = _pps(m.layers, nodes) if tp == domain and tight else [1]
            for pp in pps:
                if n % (tp * pp):
                    continue
                eps = [1] + ([tp] if m.moe and tp > 1 and m.experts % tp == 0 else [])
                for ep in eps:
                    out.append(Parallel(tp=tp, pp=pp, dp=n // (tp * pp), ep=ep))
    return out + (_wide_ep_layouts(m, counts, domain) if engine and nodes > 1 else [])


def _wide_ep_degrees(m: ModelArch, domain: int, top: int) -> list[int]:
    """EP degrees of a multi-node MoE engine: one node's devices and whole powers of two of
    nodes, up to `top` devices, that split the routed experts evenly (at least one a rank)."""
    out, ep = [], domain
    while ep <= min(top, m.experts):
        if m.experts % ep == 0:
            out.append(ep)
        ep *= 2
    return out


def _wide_ep_layouts(m: ModelArch, counts: list[int], domain: int) -> list[Parallel]:
    """Engines of a MoE on a multi-node pool as vLLM and SGLang serve DeepSeek-style models:
    for each EP degree of `_wide_ep_degrees` (a node and more), one replica of ep ranks with
    the experts split over them and either data-parallel attention (`Parallel.attn_dp` = ep:
    SGLang --enable-dp-attention, vLLM --data-parallel-size with --enable-expert-parallel;
    attention and its KV per rank) or, across nodes, tensor-parallel attention (TP = EP over
    the NIC, vLLM's multi-node TP); DP replicas of that. A hybrid (linear-attention) model is
    left to the TP layouts: its recurrent state is sharded by TP head (`state_split`).
    At most 2 log2(nodes) + 1 layouts per device count."""
    if not m.moe or m.linear_attention is not None:
        return []
    out = []
    for n in counts:
        for ep in _wide_ep_degrees(m, domain, n):
            if n % ep:
                continue
            out.append(Parallel(tp=ep, dp=n // ep, ep=ep, attn_dp=ep))
            if ep > domain and m.heads % ep == 0:  # in a node TP = EP is a layout above
                out.append(Parallel(tp=ep, dp=n // ep, ep=ep))
    return out


def _sharded_frozen(pars: list[Parallel]) -> list[Parallel]:
    """A frozen model's forward (reference, reward model) FSDP-sharded over all its dp ranks,
    as verl's and NeMo-RL's reference workers hold it (`estimate.frozen_sharded`), beside the
    whole copies `pars` (only where the job's framework runs it: `FrameworkProfile.frozen_shards`;
    `placer execute`'s workers hold whole copies)."""
    return [replace(p, sharded_weights=True) for p in pars if p.dp > 1]


def layouts(px: Pricer, role: str, pool: Pool, limit: int | None = None) -> list[Parallel]:
    """Parallel layouts to try for `role` on `pool` (not yet checked for memory)."""
    res = px.res
    dev = res.device_of(pool)
    total = pool.devices_per_node * pool.nodes
    m = res.model_of(role)
    if dev.kind is DeviceKind.cpu or m is None:
        return [Parallel(dp=n) for n in device_counts(total, pool.devices_per_node, 1, limit)]
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, px.calib.for_device(dev))
        return [Parallel(dp=n) for n in device_counts(total, pool.devices_per_node, chips, limit)
                if n >= chips]
    domain = min(pool.nvlink_domain or pool.devices_per_node, total)
    tps = [t for t in _pow2_upto(domain) if m.heads % t == 0]
    counts = device_counts(total, pool.devices_per_node, 1, limit)
    if role in TRAINING_ROLES:
        cps = CP_CHOICES if res.job.max_context > MICRO_TOKENS else (1,)
        pin = pin_of(res.job, role)
        pars = _training_layouts(m, counts, tps, domain, cps,
                                 per_stage=1 if pin is not None and pin.pp else 2)
        pars += hsdp_layouts(pars, pool, pin.shard if pin is not None else None)
    elif role == Role.ROLLOUT:
        pars = _inference_layouts(m, dev, counts, tps, domain, pool.nodes, True)
    else:
        pars = _inference_layouts(m, dev, counts, tps, domain, pool.nodes, False)
        pars += _sharded_frozen(pars) if res.job.profile.frozen_shards else []
    flags = fp8_flags(res, role, dev)
    return [replace(p, **flags) for p in pars] if any(flags.values()) else pars


def fp8_flags(res: Resolved, role: str, dev: DeviceType) -> dict[str, bool]:
    """The job's FP8 options (`spec.Precision`) that apply to `role` on `dev`: only on devices
    with FP8 tensor cores; rollout weights and KV cache for the rollout role, GEMMs for the
    training roles."""
    prec, fp8 = res.job.precision, dev.fp8_tflops is not None
    if role in TRAINING_ROLES:
        return {"fp8_train": fp8 and prec.training == "fp8"}
    if role == Role.ROLLOUT:
        return {"fp8_weights": fp8 and prec.rollout_weights == "fp8",
                "fp8_kv": fp8 and prec.kv_cache == "fp8"}
    return {}


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


def framework_layouts(res: Resolved, role: str, dev: DeviceType, pars: list[Parallel]
                      ) -> list[Parallel]:
    """The layouts the job's framework can run (`placer.spec.framework`): all of them for
    `native`, the planner's own executor."""
    profile = res.job.profile
    training, has_model = role in TRAINING_ROLES, res.model_of(role) is not None
    batch = res.job.batch
    return [p for p in pars if profile.layout_problem(
        role, training=training, has_model=has_model, on_gpu=dev.kind is DeviceKind.gpu, tp=p.tp,
        pp=p.pp, ep=p.ep, shard=p.shard, attn_dp=p.attn_dp, dp=p.dp,
        mini_batch_samples=batch.samples // batch.mini_batches) is None]


def hsdp_layouts(pars: list[Parallel], pool: Pool, pinned: int | None = None) -> list[Parallel]:
    """HSDP variants (`Parallel.shard`) of the ZeRO-3 layouts whose devices span several nodes:
    the shard group cut to one node's devices (shard x tp x cp x pp of them), so the parameter
    gathers and gradient reduce-scatters stay on NVLink and only the shards' all-reduce crosses
    nodes (`layercomm.hsdp_all_reduce`), at the price of state sharded over fewer ranks. Only
    that size (and a job's pinned `shard`), to keep the ILP small; the estimate drops a variant
    that does not fit and `prune_dominated` keeps the faster of it and plain ZeRO-3."""
    node = min(pool.devices_per_node, NODE_DEVICES)
    out = []
    for par in pars:
        if par.zero < 3 or par.shard:
            continue
        sizes = {pinned} if pinned is not None else set()
        if par.devices > node and node % par.replica == 0:
            sizes.add(node // par.replica)
        out += [replace(par, shard=s) for s in sorted(sizes) if 0 < s < par.dp and par.dp % s == 0]
    return out


def prune_dominated(cands: list[Candidate]) -> list[Candidate]:
    """Keep, for every device count, the fastest config (and the fastest HSDP one apart: its
    larger state shard costs more to switch in a colocated slot, so the ILP weighs the two; and
    a frozen model's fastest whole copy apart from its fastest sharded one, whose smaller
    weights leave more room beside the roles it shares devices with); drop a candidate that
    another with no more devices dominates.

    Safe for the ILP: a candidate with more devices, no less time in any stage and no less memory
    than another on the same pool can never be needed in an optimal plan.
    """
    best: dict[tuple[int, bool, bool], Candidate] = {}
    for c in cands:
        key = (c.devices, c.est.par.hsdp, c.est.par.sharded_weights)
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
