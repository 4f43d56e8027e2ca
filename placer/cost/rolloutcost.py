"""The rollout engines' estimate: how one iteration's samples flow through the engine replicas.

`rollout_shape` splits the generated samples over the replicas and asks the KV budget how many
run at once (`RolloutShape`); `rollout_estimate` prices the generation: the tail-aware makespan
of the critical replica (`placer.cost.rollout_tail`) when any length varies, else lockstep waves
of mean-length sequences (`wave_time`) while their KV fits to the end, plus a vision model's
image encoding and the host image preparation a framework runs inside the step. Formulas and
sources: docs/cost-model.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from placer.base.roles import Role, base_role
from placer.cost.context import PriceContext
from placer.cost.efficiency import Efficiency
from placer.cost.generation import decode_run_time, lpu_chips, max_concurrency, prefill_time
from placer.cost.model import tool_waves
from placer.cost.roleestimate import Estimate, infeasible, lpu_short
from placer.cost.rollout_tail import (
    Replicas,
    fits_lockstep,
    identical_span,
    makespan,
    steady_concurrency,
)
from placer.cost.roofline import Memory, chunk_seq, infer_memory, kv_bytes_per_token, kv_split
from placer.cost.sharding import Parallel, linear_state_bytes
from placer.cost.tail_samples import has_variance
from placer.cost.vision import engine_prompts, host_prep_s, rollout_encode_s
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind, DeviceType, Pool
from placer.spec.job import Job


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


def rollout_estimate(ctx: PriceContext, role: str, pool: Pool, dev: DeviceType, par: Parallel,
             eff: Efficiency, env_cores: int | None) -> Estimate:
    res = ctx.res
    m = res.arch_of(Role.ROLLOUT)
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, eff)
        if par.devices < chips:
            return infeasible(Estimate(role, pool.name, par, Memory(), {}),
                               lpu_short(m, dev, chips, par))
        mem = Memory(weights=m.params() * 2 / chips / 1e9)
    else:
        mem = infer_memory(m, par, dev, eff)
    shape = rollout_shape(ctx, dev, par, eff)
    st = ctx.step_terms(m, dev, par, eff)
    if shape.concurrency < 1:
        longest = res.job.max_context
        free = max(dev.memory_gb * eff.kv_mem_fraction - mem.total, 0.0)
        split = kv_split(m, par)  # devices holding distinct KV (a latent is not split by TP)
        return infeasible(Estimate(role, pool.name, par, mem, {}),
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
