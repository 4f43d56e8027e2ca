"""What kind of model the reward is: one scalar forward pass, or a generative judge that decodes.

A *scalar* reward model (the default for `models.reward: NAME`) scores a finished sample in one
forward pass over its context. A *generative* judge (an LLM-as-a-judge, often larger than the
policy) reads the sample's context plus a rubric and decodes a verdict of its own length
distribution before the reward is parsed from it: the cost of a decode, not of a forward pass.
A rule reward (`models.reward: rule`) has neither. `placer.cost.judge` prices the judge's decode
queue; the planner places its engines like any role (own engines on GPUs or LPUs, or colocated
with the rollout); the simulator replays the queue after the policy's responses.

Written as the job's `reward_model:` section, absent for rule and scalar rewards (so their jobs
and plans read as they always did).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from placer.spec.base import MAX_CONTEXT_TOKENS, Strict
from placer.spec.distributions import Distribution

Tokens = Annotated[int, Field(strict=True, ge=0, le=1_000_000_000)]


class RewardModel(Strict):
    """How the reward model (`models.reward`) turns a sample into a reward."""

    kind: Literal["scalar", "generative"] = Field(
        "scalar", description="scalar: one forward pass over the sample; generative: a judge "
        "that prefills prompt + response + rubric and decodes a verdict")
    rubric_tokens: Tokens = Field(
        0, description="generative: the rubric and judging instructions added to every judged "
        "sample's context (tokens)")
    verdict: Distribution | None = Field(
        None, description="generative: tokens of the verdict the judge decodes per sample "
        "(its reasoning and score)")

    @model_validator(mode="after")
    def _verdict_only_for_a_judge(self) -> RewardModel:
        if self.kind == "generative" and self.verdict is None:
            raise ValueError("kind 'generative' needs verdict, the judge's decoded length "
                             "distribution (e.g. {kind: lognormal, median: 200, sigma: 0.5})")
        if self.kind == "scalar" and (self.verdict is not None or self.rubric_tokens):
            raise ValueError("kind 'scalar' decodes no verdict: set kind: generative, or drop "
                             "verdict and rubric_tokens")
        return self

    @property
    def generative(self) -> bool:
        return self.kind == "generative"


def check_judge(reward: str, spec: RewardModel | None, policy_context: float, source: str
                ) -> list[str]:
    """One line per problem of a generative judge: no model to run, or a longest request
    (sample, rubric, verdict) beyond `MAX_CONTEXT_TOKENS`; [] otherwise."""
    if spec is None or not spec.generative:
        return []
    if reward == "rule":
        return [f"{source}: reward_model.kind: 'generative' needs a judge model in "
                "models.reward, got 'rule'"]
    ctx = judge_max_context(policy_context, spec)
    if not ctx <= MAX_CONTEXT_TOKENS:
        return [f"{source}: reward_model.verdict: the judge's longest request, sample + rubric + "
                f"verdict, is {ctx:.3g} tokens, beyond {MAX_CONTEXT_TOKENS:,}"]
    return []


def judge_max_context(policy_context: float, spec: RewardModel) -> float:
    """Longest context the judge holds: the sample's, the rubric and the longest verdict."""
    assert spec.verdict is not None, "a generative judge has a verdict distribution"
    return policy_context + spec.rubric_tokens + spec.verdict.max_value()
