"""Pricing a multi-agent job: each agent's roles with its own model, lengths and turns.

Every role of agent A is priced as a single-policy job's role is, on A's own view of the
episode (`placer.spec.agentjob.agent_job`: A's policy, A's response length per turn, the turns
A takes, the other agents' turns as context it reads), so a 4B verifier's engines are priced
with the 4B model and its short verdicts, a 7B solver's with its own. `AgentPricer` holds one
`Pricer` per agent (sharing one `StepTerms` table) and answers the planner under role names
`AGENT.ROLE`.

How the agents' work combines into one step (`agent_iteration_time`), beside the single-policy
rule of `placer.cost.timing` (roles in one slot add, slots run side by side):
  rollout  an episode's turns run in schedule order and a turn starts when every sample has
           finished the one before (the turn-by-turn generation of multi-agent RL loops), so
           the agents' engines never generate at once: the stage lasts the sum of every agent's
           rollout (each holding its own turns), wherever the engines are;
  sync     each trained agent refreshes its own engines; the refreshes run one after another
           (a sum: they may cross the same links);
  score, train  per-agent references, rewards and actors follow the slot rule: apart they
           overlap, in one slot they add.
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
from placer.cost.batching import StepTerms
from placer.cost.context import TermsKey
from placer.cost.efficiency import Calibration
from placer.cost.estimate import Estimate
from placer.cost.model import engine_swap_time
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.cost.timing import Breakdown, Placed, slot_switch
from placer.spec.agentjob import agent_job
from placer.spec.agents import Agents, role_name, split_role
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved, resolve
from placer.spec.hardware import Pool

BF16_BYTES = 2


def adapter_bytes(m: ModelArch, rank: int) -> float:
    """Bytes of one LoRA adapter of `rank` on every attention and MLP projection (A: rank x
    in, B: out x rank per projection; PEFT's target_modules all-linear), BF16."""
    h, kv = m.hidden, m.kv_heads * m.head_size
    q_out = m.heads * m.head_size
    dims = [(h, q_out), (h, kv), (h, kv), (q_out, h), (h, m.mlp), (h, m.mlp), (m.mlp, h)]
    return float(m.layers * sum(rank * (i + o) for i, o in dims) * BF16_BYTES)


class AgentPricer(Pricer):
    """A multi-agent job's prices: every `AGENT.ROLE` on its agent's own `Pricer`."""

    prices_agents = True

    def __init__(self, res: Resolved, calib: Calibration | None = None,
                 _terms: dict[TermsKey, StepTerms] | None = None) -> None:
        super().__init__(res, calib, _terms)
        assert res.job.agents is not None, "AgentPricer prices multi-agent jobs"
        self.agents: Agents = res.job.agents
        self.subs: dict[str, Pricer] = {
            a: Pricer(resolve(agent_job(res.job, a), a), self.given, self._terms)
            for a in self.agents.members}

    def role_names(self) -> list[str]:
        return self.res.job.role_names()

    def sub_of(self, role: str) -> tuple[Pricer, str]:
        """(the agent's pricer, the role's own name) of `AGENT.ROLE`."""
        agent, base = split_role(role)
        assert agent is not None, f"{role}: not an agent's role"
        return self.subs[agent], base

    def estimate(self, role: str, pool: Pool, par: Parallel,
                 env_cores: int | None = None) -> Estimate:
        sub, base = self.sub_of(role)
        return self.qualify(role, sub.estimate(base, pool, par, env_cores))

    def qualify(self, role: str, est: Estimate) -> Estimate:
        """An estimate by the agent's own pricer as `AGENT.ROLE`'s (a LoRA pool's later agents
        holding their adapters only)."""
        if split_role(role)[1] == Role.ROLLOUT:
            est = self._lora_share(role, est)
        return replace(est, role=role)

    def _lora_share(self, role: str, est: Estimate) -> Estimate:
        """A later agent on a LoRA pool holds its adapter, not another copy of the base."""
        agent = split_role(role)[0]
        i = self.agents.shared_of(agent or "")
        if i is None:
            return est
        pool = self.agents.shared_engines[i]
        if pool.adapters != "lora" or pool.agents[0] == agent:
            return est
        sub, _ = self.sub_of(role)
        per_device = adapter_bytes(sub.res.arch_of(Role.ROLLOUT), pool.adapter_rank) / 1e9 / max(
            est.par.tp * est.par.pp, 1)
        return replace(est, memory=replace(est.memory, weights=per_device))

    def sync_time(self, actor: Placed, rollout: Placed) -> float:
        sub, _ = self.sub_of(actor.est.role)
        return sub.sync_time(_base(actor), _base(rollout))

    def iteration_time(self, placed: list[Placed]) -> Breakdown:
        return agent_iteration_time(self, placed)

    def slot_switch(self, placed: list[Placed]) -> dict[str, float]:
        return agent_slot_switch(self, placed)

    def onloads_per_step(self, role: str) -> int:
        agent, base = split_role(role)
        i = self.agents.shared_of(agent or "")
        if base != Role.ROLLOUT or i is None or self.agents.shared_engines[i].adapters != "none":
            return 1
        return swap_runs(self.agents, i, agent or "")

    def sync_pairs(self) -> list[tuple[str, str]]:
        """(actor, rollout) of every trained agent."""
        return [(role_name(a, Role.ACTOR), role_name(a, Role.ROLLOUT))
                for a, m in self.agents.members.items() if m.trained]

    def sequential_rollouts(self) -> list[str]:
        """Every agent's engines: their rollouts run one after another (module text)."""
        return [role_name(a, Role.ROLLOUT) for a in self.agents.members]

    def colocated_roles(self) -> list[list[str]]:
        """Every shared engine pool's rollouts, in one slot."""
        order = self.role_names()
        return [sorted((role_name(a, Role.ROLLOUT) for a in s.agents), key=order.index)
                for s in self.agents.shared_engines]


def _base(p: Placed) -> Placed:
    return Placed(p.slot, replace(p.est, role=split_role(p.est.role)[1]))


def swap_runs(agents: Agents, i: int, name: str) -> int:
    """Runs of consecutive turns agent `name` takes on shared pool `i` in the cyclic schedule
    (the engines keep the last agent's weights into the next step): each run starts with its
    weights woken and ends with them put to sleep, so a turn passing from A to B costs A's sleep
    and B's wake, and a step costs every agent's `engine_swap_time` once per run."""
    on = [t for t in agents.turns if t in agents.shared_engines[i].agents]
    if len(set(on)) < 2:
        return 1
    return sum(1 for a, b in zip(on, on[1:] + on[:1]) if b == name and a != name)


def agent_slot_switch(px: AgentPricer, placed: list[Placed]) -> dict[str, float]:
    """Onload seconds per slot (`timing.slot_switch` on the roles' own names, one onload per
    member); an agent's engines on a full-weight shared pool in a slot that does not fit pay
    one per run of its turns (`swap_runs`)."""
    out = slot_switch(px, [_base(p) for p in placed])
    for p in placed:
        runs = px.onloads_per_step(p.est.role)
        if runs > 1 and p.slot in out:
            eff = px.calib.for_device(px.res.device_of(p.est.pool))
            out[p.slot] += (runs - 1) * engine_swap_time(p.est.memory.weights, eff)
    return out


def agent_iteration_time(px: AgentPricer, placed: list[Placed]) -> Breakdown:
    """One step of a multi-agent job (the module text: rollouts in sequence, syncs in sequence,
    the slot rule otherwise; the pipeline mode's rule over the chain and the busiest slot)."""
    by_role = {p.est.role: p for p in placed}
    syncs = {r: px.sync_time(by_role[a], by_role[r]) for a, r in px.sync_pairs()
             if a in by_role and r in by_role}
    switch = px.slot_switch(placed)
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
        by_role[r].est.stage_s.get("rollout", 0.0) for r in px.sequential_rollouts() if r in by_role))
    stage_s["switch"] = max(switch.values(), default=0.0)
    chain = sum(stage_s.values())
    total = px.res.job.pipeline.mechanism.iteration_s(chain, max(busy.values(), default=0.0))
    return Breakdown(total, stage_s, busy, switch, stage_s["sync"])

