"""The pricer: what the solver, the baselines, the simulator and the fits ask the cost model.

`Pricer(res, calib)` is one problem's pricing context (`placer.cost.context`: the resolved job,
its efficiency factors and the memo of its prices) with the cost model's entry points as
methods. Make one per problem and pass it along; two problems priced with two pricers, in any
order, get the numbers each gets alone (tests/test_pricer.py).
"""
from __future__ import annotations

from dataclasses import replace

from placer.base.roles import Role
from placer.cost.agents import (
    agent_iteration_time,
    agent_slot_switch,
    base_placed,
    lora_share,
    onloads_per_step,
    rollout_roles,
    shared_slots,
    sync_pairs,
)
from placer.cost.batching import StepTerms
from placer.cost.context import PriceContext, TermsKey
from placer.cost.efficiency import Calibration
from placer.cost.estimate import estimate
from placer.cost.roleestimate import Estimate
from placer.cost.rolloutcost import RolloutShape, rollout_shape
from placer.cost.sharding import Parallel
from placer.cost.split import SplitKeep, SplitSpace, split_estimates
from placer.cost.timing import (
    Breakdown,
    Placed,
    iteration_time,
    rollout_tool_time,
    slot_switch,
    sync_time,
    validation_swap_s,
)
from placer.cost.validation import validation_rollout_s
from placer.spec.agentjob import agent_job
from placer.spec.agents import Agents, split_role
from placer.spec.catalog import Resolved, resolve
from placer.spec.hardware import DeviceType, Pool


class Pricer(PriceContext):
    """A problem's prices: estimates of roles, their iteration time and the weight sync. A
    multi-agent job's pricer is an `AgentPricer`, whoever makes it."""

    def __new__(cls, res: Resolved, calib: Calibration | None = None,
                _terms: dict[TermsKey, StepTerms] | None = None, step_draws: int = 0) -> Pricer:
        if cls is Pricer and res.job.agents is not None:
            cls = AgentPricer
        return super().__new__(cls)

    def estimate(self, role: str, pool: Pool, par: Parallel,
                 env_cores: int | None = None) -> Estimate:
        """One role's work per iteration on `pool` with `par` (`placer.cost.estimate`)."""
        return estimate(self, role, pool, par, env_cores)

    def split_estimates(self, role: str, singles: dict[str, list[Estimate]],
                        keep: SplitKeep | None = None, space: SplitSpace | None = None,
                        shared: frozenset[str] = frozenset()) -> list[Estimate]:
        """`role` split over every pair of pools, from its single-pool estimates
        (`placer.cost.split`); `space` counts what was searched; `shared`: pools where a part
        may time-share a slot."""
        return split_estimates(self, role, singles, keep, space, shared)

    def rollout_shape(self, dev: DeviceType, par: Parallel) -> RolloutShape:
        """How the batch's samples meet the rollout's engine replicas."""
        return rollout_shape(self, dev, par, self.calib.for_device(dev))

    def iteration_time(self, placed: list[Placed]) -> Breakdown:
        """Placed estimates combined into one RL step (`placer.cost.timing`)."""
        return iteration_time(self, placed)

    def sync_time(self, actor: Placed, rollout: Placed) -> float:
        """One weight refresh from the actor's placement to the rollout's."""
        return sync_time(self, actor, rollout)

    def tool_time(self, rollout: Placed, env: Placed) -> float:
        """What tool calls queueing for the environment's cores add to the rollout stage."""
        return rollout_tool_time(self, rollout, env)

    def slot_switch(self, placed: list[Placed]) -> dict[str, float]:
        """Onload seconds per slot whose roles do not fit on its devices together."""
        return slot_switch(self, placed)

    def validation_terms(self, rollout: Estimate) -> tuple[float, float]:
        """A periodic validation's per-step seconds on rollout candidate `rollout`
        (`placer.cost.validation`): (its generation, the engines' sleep and wake if its slot is
        shared), each / `validation.every`; the refit's share is the sync's / every. (0, 0)
        without a `validation` section."""
        val = self.res.job.validation
        if val is None:
            return 0.0, 0.0
        return (validation_rollout_s(self, rollout) / val.every,
                validation_swap_s(self, rollout) / val.every)

    def sync_pairs(self) -> list[tuple[str, str]]:
        """(actor, rollout) of every weight sync the job runs (one: the policy's)."""
        return [(Role.ACTOR, Role.ROLLOUT)]

    def sequential_rollouts(self) -> list[str]:
        """Rollout roles whose stage times add wherever they sit (several agents' engines,
        `placer.cost.agents`); none for a single-policy job."""
        return []

    def colocated_roles(self) -> list[list[str]]:
        """Groups of roles that must share one slot: a single-policy job's framework's hybrid
        engine (`FrameworkProfile.hybrid_engine`, the roles the job has; EasyR1 builds them in
        one worker group), else none."""
        group = [r for r in self.res.job.profile.hybrid_engine if r in self.res.job.roles()]
        return [group] if len(group) > 1 else []

    def apart_roles(self) -> list[str]:
        """Roles of the job no two of which may share a slot: its framework's for its pipeline
        (`FrameworkProfile.apart_roles`: NeMo-RL's async GRPO keeps its vLLM generation off the
        policy's devices), else none."""
        job = self.res.job
        apart = job.profile.apart_roles(async_steps=job.pipeline.mechanism.overlaps_steps)
        group = [r for r in apart if r in job.roles()]
        return group if len(group) > 1 else []

    def same_devices_roles(self) -> list[list[str]]:
        """Groups of roles that must run over the same devices, not just share a slot: a
        framework's hybrid engine (EasyR1's one worker group runs the actor, the rollout and
        the reference over every GPU of its pool: verl/trainer/ray_trainer.py:256-263), so
        each is priced on the devices it will run on; none for an agents' job."""
        return self.colocated_roles()

    def onloads_per_step(self, role: str) -> int:
        """Onloads a role pays per step in a slot whose members do not fit together: one,
        unless its engines hand the slot to another agent's several times a step
        (`placer.cost.agents.swap_runs`)."""
        return 1


class AgentPricer(Pricer):
    """A multi-agent job's prices (`placer.cost.agents`): every `AGENT.ROLE` on its agent's
    own `Pricer` (its view of the episode, `placer.spec.agentjob`), one `StepTerms` table."""

    prices_agents = True

    def __init__(self, res: Resolved, calib: Calibration | None = None,
                 _terms: dict[TermsKey, StepTerms] | None = None, step_draws: int = 0) -> None:
        super().__init__(res, calib, _terms, step_draws)
        assert res.job.agents is not None, "AgentPricer prices multi-agent jobs"
        self.agents: Agents = res.job.agents
        self.subs: dict[str, Pricer] = {
            a: Pricer(resolve(agent_job(res.job, a), a), self.given, self._terms)
            for a in self.agents.members}

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
        """An estimate by the agent's own pricer as `AGENT.ROLE`'s (`agents.lora_share`)."""
        sub, base = self.sub_of(role)
        if base == Role.ROLLOUT:
            est = lora_share(self.agents, role, sub.res.arch_of(Role.ROLLOUT), est)
        return replace(est, role=role)

    def sync_time(self, actor: Placed, rollout: Placed) -> float:
        sub, _ = self.sub_of(actor.est.role)
        return sub.sync_time(base_placed(actor), base_placed(rollout))

    def iteration_time(self, placed: list[Placed]) -> Breakdown:
        by_role = {p.est.role: p for p in placed}
        syncs = {r: self.sync_time(by_role[a], by_role[r]) for a, r in self.sync_pairs()
                 if a in by_role and r in by_role}
        return agent_iteration_time(self, self.agents, placed, syncs)

    def slot_switch(self, placed: list[Placed]) -> dict[str, float]:
        return agent_slot_switch(self, self.agents, placed)

    def tool_time(self, rollout: Placed, env: Placed) -> float:
        raise AssertionError("a multi-agent job runs no tool environment")

    def split_estimates(self, role: str, singles: dict[str, list[Estimate]],
                        keep: SplitKeep | None = None, space: SplitSpace | None = None,
                        shared: frozenset[str] = frozenset()) -> list[Estimate]:
        return []  # an agent's role is not split over pools (`placer.solve.agentplan`)

    def sync_pairs(self) -> list[tuple[str, str]]:
        return sync_pairs(self.agents)

    def sequential_rollouts(self) -> list[str]:
        return rollout_roles(self.agents)

    def colocated_roles(self) -> list[list[str]]:
        return shared_slots(self.agents)

    def same_devices_roles(self) -> list[list[str]]:
        return []  # agents' engines share a pool's slot, each on its own device count

    def apart_roles(self) -> list[str]:
        return []  # a framework's rules are refused for an agents' job (`planner.build_problem`)

    def onloads_per_step(self, role: str) -> int:
        return onloads_per_step(self.agents, role)
