"""Pricing a multi-agent job: each agent's roles with its own model, lengths and turns.

Every role of agent A is priced as a single-policy job's role is, on A's own view of the
episode (`placer.spec.agentjob.agent_job`: A's policy, A's response length per turn, the turns
A takes, the other agents' turns as context it reads), so a 4B verifier's engines are priced
with the 4B model and its short verdicts, a 7B solver's with its own. `AgentPricer` holds one
`Pricer` per agent (sharing one `StepTerms` table) and answers the planner under role names
`AGENT.ROLE` (`placer.cost.pricer.AgentPricer`; `Pricer(res)` of a multi-agent job is one).

How the agents' work combines into one step (`agent_iteration_time`), beside the single-policy
rule of `placer.cost.timing` (roles in one slot add, slots run side by side):
  rollout  an episode's turns run in schedule order and a turn starts when every sample has
           finished the one before (the turn-by-turn generation of multi-agent RL loops), so
           the agents' engines never generate at once: the stage lasts the sum of every agent's
           rollout (each holding its own turns), wherever the engines are;
  sync     each trained agent refreshes its own engines; the refreshes run one after another
           (a sum: they may cross the same links);
  score, train  per-agent references, rewards and actors follow the slot rule: apart they
           overlap, in one slot they add;
  switch   a slot whose members do not fit together onloads each of them once per step: the
           engines' onloads come with their rollouts, one agent after another (a sum); the
           other roles' follow the slot rule (`switch_stage_s`).
Agents on one shared engine pool (`agents.shared_engines`) sit in one slot. Full weights swapped
in turn (`adapters: none`) reload the engines whenever the turn passes between them, when they
do not fit together (each agent's `engine_swap_time` once per run of its turns, `swap_runs`);
LoRA adapters on one base hold the base once (the later agents' engines add only their adapter
bytes, `adapter_bytes`) and never swap. Batching across agents does not arise: turns run in
schedule order, so a LoRA pool's engines batch one agent's turn at a time, as its own would.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from placer.base.roles import Role
from placer.cost.context import PriceContext
from placer.cost.roleestimate import Estimate
from placer.cost.timing import Breakdown, Placed, onload_time
from placer.spec.agents import Agents, role_name, split_role
from placer.spec.arch import ModelArch

BF16_BYTES = 2


def adapter_bytes(m: ModelArch, rank: int) -> float:
    """Bytes of one LoRA adapter of `rank` on every attention and MLP projection (A: rank x
    in, B: out x rank per projection; PEFT's target_modules all-linear), BF16."""
    h, kv = m.hidden, m.kv_heads * m.head_size
    q_out = m.heads * m.head_size
    dims = [(h, q_out), (h, kv), (h, kv), (q_out, h), (h, m.mlp), (h, m.mlp), (m.mlp, h)]
    return float(m.layers * sum(rank * (i + o) for i, o in dims) * BF16_BYTES)


def swap_runs(agents: Agents, i: int, name: str) -> int:
    """Runs of consecutive turns agent `name` takes on shared pool `i` in the cyclic schedule
    (the engines keep the last agent's weights into the next step): each run starts with its
    weights woken and ends with them put to sleep, so a turn passing from A to B costs A's sleep
    and B's wake, and a step costs every agent's `engine_swap_time` once per run."""
    on = [t for t in agents.turns if t in agents.shared_engines[i].agents]
    if len(set(on)) < 2:
        return 1
    return sum(1 for a, b in zip(on, on[1:] + on[:1]) if b == name and a != name)


def onloads_per_step(agents: Agents, role: str) -> int:
    """`Pricer.onloads_per_step` of `AGENT.ROLE`: `swap_runs` for engines on a full-weight
    shared pool, else one."""
    agent, base = split_role(role)
    i = agents.shared_of(agent or "")
    if base != Role.ROLLOUT or i is None or agents.shared_engines[i].adapters != "none":
        return 1
    return swap_runs(agents, i, agent or "")


def lora_share(agents: Agents, role: str, m: ModelArch, est: Estimate) -> Estimate:
    """A later agent's engines on a LoRA pool hold its adapter, not another copy of the base
    (`est` as the agent's own pricer made it)."""
    agent, base = split_role(role)
    i = agents.shared_of(agent or "")
    if base != Role.ROLLOUT or i is None:
        return est
    pool = agents.shared_engines[i]
    if pool.adapters != "lora" or pool.agents[0] == agent:
        return est
    per_device = adapter_bytes(m, pool.adapter_rank) / 1e9 / max(est.par.tp * est.par.pp, 1)
    return replace(est, memory=replace(est.memory, weights=per_device))


def base_placed(p: Placed) -> Placed:
    """`p` under its role's own name (what the single-policy cost functions compare)."""
    return Placed(p.slot, replace(p.est, role=split_role(p.est.role)[1]))


def agent_onloads(ctx: PriceContext, agents: Agents, placed: list[Placed]) -> dict[str, float]:
    """Role -> onload seconds per step, for the members of every slot whose roles (of every
    agent) do not fit its devices together (`timing.slot_switch`'s rule, `onload_time` on the
    role's own name): once per step, an agent's engines on a full-weight shared pool once per
    run of its turns (`swap_runs`)."""
    by_slot: dict[str, list[Placed]] = defaultdict(list)
    for p in placed:
        by_slot[p.slot].append(p)
    out: dict[str, float] = {}
    for members in by_slot.values():
        dev = ctx.res.device_of(members[0].est.pool)
        if len(members) < 2 or dev.host_backed:
            continue
        if sum(p.est.memory.total for p in members) <= dev.memory_gb:
            continue
        eff = ctx.calib.for_device(dev)
        for p in members:
            once = onload_time(split_role(p.est.role)[1], p.est.memory, dev, eff,
                               ctx.res.job.sleep_level)
            out[p.est.role] = once * onloads_per_step(agents, p.est.role)
    return out


def agent_slot_switch(ctx: PriceContext, agents: Agents, placed: list[Placed]
                      ) -> dict[str, float]:
    """Onload seconds per slot: its members' `agent_onloads`."""
    slot_of = {p.est.role: p.slot for p in placed}
    out: dict[str, float] = defaultdict(float)
    for r, t in agent_onloads(ctx, agents, placed).items():
        out[slot_of[r]] += t
    return dict(out)


def switch_stage_s(agents: Agents, placed: list[Placed], onloads: dict[str, float]) -> float:
    """The step's onload time: the agents' engines onload as their rollouts run, one agent
    after another (a sum); every other role onloads on its slot, slots side by side (the max
    over slots of their other members' sum)."""
    seq = set(rollout_roles(agents))
    slot_of = {p.est.role: p.slot for p in placed}
    others: dict[str, float] = defaultdict(float)
    for r, t in onloads.items():
        if r not in seq:
            others[slot_of[r]] += t
    return sum(t for r, t in onloads.items() if r in seq) + max(others.values(), default=0.0)


def agent_iteration_time(ctx: PriceContext, agents: Agents, placed: list[Placed],
                         syncs: dict[str, float]) -> Breakdown:
    """One step of a multi-agent job (the module text: rollouts in sequence, syncs in sequence,
    the slot rule otherwise; the pipeline mode's rule over the chain and the busiest slot).
    `syncs`: each trained agent's weight sync by its rollout's name."""
    by_role = {p.est.role: p for p in placed}
    onloads = agent_onloads(ctx, agents, placed)
    switch = agent_slot_switch(ctx, agents, placed)
    per_slot: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p in placed:
        for stage, t in p.est.stage_s.items():
            per_slot[p.slot][stage] += t
    for r, t in syncs.items():
        per_slot[by_role[r].slot]["sync"] += t
    for slot, t in switch.items():
        per_slot[slot]["switch"] += t
    busy = {s: sum(st.values()) for s, st in per_slot.items()}
    stage_s = {st: max((v.get(st, 0.0) for v in per_slot.values()), default=0.0)
               for st in ("sync", "rollout", "score", "train")}
    stage_s["sync"] = sum(syncs.values())
    stage_s["rollout"] = max(stage_s["rollout"], sum(
        by_role[r].est.stage_s.get("rollout", 0.0) for r in rollout_roles(agents) if r in by_role))
    stage_s["switch"] = switch_stage_s(agents, placed, onloads)
    chain = sum(stage_s.values())
    total = ctx.res.job.pipeline.mechanism.iteration_s(chain, max(busy.values(), default=0.0))
    return Breakdown(total, stage_s, busy, switch, stage_s["sync"])



def rollout_roles(agents: Agents) -> list[str]:
    """Every agent's engines: their rollouts run one after another (module text)."""
    return [role_name(a, Role.ROLLOUT) for a in agents.members]


def sync_pairs(agents: Agents) -> list[tuple[str, str]]:
    """(actor, rollout) of every trained agent."""
    return [(role_name(a, Role.ACTOR), role_name(a, Role.ROLLOUT))
            for a, m in agents.members.items() if m.trained]


def shared_slots(agents: Agents) -> list[list[str]]:
    """Every shared engine pool's rollouts (to sit in one slot), in role order."""
    return [[role_name(a, Role.ROLLOUT) for a in agents.members if a in s.agents]
            for s in agents.shared_engines]
