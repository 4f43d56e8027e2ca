"""Stage-level calibration: the efficiency factors a trace's events cannot see, fitted so that
the simulator's stage times match an executed run's measured ones.

`placer calibrate` first fits the event-level factors (placer/calibrate/fit.py: prefill, decode, generate,
forward, train and transfer events, each priced by the cost model). Some of a step's time is in
no such event: the executor's round trip around a weight push, the sandbox starting one
interpreter per batch of tool calls, the driver's work between stages. Four
factors price that time; each is fitted on the stage it drives (mean over the steady steps of
`workflows.fidelity`'s measured and simulated stage times):

  sync_latency_s   (rollout device)      the sync stage: the round trip (fetch weights, put,
                                         load) around the push
  tool_overhead_s  (environment's CPU)   the rollout stage of a multi-turn job: a tool call's
                                         cost beyond its own run; single-turn jobs make no tool
                                         calls and leave it as it is
  sandbox_batch_s  (reward's CPU)        environment + score stages: what the reward's
  or rule_reward_s                       events leave of them (the start of each sandbox, the
                                         driver's work around the check); `sandbox_batch_s`
                                         for a job whose answers run in a sandbox, else the
                                         in-process check's `rule_reward_s`
                                         (`placer.cost.rulecheck`: the kinds are fitted apart)
  train_overhead_s (actor device)        train + "other": the optimizer step plus the driver's
                                         work after it (a checkpoint is its own stage, priced
                                         by the event-level `checkpoint_overhead_s`)

Each factor is found by Newton steps on the simulator itself (probe, solve, repeat: at most
NEWTON_STEPS simulations of the run's replayed inputs, plus one probe each), so the fit never
re-derives the simulator's formulas; a stage that does not move with its factor keeps the
prior and is not reported. The result is the profile with the factors set and a `fit.stages`
section saying, per factor, its stage, value and the measured and simulated stage seconds.
It needs the simulator, hence lives here (workflows) rather than in placer/calibrate/fit.py.
"""
from __future__ import annotations

import copy
from typing import Any

from placer.base.roles import Role
from placer.cost.calibration import calibration_from_dict
from placer.cost.efficiency import Efficiency
from placer.cost.rulecheck import uses_sandbox
from placer.solve.planfile import Plan
from traces.schema import Trace
from workflows.fidelity import fidelity

# stage -> (role whose device holds the factor, factor); environment+score fit together
STAGE_FACTORS = (("sync", Role.ROLLOUT, "sync_latency_s"),
                 ("rollout", Role.ENVIRONMENT, "tool_overhead_s"),
                 ("score", Role.REWARD, "rule_reward_s"),
                 ("train", Role.ACTOR, "train_overhead_s"))
NEWTON_STEPS = 4


def _set(doc: dict[str, Any], device: str, name: str, value: float) -> None:
    doc.setdefault("devices", {}).setdefault(device, {})[name] = float(f"{value:.6g}")


def _get(doc: dict[str, Any], device: str, name: str) -> float:
    cal = calibration_from_dict({k: v for k, v in doc.items() if k != "fit"})
    return getattr(cal.per_device.get(device, cal.default or Efficiency()), name)


def _stage_means(plan: Plan, trace: Trace, doc: dict[str, Any], warmup: int = 1
                 ) -> tuple[dict, dict]:
    """Measured and simulated stage seconds (steady mean), environment in score, other in train."""
    rep, _ = fidelity(plan, trace, calibration_from_dict({k: v for k, v in doc.items()
                                                          if k != "fit"}), warmup=warmup)
    m = {k: v.measured for k, v in rep.stages.items()}
    s = {k: v.simulated for k, v in rep.stages.items()}
    for side in (m, s):  # the environment's work is priced as the rule check in `score`
        side["score"] = side.get("score", 0.0) + side.pop("environment", 0.0)
        side["train"] = side.get("train", 0.0) + side.pop("other", 0.0)
    return m, s


def stage_calibrate(plan: Plan, trace: Trace, doc: dict[str, Any], warmup: int = 1
                    ) -> dict[str, Any]:
    """`doc` (a profile) plus the stage-level factors (module docstring), with a `fit.stages`
    section saying what each was fitted from. `trace` must be an executed run of `plan`; its
    first `warmup` steps are not fitted (`workflows.fidelity.fidelity`)."""
    doc = copy.deepcopy(doc)
    res = plan.resolved()
    report: dict[str, Any] = {}
    for stage, role, name in STAGE_FACTORS:
        if role not in plan.roles:
            continue
        dev = res.device_of(plan.roles[role].pool).name
        if name == "rule_reward_s" and uses_sandbox(res.job):
            name = "sandbox_batch_s"  # the kind of check this job runs (placer.cost.rulecheck)
        identified = True
        for k in range(NEWTON_STEPS):
            measured, simulated = _stage_means(plan, trace, doc, warmup)
            resid = measured.get(stage, 0.0) - simulated.get(stage, 0.0)
            x = _get(doc, dev, name)
            if abs(resid) <= 1e-3 * max(measured.get(stage, 0.0), 1e-9):
                break
            h = max(abs(x) * 0.1, 1e-3)
            probe = copy.deepcopy(doc)
            _set(probe, dev, name, x + h)
            slope = (_stage_means(plan, trace, probe, warmup)[1].get(stage, 0.0)
                     - simulated.get(stage, 0.0)) / h
            if slope <= 0:  # the stage does not move with this factor here: keep it
                identified = k > 0
                break
            _set(doc, dev, name, max(x + resid / slope, 0.0))
        if not identified:  # e.g. tool calls in a job that makes none: nothing to report
            continue
        measured, simulated = _stage_means(plan, trace, doc, warmup)
        report[f"{dev}.{name}"] = {"stage": stage, "value": _get(doc, dev, name),
                                   "measured_s": round(measured.get(stage, 0.0), 6),
                                   "simulated_s": round(simulated.get(stage, 0.0), 6)}
    doc.setdefault("fit", {})["stages"] = report
    return doc
