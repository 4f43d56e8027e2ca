"""The cost table of a multi-agent job: every role of every agent, for the one placement ILP.

Each agent's roles get the candidates a single-policy job's would (`candidates.single_candidates`
on the agent's own pricer: its model, its lengths, its turns), renamed `AGENT.ROLE` and priced
by `placer.cost.agents.AgentPricer`. The ILP (`placer.solve.ilp`) then places them all at once:
colocation across agents is one more choice of slots; the agents' rollouts add in the rollout
stage and their weight syncs add (`Pricer.sequential_rollouts`, `Pricer.sync_pairs`); shared
engine pools are slots their agents' rollouts must share (`Pricer.colocated_roles`). A role
split over two pools is not offered to an agent (its parts would need the agent's own split
pricing); host-memory refusals read a role's model by its own name and are left to the plan's
node mapping.
"""
from __future__ import annotations

from placer.base.errors import Infeasible
from placer.cost.pricer import AgentPricer
from placer.solve.candidates import Candidate, single_candidates
from placer.solve.problem import Problem
from placer.spec.agents import role_name


def agent_candidates(px: AgentPricer) -> dict[str, list[Candidate]]:
    """`AGENT.ROLE` -> its candidates on every pool that may host it."""
    out: dict[str, list[Candidate]] = {}
    for agent, sub in px.subs.items():
        per_pool = single_candidates(sub)
        for role in px.agents.roles_of(agent):
            name = role_name(agent, role)
            out[name] = [Candidate(name, c.pool, px.qualify(name, c.est))
                         for cs in per_pool[role].values() for c in cs]
    return out


def build_agent_problem(px: AgentPricer, objective: str | None = None) -> Problem:
    """The multi-agent cost table; Infeasible naming every role no pool can host."""
    cands = agent_candidates(px)
    missing = [r for r, cs in cands.items() if not cs]
    if missing:
        raise Infeasible(f"{', '.join(missing)}: no pool of the cluster fits "
                         f"{'this role' if len(missing) == 1 else 'these roles'} (placer "
                         "validate shows each role's memory floor and smallest layout)")
    return Problem(px, cands, objective or px.res.job.objective)
