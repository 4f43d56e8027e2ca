"""Rank long-tail policies for a job: simulate the plan under each with the same seed.

    rows = compare_policies(plan, iterations=3, seed=0)   # best first
    rows[0]["kind"], rows[0]["samples_per_s"], rows[0]["why"]

The policies (`placer.spec.job.TailPolicy`, modelled in `simulator.tails` and the CPU pool): none,
overprovision, partial and (with tool calls) reissue. A policy the job sets keeps its parameters;
the others get defaults read off the job's own distributions with the same seed: over-provision
10%, a partial-rollout budget at the 90th percentile of a sample's response tokens, a re-issue
deadline at the 95th percentile of tool latency (never below the mean: `spec.check_tail_policy`).

Ranking metric: committed (trained) samples per second of wall time - iteration time alone would
flatter partial rollouts, whose steps train fewer finished samples. Every row says why it moved
against `none` in the simulator's own terms (long tail after 90% of samples, tool queueing, work
generated and carried).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from placer.base.errors import SpecError
from placer.solve.planfile import Plan, load_plan
from placer.spec.job import Job
from placer.spec.load import check_tail_policy
from placer.spec.tailpolicy import POLICIES, Draws, TailPolicy
from simulator.api import simulate_plan
from simulator.config import SimConfig
from simulator.metrics import SimMetrics
from simulator.workload import has_tools, samples_for


def policy_options(job: Job, seed: int = 0) -> list[TailPolicy]:
    """The policies to compare for `job` (its own kind keeps its parameters), each at defaults
    read off the job's draws (`TailMechanism.option`)."""
    own = job.tail_policy
    base = job.model_copy(update={"tail_policy": TailPolicy()})
    smp = samples_for(base, SimConfig().workload, seed, 0)
    draws = Draws(response_totals=[float(sum(r)) for r in smp.response],
                  tool_latencies_s=np.array(smp.tool_s).ravel().tolist(),
                  response_floor=job.environment.turns * math.ceil(
                      job.lengths.response.mean_value()),
                  mean_tool_s=job.environment.tool_latency_s.mean_value(),
                  has_tools=has_tools(job))
    out = [p for mech in POLICIES.values() if (p := mech.option(draws)) is not None]
    return [own if p.kind == own.kind else p for p in out]


def with_policy(plan: Plan, policy: TailPolicy) -> Plan:
    """The plan with its job's tail policy replaced (placement unchanged)."""
    job = {**plan.job, "tail_policy": policy.model_dump(exclude_none=True)}
    check_tail_policy(Job.model_validate(job), f"tail_policy {policy.kind}")
    return plan.model_copy(update={"job": job})


def compare_policies(plan: Plan | str, iterations: int = 3, seed: int = 0,
                     config: SimConfig | None = None) -> list[dict[str, Any]]:
    """Simulate `plan` under every policy (same seed, same draws); best first."""
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
    if iterations < 1:
        raise SpecError(f"iterations: must be at least 1 (got {iterations})")
    job = plan.spec
    cfg = config if config is not None else SimConfig()
    rows = []
    for policy in policy_options(job, seed):
        rows.append(_row(policy, simulate_plan(with_policy(plan, policy), iterations, seed,
                                               cfg).metrics))
    base = next(r for r in rows if r["kind"] == TailPolicy().kind)  # the default: wait for all
    for r in rows:
        r["vs_none"] = r["samples_per_s"] / base["samples_per_s"] - 1 if base["samples_per_s"] else 0.0
        r["why"] = _why(r, base, job)
    rows.sort(key=lambda r: -r["samples_per_s"])
    for k, r in enumerate(rows, 1):
        r["rank"] = k
    return rows


def _row(policy: TailPolicy, m: SimMetrics) -> dict[str, Any]:
    tp = m.tail_policy
    return {"kind": policy.kind, "policy": policy.model_dump(exclude_none=True),
            "samples_per_s": m.samples_per_s, "iteration_s": m.iteration_s.mean,
            "iteration_p99_s": m.iteration_s.p99,
            "rollout_s": m.stage_s.rollout, "long_tail_s": m.why.long_tail_s,
            "queueing_s": m.why.queueing_s, "generated": tp.generated_per_iteration,
            "committed": tp.committed_per_iteration,
            "carried_tokens": tp.carried_tokens_per_iteration,
            "reissued_calls": tp.reissued_calls, "reissue_saved_s": tp.reissue_saved_s}


def _why(r: dict[str, Any], base: dict[str, Any], job: Job) -> str:
    return TailPolicy.model_validate(r["policy"]).mechanism.explain(r, base, job.batch.samples)
