"""Where a generative judge went and why: the `judge` section of `placer plan --explain`.

A generative judge (`placer.spec.judge`) is a decode queue of its own (`placer.cost.judge`), so
where it runs is a real choice: engines of its own on any pool that holds its weights and KV, or
a slot shared with the rollout (and the trainer), paying the switch when they do not fit in
memory together. This section reports the chosen placement, the judge's queue on it (requests
per replica, the first wave an empty replica admits, the verdict and rubric it decodes and
reads), and, for every pool that can host the judge, the best plan with the judge held to that
pool (the job's cost table with the judge's other candidates left out, re-solved for the same
objective and priced as `assemble` would predict), so the reader sees what each alternative
would cost the iteration.
"""
from __future__ import annotations

import math
from dataclasses import replace

from placer.base.records import Record
from placer.base.roles import Role
from placer.cost.judge import judge_replicas
from placer.cost.pricer import Pricer
from placer.solve.ilp_bound import score
from placer.solve.ilp_solve import solve
from placer.solve.moves import dims
from placer.solve.planfile import Plan
from placer.solve.planner import build_problem
from placer.solve.problem import Unsolved


class JudgeOption(Record):
    """The best plan with the judge held to one pool (None: no plan found in the time limit)."""

    pool: str
    iteration_s: float | None
    judge: str | None
    """the judge's `POOL xN layout` in that plan"""
    shares_slot_with: list[str]
    """the roles in the judge's slot in that plan"""


class JudgeWhy(Record):
    """The generative judge's placement, its queue and the per-pool alternatives."""

    model: str
    pool: str
    devices: int
    layout: str
    slot: str
    shares_slot_with: list[str]
    time_s: float
    requests_per_replica: int
    first_wave: int
    verdict_mean_tokens: float
    rubric_tokens: int
    options: list[JudgeOption]


def judge_why(plan: Plan, px: Pricer, time_limit_s: float = 5.0) -> JudgeWhy | None:
    """The judge section, or None when the job's reward is not a generative judge."""
    res = px.res
    spec = res.job.judge
    rp = plan.roles.get(Role.REWARD)
    if spec is None or spec.verdict is None or rp is None:
        return None
    m = res.arch_of(Role.REWARD)
    dev = res.device_of(rp.pool)
    par = rp.par
    reps = judge_replicas(m, dev, par, px.calib.for_device(dev))
    mates = [r for r, other in plan.roles.items() if other.slot == rp.slot and r != Role.REWARD]
    return JudgeWhy(model=m.name, pool=rp.pool, devices=rp.devices, layout=dims(par),
                    slot=rp.slot, shares_slot_with=mates, time_s=rp.time_s,
                    requests_per_replica=math.ceil(res.job.batch.samples / reps),
                    first_wave=rp.concurrency, verdict_mean_tokens=spec.verdict.mean_value(),
                    rubric_tokens=spec.rubric_tokens,
                    options=_options(plan, px, time_limit_s))


def _options(plan: Plan, px: Pricer, time_limit_s: float) -> list[JudgeOption]:
    full = build_problem(px, plan.objective)
    pools = sorted({c.pool for c in full.cands.get(Role.REWARD, []) if not c.split})
    out = []
    for pool in pools:
        cands = {r: ([c for c in cs if c.pool == pool] if r == Role.REWARD else cs)
                 for r, cs in full.cands.items()}
        try:
            sol = solve(replace(full, cands=cands), time_limit_s=time_limit_s)
        except Unsolved:
            out.append(JudgeOption(pool=pool, iteration_s=None, judge=None, shares_slot_with=[]))
            continue
        t, _usd = score(replace(full, cands=cands), sol.assignment)
        a = sol.assignment
        c = a.choice[Role.REWARD]
        slot = a.slot_of[Role.REWARD]
        out.append(JudgeOption(pool=pool, iteration_s=round(t, 3),
                               judge=f"{c.pool} x{c.devices} {dims(c.est.par)}",
                               shares_slot_with=[r for r in a.choice if r != Role.REWARD
                                                 and a.slot_of[r] == slot]))
    return out


def judge_lines(j: JudgeWhy) -> list[str]:
    """The section as text."""
    with_ = ", ".join(j.shares_slot_with) if j.shares_slot_with else "nothing (engines of its own)"
    lines = [f"judge ({j.model}, generative): {j.pool} x{j.devices} {j.layout}, slot {j.slot} "
             f"shared with {with_}; {j.time_s:.3f} s per step",
             f"  queue: {j.requests_per_replica} requests per replica, {j.first_wave} admitted at "
             f"once; each reads sample + {j.rubric_tokens} rubric tokens and decodes a "
             f"{j.verdict_mean_tokens:.0f}-token verdict on average",
             "  best plan with the judge held to each pool (re-solved):"]
    for o in j.options:
        if o.iteration_s is None:
            lines.append(f"    {o.pool:<8} no plan found in the time limit")
            continue
        mates = ", ".join(o.shares_slot_with) or "no other role"
        lines.append(f"    {o.pool:<8} iteration {o.iteration_s:.3f} s, judge {o.judge} "
                     f"sharing its slot with {mates}")
    return lines
