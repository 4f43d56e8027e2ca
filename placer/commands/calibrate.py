"""`placer calibrate TRACE.json [--plan PLAN.json] [-o profile.yaml] [--events-only] [--json]`.

Fits the cost model to an executed (or simulated) trace and writes a calibration profile that
`plan`, `simulate`, `compare`, `validate` and `fidelity` take with `--calibration`. Two levels:

  events  the efficiency factors per device type that price each prefill, decode, generate,
          forward, train and transfer event, and the tool-latency distribution of the tool
          events (method and equations: placer/calibrate/fit.py);
  stages  for an executed run, the factors no event shows (the sync round trip, a tool call's
          overhead, the rule reward, the train overhead), fitted so that the simulator's stage
          times match the run's (workflows/stagefit.py); `--events-only` skips it.
 The plan tells which device type each pool
holds and each role's model and parallel config. Without `--plan`, the trace's metadata must carry
it: `plan` (the plan document itself) or `plan_path` (a path, relative to the trace's folder).
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from placer.base.errors import SpecError
from placer.base.inputs import SpecErrors, check_output
from placer.calibrate.fit import MEASURED, FitResult, fit_trace, fitted_calibration
from placer.cli import emit_json, note
from placer.cost.calibration import write_calibration
from placer.cost.efficiency import StageReport
from placer.solve.planfile import Plan, check_plan, load_plan
from placer.spec.errorlines import validation_lines
from traces.schema import Trace, read_trace


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE.json", help="Chrome trace (traces/schema.py)")
    p.add_argument("--plan", metavar="PLAN.json",
                   help="the plan the run executed (default: the trace's metadata plan/plan_path)")
    p.add_argument("-o", "--out", metavar="profile.yaml",
                   help="profile to write (YAML, or JSON by suffix; default: TRACE.calibration.yaml)")
    p.add_argument("--min-events", type=int, default=3,
                   help="fewest events of a kind (category on a device type) to fit it (default 3)")
    p.add_argument("--events-only", action="store_true",
                   help="fit the event-level factors only (skip the stage-level fit, which "
                        "simulates the run a few dozen times)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def plan_for(trace: Trace, trace_path: str, plan_path: str | None) -> tuple[Plan, str]:
    """The plan from --plan, else from the trace's metadata; (plan, where it came from)."""
    if plan_path:
        return load_plan(plan_path), plan_path
    meta = trace.metadata
    if isinstance(meta.get("plan"), dict):
        try:
            plan = Plan.model_validate(meta["plan"])
        except ValidationError as e:
            raise SpecErrors(validation_lines(e, f"{trace_path}: metadata.plan.")) from None
        check_plan(plan, plan.resolved(), f"{trace_path}: metadata.plan")
        return plan, "trace metadata (embedded plan)"
    if isinstance(meta.get("plan_path"), str):
        p = Path(meta["plan_path"])
        p = p if p.is_absolute() else Path(trace_path).parent / p
        return load_plan(p), str(p)
    raise SpecError(f"{trace_path}: metadata names no plan (plan or plan_path); pass --plan PLAN.json")


def table(result: FitResult) -> list[str]:
    width = max([18, *(len(f.name) for f in result.factors)])  # the longest factor's name
    lines = [f"  {'device':<12} {'factor':<{width}} {'prior':>10} {'fitted':>10} {'rel RMS':>8} "
             f"{'stderr':>7} {'events':>6}"]
    for f in result.factors:
        # a measured value (the host's cores) is shown as it is, like a fitted one
        fitted = f"{f.value:.4g}" if f.status in ("fitted", MEASURED) else "(prior)"
        rms = f"{f.rel_rms:.1%}" if f.rel_rms is not None else "-"
        se = f"{f.rel_stderr:.1%}" if f.rel_stderr is not None else "-"
        lines.append(f"  {f.device:<12} {f.name:<{width}} {f.prior:>10.4g} {fitted:>10} {rms:>8} "
                     f"{se:>7} {f.events:>6}" + ("" if f.status == "fitted" else f"  {f.status}"))
    if result.tool is not None:
        t = result.tool
        lines.append(f"  tool latency: {t.distribution} from {t.events} events (KS {t.ks:.3f}; "
                     f"mean {t.mean_measured_s:.3g} s measured, {t.mean_fitted_s:.3g} s fitted)")
    return lines


def executed_run(trace: Trace) -> bool:
    """Whether the stage fit applies: an executed run with its steps and stages recorded."""
    cats = {e.cat for e in trace.events}
    return trace.metadata.get("source") == "execute" and {"step", "stage"} <= cats


def stage_table(stages: Mapping[str, StageReport]) -> list[str]:
    """The stage-level factors: which stage each was fitted on, measured vs simulated after."""
    lines = [f"  {'stage factor':<30} {'stage':<8} {'fitted':>10} {'measured s':>11} "
             f"{'simulated s':>11}"]
    lines += [f"  {name:<30} {f.stage:<8} {f.value:>10.4g} {f.measured_s:>11.4f} "
              f"{f.simulated_s:>11.4f}" for name, f in stages.items()]
    return lines if stages else ["  stage factors: none identifiable from this run"]


def run(args: argparse.Namespace) -> int:
    check_output(args.out, "--out")  # before the fit (the default sits beside the trace)
    trace = read_trace(args.trace)
    plan, plan_src = plan_for(trace, args.trace, args.plan)
    result = fit_trace(trace, plan, args.trace, args.min_events)
    out = Path(args.out) if args.out else Path(args.trace).with_suffix(".calibration.yaml")
    provenance = {"trace": str(args.trace), "plan": plan_src,
                  "trace_source": trace.metadata.get("source", "unknown"),
                  "method": "weighted least squares on (cost model at factor 1, measured) pairs, "
                            "relative residuals; see placer/calibrate/fit.py"}
    calib = fitted_calibration(result, plan, provenance)
    staged = not args.events_only and executed_run(trace)
    if staged:
        from workflows.stagefit import stage_calibrate  # lazy: the simulator
        calib = stage_calibrate(plan, trace, calib)
    write_calibration(calib, out)
    if args.json:
        emit_json({"profile": str(out), **calib.to_dict()})
        return 0
    note(f"calibrated from {args.trace} ({sum(result.counts.values())} events; plan: {plan_src})")
    print("\n".join(table(result)))
    for why, n in sorted(result.skipped.items()):
        print(f"  skipped {n} event(s): {why}")
    if staged and calib.fit is not None:
        print("\n".join(stage_table(calib.fit.stages)))
    elif not args.events_only:
        note("stage fit skipped: not an executed run (metadata source "
             f"{trace.metadata.get('source', 'unknown')!r}, or no step and stage events)")
    print(f"wrote {out}")
    return 0
