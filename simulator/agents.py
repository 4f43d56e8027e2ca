"""Simulating a multi-agent plan: every agent's turns on its own engines, on shared slots.

One simpy environment and one set of slots (the plan's) for every agent. Each agent runs as the
single-policy model does (`simulator.iteration.Model`) on its own view of the plan: its roles
under their own names, its own job (`placer.spec.agentjob.agent_job`: its model, its lengths,
the turns it takes with the other agents' turns between them as context of their mean length)
and its own samples. A step, in sync mode:
  sync     each trained agent refreshes its engines, one agent after another;
  rollout  the agents' rollouts one after another, in the order of their first turns: each
           agent's engines run all of its turns of every sample (continuous batching, long
           tails, KV admission: `simulator.engine`), no two agents' engines at once;
  score, train  every agent's roles' work, each on the slot the plan gives it; roles of
           different agents on one slot take turns on it, slots run side by side.
A slot whose members (of every agent) do not fit its memory together pays each member's onload
once per step, and an agent's engines on a full-weight shared pool once per run of its turns
(`placer.cost.agents.swap_runs`), as the planner prices it: with every source of variance off,
the simulated step is the plan's predicted time (tests/test_agents_sim.py).

What is simplified: an agent's turns read the other agents' turns at their mean lengths, not
the drawn ones (each agent draws its own samples); a turn never starts on one agent's engines
while another agent's engines finish the previous turn of other samples (the turn-by-turn
generation the planner prices). Async mode is not simulated for multi-agent plans.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator

import simpy

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.agents import agent_onloads as cost_onloads
from placer.cost.pricer import AgentPricer
from placer.cost.timing import Placed
from placer.solve.planfile import Plan, SlotPlan
from placer.spec.agentjob import agent_job
from placer.spec.agents import role_name, split_role
from placer.spec.load import dump_job
from simulator.config import SimConfig
from simulator.iteration import IterRecord, Model, RunRecord
from simulator.recorder import Recorder
from simulator.training import Work, stage_work


def agent_plan(plan: Plan, agent: str) -> Plan:
    """Agent `agent`'s view of a multi-agent plan: its roles under their own names, its job,
    every slot that holds one of them (the slot's name, pool and devices kept)."""
    res = plan.resolved()
    job = res.job
    assert job.agents is not None
    mine = {role_name(agent, r): str(r) for r in job.agents.roles_of(agent)}
    roles = {base: plan.roles[full] for full, base in mine.items() if full in plan.roles}
    slots = [SlotPlan(name=s.name, pool=s.pool, devices=s.devices, nodes=s.nodes,
                      roles=[mine[r] for r in s.roles if r in mine], parts=s.parts)
             for s in plan.slots if any(r in mine for r in s.roles)]
    return plan.model_copy(update={"job": dump_job(agent_job(job, agent)), "roles": roles,
                                   "slots": slots, "sync_routes": []})


def agent_onloads(px: AgentPricer, plan: Plan) -> dict[str, dict[str, float]]:
    """Agent -> its role (own name) -> seconds it pays per step to onload, in a slot whose
    members of every agent do not fit together: the planner's own figure
    (`placer.cost.agents.agent_onloads`) for the plan's layouts."""
    placed = [Placed(rp.slot, px.estimate(r, px.res.cluster.pool(rp.pool), rp.par))
              for r, rp in plan.roles.items()]
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for r, t in cost_onloads(px, px.agents, placed).items():
        agent, base = split_role(r)
        out[agent or ""][base] = t
    return out


class AgentModel:
    """A multi-agent plan made runnable: one `Model` per agent on shared slots (module text)."""

    def __init__(self, px: AgentPricer, plan: Plan, cfg: SimConfig, seed: int, rec: Recorder,
                 on_iteration: Callable[[int, int], None] | None = None) -> None:
        if plan.pipeline.overlaps_steps:
            raise SpecError("plan: mode: a multi-agent plan is simulated in sync mode only "
                            "(got 'async')")
        self.px, self.plan, self.rec = px, plan, rec
        self.on_iteration = on_iteration
        self.env = simpy.Environment()
        slot_res = {s.name: simpy.PriorityResource(self.env, 1) for s in plan.slots}
        onloads = agent_onloads(px, plan)
        agents = px.agents
        # the order their rollouts run in: by first turn
        self.order = sorted(agents.members, key=agents.turns.index)
        self.models: dict[str, Model] = {}
        for a in self.order:
            m = Model(px.subs[a], agent_plan(plan, a), cfg, seed, rec)
            m.env, m.slot_res, m.onload = self.env, slot_res, onloads.get(a, {})
            self.models[a] = m
        self.records: list[IterRecord] = []

    def run(self, iterations: int) -> RunRecord:
        self.records = [IterRecord(i) for i in range(iterations)]
        for m in self.models.values():
            m.records = [IterRecord(i) for i in range(iterations)]
        self.env.process(self._loop(iterations))
        self.env.run()
        first = self.models[self.order[0]]
        busy = [b for m in self.models.values() for b in m.busy]
        engine_busy: dict[str, float] = defaultdict(float)
        role_s: dict[str, float] = {}
        for a, m in self.models.items():
            for slot, s in m.engine_busy.items():
                engine_busy[slot] += s
            role_s.update({(k if k == "sync" else role_name(a, k)): v for k, v in m.role_s.items()
                           if k != "sync"})
            role_s["sync"] = role_s.get("sync", 0.0) + m.role_s.get("sync", 0.0)
        return RunRecord(self.records, first.samples, busy, dict(engine_busy), role_s,
                         self.env.now, [], sum(m.runs for m in self.models.values()),
                         first.replicas, first.committed)

    def _loop(self, n: int) -> Generator:
        env = self.env
        for i in range(n):
            rec = self.records[i]
            rec.start = env.now
            prepared = {a: m._prepare(i) for a, m in self.models.items()}
            for stage in ("sync", "rollout", "score", "train"):
                t0 = env.now
                if stage in ("sync", "rollout"):
                    for a in self.order:  # one agent after another
                        m = self.models[a]
                        smp, factors = prepared[a]
                        proc = (m._weight_sync(i) if stage == "sync"
                                else m._rollout(i, smp, factors))
                        yield env.process(proc)
                else:
                    yield env.process(self._stage(i, stage, prepared))
                rec.stages[stage] = (t0, env.now)
            first = self.models[self.order[0]].records[i]
            rec.committed, rec.generated = first.committed, first.generated
            rec.sync_s = sum(m.records[i].sync_s for m in self.models.values())
            rec.end = env.now
            if self.on_iteration is not None:
                self.on_iteration(i + 1, n)

    def _stage(self, i: int, stage: str, prepared: dict) -> Generator:
        """Every agent's work of `stage`, each role on its slot; one process per (slot,
        agent), so roles of different agents on one slot take turns on it."""
        procs = []
        for a, m in self.models.items():
            by_slot: dict[str, list[Work]] = defaultdict(list)
            for w in stage_work(m.px, m.plan, m.committed[i], stage):
                by_slot[m.plan.roles[w.role].slot].append(w)
            factors = prepared[a][1]
            procs += [self.env.process(m._slot_work(i, slot, works, factors[slot]))
                      for slot, works in by_slot.items()]
        yield simpy.AllOf(self.env, procs)


def check_agent_plan(px: AgentPricer, plan: Plan) -> None:
    """SpecError naming the agent's role when a plan lacks an agent's engines."""
    for a in px.agents.members:
        r = role_name(a, Role.ROLLOUT)
        if r not in plan.roles:
            raise SpecError(f"plan: roles.{r}: a multi-agent plan must place every agent's "
                            "rollout")

