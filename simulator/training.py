"""Frozen inference and training: the work of every non-rollout role in one iteration.

Scored over the tokens the iteration actually produced (every sample's final context), with the
same cost-model calls as `placer.estimate`:
  score stage  reference / reward model / critic values / the actor's old log-probs:
               one forward pass (`costmodel.forward_time`) per role;
               a rule reward verifies each sample on the CPU pool's cores (`Efficiency.rule_reward_s` each;
               identical FIFO jobs finish in ceil(n / cores) rounds);
  train stage  actor and critic: `mini_batches` optimizer steps, one event each; `train_time` is
               linear in tokens apart from its per-step terms, so the steps sum to the placer's
               figure exactly.
Every model pass (score or train) first pays the driver's dispatch of the batch padded to the
job's longest context (`costmodel.dispatch_time`, as `placer.estimate.pass_dispatch`), once per
pass: `Work.dispatch_s`, recorded as an unsized transfer event (which no fitted factor prices,
like an onload), so the steps' events stay the passes' compute alone.
Roles sharing a slot run one after another on it (`simulator.iteration` holds the slot); when
their memory does not fit together, a role pays its onload (`costmodel.switch_time`) the first
time it takes the slot in an iteration - the rule `placer.timing.slot_switch` prices.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from placer.catalog import Resolved
from placer.costmodel import Calibration, dispatch_time, forward_time, switch_time, train_time
from placer.planfile import Plan
from placer.roles import Role
from placer.spec import DeviceKind
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

    @property
    def total_s(self) -> float:
        return self.dispatch_s + sum(self.steps)


def stage_work(res: Resolved, plan: Plan, calib: Calibration, smp: Samples,
               stage: str) -> list[Work]:
    """Work of every role placed in `stage`, in the job's role order."""
    ctx = smp.context_tokens()
    tokens = sum(ctx)
    seq = tokens / max(len(ctx), 1)
    out = []
    for role in res.job.roles():
        if stage not in ROLE_STAGES.get(role, ()) or role not in plan.roles:
            continue
        rp = plan.roles[role]
        dev = res.device_of(rp.pool)
        eff = calib.for_device(dev)
        m = res.model_of(role)
        steps: tuple[float, ...]
        ship = 0.0
        if m is None:  # a rule reward: per-sample checks on CPU cores
            cores = rp.par.devices * dev.cores
            steps = (math.ceil(smp.n / cores) * eff.rule_reward_s,)
        elif stage == "score":
            steps = (forward_time(m, dev, rp.par, tokens, seq, eff),)
            ship = dispatch_time(smp.n, res.job.max_context, eff)
        else:
            mb = res.job.batch.mini_batches
            steps = tuple(train_time(m, dev, rp.par, tokens / mb, seq, 1, eff) for _ in range(mb))
            ship = dispatch_time(smp.n, res.job.max_context, eff)  # once, before the first step
        out.append(Work(role, stage, steps, tokens, ship))
    return out


def onload_costs(res: Resolved, plan: Plan, calib: Calibration) -> dict[str, float]:
    """Role -> seconds it pays to onload when its slot's roles do not fit together."""
    out: dict[str, float] = {}
    for slot in plan.slots:
        members = [r for r in slot.roles if r in plan.roles]
        dev = res.device_of(slot.pool)
        if len(members) < 2 or dev.kind is DeviceKind.cpu:
            continue
        if sum(plan.roles[r].memory_gb for r in members) > dev.memory_gb:
            eff = calib.for_device(dev)
            for r in members:
                out[r] = switch_time(plan.roles[r].memory_gb, eff)
    return out
