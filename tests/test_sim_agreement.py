"""With every source of variance off, the simulator reproduces the placer's prediction (within
2%) on every example, the placement priced with every length and latency at its mean
(`rollout_tail.at_means`; the plan itself is priced with the job's tails): for the plan the
planner makes and for the fixed hand placements that exercise colocation, LPUs, CPU pools and
async mode.

What this checks and what it does not: both sides price a stage with the same cost-model
functions, so it is no evidence that those prices are right (tests/test_operators.py and
tests/test_loo.py check them against measured data). It is an independent check of the
composition: the simulator's event schedule (barriers, overlap, colocated slots taking turns,
async staleness) against the planner's closed-form `iteration_time`."""
from __future__ import annotations

import pytest
import yaml
from simplans import EXAMPLES, example_names, example_plan, hand_plan

from placer.cost import rollout_tail
from placer.cost.efficiency import Calibration
from placer.solve.assemble import reprice
from placer.solve.planfile import Plan
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from simulator.api import simulate_plan
from simulator.config import SimConfig
from simulator.handplans import EXAMPLE_PLACEMENTS, place

TOL = 0.02


def _iterations(plan) -> int:
    return 5 if plan.mode == "async" else 1  # async: fill, three steady steps, drain


def at_means(plan) -> float:
    """The plan's placement priced with every length and latency at its mean: the planner's
    prediction of a no-variance run (the plan itself is priced with the job's tails)."""
    return reprice(plan, rollout_tail.at_means(plan.spec), Calibration()).iteration_s


def _check(plan, iterations: int | None = None) -> None:
    r = simulate_plan(plan, iterations=iterations or _iterations(plan), seed=0,
                      config=SimConfig.no_variance())
    # async: the steady period is the mean of the two intervals between the fill and the drain;
    # the first interval after the fill can still be short when a colocated slot is the
    # bottleneck (its rollout ran ahead), and a slot whose stages interleave two iterations
    # alternates a short and a long interval (large-1k-nodes: 253 and 548 s for a 401 s period)
    ends = [it.end for it in r.run.iterations]
    sim = ((ends[3] - ends[1]) / 2 if plan.mode == "async"
           else r.metrics.iteration_s.mean)
    pred = at_means(plan)
    assert abs(sim - pred) <= TOL * pred, f"simulated {sim:.3f} s vs predicted {pred:.3f} s"


@pytest.mark.parametrize("name", example_names())
def test_planned_example_agrees(name):
    _check(example_plan(name))


@pytest.mark.parametrize("name", sorted(n for n in EXAMPLE_PLACEMENTS if n in example_names()))
def test_hand_placed_example_agrees(name):
    _check(hand_plan(name))


def test_no_variance_is_lockstep():
    """Every sample of a no-variance run ends its rollout at one of a few lockstep times."""
    plan = hand_plan("grpo-qwen7b-h100")
    r = simulate_plan(plan, config=SimConfig.no_variance())
    ends = {round(t, 9) for t in r.run.iterations[0].done_at.values()}
    assert len(ends) <= 2  # one per engine wave (full waves and the remainder)


def _validating(name: str, every: int) -> Plan:
    """Example `name`'s hand placement on its job with a validation pass every `every` steps."""
    doc = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    doc["validation"] = {"every": every, "samples": 64}
    return place(resolve(job_from_dict(doc), name), EXAMPLE_PLACEMENTS[name], Calibration())


@pytest.mark.parametrize("name", ["grpo-qwen7b-h100", "tiny-cpu", "ppo-llama8b-hetero",
                                  "agentic-code"])
def test_validating_example_agrees(name):
    """A job that validates every 2 steps (`simulator.validation`): the simulated mean step over
    a multiple of 2 steps (sync: 2 steps; async: the two steady intervals, one of them
    validating) is the planned step, its `validate` share included (colocated engines wake for
    it: grpo-qwen7b-h100, tiny-cpu; engines on slots of their own, which pay the refit and
    not the wake: ppo-llama8b-hetero, and agentic-code in async mode, where the training slot
    stays the busiest and the validation moves neither side's step)."""
    plan = _validating(name, 2)
    bd = reprice(plan, rollout_tail.at_means(plan.spec), Calibration())
    plain = reprice(plan, rollout_tail.at_means(plan.spec.model_copy(update={"validation": None})),
                    Calibration())
    assert bd.stage_s["validate"] > 0
    if plan.mode == "sync":  # async: the busiest slot (training's) still sets the pace
        assert bd.iteration_s == pytest.approx(plain.iteration_s + bd.stage_s["validate"])
    _check(plan, iterations=5 if plan.mode == "async" else 2)
