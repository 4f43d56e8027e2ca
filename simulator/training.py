"""Frozen inference and training: the work of every non-rollout role in one iteration.

Scored over the tokens the iteration actually produced (every sample's final context), with the
same cost-model calls as `placer.cost.estimate`:
  score stage  reference / reward model / critic values / the actor's old log-probs:
               one forward pass (`costmodel.score_time`) per role;
               a rule reward checks each sample on the CPU pool's cores by its kind of check
               (`placer.cost.rulecheck.rule_reward_time`: sandboxed code or an in-process rule),
               after the environment's sandbox verify of the answers where the job has one
               (`Work.verify_s`: charged to the reward, recorded as the environment's `tool`
               event with `call: verify`, as the executor records it);
  train stage  actor and critic: `mini_batches` optimizer steps, one event each; `train_time` is
               linear in tokens apart from its per-step terms, so the steps sum to the placer's
               figure exactly.
Every model pass (score or train) first pays the driver's dispatch of the batch padded to the
job's longest context (`costmodel.dispatch_time`, as `placer.cost.estimate.pass_dispatch`), once per
pass: `Work.dispatch_s`, recorded as an unsized transfer event (which no fitted factor prices,
like an onload), so the steps' events stay the passes' compute alone.
Roles sharing a slot run one after another on it (`simulator.iteration` holds the slot); when
their memory does not fit together (or the framework switches the role every step, NeMo-RL's
colocated policy and engine), a role pays its onload (`placer.cost.timing.onload_time`: a GPU
rollout engine's sleep and wake, another role's weights and optimizer out and back) the first
time it takes the slot in an iteration; a trainer whose optimizer is parked
(`placer.cost.optpark`) pays its copy out and back there instead - the rule
`placer.cost.timing.slot_switch` prices.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from placer.base.roles import Role
from placer.cost import optpark
from placer.cost.context import PriceContext
from placer.cost.efficiency import Efficiency
from placer.cost.estimate import budgeted, reducing
from placer.cost.layercomm import weight_gather_time
from placer.cost.model import dispatch_time, score_time, train_time
from placer.cost.packing import samples_pad
from placer.cost.pricer import Pricer
from placer.cost.roofline import Memory, infer_memory, weight_tensors
from placer.cost.rulecheck import rule_check_time, sandbox_verify_time
from placer.cost.timing import onload_time
from placer.cost.vision import pass_encode_s
from placer.cost.vocabcomm import head_of
from placer.solve.assemble import placed_estimate, shares_slot
from placer.solve.planfile import Plan
from placer.spec.hardware import DeviceKind
from simulator.judge import judge_stage_s, verdict_tokens
from simulator.workload import Samples

# Which stage each role works in besides rollout (the environment's work is its tool calls).
ROLE_STAGES: dict[str, tuple[str, ...]] = {
    Role.ACTOR: ("score", "train"), Role.CRITIC: ("score", "train"),
    Role.REFERENCE: ("score",), Role.REWARD: ("score",),
}


@dataclass(frozen=True)
class Work:
    """Durations (s, before straggler slowdown) of a role's steps in one stage."""

    role: str
    stage: str
    steps: tuple[float, ...]
    tokens: int
    dispatch_s: float = 0.0  # the driver ships the batch first (its own unsized transfer event)
    verify_s: float = 0.0  # a rule reward: the environment's sandbox verify before the checks

    @property
    def total_s(self) -> float:
        return self.dispatch_s + self.verify_s + sum(self.steps)


def stage_work(px: PriceContext, plan: Plan, smp: Samples, stage: str,
               verdicts: list[int] | None = None) -> list[Work]:
    """Work of every role placed in `stage`, in the job's role order; a generative judge
    decodes `verdicts` (one per sample of `smp`: `simulator.judge`)."""
    res, calib = px.res, px.calib
    ctx = smp.context_tokens()
    tokens = sum(ctx)
    seq = tokens / max(len(ctx), 1)
    # causal attention over the packed samples: sum s^2 / sum s (`placer.cost.attnspan`)
    span = sum(c * c for c in ctx) / tokens if tokens else 0.0
    out = []
    imgs = res.job.lengths.images_per_prompt
    for role in res.job.roles():
        if stage not in ROLE_STAGES.get(role, ()) or role not in plan.roles:
            continue
        rp = plan.roles[role]
        dev = res.device_of(rp.pool)
        eff = calib.for_device(dev)
        m = res.model_of(role)
        steps: tuple[float, ...]
        ship = verify = 0.0
        if m is None:  # a rule reward: per-sample checks on CPU cores (`placer.cost.rulecheck`)
            verify = sandbox_verify_time(res.job, smp.n, rp.par.devices, eff)
            steps = (rule_check_time(res.job, smp.n, rp.par.devices * dev.cores, eff),)
        elif role == Role.REWARD and res.job.judge is not None:  # a decode queue
            steps = (judge_stage_s(px, plan, smp, verdicts or verdict_tokens(
                px, smp.n, res.job.seed, 0, mean=True)),)
            ship = dispatch_time(smp.n, res.job.max_context, eff)
        elif stage == "score":  # (+ a VLM's encoder over the samples' images)
            # NeMo-RL's pipelined passes pad each packed bin (`placer.cost.packing`)
            pad = samples_pad(res, budgeted(res, rp.par, "forward"), ctx, "forward")
            steps = (score_time(m, dev, rp.par, tokens * pad, seq, eff, head_of(role), span)
                     + pass_encode_s(m, dev, rp.par, smp.n, imgs, eff),)
            ship = dispatch_time(smp.n, res.job.max_context, eff)
        else:
            mb = res.job.batch.mini_batches
            enc = pass_encode_s(m, dev, rp.par, smp.n, imgs, eff, train=True) / mb
            upar = reducing(res, rp.par)  # the framework's gradient precision, as planned
            pad = samples_pad(res, budgeted(res, rp.par, "update"), ctx, "update")
            steps = tuple(train_time(m, dev, upar, tokens * pad / mb, seq, 1, eff,
                                     head_of(role), span) + enc
                          for _ in range(mb))
            ship = dispatch_time(smp.n, res.job.max_context, eff)  # once, before the first step
            # and once per RL step the sharded trainer's weights gathered for the sync
            # (`costmodel.weight_gather_time`, as the planner's train stage prices it): kept
            # out of the mini-batches' train events, which calibration prices as train_time
            ship += weight_gather_time(m, dev, rp.par, weight_tensors(m), eff)
        out.append(Work(role, stage, steps, tokens, ship, verify))
    return out


def onload_costs(px: Pricer, plan: Plan) -> dict[str, float]:
    """Role -> seconds it pays per iteration to take its slot: its onload when its slot's roles
    do not fit together even with parked optimizers or its framework switches it every step
    (`FrameworkProfile.switches_every_step`), else its parked optimizer's copies out and back
    as the job's framework moves it (`placer.cost.timing.slot_switch`'s rule, on the plan's
    memory)."""
    res, calib = px.res, px.calib
    out: dict[str, float] = {}
    for slot in plan.slots:
        members = [r for r in slot.roles if r in plan.roles]
        dev = res.device_of(slot.pool)
        if not members or dev.host_backed:  # host RAM already: nothing to move
            continue
        eff = calib.for_device(dev)
        rows = [(plan.roles[r].memory_gb, plan.roles[r].parked_gb) for r in members]
        if len(members) > 1 and optpark.slot_peak_gb(rows) > dev.memory_gb:
            for r in members:
                out[r] = onload_time(r, _onload_memory(px, plan, r, eff), dev, eff,
                                     res.job.sleep_level)
            continue
        fw = res.job.profile.park_scheme
        every = res.job.profile.switches_every_step(members)  # fit or not (NeMo-RL colocated)
        for r, (_, parked) in zip(members, rows):
            if r in every:
                out[r] = onload_time(r, _onload_memory(px, plan, r, eff), dev, eff,
                                     res.job.sleep_level)
            elif parked:  # as its framework copies it (`optpark.moved_gb`, `timing.member_switch`)
                est = placed_estimate(px, r, plan.roles[r], shares_slot(plan, r))
                out[r] = optpark.park_time(optpark.moved_gb(est, fw), eff)
    return out


def engine_swap_s(px: Pricer, plan: Plan) -> float:
    """Seconds the rollout engines take to wake and go back to sleep once more where their slot
    holds other roles (a periodic validation's generation, `simulator.validation`): the
    rollout's `onload_time`, as `placer.cost.validation` prices it; 0 on devices of their own or
    whose memory is host RAM."""
    res, rp = px.res, plan.roles[Role.ROLLOUT]
    slot = next(s for s in plan.slots if s.name == rp.slot)
    dev = res.device_of(slot.pool)
    if sum(r in plan.roles for r in slot.roles) < 2 or dev.host_backed:
        return 0.0
    eff = px.calib.for_device(dev)
    return onload_time(Role.ROLLOUT, _onload_memory(px, plan, Role.ROLLOUT, eff), dev, eff,
                       res.job.sleep_level)


def _onload_memory(px: Pricer, plan: Plan, role: str, eff: Efficiency) -> Memory:
    """The memory `placer.cost.timing.onload_time` prices: for a GPU rollout engine its weights
    per device as `placer.cost.estimate` prices them (`infer_memory`), for any other role its
    placement priced again (`assemble.placed_estimate`: the weights and optimizer a switch
    copies, `model.switched_gb`)."""
    res = px.res
    rp = plan.roles[role]
    dev = res.device_of(rp.pool)
    if role == Role.ROLLOUT and dev.kind is DeviceKind.gpu:
        return infer_memory(res.arch_of(Role.ROLLOUT), rp.par, dev, eff)
    if role == Role.REWARD and res.job.judge is not None and dev.kind is DeviceKind.gpu:
        eng = infer_memory(res.arch_of(Role.REWARD), rp.par, dev, eff)  # a judge's engine
        return replace(eng, kv_cache=max(rp.memory_gb - eng.total, 1e-9))
    return placed_estimate(px, role, rp, shares_slot(plan, role)).memory
