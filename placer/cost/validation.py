"""Periodic validation inside the trainer's step: its generation's share of the mean step.

A framework that validates every N steps inside its step timer makes the mean step longer by
one validation pass / N. verl does (volcengine/verl @e2e4c35ecb6ede3e3fb23fafc44061bf31b54f37
verl/trainer/ppo/ray_trainer.py:1137-1339): the `step` timer holds `_validate()` on the steps
`trainer.test_freq` picks (1307-1318), and the `timing_s/step` it logs (1355) is that timer. A
validation pass (`_validate`, 628-760) is one `generate_sequences` of the validation set,
`val_kwargs.n` samples a prompt, padded to a multiple of the actor's world size
(`pad_dataproto_to_divisor`, 687-693), then the rule reward on the driver. Its generation runs
through the same sharding manager as a training one (verl/workers/sharding_manager/
megatron_vllm.py:143-199, fsdp_vllm.py alike): the parked weights are loaded, exported into the
engines (the refit), the engines woken, and put back to sleep after. So one pass costs

  the rollout stage of `Validation.samples` sequences of the job's lengths, on the rollout's own
  layout (its tail is the longest of those samples, not of the training batch's)
  + the weight refit (the step's `sync`)
  + the engines' sleep and wake where they share their devices (`timing.onload_time`)

and the step carries it / `Validation.every`. The job's length distributions stand for the
validation set's (a job that validates on other data states it in its file). Not priced: the
validation reward (a rule check of a few dozen answers on the driver), the trainer's parked
weights loaded and offloaded once more around the refit (`placer.cost.offload`; a few seconds
of host copies, / every), a checkpoint (`trainer.save_freq`). Agent jobs are not priced with it
(`placer.spec.job.Job` refuses the pair).
"""
from __future__ import annotations

from placer.base.roles import Role
from placer.cost.context import PriceContext
from placer.cost.estimate import estimate
from placer.cost.roleestimate import Estimate


def validation_rollout_s(ctx: PriceContext, rollout: Estimate) -> float:
    """Seconds one validation's generation takes on `rollout`'s engines: the rollout stage of
    the job's `validation.samples` sequences (a split rollout: each part its share of them, by
    its share of the batch, the slowest part). 0 without a `validation` section."""
    val = ctx.res.job.validation
    if val is None:
        return 0.0
    parts = [(p.est, p.samples) for p in rollout.parts] or [(rollout, 1)]
    total = sum(n for _, n in parts)
    worst = 0.0
    for est, n in parts:
        share = max(round(val.samples * n / total), 1)
        vctx = ctx.with_own_samples(share)
        pool = ctx.res.cluster.pool(est.pool)
        worst = max(worst, estimate(vctx, Role.ROLLOUT, pool, est.par).stage_s.get("rollout",
                                                                                    0.0))
    return worst


def validation_time(ctx: PriceContext, rollout: Estimate, sync_s: float,
                    swap_s: float) -> float:
    """Seconds a validation adds to the mean RL step (module docstring): its generation
    (`validation_rollout_s`), the refit before it (`sync_s`, the step's) and the engines' sleep
    and wake (`swap_s`: 0 where they hold their devices alone), / `validation.every`."""
    val = ctx.res.job.validation
    if val is None:
        return 0.0
    return (validation_rollout_s(ctx, rollout) + sync_s + swap_s) / val.every
