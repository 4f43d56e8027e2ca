"""Per-role estimates: what one role's work in one iteration costs on a pool and parallel config.

This is the bridge from a job (batch, lengths, turns) to the cost model's primitives. The planner
turns these estimates into its cost table; the simulator replays the same work sample by sample,
so with every source of variance off both agree.

Roles and the work they do each iteration (n samples, mean context s tokens):
  rollout      generate n samples, `turns` turns each, on dp engine replicas: the tail-aware
               makespan of the critical replica (`placer.cost.rollout_tail`) with the job's
               distributions, lockstep waves of mean sequences (`wave_time`) with every
               distribution fixed
  environment  (turns - 1) rounds of n tool calls on CPU cores
  reference    forward over n*s tokens (KL log-probs)
  reward       forward over n*s tokens (model), a generative judge's decode queue (prefill of
               context + rubric, decode of its verdict: `placer.cost.judge`), or a
               rule/verifier per sample on CPU cores
  critic       forward (values) + training over n*s tokens (PPO)
  actor        forward (old log-probs) + training over n*s tokens in `mini_batches` steps
A vision-language model's encoder adds its FLOPs per image to each of these passes and its
activations to their memory (`placer.cost.vision`); the image tokens are in the prompt's length.
Every trainer and frozen forward pass also pays the driver's dispatch (`pass_dispatch`).
Formulas and sources: docs/cost-model.md.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

import numpy as np

from placer.base.roles import TRAINING_ROLES, Role, base_role
from placer.cost.attnspan import attention_span
from placer.cost.context import PriceContext
from placer.cost.efficiency import Efficiency
from placer.cost.generation import (
    decode_run_time,
    forward_time,
    lpu_chips,
    max_concurrency,
    prefill_time,
)
from placer.cost.judge import judge_cost
from placer.cost.layercomm import fsdp_units, weight_gather_time
from placer.cost.model import dispatch_time, score_time, tool_waves, train_memory, train_time
from placer.cost.offload import streamed
from placer.cost.refswap import swap_time
from placer.cost.rollout_tail import (
    Replicas,
    fits_lockstep,
    identical_span,
    makespan,
    steady_concurrency,
)
from placer.cost.roofline import (
    BYTES,
    GB,
    Memory,
    chunk_seq,
    infer_memory,
    kv_bytes_per_token,
    kv_split,
    weight_tensors,
)
from placer.cost.rulecheck import rule_reward_time
from placer.cost.sharding import Parallel, linear_state_bytes, train_state_bytes
from placer.cost.tail_samples import has_variance, quantile, varies
from placer.cost.vision import (
    encoder_activation_gb,
    engine_prompts,
    host_prep_s,
    pass_encode_s,
    rollout_encode_s,
    trainer_image_prep_s,
)
from placer.cost.vocabcomm import head_of
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.distributions import Distribution
from placer.spec.hardware import DeviceKind, DeviceType, Pool
from placer.spec.job import Job

# Which kinds of device may host a role (training needs can_train as well).
HOSTS: dict[str, tuple[DeviceKind, ...]] = {
    Role.ACTOR: (DeviceKind.gpu,),
    Role.CRITIC: (DeviceKind.gpu,),
    Role.ROLLOUT: (DeviceKind.gpu, DeviceKind.lpu, DeviceKind.cpu),
    Role.REFERENCE: (DeviceKind.gpu, DeviceKind.lpu, DeviceKind.cpu),
    Role.REWARD: (DeviceKind.gpu, DeviceKind.lpu, DeviceKind.cpu),
    Role.ENVIRONMENT: (DeviceKind.cpu,),
}
TRUNCATION_GRID = 4096  # quantiles (or draws) behind the trained samples' mean length
RULE_REWARD_S = Efficiency().rule_reward_s  # default CPU seconds per rule-checked sample


@dataclass(frozen=True)
class Estimate:
    """Time (s) of a role's work per iteration, split by stage, and its memory per device (GB)."""

    role: str
    pool: str
    par: Parallel
    memory: Memory
    stage_s: dict[str, float]
    feasible: bool = True
    reason: str = ""
    concurrency: int = 0  # rollout: sequences per replica at once
    # A role split over pools (`placer.cost.split`): each part's own estimate and samples; the
    # whole's `pool` names the parts' pools joined by "+", `par` is the first part's layout.
    parts: tuple[Part, ...] = ()

    @property
    def time_s(self) -> float:
        return sum(self.stage_s.values())

    @property
    def devices(self) -> int:
        return sum(p.est.devices for p in self.parts) if self.parts else self.par.devices

    def pool_devices(self) -> dict[str, int]:
        """Devices held on each pool: one pool, or every part's."""
        if not self.parts:
            return {self.pool: self.devices}
        out: dict[str, int] = {}
        for p in self.parts:
            out[p.est.pool] = out.get(p.est.pool, 0) + p.est.devices
        return out


@dataclass(frozen=True)
class Part:
    """One part of a split role: its estimate for its `samples` of the batch's kept samples."""

    est: Estimate
    samples: int


def can_host(res: Resolved, role: str, pool: Pool) -> bool:
    dev = res.device_of(pool)
    if dev.kind not in HOSTS[role]:
        return False
    if role in TRAINING_ROLES and not dev.can_train:
        return False
    if role == Role.REWARD and res.model_of(Role.REWARD) is None:
        return dev.kind is DeviceKind.cpu  # a rule reward is CPU work
    return True


def mean_context(res: Resolved) -> float:
    """Mean tokens of one finished sample: prompt, every turn's response and tool outputs."""
    j = res.job
    env = j.environment
    return (j.lengths.prompt.mean_value() + env.turns * j.lengths.response.mean_value()
            + (env.turns - 1) * env.tool_output_tokens)


# One role's estimate on a pool: (context, role, pool, device, layout, factors, environment cores).
RoleEstimator = Callable[[PriceContext, str, Pool, DeviceType, Parallel, Efficiency, int | None],
                         Estimate]


def estimate(ctx: PriceContext, role: str, pool: Pool, par: Parallel,
             env_cores: int | None = None) -> Estimate:
    """Estimate one role on `pool` with `par`; `env_cores` prices tool calls inside the rollout."""
    dev = ctx.res.device_of(pool)
    eff = ctx.calib.for_device(dev)
    fns: dict[str, RoleEstimator] = {
        Role.ROLLOUT: _rollout, Role.ENVIRONMENT: _environment, Role.ACTOR: _train,
        Role.CRITIC: _train, Role.REFERENCE: _forward, Role.REWARD: _reward}
    fn = fns[role]
    est = fn(ctx, role, pool, dev, par, eff, env_cores)
    if est.feasible and est.memory.total > dev.memory_gb:
        mem = est.memory
        parts = ", ".join(f"{k} {getattr(mem, k):.1f}" for k in
                          ("weights", "grads", "optimizer", "activations", "kv_cache", "overhead")
                          if getattr(mem, k) > 0)
        return _infeasible(est, f"needs {mem.total:.1f} GB per device ({parts}), "
                                f"{dev.name} has {dev.memory_gb:g} GB")
    return est


def _lpu_short(m: ModelArch, dev: DeviceType, chips: int, par: Parallel) -> str:
    return (f"{m.name} needs {chips} {dev.name} chips to hold {m.params() * 2 / 1e9:.1f} GB of "
            f"weights plus KV reserve in {dev.memory_gb:g} GB of SRAM each, got {par.devices}")


def _infeasible(est: Estimate, reason: str) -> Estimate:
    return Estimate(est.role, est.pool, est.par, est.memory, est.stage_s, False, reason,
                    est.concurrency)


def _tokens(res: Resolved) -> tuple[float, float]:
    s = trained_context(res)
    return res.job.batch.samples * s, s


def trained_span(res: Resolved) -> float:
    """The length whose causal attention prices the trained samples' (`attnspan`: E[s^2] / E[s]
    over them, the shortest kept fraction of an over-provisioned step)."""
    j = res.job
    gen = generated_samples(j)
    cut = j.tail_policy.mechanism.keeps_first and gen > j.batch.samples and varies(
        j.lengths.response)
    return attention_span(trained_context(res), j.lengths.prompt, j.lengths.response,
                          j.environment.turns, j.batch.samples / gen if cut else 1.0, j.seed)


def trained_context(res: Resolved) -> float:
    """Mean tokens of one sample that the step scores and trains. Over-provisioned, the step
    keeps the first n of the ceil(n (1 + f)) generated to finish, and with continuous batching
    those are close to the n shortest: responses are then the mean below the n / generated
    quantile of a sample's total response (the sum of its turns), not the distribution's mean
    (the simulator trains exactly the committed samples; pricing full means put trained stages
    20-45% high with lognormal responses)."""
    j = res.job
    full = mean_context(res)
    gen = generated_samples(j)
    if not j.tail_policy.mechanism.keeps_first or gen <= j.batch.samples or not varies(
            j.lengths.response):
        return full
    return full - _shortest_cut(j.lengths.response, j.environment.turns,
                                j.batch.samples / gen, j.seed)


@lru_cache(maxsize=64)
def _shortest_cut(resp: Distribution, turns: int, keep: float, seed: int) -> float:
    """Mean total response of all samples minus that of the `keep` fraction with the shortest
    totals (a pure function of its arguments, so cached across a plan's candidates)."""
    if turns == 1:  # the exact truncated mean, on a fine grid of quantiles
        totals = quantile(resp, (np.arange(TRUNCATION_GRID) + 0.5) / TRUNCATION_GRID)
    else:  # a sum of turns: draws from the job's seed
        u = np.random.default_rng(seed).random(TRUNCATION_GRID * turns)
        totals = np.sort(quantile(resp, u).reshape(TRUNCATION_GRID, turns).sum(axis=1))
    shortest = totals[:max(int(keep * TRUNCATION_GRID), 1)]
    return float(np.mean(totals) - np.mean(shortest))


def budgeted(res: Resolved, par: Parallel, kind: Literal["forward", "update"]) -> Parallel:
    """`par` with the job's micro-batch token budget of `kind` (`Job.micro_token_budget`), else
    its framework's (`FrameworkProfile.micro_token_budget`: EasyR1's dynamic batching, its
    sequences per micro-batch x the padded length), where the layout sets none of its own (a
    budget or a `micro_batch` count): what a pass's micro-batches are priced at
    (`layercomm.micro_tokens`)."""
    budget = res.job.micro_token_budget
    tokens = getattr(budget, kind) if budget is not None else None
    if tokens is None:
        # the padded length: the longest prompt (its image tokens included) plus response
        tokens = res.job.profile.micro_token_budget(kind, res.job.max_context)
    if tokens is None or par.micro_token_budget > 0 or par.micro_batch > 0:
        return par
    return replace(par, micro_token_budget=tokens)


def _train(ctx: PriceContext, role: str, pool: Pool, dev: DeviceType, par: Parallel,
           eff: Efficiency, _env: int | None) -> Estimate:
    res = ctx.res
    m = res.arch_of(role)
    tokens, seq = _tokens(res)
    # the largest micro-batch's activations: `micro_batch` sequences at the longest context
    mem = train_memory(m, par, micro_tokens=max(par.micro_batch, 1) * res.job.max_context, eff=eff,
                       optimizer_bytes=res.job.profile.optimizer_bytes(pp=par.pp, ep=par.ep))
    imgs = res.job.lengths.images_per_prompt  # a VLM's encoder (`placer.cost.vision`)
    if m.vision is not None and imgs:
        mem = replace(mem, activations=mem.activations
                      + encoder_activation_gb(m, par, imgs, train=True))
    n = res.job.batch.samples
    ship = pass_dispatch(res, eff)  # each pass's batch through the driver, once per pass
    head = head_of(role)
    fpar, upar = budgeted(res, par, "forward"), budgeted(res, par, "update")
    # the update's gradients reduce at its framework's precision (fp32 or BF16)
    upar = replace(upar, grad_reduce_bytes=res.job.profile.grad_reduce_bytes(pp=par.pp, ep=par.ep))
    span = trained_span(res)
    fwd = (score_time(m, dev, fpar, tokens, seq, eff, head, span) + ship
           + pass_encode_s(m, dev, par, n, imgs, eff))
    train = (train_time(m, dev, upar, tokens, seq, res.job.batch.mini_batches, eff, head, span)
             + ship
             + pass_encode_s(m, dev, par, n, imgs, eff, train=True))
    train += weight_gather_time(m, dev, par, weight_tensors(m), eff)  # once per RL step
    train += trainer_image_prep_s(res, role, par, eff)
    return Estimate(role, pool.name, par, mem, {"score": fwd, "train": train})


def _weight_tensors(m: ModelArch) -> int:
    """`timing.weight_tensors` (imported here: placer.cost.timing imports this module)."""
    from placer.cost.roofline import weight_tensors
    return weight_tensors(m)


def pass_dispatch(res: Resolved, eff: Efficiency) -> float:
    """Seconds the driver spends shipping one trainer or forward pass's batch: every trained
    sample padded to the job's longest context (`costmodel.dispatch_time`)."""
    return dispatch_time(res.job.batch.samples, res.job.max_context, eff)


def _forward(ctx: PriceContext, role: str, pool: Pool, dev: DeviceType, par: Parallel,
             eff: Efficiency, _env: int | None) -> Estimate:
    res = ctx.res
    m = res.arch_of(role)
    tokens, seq = _tokens(res)
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, eff)
        if par.devices < chips:
            return _infeasible(Estimate(role, pool.name, par, Memory(), {}),
                               _lpu_short(m, dev, chips, par))
        mem = Memory(weights=infer_memory(m, par, dev, eff).weights * par.replica / chips)
        return Estimate(role, pool.name, par, mem,
                        {"score": forward_time(m, dev, par, tokens, trained_span(res), eff)
                         + pass_dispatch(res, eff)
                         + pass_encode_s(m, dev, par, res.job.batch.samples,
                                         res.job.lengths.images_per_prompt, eff)})
    mem = infer_memory(m, par, dev, eff)
    imgs = res.job.lengths.images_per_prompt  # a VLM's encoder (`placer.cost.vision`)
    fpar = budgeted(res, par, "forward")  # the job's forward micro-batches
    score = score_time(m, dev, fpar, tokens, seq, eff, head_of(role), trained_span(res))
    weights, gathered = mem.weights, 0.0
    if dev.kind is DeviceKind.gpu and frozen_sharded(par):
        # the same pass time: `mfu_score` is fitted on verl's old-log-prob passes, which run on
        # the FSDP-sharded actor, so it holds the per-unit gathers (a whole copy, which skips
        # them, is priced no faster: a known bias)
        weights, gathered = frozen_shard_gb(m, par)
    if dev.kind is DeviceKind.gpu:  # FSDP's CPU offload: the shard copied in per micro-batch
        stream_s, weights = streamed(weights, fpar, tokens / par.dp, seq, eff)
        score += stream_s
    if dev.kind is DeviceKind.gpu and base_role(role) in res.job.profile.swap_frozen:
        # a host state dict swapped into the policy's model per pass (`placer.cost.refswap`)
        score += swap_time(m, dev, par, weights, eff)
        weights = 0.0
    mem = Memory(weights=weights, overhead=mem.overhead,
                 activations=res.job.max_context * 34 * m.hidden / par.tp / 1e9 + gathered
                 + encoder_activation_gb(m, par, imgs))
    return Estimate(role, pool.name, par, mem,
                    {"score": score + pass_dispatch(res, eff)
                     + pass_encode_s(m, dev, par, res.job.batch.samples, imgs, eff)})


def frozen_sharded(par: Parallel) -> bool:
    """Whether a frozen model's forward (reference, reward model) holds its weights FSDP /
    ZeRO-3 sharded over its data-parallel ranks, as verl's and NeMo-RL's reference workers do
    (the actor's FSDP / Megatron wrapping applied to the reference), rather than a whole copy
    (over tp x pp) on every rank: `Parallel.sharded_weights` over more than one dp rank."""
    return par.sharded_weights and par.dp > 1


def frozen_shard_gb(m: ModelArch, par: Parallel) -> tuple[float, float]:
    """(shard, gathered) GB per device of a sharded frozen model: its BF16 shard
    (`train_state_bytes`' weights over the ZeRO group), which is what a colocated slot parks,
    and two FSDP units gathered whole while the pass runs (the unit in use and the one
    prefetched: FSDP2's default forward prefetch), freed after it like activations."""
    unit = m.params() * BYTES / fsdp_units(m) / par.weight_shards
    return train_state_bytes(m, par)[0] / GB, 2 * unit / GB


def _reward(ctx: PriceContext, role: str, pool: Pool, dev: DeviceType, par: Parallel,
            eff: Efficiency, env: int | None) -> Estimate:
    res = ctx.res
    if res.job.judge is not None:  # a generative judge: a decode queue (`placer.cost.judge`)
        m = res.arch_of(Role.REWARD)
        jc = judge_cost(ctx.step_terms(m, dev, par, eff), m, dev, par, eff, res.job.judge,
                        res.job.batch.samples, trained_context(res), res.job.max_context)
        est = Estimate(role, pool.name, par, jc.memory,
                       {"score": jc.seconds + pass_dispatch(res, eff)}, concurrency=jc.concurrency)
        return _infeasible(est, jc.reason) if jc.reason else est
    if res.model_of(Role.REWARD) is not None:
        return _forward(ctx, role, pool, dev, par, eff, env)
    # by its kind of check (`placer.cost.rulecheck`): one verify sandbox per CPU device, the
    # checks on every core or on the framework's verify workers (`FrameworkProfile.rule_workers`)
    cores = par.devices * dev.cores
    workers = res.job.profile.rule_workers
    t = rule_reward_time(res.job, res.job.batch.samples, par.devices,
                         min(cores, workers) if workers else cores, eff)
    return Estimate(role, pool.name, par, Memory(), {"score": t})


def _environment(ctx: PriceContext, role: str, pool: Pool, dev: DeviceType, par: Parallel,
                 eff: Efficiency, _env: int | None) -> Estimate:
    res = ctx.res
    env = res.job.environment
    cores = par.devices * dev.cores
    lat = env.tool_latency_s.mean_value() + eff.tool_overhead_s
    every = tool_waves(generated_samples(res.job), env.cpu_per_call, cores)
    # Calls queue first come, first served. Over-provisioned, the stage ends once n samples are
    # done: every generated sample's calls run in the rounds before the last, but of the last
    # round's only the first n (the rest are aborted); without it n is every sample.
    last = tool_waves(res.job.batch.samples, env.cpu_per_call, cores)
    rounds = env.turns - 1
    t = (max(rounds - 1, 0) * every + last) * lat if rounds else 0.0
    return Estimate(role, pool.name, par, Memory(), {"rollout": t})


def generated_samples(job: Job) -> int:
    """Samples the rollout generates per iteration: the batch, plus the over-provisioned extra
    (`tail_policy: overprovision` generates ceil(n (1 + fraction)) and keeps the first n)."""
    return job.tail_policy.mechanism.generated(job.batch.samples)


@dataclass(frozen=True)
class RolloutShape:
    """How samples flow through one engine replica. `concurrency`: the sequences an empty
    replica admits at once (KV for their mean prompts, `max_num_seqs`, `batching.KvBudget`);
    with variance off, the size of its lockstep waves while their KV fits to the end
    (`rollout_tail.fits_lockstep`)."""

    replicas: int
    per_replica: int
    concurrency: int
    waves: int
    generated: int = 0  # samples generated over all replicas (0: not given, = kept)
    kept: int = 0  # samples the step waits for
    steady: int = 0  # sequences at once in steady state (`rollout_tail.steady_concurrency`)

    def waves_used(self) -> tuple[int, int]:
        """(full waves, size of the last partial wave or 0) the busiest replica runs before the
        `kept` samples are done, every source of variance off (all of a wave ends together).

        Samples go round-robin, so replicas hold per_replica or per_replica - 1 of them; without
        over-provisioning every wave is needed, as before."""
        c, per = self.concurrency, self.per_replica
        full, rest = divmod(per, c) if c > 0 else (0, 0)
        if not self.overprovisioned:
            return full, rest
        lo, hi = 1, self.waves  # smallest w with done(w) >= kept
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if self._done(mid) < self.kept else (lo, mid)
        return (lo, 0) if lo <= full else (full, rest)

    @property
    def overprovisioned(self) -> bool:
        return self.generated > self.kept > 0 and self.concurrency > 0

    def _done(self, w: int) -> int:
        """Samples finished over all replicas after w waves (no variance)."""
        c, per = self.concurrency, self.per_replica
        big = self.generated - (per - 1) * self.replicas  # replicas holding `per` samples
        return big * min(w * c, per) + (self.replicas - big) * min(w * c, per - 1)


def rollout_shape(ctx: PriceContext, dev: DeviceType, par: Parallel, eff: Efficiency
                  ) -> RolloutShape:
    res = ctx.res
    m = res.arch_of(Role.ROLLOUT)
    replicas = (par.dp if dev.kind is not DeviceKind.lpu
                else max(par.devices // lpu_chips(m, dev, eff), 1))
    gen = generated_samples(res.job)
    per = math.ceil(gen / replicas)
    conc = steady = 0  # an engine that cannot hold one longest sequence runs none (infeasible)
    if max_concurrency(m, dev, par, res.job.max_context, eff) >= 1:
        prompt = max(int(round(res.job.lengths.prompt.mean_value())), 1)
        kv = ctx.step_terms(m, dev, par, eff).kv
        conc = kv.first_wave(prompt, per)
        steady = steady_concurrency(res.job, kv, conc)
    return RolloutShape(replicas, per, conc, math.ceil(per / conc) if conc > 0 else 0, gen,
                        res.job.batch.samples, steady)


def wave_time(res: Resolved, dev: DeviceType, par: Parallel, eff: Efficiency, batch: int,
              env_cores: int | None) -> tuple[float, float]:
    """(generation seconds, tool seconds) of one lockstep wave of `batch` sequences.

    Turn k: prefill the new tokens (prompt, or the previous tool output) at the grown context,
    decode `response` tokens; between turns every sequence waits on its tool call.
    """
    j, m = res.job, res.arch_of(Role.ROLLOUT)
    env = j.environment
    p, r, o = (j.lengths.prompt.mean_value(), j.lengths.response.mean_value(),
               env.tool_output_tokens)
    gen = tools = 0.0
    ctx = 0.0
    for turn in range(env.turns):
        new = p if turn == 0 else o
        if new > 0:
            gen += prefill_time(m, dev, par, batch * new, chunk_seq(ctx + new, new), eff)
        ctx += new
        gen += decode_run_time(m, dev, par, batch, ctx, int(round(r)), eff)
        ctx += r
        if turn < env.turns - 1 and env_cores:
            lat = env.tool_latency_s.mean_value() + eff.tool_overhead_s
            tools += tool_waves(batch, env.cpu_per_call, env_cores) * lat
    return gen, tools


def _waves(res: Resolved, dev: DeviceType, par: Parallel, eff: Efficiency,
           shape: RolloutShape) -> float:
    """Lockstep waves of mean-length sequences (every source of variance off): generation, and
    the tool waits of a wave's sequences when the CPU pool serves them all at once (their
    queueing for cores is `timing.rollout_tool_time`'s pair term)."""
    full, rest = shape.waves_used()
    gen = 0.0
    for batch, count in ((shape.concurrency, full), (rest, 1 if rest else 0)):
        if count:
            g, _ = wave_time(res, dev, par, eff, batch, None)
            gen += count * g
    env = res.job.environment
    if env.kind != "none" and env.turns > 1:
        lat = env.tool_latency_s.mean_value() + eff.tool_overhead_s
        gen += (env.turns - 1) * (full + (1 if rest else 0)) * lat
    return gen


def _state_note(m: ModelArch, eff: Efficiency) -> str:
    """' + X GB of linear-attention state' for a hybrid model (its per-sequence GDN state)."""
    state = linear_state_bytes(m, eff)
    return f" + {state / 1e9:.2f} GB of linear-attention state" if state > 0 else ""


def _rollout(ctx: PriceContext, role: str, pool: Pool, dev: DeviceType, par: Parallel,
             eff: Efficiency, env_cores: int | None) -> Estimate:
    res = ctx.res
    m = res.arch_of(Role.ROLLOUT)
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, eff)
        if par.devices < chips:
            return _infeasible(Estimate(role, pool.name, par, Memory(), {}),
                               _lpu_short(m, dev, chips, par))
        mem = Memory(weights=m.params() * 2 / chips / 1e9)
    else:
        mem = infer_memory(m, par, dev, eff)
    shape = rollout_shape(ctx, dev, par, eff)
    st = ctx.step_terms(m, dev, par, eff)
    if shape.concurrency < 1:
        longest = res.job.max_context
        free = max(dev.memory_gb * eff.kv_mem_fraction - mem.total, 0.0)
        split = kv_split(m, par)  # devices holding distinct KV (a latent is not split by TP)
        return _infeasible(Estimate(role, pool.name, par, mem, {}),
                           f"one {longest}-token sequence needs "
                           f"{longest * kv_bytes_per_token(m) / 1e9:.2f}"
                           f" GB of KV cache{_state_note(m, eff)} per replica, "
                           f"{free * split:.2f} GB is left on "
                           f"{split} x {dev.name} after {mem.total:.1f} GB of weights and "
                           "engine per device")
    if has_variance(res.job):  # the tail: continuous batching of drawn lengths
        gen = makespan(res.job, st, eff, Replicas(
            shape.replicas, shape.per_replica, shape.steady, shape.generated, shape.kept,
            ctx.step_draws))
    else:
        gen = (_waves(res, dev, par, eff, shape) if fits_lockstep(res.job, st.kv, shape.concurrency)
               else identical_span(res.job, st, Replicas(shape.replicas, shape.per_replica,
                                                         shape.steady, shape.generated,
                                                         shape.kept), eff.tool_overhead_s))
    gen += rollout_encode_s(m, dev, replica_devices(m, dev, par, eff), shape.per_replica,
                            res.job.lengths.images_per_prompt, eff)  # a VLM's images first
    if base_role(role) in res.job.profile.host_image_prep:  # prepared on the host, per prompt
        gen += host_prep_s(m, engine_prompts(shape.per_replica, res.job.batch.samples_per_prompt),
                           res.job.lengths.images_per_prompt, eff)
    kv = mem.total if dev.kind is DeviceKind.lpu else dev.memory_gb * eff.kv_mem_fraction
    return Estimate(role, pool.name, par, Memory(weights=mem.weights, overhead=mem.overhead,
                                                 kv_cache=max(kv - mem.total, 0.0)),
                    {"rollout": gen}, concurrency=shape.concurrency)


def replica_devices(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> int:
    """Devices of one engine replica: a set of `lpu_chips` on LPUs, tp x pp elsewhere."""
    if dev.kind is DeviceKind.lpu:
        return min(lpu_chips(m, dev, eff), par.devices)
    return par.replica
