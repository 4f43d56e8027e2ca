"""`simulate_plan`: the simulator's one entry point (the CLI, the golden tests, the notebooks and
`placer compare --simulate` all call it).

    result = simulate_plan(plan, iterations=3, seed=0)
    result.metrics.iteration_s.p99, result.metrics.why.dominant   # typed: `SimMetrics`
    result.metrics.to_dict()                  # the JSON document (`placer simulate --json`)
    result.trace.write("sim.json")            # Chrome trace, opens in Perfetto

The plan must match its job (the roles it places, pools that exist); a bad plan, workload trace
or config raises `placer.spec.job.SpecError` with one line naming the field.
"""
from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.pricer import AgentPricer, Pricer
from placer.solve.hostmem import plan_checkpoint_s
from placer.solve.planfile import Plan, calibration_of, check_plan, load_plan
from placer.spec.catalog import Resolved
from placer.spec.load import check_tail_policy
from simulator.agents import AgentModel, check_agent_plan
from simulator.config import SimConfig
from simulator.faults import compose, failure_rate_per_s
from simulator.iteration import Model
from simulator.metrics import compute, iteration_durations
from simulator.recorder import Recorder
from simulator.result import SimResult
from simulator.workload import load_replay


def _check_runnable(px: Pricer, plan: Plan) -> None:
    res = px.res
    if isinstance(px, AgentPricer):
        check_agent_plan(px, plan)
        return
    if Role.ROLLOUT not in plan.roles:
        raise SpecError("plan: roles.rollout: a plan must place the rollout role")
    r = plan.roles[Role.ROLLOUT]
    # a role split over pools: each part on the job of its own samples (`simulator.groups`)
    parts = ([(f"roles.rollout.parts.{i}", q.pool, q.devices, q.tp, q.par,
               px.with_samples(q.samples)) for i, q in enumerate(r.parts)]
             or [("roles.rollout", r.pool, r.devices, r.tp, r.par, px)])
    for where, pool, devices, tp, par, part in parts:
        if part.rollout_shape(res.device_of(pool), par).concurrency < 1:
            raise SpecError(f"plan: {where}: {pool} x{devices} tp{tp} has no KV memory "
                            f"for one {res.job.max_context}-token sequence")
    for name, rp in plan.roles.items():
        slot = next(s for s in plan.slots if s.name == rp.slot)
        if rp.devices > slot.devices or slot.pool != rp.pool:
            raise SpecError(f"plan: roles.{name}: {rp.devices} devices of pool {rp.pool} do not "
                            f"fit slot {slot.name} ({slot.devices} of {slot.pool})")


# Sample-turns one simulation may run: each is a few simpy processes and records (~1 kB), so the
# bound keeps a run within a few GB and about a minute; the largest example's default goodput
# run (6 iterations of 32,768 samples) is a fifth of it.
MAX_SAMPLE_TURNS = 1_000_000


def check_size(res: Resolved, iterations: int) -> None:
    """SpecError, before any work, when `iterations` of the job's batch would not fit in memory."""
    job = res.job
    work = iterations * job.batch.samples * job.environment.turns
    if work > MAX_SAMPLE_TURNS:
        raise SpecError(f"--iterations: {iterations} iteration(s) x {job.batch.samples:,} samples x "
                        f"{job.environment.turns} turn(s) = {work:,} sample-turns exceed the "
                        f"{MAX_SAMPLE_TURNS:,} one simulation runs (got {iterations})")


def simulate_plan(plan: Plan | str | Path, iterations: int = 1, seed: int = 0,
                  config: SimConfig | None = None, trace_path: str | Path | None = None,
                  plots_dir: str | Path | None = None, calibration: Calibration | None = None,
                  workload: str | Path | None = None,
                  on_iteration: Callable[[int, int], None] | None = None) -> SimResult:
    """Simulate `iterations` iterations of `plan` (a Plan or a plan file).

    `workload` replays a JSONL workload trace instead of drawing lengths and latencies;
    `trace_path` writes the Chrome trace; `plots_dir` writes the figures (PNG);
    `on_iteration(done, iterations)` is called as each iteration's train step ends (a progress
    bar; `simulate_steady` passes it to every run it makes).
    """
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
    if iterations < 1:
        raise SpecError(f"iterations: must be at least 1 (got {iterations})")
    if seed < 0:  # numpy's seed sequences take non-negative integers only
        raise SpecError(f"--seed: must be >= 0 (got {seed})")
    cfg = config or SimConfig()  # its ranges were checked when it was built
    res = plan.resolved()
    check_plan(plan, res)
    check_tail_policy(res.job, "plan.job")
    calib = calibration if calibration is not None else calibration_of(plan)
    px = Pricer(res, calib)  # this simulation's prices: the engines share its step terms
    _check_runnable(px, plan)
    check_size(res, iterations)
    replay = load_replay(workload, res.job) if workload is not None else None
    rec = Recorder(record_tools=cfg.record_tools)
    # The run allocates hundreds of thousands of long-lived small objects and no cycles worth
    # collecting; pausing the cyclic collector during it saves about a quarter of the time.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        run = (AgentModel(px, plan, cfg, seed, rec, on_iteration).run(iterations)
               if isinstance(px, AgentPricer) else
               Model(px, plan, cfg, seed, rec, replay, on_iteration).run(iterations))
    finally:
        if was_enabled:
            gc.enable()
    durs = iteration_durations(run, plan.pipeline)
    rate = failure_rate_per_s(res, plan, cfg.failures)
    ckpt_s = 0.0
    if rate > 0:  # checkpoints cost wall time only where failures are composed (faults.compose)
        ckpt_s = (cfg.failures.checkpoint_s if cfg.failures.checkpoint_s is not None
                  else plan_checkpoint_s(plan, calib))
    tl = compose(durs, rate, cfg.failures, seed, ckpt_s)
    metrics = compute(res, plan, run, tl, restart_s=cfg.failures.restart_s if tl.failures else 0.0,
                      checkpoint_s=ckpt_s if tl.checkpoints else 0.0, events=len(rec))
    result = SimResult(metrics, run, tl, plan, seed, rec)
    if trace_path is not None:
        result.trace.write(trace_path)
    if plots_dir is not None:
        from simulator.plots import write_plots  # lazy: matplotlib (~0.5 s) only when plots are asked for
        write_plots(result, plots_dir)
    return result
