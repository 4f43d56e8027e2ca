"""How the cost model prices one event of a trace: the bridge from trace events to `placer.calibrate.fit`.

For each event this module finds the device type (from `args.devices` "pool:node:index", else the
`pid` "pool:node", else the role's pool in the plan), the role's model and parallel config (from the
plan; dp cut to the devices the event names), and returns the cost model's time for the event as a
function of the efficiency factors. The unknowns `placer.calibrate.fit` solves for are listed in `GROUPS`.

Event conventions relied on (traces/schema.py; the simulator and the executor write them):
  prefill   batch, tokens (new tokens over the batch), context (the attention span after the
            prefill, summed over the batch; default: tokens)
  decode    batch, tokens (generated over the batch), context (KV tokens the batch holds when the
            event starts, summed), steps (default tokens / batch): a lockstep run
  generate  a whole lockstep generation (prefill then decode): batch, tokens (generated), steps
            (decode steps; default tokens / batch), prompt_tokens (a total, or a list per sample;
            default batch x the job's mean prompt)
  forward, train   tokens, sample_ids (mean sequence = tokens / samples; default the job's mean
            context), steps (optimizer steps of a train event, default 1), gathers (full-weight
            gathers for the sync the event includes, `costmodel.weight_gather_time`; default 0)
  transfer  bytes (or gb), gbs (the path's nominal GB/s; default the plan's per-replica weight-sync
            bandwidth as `placer.cost.timing.sync_time` prices it), dst ("pool:node"; default the rollout
            pool, whose efficiency prices the push), calls (sequential calls per sender; default
            `placer.cost.timing.sync_calls` of the bytes for the plan's rollout model and actor pipeline,
            at the prior `sync_bucket_gb`); a transfer without a size (an onload) is skipped
  checkpoint  none: a checkpoint of every trained role (`hostmem.plan_checkpoint_s`), which fits
            `checkpoint_overhead_s` on the actor's device type
  collective  collective (all_reduce, all_gather, reduce_scatter, or fsdp_unit: an FSDP2 unit's
            gather and reduce-scatter, each a call; gather: a whole-tensor gather; tp_pair: a TP
            linear pair's all-reduces), ranks, bytes (the message as `placer.cost.collectives`
            defines it), calls: the trainers' timed probe (executors/collprobe.py), which fits
            `coll_base_s` (gather: `gather_call_s`; tp_pair: `tp_call_s`; fsdp_unit:
            `fsdp_call_s`)
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache, partial

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.collectives import all_gather, all_reduce, reduce_scatter
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.estimate import mean_context, reducing
from placer.cost.generation import decode_run_time, decode_step_time, prefill_time
from placer.cost.layercomm import oversubscription, span_link, tp_link, weight_gather_time
from placer.cost.model import score_time, sync_call_cost, train_time, transfer_time
from placer.cost.pricer import Pricer
from placer.cost.roleestimate import Estimate
from placer.cost.roofline import GB, Memory, chunk_seq, weight_tensors
from placer.cost.sharding import Parallel
from placer.cost.timing import Placed, sync_bandwidth, sync_calls
from placer.cost.vocabcomm import head_of
from placer.solve.hostmem import checkpoint_time, trained_layouts
from placer.solve.planfile import Plan, calibration_of
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceType
from traces.schema import TraceEvent

OFF = 1e30  # a factor "switched off": its term vanishes (1/OFF is below any float noise here)
INV, ADD = "inverse", "additive"
GROUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "inference": (("mfu_prefill", INV), ("decode_bw_eff", INV), ("decode_flops_eff", INV),
                  ("step_overhead_s", ADD), ("lpu_step_s", ADD)),
    "train": (("mfu_train", INV), ("mfu_score", INV), ("train_overhead_s", ADD)),
    "transfer": (("link_eff", INV), ("sync_latency_s", ADD), ("sync_call_s", ADD),
                 ("sync_load_entry_s", ADD)),
    "collective": (("coll_base_s", ADD), ("gather_call_s", ADD), ("tp_call_s", ADD),
                   ("fsdp_call_s", ADD)),
    "checkpoint": (("checkpoint_overhead_s", ADD),),
}
GROUP_OF = {"prefill": "inference", "decode": "inference", "generate": "inference",
            "forward": "train", "train": "train", "transfer": "transfer",
            "collective": "collective", "checkpoint": "checkpoint"}
# groups whose events exist to time their one overhead (a timed probe, a checkpoint): each event
# supports it whatever its prior's share (a prior of 0 s has none)
OWN_TIMING = ("collective", "checkpoint")
# kinds a run may record too rarely to fit (a checkpoint every k steps): fewer than the minimum
# leave the prior, where too few of another kind refuse the fit (`placer.calibrate.fit._check_counts`)
OPTIONAL = ("checkpoint",)
# fitted first: the other groups' events price their collectives at its result (placer.calibrate.fit)
FIRST_GROUPS = ("collective",)
# a probe's kind -> its price per call; an FSDP unit's round is a gather and a reduce-scatter
COLLECTIVES = {"all_reduce": all_reduce, "all_gather": all_gather,
               "reduce_scatter": reduce_scatter, "fsdp_unit": all_gather, "gather": all_gather,
               "tp_pair": all_reduce}
# probe kinds whose per-call cost is another factor than `coll_base_s` (`layercomm.call_cost`;
# here without its fallback, so that each kind prices one unknown)
OWN_CALL_COST = {"gather": "gather_call_s", "tp_pair": "tp_call_s", "fsdp_unit": "fsdp_call_s"}
KINDS = {n: k for group in GROUPS.values() for n, k in group}


# ----------------------------------------------------------------------------- event -> model
class EventContext:
    """What an event needs from the plan: device type, model, parallel config, priors."""

    def __init__(self, plan: Plan, source: str):
        self.plan, self.source = plan, source
        self.px = Pricer(plan.resolved(), calibration_of(plan))  # the plan's prices, as planned
        self.res: Resolved = self.px.res
        self.calib: Calibration = self.px.calib
        self.pools = {p.name for p in self.res.cluster.pools}
        self.sync_gbs = _plan_sync_gbs(plan, self.px)

    def bad(self, i: int, ev: TraceEvent, what: str) -> SpecError:
        return SpecError(f"{self.source}: traceEvents.{i} ({ev.cat} {ev.name!r}): {what}")

    def num(self, i: int, ev: TraceEvent, key: str, default: float | None = None,
            positive: bool = False) -> float:
        v = ev.args.get(key, default)
        if v is None:
            raise self.bad(i, ev, f"args.{key}: missing (needed to price a {ev.cat} event)")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                or (positive and v == 0):
            raise self.bad(i, ev, f"args.{key}: expected a {'positive' if positive else 'non-negative'}"
                                  f" number (got {v!r})")
        return float(v)

    def pool(self, i: int, ev: TraceEvent) -> str:
        devs = ev.args.get("devices")
        if isinstance(devs, list) and devs:
            name = str(devs[0]).split(":")[0]
        else:
            name = ev.pid.split(":")[0]
        if name not in self.pools:
            role = ev.args.get("role")
            if role in self.plan.roles:
                return self.plan.roles[role].pool
            raise self.bad(i, ev, f"pool {name!r} (from devices/pid) is not in the plan's cluster "
                                  f"({', '.join(sorted(self.pools))})")
        return name

    def role(self, i: int, ev: TraceEvent) -> str:
        role = ev.args.get("role")
        if role not in self.plan.roles:
            raise self.bad(i, ev, f"args.role: {role!r} is not a role of the plan "
                                  f"({', '.join(self.plan.roles)})")
        return str(role)

    def par(self, ev: TraceEvent, role: str) -> Parallel:
        """The role's parallel config, with dp cut to the devices the event names (a worker's
        share of a data-parallel step); of a split role, the event's part's (`args.part`, which
        the executor records on a split role's events)."""
        r = self.plan.roles[role]
        part = ev.args.get("part")
        if r.parts and isinstance(part, int) and 0 <= part < len(r.parts):
            par = r.parts[part].par
        else:
            par = r.par
        devs = ev.args.get("devices")
        if isinstance(devs, list) and devs:
            return replace(par, dp=max(len(devs) // par.replica, 1))
        return par


def price_event(ctx: EventContext, i: int, ev: TraceEvent
                ) -> tuple[str, DeviceType, Callable[[Efficiency], float]] | None:
    """(device type name, device, time-as-a-function-of-efficiency) of one event, or None when
    no named factor prices it (a rule reward, an environment's own work)."""
    if ev.cat == "transfer":
        return _price_transfer(ctx, i, ev)
    if ev.cat == "collective":
        return _price_collective(ctx, i, ev)
    if ev.cat == "checkpoint":
        return _price_checkpoint(ctx)
    role = ctx.role(i, ev)
    m = ctx.res.model_of(role)
    if m is None:
        return None
    dev = ctx.res.device_of(ctx.pool(i, ev))
    par = ctx.par(ev, role)
    tokens = ctx.num(i, ev, "tokens", positive=True)
    if ev.cat in ("prefill", "decode", "generate"):
        batch = ctx.num(i, ev, "batch", positive=True)
        if ev.cat == "prefill":  # span as priced, else from the summed context (sequences' mean)
            span = ctx.num(i, ev, "span", 0.0) or chunk_seq(
                max(ctx.num(i, ev, "context", 0.0), tokens) / batch, tokens / batch)
            return dev.name, dev, lambda e: prefill_time(m, dev, par, tokens, span, e)
        steps = max(int(round(ctx.num(i, ev, "steps", tokens / batch, positive=True))), 1)
        if ev.cat == "decode":
            return dev.name, dev, DecodeRun(m, dev, par, int(round(batch)),
                                            ctx.num(i, ev, "context", 0.0) / batch, steps)
        per = ev.args.get("prompt_tokens")
        if isinstance(per, list):  # per sample (traces/record.py)
            if not per or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and 0 <= v < math.inf for v in per):
                raise ctx.bad(i, ev, f"args.prompt_tokens: expected non-negative numbers "
                                     f"(got {per!r:.80})")
            prompt = float(sum(per))
        else:
            prompt = ctx.num(i, ev, "prompt_tokens",
                             batch * ctx.res.job.lengths.prompt.mean_value(), positive=True)
        return dev.name, dev, GenerateRun(m, dev, par, int(round(batch)), prompt / batch, steps)
    ids = ev.args.get("sample_ids")
    seq = tokens / len(ids) if isinstance(ids, list) and ids else mean_context(ctx.res)
    if ev.cat == "forward":
        head = head_of(role)
        return dev.name, dev, lambda e: score_time(m, dev, par, tokens, seq, e, head)
    steps = int(round(ctx.num(i, ev, "steps", 1.0, positive=True)))
    # an executor's train event ends with the weights' gather for the sync (`args.gathers`)
    gathers, tensors = ctx.num(i, ev, "gathers", 0.0), weight_tensors(m)
    upar = reducing(ctx.res, par)  # the gradients at the framework's precision, as planned

    def train(e: Efficiency) -> float:
        return train_time(m, dev, upar, tokens, seq, steps, e, head_of(role)) + gathers * weight_gather_time(
            m, dev, par, tensors, e)
    return dev.name, dev, train


def _price_transfer(ctx: EventContext, i: int, ev: TraceEvent
                    ) -> tuple[str, DeviceType, Callable[[Efficiency], float]] | None:
    """A weight push to the rollout pool, priced by `costmodel.transfer_time` (the destination's
    efficiency applies, as in `timing.sync_time`)."""
    if "bytes" in ev.args:
        nbytes = ctx.num(i, ev, "bytes", positive=True)
    elif "gb" in ev.args:
        nbytes = ctx.num(i, ev, "gb", positive=True) * GB
    else:
        return None  # an onload or other unsized copy: no factor here prices it
    dst_pool = str(ev.args.get("dst", "")).split(":")[0]
    if dst_pool not in ctx.pools:
        if Role.ROLLOUT not in ctx.plan.roles:
            return None
        dst_pool = ctx.plan.roles[Role.ROLLOUT].pool
    dev = ctx.res.device_of(dst_pool)
    gbs = ctx.num(i, ev, "gbs", ctx.sync_gbs, positive=True)
    calls = ev.args.get("calls")
    # the bucket size is a prior (not fitted): the calls of an event are fixed while fitting
    if calls is None and {Role.ACTOR, Role.ROLLOUT} <= set(ctx.plan.roles):
        calls = sync_calls(ctx.res.arch_of(Role.ROLLOUT), ctx.plan.roles[Role.ACTOR].pp,
                           ctx.calib.for_device(dev), nbytes)
    n = int(ctx.num(i, ev, "calls", calls if calls is not None else 1, positive=True))
    if Role.ROLLOUT not in ctx.plan.roles:
        return dev.name, dev, partial(transfer_time, nbytes, gbs, dev, calls=n)
    m = ctx.res.arch_of(Role.ROLLOUT)

    def push(e: Efficiency) -> float:  # a call: a bucket's, or one tensor's loader walk
        return transfer_time(nbytes, gbs, dev, e, n, sync_call_cost(m, e))
    return dev.name, dev, push


def _price_collective(ctx: EventContext, i: int, ev: TraceEvent
                      ) -> tuple[str, DeviceType, Callable[[Efficiency], float]]:
    """A timed run of `calls` collectives of one kind (executors/collprobe.py) over `ranks`
    ranks of the event's pool, each priced by `placer.cost.collectives` on the link a group of that
    many devices runs on (`layercomm.span_link`): calls * (coll_base_s + hops + bytes / bw)."""
    kind = ev.args.get("collective")
    if kind not in COLLECTIVES:
        raise ctx.bad(i, ev, f"args.collective: expected one of {', '.join(COLLECTIVES)} "
                             f"(got {kind!r})")
    fn = COLLECTIVES[str(kind)]
    ranks = int(ctx.num(i, ev, "ranks", positive=True))
    nbytes = ctx.num(i, ev, "bytes", 0.0)
    calls = ctx.num(i, ev, "calls", positive=True)
    dev = ctx.res.device_of(ctx.pool(i, ev))

    def t(e: Efficiency) -> float:  # the probe's ranks share an emulated device's host too
        # a TP pair runs on the TP group's link (`layercomm.tp_link`)
        link = tp_link(dev, e) if kind == "tp_pair" else span_link(dev, ranks, e)
        if kind in OWN_CALL_COST:
            link = replace(link, base_s=getattr(e, OWN_CALL_COST[kind]))
        return calls * fn(nbytes, ranks, link) * oversubscription(dev, ranks, e)
    return dev.name, dev, t


def _price_checkpoint(ctx: EventContext
                      ) -> tuple[str, DeviceType, Callable[[Efficiency], float]] | None:
    """A checkpoint of every trained role at once (`hostmem.plan_checkpoint_s`: the slowest
    role's write and fixed cost), priced on the actor's device type (the first trained
    role's), whose factors the fit sets; None without a trained role."""
    trained = trained_layouts(ctx.plan)
    if not trained:
        return None
    storage = ctx.res.job.cluster.storage_gbs

    def t(e: Efficiency) -> float:
        return max(checkpoint_time(m, e, storage) for m, _, _ in trained)
    return trained[0][1].name, trained[0][1], t


def _plan_sync_gbs(plan: Plan, px: Pricer) -> float | None:
    """The plan's weight-sync bandwidth (raw GB/s of the broadcast's slowest link, with the
    rollout device's sender and local-load rates), as `timing.sync_time` prices it."""
    roles, res = plan.roles, px.res
    if Role.ACTOR not in roles or Role.ROLLOUT not in roles:
        return None
    actor, rollout = roles[Role.ACTOR], roles[Role.ROLLOUT]
    a = Placed(actor.slot, Estimate(Role.ACTOR, actor.pool, actor.par, Memory(), {}))
    targets = [(q.pool, q.par) for q in rollout.parts] or [(rollout.pool, rollout.par)]
    # a split rollout: the broadcast every part joins runs at its slowest part's links
    return min(sync_bandwidth(res, a, Placed(rollout.slot, Estimate(Role.ROLLOUT, pool, par,
                                                                     Memory(), {})),
                              px.eff(pool))
               for pool, par in targets)


@lru_cache(maxsize=256)
def _off_cached(eff: Efficiency, names: tuple[str, ...]) -> Efficiency:
    return eff.override({n: (OFF if KINDS[n] == INV else 0.0) for n in names})


def switch_off(eff: Efficiency, names: list[str]) -> Efficiency:
    """`eff` with the named unknowns switched off (cached: every event of a group probes the
    same few variants)."""
    return _off_cached(eff, tuple(names))


@lru_cache(maxsize=256)
def probe_variants(eff: Efficiency, unknowns: tuple[str, ...]) -> tuple[Efficiency, ...]:
    base = switch_off(eff, list(unknowns))
    return (base, *(base.override({n: 1.0}) for n in unknowns))


@dataclass(frozen=True)
class DecodeRun:
    """A decode event: `steps` lockstep steps of `batch` sequences from per-sequence context ctx0."""

    m: ModelArch
    dev: DeviceType
    par: Parallel
    batch: int
    ctx0: float
    steps: int

    def __call__(self, e: Efficiency, start: int = 0, count: int | None = None) -> float:
        n = self.steps - start if count is None else count
        return decode_run_time(self.m, self.dev, self.par, self.batch, self.ctx0 + start, n, e)

    def compute_bound_steps(self, e: Efficiency) -> int:
        """Steps 0..j-1 are compute-bound at `e` (the memory term only grows with the context)."""
        mem, comp = switch_off(e, ["decode_flops_eff"]), switch_off(e, ["decode_bw_eff"])

        def memory_bound(i: int) -> bool:
            ctx = self.batch * (self.ctx0 + i)
            return (decode_step_time(self.m, self.dev, self.par, self.batch, ctx, mem)
                    >= decode_step_time(self.m, self.dev, self.par, self.batch, ctx, comp))
        if memory_bound(0):
            return 0
        if not memory_bound(self.steps - 1):
            return self.steps
        lo, hi = 1, self.steps - 1  # first memory-bound step, by bisection
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if memory_bound(mid) else (mid + 1, hi)
        return lo

    def parts(self, e: Efficiency) -> tuple[int, list[tuple[Callable[[Efficiency], float], str]]]:
        """(j, [(time of a part, the decode factor switched off in it)]): the compute-bound
        prefix prices FLOPs, the memory-bound rest prices bandwidth."""
        j = self.compute_bound_steps(e)
        out: list[tuple[Callable[[Efficiency], float], str]] = []
        for start, count, drop in ((0, j, "decode_bw_eff"), (j, self.steps - j, "decode_flops_eff")):
            if count:
                out.append((partial(self.__call__, start=start, count=count), drop))
        return j, out


@dataclass(frozen=True)
class GenerateRun:
    """A whole lockstep generation (the executor's `generate` event): one prefill of the
    prompts, then `steps` decode steps of the batch."""

    m: ModelArch
    dev: DeviceType
    par: Parallel
    batch: int
    prompt: float  # mean prompt tokens per sequence
    steps: int

    def parts(self, e: Efficiency) -> tuple[int, list[tuple[Callable[[Efficiency], float], str]]]:
        pre = self.batch * self.prompt
        decode = DecodeRun(self.m, self.dev, self.par, self.batch, self.prompt, self.steps)
        j, rest = decode.parts(e)
        return j, [(lambda eff: prefill_time(self.m, self.dev, self.par, pre, self.prompt, eff),
                    ""), *rest]

    def __call__(self, e: Efficiency) -> float:
        return sum(f(e) for f, _ in self.parts(e)[1])
