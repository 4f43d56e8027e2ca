"""A periodic validation inside the step (`Job.validation`), run as the planner prices it.

Which steps validate. verl's fit loop (volcengine/verl @e2e4c35ecb6ede3e3fb23fafc44061bf31b54f37
verl/trainer/ppo/ray_trainer.py:1307-1318) calls `_validate()` inside the step timer, after the
update, when `global_steps % trainer.test_freq == 0` (`global_steps` counts from 1) or on the
last step; `trainer.val_before_train` runs one more before the loop, outside any step. The
planner prices the mean step over a run that validates every `every` steps, one pass / every
(`placer.cost.validation`), so the simulator runs the periodic passes: step i (from 0) validates
when (i + 1) % every == 0. Left out, as the planner leaves them out: the last step's pass of a
run whose length is not a multiple of `every`, and the pass before training.

One pass, on the rollout's slot after the step's train, holding the slot (its priority the
step's, as every other hold): the engines woken, where their slot holds other roles
(`training.engine_swap_s`: their sleep and wake, the rollout's `onload_time`); the weight sync
to the engines (the step's sync plan, `simulator.network`); then one generation of
`Validation.samples` sequences on the rollout's engine groups (`simulator.groups`, dealt as a
step's rows are), their lengths drawn from the job's distributions with the run's seed on
streams of their own (`samples_for(..., stream=(STREAM_VALIDATION,))`: the step's draws do not
move), at their means without variance, every sequence waited for (no tail policy, as the
planner prices it). A replayed workload replays the training prompts; the validation set is
still drawn from the job's distributions.

Trace: a `stage` event `validate` over the pass on the slot's `validate` track, and the pass's
onload, weight-sync, prefill, decode and tool events, every one with `validation: true` in its
args (`traces.schema.EventArgs`): readers that fit or compare the step's own rollout leave them
out by that marker.
"""
from __future__ import annotations

from collections.abc import Generator

import simpy

from placer.base.roles import Role
from placer.cost.pricer import Pricer
from placer.solve.planfile import Plan
from placer.spec.catalog import Resolved
from placer.spec.job import Job
from simulator.config import SimConfig
from simulator.environment import CorePool
from simulator.groups import Group, engines_for
from simulator.network import SyncPlan, record_sync
from simulator.recorder import Recorder
from simulator.training import engine_swap_s
from simulator.workload import Samples, samples_for

STREAM_VALIDATION = 9  # extends the step's draw keys: the validation set's own generators


def validates(job: Job, step: int) -> bool:
    """Whether step `step` (from 0) runs a validation pass: verl's `global_steps % test_freq
    == 0`, `global_steps` = step + 1 (module docstring)."""
    return job.validation is not None and (step + 1) % job.validation.every == 0


class Validating:
    """What a validation pass reads of the runnable plan (`simulator.iteration.Model` is one):
    its prices, plan, engines, sync plan, slots and records."""

    px: Pricer
    res: Resolved
    plan: Plan
    cfg: SimConfig
    seed: int
    env: simpy.Environment
    rec: Recorder
    sync: SyncPlan | None
    groups: list[Group]
    tools: CorePool | None
    tool_overhead: float
    slot_res: dict[str, simpy.PriorityResource]
    busy: list[tuple[str, float, float, float]]
    role_s: dict[str, float]


def validation_samples(model: Validating, step: int) -> Samples:
    """The sequences step `step`'s validation generates: `Validation.samples` of them, one per
    prompt, drawn (or at means) from the job's lengths on the validation's own streams."""
    job = model.res.job
    assert job.validation is not None, "only a job with a validation section validates"
    batch = job.batch.model_copy(update={"prompts": job.validation.samples,
                                         "samples_per_prompt": 1})
    vjob = job.model_copy(update={"batch": batch, "tail_policy": type(job.tail_policy)()})
    return samples_for(vjob, model.cfg.workload, model.seed, step, stream=(STREAM_VALIDATION,))


def run_validation(model: Validating, step: int, factors: dict) -> Generator:
    """The simpy process of one validation pass after step `step`'s train (module docstring);
    `factors`: the step's per-slot device slowdowns (stragglers slow the pass as they slow the
    step)."""
    env, r = model.env, model.plan.roles[Role.ROLLOUT]
    req = model.slot_res[r.slot].request(priority=step)
    yield req
    t0 = env.now
    swap = engine_swap_s(model.px, model.plan)
    if swap > 0:
        model.rec.add("onload", "transfer", env.now, swap, r.pool, r.slot, role=Role.ROLLOUT,
                      step=step, validation=True)
        yield env.timeout(swap)
    if model.sync is not None:
        yield from _sync(model, step, r.slot)
    scratch = Recorder(record_tools=model.rec.record_tools)
    yield from _generate(model, step, factors, scratch)
    for k in range(len(scratch)):  # the pass's engine events, marked
        name, cat, ts, dur, pid, tid, args = scratch.row(k)
        kw = args if isinstance(args, dict) else dict(zip(*args))
        model.rec.add(name, cat, ts, dur, pid, tid, **kw, validation=True)
    total = env.now - t0
    model.rec.add("validate", "stage", t0, total, r.pool, f"{r.slot}/validate",
                  role=Role.ROLLOUT, step=step, policy_version=step + 1,
                  batch=model.res.job.validation.samples if model.res.job.validation else 0,
                  validation=True)
    model.busy.append((r.slot, t0, total, 1.0))
    model.role_s["validate"] += total
    model.slot_res[r.slot].release(req)


def _sync(model: Validating, step: int, slot: str) -> Generator:
    """The refit before the validation's generation: the step's sync plan once more."""
    assert model.sync is not None
    total = record_sync(model.sync, model.rec, model.env.now, slot, step, step + 1,
                        validation=True)
    yield model.env.timeout(total)


def _generate(model: Validating, step: int, factors: dict, rec: Recorder) -> Generator:
    """The validation set's generation on every engine group, recorded in `rec`; ends when
    the last sequence is done."""
    env, r = model.env, model.plan.roles[Role.ROLLOUT]
    smp = validation_samples(model, step)
    engines = engines_for(model.groups, smp, model.res.job.lengths.images_per_prompt,
                          factors[r.slot], model.tools, model.tool_overhead, rec, step)
    yield simpy.AllOf(env, [env.process(e.run(env)) for _, e in engines])
