"""The job: what the user writes in YAML, as one strict model.

An RL post-training *job* names an algorithm (GRPO, PPO, RLOO), the models it trains and serves, the
batch, the length distributions of prompts and responses, an optional multi-turn environment, the
pipeline mode and the objective. A *cluster* is a set of *pools* of identical nodes plus the network
that joins them. Every model is strict (unknown keys are errors) so that a typo never silently
falls back to a default; `placer.spec.load` reads a file into a `Job` and turns validation failures
into one `SpecError` that names the field path and the bad value.

The *roles* an algorithm runs are derived here, not written by the user: see `Job.roles()`.
The sections live in their own modules of this package: `hardware` (device types, pools, the
cluster), `arch` (a model's shape), `sections` (algorithm, models, batch, lengths, environment,
pipeline, tail policy, precision), `rlterms` (KL and sampling), `weightsync` (the refit's
transport), `pins` (layout pins), `base` (the strict base model and bounded number types).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from placer.base.roles import Role
from placer.spec.agents import Agents, role_name
from placer.spec.arch import ModelArch
from placer.spec.base import Strict
from placer.spec.current import CurrentPlacement
from placer.spec.distributions import Distribution
from placer.spec.framework import FrameworkName, FrameworkProfile, profile_of
from placer.spec.hardware import Cluster, DeviceType
from placer.spec.judge import RewardModel
from placer.spec.localdata import Dataset
from placer.spec.pins import Pin, Pins, _Layout
from placer.spec.pipeline import Pipeline
from placer.spec.rlterms import KL, Sampling
from placer.spec.sections import (
    Algorithm,
    Batch,
    EngineSettings,
    Environment,
    Lengths,
    MicroTokenBudget,
    Models,
    Precision,
    Validation,
)
from placer.spec.tailpolicy import TailPolicy
from placer.spec.weightsync import WeightSync


# ------------------------------------------------------------------------------------ the job
class Catalog(Strict):
    devices: list[DeviceType] = []
    models: list[ModelArch] = []


class Job(Strict):
    name: str = "job"
    algorithm: Algorithm
    models: Models
    batch: Batch
    lengths: Lengths
    environment: Environment = Environment()
    pipeline: Pipeline = Pipeline()
    objective: Literal["time", "cost"] = "time"
    tail_policy: TailPolicy = TailPolicy()
    weight_sync: WeightSync = WeightSync()
    kl: KL = Field(KL(), description="the KL penalty to the reference: coef, in (reward | "
                   "loss), estimator (k1 | k2 | k3) (placer/spec/rlterms.py)")
    sampling: Sampling = Field(Sampling(), description="the rollout's temperature, which "
                               "the trainer's log-probs use too (placer/spec/rlterms.py)")
    precision: Precision = Field(Precision(), description="optional FP8 formats (Precision)")
    micro_token_budget: MicroTokenBudget | None = Field(
        None, description="the framework's tokens per device per micro-batch, {forward, "
                          "update} (placer/spec/sections.py MicroTokenBudget); none: the cost "
                          "model's default")
    engine: EngineSettings | None = Field(
        None, description="the run's inference-engine settings, {memory_fraction, "
                          "max_num_seqs} (placer/spec/sections.py EngineSettings); none: the "
                          "calibration's")
    validation: Validation | None = Field(
        None, description="a validation generation inside the step every N steps, {every, "
                          "samples} (placer/spec/sections.py Validation); none: not priced")
    reward_model: RewardModel | None = Field(
        None, description="how the reward model scores: a scalar forward pass (default) or a "
                          "generative judge that decodes a verdict (placer/spec/judge.py)")
    cluster: Cluster
    catalog: Catalog = Catalog()
    seed: Annotated[int, Field(strict=True, ge=0, le=2**63)] = 0
    data: Dataset | None = Field(None, description="JSONL or Parquet prompts with answers or "
                                 "unit tests (the executor's math or code reward; "
                                 "placer/spec/localdata.py)")
    current: CurrentPlacement | None = Field(
        None, description="the placement the job runs today (placer import); placer compare "
                          "prices it as the baseline `current`")
    pin: Pins | None = Field(
        None, description="per-role layout pins the planner keeps to, e.g. {actor: {tp: 2, "
                          "dp: 2}} (placer/spec/pins.py)")
    agents: Agents | None = Field(
        None, description="several agents taking turns in one episode, each with its own "
                          "policy, trainer, engines and reward (placer/spec/agents.py); "
                          "`models` then describes the first turn's agent and may be left out")
    framework: FrameworkName | None = Field(
        None, description="the framework the job runs under (placer/spec/framework.py): the "
                          "planner searches only the layouts it can run and prices its "
                          "overheads; none: native (placer execute)")
    rollout_sleep_level: Literal[1, 2] | None = Field(
        None, description="the vLLM sleep level a colocated rollout engine sleeps at between "
                          "generations: 1 copies its weights to the host and back, 2 discards "
                          "them (the refit rewrites them); none: the framework's "
                          "(placer/spec/framework.py rollout_sleep_level: verl 2, as its hybrid "
                          "engine does with vLLM >= 0.8.5; set 1 for verl 0.5 and before)")

    @model_validator(mode="before")
    @classmethod
    def _models_of_first_agent(cls, data: Any) -> Any:
        """A multi-agent job without `models`: those of the agent that takes the first turn."""
        if not isinstance(data, dict) or "models" in data:
            return data
        agents = data.get("agents")
        if not isinstance(agents, dict):
            return data
        members, turns = agents.get("members"), agents.get("turns")
        if not (isinstance(members, dict) and isinstance(turns, list) and turns
                and isinstance(turns[0], str) and isinstance(members.get(turns[0]), dict)):
            return data  # the agents' own errors say what is wrong
        first = members[turns[0]]
        models = {k: first[k] for k in ("policy", "reference", "reward", "use_reference")
                  if k in first}
        if models.get("reward") == "none":
            models["reward"] = "rule"
        if first.get("trained") is False:
            models["use_reference"] = False
        return {**data, "models": models}

    @model_validator(mode="after")
    def _validation_single_policy(self) -> Job:
        """A periodic validation is priced on the one rollout of a single-policy job
        (`placer.cost.validation`); a multi-agent job's step is priced per agent."""
        if self.validation is not None and self.agents is not None:
            raise ValueError("validation: not priced for a multi-agent job (agents); "
                             "leave it out")
        return self

    @model_serializer(mode="wrap")
    def _without_framework(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A job without a framework or agents is written without the key (files stay as they
        were)."""
        out: dict[str, Any] = handler(self)
        for key in ("framework", "agents", "micro_token_budget", "rollout_sleep_level", "engine",
                    "validation"):
            if out.get(key, "") is None:
                out.pop(key)
        return out

    @property
    def profile(self) -> FrameworkProfile:
        """The framework profile the job is planned for (`placer.spec.framework`)."""
        return profile_of(self.framework)

    @property
    def sleep_level(self) -> int:
        """The vLLM sleep level its colocated rollout engines sleep at: the job's
        `rollout_sleep_level`, else its framework's (`FrameworkProfile.rollout_sleep_level`)."""
        return self.rollout_sleep_level or self.profile.rollout_sleep_level

    def roles(self) -> list[Role]:
        """Roles the algorithm runs, in a stable order."""
        out = [Role.ACTOR, Role.ROLLOUT]
        if self.models.use_reference:
            out.append(Role.REFERENCE)
        out.append(Role.REWARD)
        if self.algorithm is Algorithm.ppo:
            out.append(Role.CRITIC)
        if self.environment.kind != "none":
            out.append(Role.ENVIRONMENT)
        return out

    def role_names(self) -> list[str]:
        """Every role the job runs by the name plans use: `roles()` for a single-policy job,
        `AGENT.ROLE` per agent (agents in their written order) for a multi-agent one; the
        environment, shared by every agent, keeps its own name."""
        if self.agents is None:
            return [str(r) for r in self.roles()]
        out = [role_name(a, r) for a in self.agents.members for r in self.agents.roles_of(a)]
        return out + ([Role.ENVIRONMENT.value] if self.environment.kind != "none" else [])

    def response_of(self, agent: str) -> Distribution:
        """Tokens agent `agent` generates per turn (its own, else `lengths.response`)."""
        assert self.agents is not None, "a single-policy job has no agents"
        return self.agents.members[agent].response or self.lengths.response

    def max_context_float(self) -> float:
        """Longest context a sample reaches: prompt + all turns' responses and tool outputs."""
        if self.agents is not None:  # every turn's response, in schedule order
            return self.lengths.prompt.max_value() + sum(
                self.response_of(t).max_value() for t in self.agents.turns
                if t in self.agents.members)
        env = self.environment
        return (self.lengths.prompt.max_value() + env.turns * self.lengths.response.max_value()
                + (env.turns - 1) * env.tool_output_tokens)

    @property
    def judge(self) -> RewardModel | None:
        """The generative judge's settings, or None for a rule or scalar reward."""
        rm = self.reward_model
        return rm if rm is not None and rm.generative else None

    @property
    def max_context(self) -> int:
        """`max_context_float` in whole tokens (finite: checked when the job is loaded)."""
        return int(self.max_context_float())


def distributions(job: Job) -> list[tuple[str, Distribution]]:
    """Every distribution of a job with its field path."""
    return [("lengths.prompt", job.lengths.prompt), ("lengths.response", job.lengths.response),
            ("environment.tool_latency_s", job.environment.tool_latency_s)] + (
        [("reward_model.verdict", job.judge.verdict)]
        if job.judge is not None and job.judge.verdict is not None else []) + (
        [(f"agents.members.{n}.response", a.response) for n, a in job.agents.members.items()
         if a.response is not None] if job.agents is not None else [])


# ------------------------------------------------------------------------------------ pins
L = TypeVar("L", bound=_Layout)


def pin_of(job: Job, role: str) -> Pin | None:
    """The job's pin of `role`, or None when the role is free."""
    return job.pin.of(role) if job.pin is not None else None


def pinned_layouts(job: Job, role: str, pool: str, pars: Iterable[L]) -> list[L]:
    """The layouts of `role` on `pool` that keep to the job's pin (all of them when unpinned)."""
    pin = pin_of(job, role)
    return list(pars) if pin is None else [p for p in pars if pin.allows(pool, p)]
