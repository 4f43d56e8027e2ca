"""Event-level fit of the rule reward's per-sample factors, each from events of its own kind.

`placer.cost.rulecheck` prices a rule reward with three factors of the reward's device type; two of
them show directly in an executed trace (executors/rollouts.py `EnvironmentCalls.run`,
executors/roles.py `RuleReward.score`):

  sandbox_sample_s  a job that verifies answers in a sandbox records one `tool` event per answer
                    (`call: verify`), start and duration as the sandbox's runner timed them; in
                    one batch (a step's events of one worker) the answers run one after another,
                    so the batch's span from its first start to its last end over its answers is
                    the per-answer cost with the fork between answers included; the factor is
                    the median over the batches of two or more answers;
  rule_reward_s     the reward worker's `reward` event (its `sample_ids` the answers checked) of
                    a job whose check runs in process: the event's duration over the rounds it
                    is priced in, ceil(samples / cores) (`rulecheck.rule_reward_time`), median
                    over the events.

Medians, not means: a worker's first call pays one-off costs (sympy's import, ~0.6 s against
~2 ms a step after it) that no later step sees.

A job whose reward runs each answer's unit tests in a sandbox (`data.reward: code`) fits neither
here: its reward events hold whole sandbox runs, and the stage fit (workflows/stagefit.py) gives
`sandbox_batch_s` what the events leave. A simulated trace's reward event has no sample_ids and
fits nothing. Factors go to the reward role's device type, where `rulecheck` reads them.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from placer.base.roles import Role
from placer.cost.rulecheck import runs_code_reward, verifies_in_sandbox
from placer.solve.planfile import Plan
from traces.schema import Trace, TraceEvent

# (device type, factor, value, batches or events it is the median of, relative RMS about it)
RuleFit = tuple[str, str, float, int, float]


def _median_rel(xs: list[float]) -> tuple[float, float]:
    """Median and relative RMS deviation from it of `xs` (non-empty)."""
    a = np.asarray(xs, dtype=float)
    m = float(np.median(a))
    return m, float(np.sqrt(np.mean(((a - m) / m) ** 2))) if m > 0 else 0.0


def _verify_spans(events: list[TraceEvent]) -> list[float]:
    """Per answer, each verify batch's span (first start to last end) over its answers."""
    batches: dict[tuple[object, str, str], list[TraceEvent]] = defaultdict(list)
    for ev in events:
        if ev.cat == "tool" and ev.args.get("call") == "verify" and ev.dur_s > 0:
            batches[(ev.args.get("step"), ev.pid, ev.tid)].append(ev)
    out = []
    for evs in batches.values():
        if len(evs) >= 2:
            start = min(e.ts_s for e in evs)
            end = max(e.ts_s + e.dur_s for e in evs)
            out.append((end - start) / len(evs))
    return out


def _check_times(events: list[TraceEvent], cores: int) -> list[float]:
    """Per round of in-process checks, each rule reward event's duration."""
    out = []
    for ev in events:
        ids = ev.args.get("sample_ids")
        if ev.cat == "reward" and isinstance(ids, list) and ids and ev.dur_s > 0:
            out.append(ev.dur_s / math.ceil(len(ids) / max(cores, 1)))
    return out


def fit_rule_factors(trace: Trace, plan: Plan, min_events: int) -> list[RuleFit]:
    """The rule reward's per-sample factors the trace's events show (module docstring)."""
    if Role.REWARD not in plan.roles:
        return []
    res = plan.resolved()
    if res.model_of(Role.REWARD) is not None or runs_code_reward(res.job):
        return []  # a reward model (priced by forward events), or whole sandbox runs
    rp = plan.roles[Role.REWARD]
    dev = res.device_of(rp.pool)
    kinds: list[tuple[str, Callable[[], list[float]]]] = [
        ("rule_reward_s", lambda: _check_times(trace.events, rp.par.devices * dev.cores))]
    if verifies_in_sandbox(res.job):
        kinds.append(("sandbox_sample_s", lambda: _verify_spans(trace.events)))
    out = []
    for name, samples in kinds:
        xs = samples()
        if len(xs) >= min_events:
            med, rel = _median_rel(xs)
            out.append((dev.name, name, med, len(xs), rel))
    return out
