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

from placer.base.roles import Role
from placer.cost.efficiency import Calibration, FitReport, StageReport
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


def _set(calib: Calibration, device: str, name: str, value: float) -> Calibration:
    return calib.with_factor(device, name, float(f"{value:.6g}"))


def _get(calib: Calibration, device: str, name: str) -> float:
    value: float = getattr(calib.per_device.get(device, calib.default), name)
    return value


def _stage_means(plan: Plan, trace: Trace, calib: Calibration, warmup: int = 1
                 ) -> tuple[dict[str, float], dict[str, float]]:
    """Measured and simulated stage seconds (steady mean), environment in score, other in train."""
    rep, _ = fidelity(plan, trace, calib, warmup=warmup)
    m = {k: v.measured for k, v in rep.stages.items()}
    s = {k: v.simulated for k, v in rep.stages.items()}
    for side in (m, s):  # the environment's work is priced as the rule check in `score`
        side["score"] = side.get("score", 0.0) + side.pop("environment", 0.0)
        side["train"] = side.get("train", 0.0) + side.pop("other", 0.0)
    return m, s


def stage_calibrate(plan: Plan, trace: Trace, calib: Calibration, warmup: int = 1
                    ) -> Calibration:
    """`calib` (a profile) plus the stage-level factors (module docstring), with a `fit.stages`
    section saying what each was fitted from. `trace` must be an executed run of `plan`; its
    first `warmup` steps are not fitted (`workflows.fidelity.fidelity`)."""
    res = plan.resolved()
    report: dict[str, StageReport] = {}
    for stage, role, name in STAGE_FACTORS:
        if role not in plan.roles:
            continue
        dev = res.device_of(plan.roles[role].pool).name
        if name == "rule_reward_s" and uses_sandbox(res.job):
            name = "sandbox_batch_s"  # the kind of check this job runs (placer.cost.rulecheck)
        identified = True
        for k in range(NEWTON_STEPS):
            measured, simulated = _stage_means(plan, trace, calib, warmup)
            resid = measured.get(stage, 0.0) - simulated.get(stage, 0.0)
            x = _get(calib, dev, name)
            if abs(resid) <= 1e-3 * max(measured.get(stage, 0.0), 1e-9):
                break
            h = max(abs(x) * 0.1, 1e-3)
            probe = _set(calib, dev, name, x + h)
            slope = (_stage_means(plan, trace, probe, warmup)[1].get(stage, 0.0)
                     - simulated.get(stage, 0.0)) / h
            if slope <= 0:  # the stage does not move with this factor here: keep it
                identified = k > 0
                break
            calib = _set(calib, dev, name, max(x + resid / slope, 0.0))
        if not identified:  # e.g. tool calls in a job that makes none: nothing to report
            continue
        measured, simulated = _stage_means(plan, trace, calib, warmup)
        report[f"{dev}.{name}"] = StageReport(stage=stage, value=_get(calib, dev, name),
                                              measured_s=round(measured.get(stage, 0.0), 6),
                                              simulated_s=round(simulated.get(stage, 0.0), 6))
    return calib.with_fit((calib.fit or FitReport()).with_stages(report))
