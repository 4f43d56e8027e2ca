"""Per-role estimates: what one role's work in one iteration costs on a pool and parallel config.

This is the bridge from a job (batch, lengths, turns) to the cost model's primitives. The planner
turns these estimates into its cost table; the simulator replays the same work sample by sample,
so with every source of variance off both agree.

Roles and the work they do each iteration (n samples, mean context s tokens):
  rollout      generate n samples, `turns` turns each, on dp engine replicas
               (`placer.cost.rolloutcost`: the tail-aware makespan of the critical replica
               with the job's distributions, lockstep waves of mean sequences with every
               distribution fixed)
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
`estimate` dispatches each role to its estimator; the result is a `placer.cost.roleestimate.Estimate`.
Formulas and sources: docs/cost-model.md.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Literal

import numpy as np

from placer.base.roles import TRAINING_ROLES, Role, base_role
from placer.cost.attnspan import attention_span
from placer.cost.context import PriceContext
from placer.cost.efficiency import Efficiency
from placer.cost.generation import (
    forward_time,
    lpu_chips,
)
from placer.cost.judge import judge_cost
from placer.cost.layercomm import fsdp_units, weight_gather_time
from placer.cost.model import dispatch_time, score_time, tool_waves, train_memory, train_time
from placer.cost.offload import streamed
from placer.cost.packing import pass_pad
from placer.cost.refswap import swap_time
from placer.cost.roleestimate import Estimate, infeasible, lpu_short
from placer.cost.rolloutcost import (
    generated_samples,
    rollout_estimate,
)
from placer.cost.roofline import (
    BYTES,
    GB,
    Memory,
    infer_memory,
    weight_tensors,
)
from placer.cost.rulecheck import rule_reward_time
from placer.cost.sharding import Parallel, train_state_bytes
from placer.cost.tail_samples import sample_totals, shortest, varies
from placer.cost.vision import (
    encoder_activation_gb,
    pass_encode_s,
    trainer_image_prep_s,
)
from placer.cost.vocabcomm import head_of
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.distributions import Distribution
from placer.spec.hardware import DeviceKind, DeviceType, Pool

# Which kinds of device may host a role (training needs can_train as well).
HOSTS: dict[str, tuple[DeviceKind, ...]] = {
    Role.ACTOR: (DeviceKind.gpu,),
    Role.CRITIC: (DeviceKind.gpu,),
    Role.ROLLOUT: (DeviceKind.gpu, DeviceKind.lpu, DeviceKind.cpu),
    Role.REFERENCE: (DeviceKind.gpu, DeviceKind.lpu, DeviceKind.cpu),
    Role.REWARD: (DeviceKind.gpu, DeviceKind.lpu, DeviceKind.cpu),
    Role.ENVIRONMENT: (DeviceKind.cpu,),
}
RULE_REWARD_S = Efficiency().rule_reward_s  # default CPU seconds per rule-checked sample


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
        Role.ROLLOUT: rollout_estimate, Role.ENVIRONMENT: _environment, Role.ACTOR: _train,
        Role.CRITIC: _train, Role.REFERENCE: _forward, Role.REWARD: _reward}
    fn = fns[role]
    est = fn(ctx, role, pool, dev, par, eff, env_cores)
    if est.feasible and est.memory.total > dev.memory_gb:
        mem = est.memory
        parts = ", ".join(f"{k} {getattr(mem, k):.1f}" for k in
                          ("weights", "grads", "optimizer", "activations", "kv_cache", "overhead")
                          if getattr(mem, k) > 0)
        return infeasible(est, f"needs {mem.total:.1f} GB per device ({parts}), "
                                f"{dev.name} has {dev.memory_gb:g} GB")
    return est


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
    totals = sample_totals(resp, turns, seed)
    return float(np.mean(totals) - np.mean(shortest(totals, keep)))


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


def reducing(res: Resolved, par: Parallel) -> Parallel:
    """`par` as its update runs: its gradients reduced at the job's framework's precision
    (`FrameworkProfile.grad_reduce_bytes`: fp32 or BF16). The planner's estimate and the
    simulator's train events both price the update on it."""
    return replace(par, grad_reduce_bytes=res.job.profile.grad_reduce_bytes(pp=par.pp, ep=par.ep))


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
    upar = reducing(res, upar)
    span = trained_span(res)
    # a pipelined pass's packed micro-batches, each padded to its rank's longest bin
    # (`placer.cost.packing`, the frameworks that do)
    fwd = (score_time(m, dev, fpar, tokens * pass_pad(res, fpar, "forward"), seq, eff, head, span)
           + ship + pass_encode_s(m, dev, par, n, imgs, eff))
    train = (train_time(m, dev, upar, tokens * pass_pad(res, upar, "update"), seq,
                        res.job.batch.mini_batches, eff, head, span)
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
            return infeasible(Estimate(role, pool.name, par, Memory(), {}),
                               lpu_short(m, dev, chips, par))
        mem = Memory(weights=infer_memory(m, par, dev, eff).weights * par.replica / chips)
        return Estimate(role, pool.name, par, mem,
                        {"score": forward_time(m, dev, par, tokens, trained_span(res), eff)
                         + pass_dispatch(res, eff)
                         + pass_encode_s(m, dev, par, res.job.batch.samples,
                                         res.job.lengths.images_per_prompt, eff)})
    mem = infer_memory(m, par, dev, eff)
    imgs = res.job.lengths.images_per_prompt  # a VLM's encoder (`placer.cost.vision`)
    fpar = budgeted(res, par, "forward")  # the job's forward micro-batches
    score = score_time(m, dev, fpar, tokens * pass_pad(res, fpar, "forward"), seq, eff,
                       head_of(role), trained_span(res))
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
        return infeasible(est, jc.reason) if jc.reason else est
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
