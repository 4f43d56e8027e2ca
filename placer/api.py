"""The Python API: the CLI's commands as functions, for notebooks and scripts.

    import placer
    job = placer.load_job("examples/grpo-qwen7b-h100.yaml")
    plan = placer.plan(job)                      # placer plan
    sim = placer.simulate(plan, iterations=3)    # placer simulate (sim.metrics: SimMetrics)
    rows = placer.compare(job)                   # placer compare: name -> Plan (None: n/a)
    run = placer.execute(plan, steps=2)          # placer execute (a local Ray on loopback)
    files = placer.export(plan, "verl")          # placer export (an Export: files, warnings)
    job2 = placer.import_run("verl", "run.sh")   # placer import (`import` is a keyword)

Arguments take what the CLI reads (a path) or the object itself (a `Job`, a job dict, a `Plan`);
errors are the CLI's (`placer.base.errors.SpecError`, `Infeasible`). This module is a front end:
`placer/__init__.py` exposes its names lazily, so `import placer` loads neither the solver nor
the simulator nor Ray until one of them is called.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placer.cost.calibration import load_calibration
from placer.cost.efficiency import Calibration
from placer.interop.common import Export
from placer.solve.planfile import Plan, load_plan
from placer.spec.catalog import Resolved, resolve
from placer.spec.job import Job
from placer.spec.load import job_from_dict, load_job

if TYPE_CHECKING:
    from executors.run import ExecResult
    from simulator.result import SimResult

__all__ = ["compare", "execute", "export", "import_run", "load_job", "load_plan", "plan",
           "simulate", "validate"]

JobLike = Job | dict[str, Any] | str | Path
PlanLike = Plan | str | Path


def _job(job: JobLike) -> Job:
    if isinstance(job, Job):
        return job
    if isinstance(job, dict):
        return job_from_dict(job)
    return load_job(job)


def _plan(plan: PlanLike) -> Plan:
    return plan if isinstance(plan, Plan) else load_plan(plan)


def _calib(calibration: Calibration | str | Path | None) -> Calibration:
    if isinstance(calibration, Calibration):
        return calibration
    return load_calibration(calibration)


def validate(job: JobLike) -> Resolved:
    """`placer validate`: the job checked, with its devices and models looked up."""
    return resolve(_job(job))


def plan(job: JobLike, *, time_limit: float = 10.0, objective: str | None = None,
         calibration: Calibration | str | Path | None = None, workers: int = 2,
         seed: int = 0, framework: str | None = None) -> Plan:
    """`placer plan`: every role of a job (a `Job`, a job dict or a job file) placed by the ILP;
    `framework`: plan for that framework in place of the job's (`placer.spec.framework`)."""
    from placer.commands.plan import with_framework
    from placer.cost.pricer import Pricer  # lazy: the cost model loads only when a plan is asked for
    from placer.solve.planner import plan_job

    return plan_job(Pricer(resolve(with_framework(_job(job), framework)), _calib(calibration)),
                    time_limit_s=time_limit, objective=objective, workers=workers, seed=seed)


def compare(job: JobLike, *, time_limit: float = 10.0, objective: str | None = None,
            calibration: Calibration | str | Path | None = None, workers: int = 2,
            seed: int = 0) -> dict[str, Plan | None]:
    """`placer compare`: the ILP's plan ("ilp") and every baseline's by name (None where a
    baseline cannot place the job; "current" when the job records its current placement),
    fastest first."""
    from placer.cost.pricer import Pricer
    from placer.solve.baselines import baseline_assignments
    from placer.solve.planner import build_problem, plan_assignment, plan_job

    res, calib = validate(job), _calib(calibration)
    out: dict[str, Plan | None] = {
        "ilp": plan_job(Pricer(res, calib), time_limit_s=time_limit, objective=objective,
                        workers=workers, seed=seed)}
    problem = build_problem(Pricer(res, calib), objective)
    for name, a in baseline_assignments(problem).items():
        out[name] = None if a is None else plan_assignment(problem, a, name)
    return dict(sorted(out.items(), key=lambda kv: (
        kv[1] is None, kv[1].predicted_iteration_s if kv[1] is not None else 0.0)))


def simulate(plan: PlanLike, *, iterations: int = 1, seed: int = 0, config: Any = None,
             trace: str | Path | None = None, plots: str | Path | None = None,
             calibration: Calibration | str | Path | None = None,
             workload: str | Path | None = None, progress: bool = False) -> SimResult:
    """`placer simulate`: `iterations` simulated iterations; `.metrics` is a `SimMetrics`
    (`.metrics.to_dict()`: the --json document, less its `steady_state`).
    `progress=True` shows a spinner on a terminal (see `placer.progress`)."""
    from placer.progress import progress as bar
    from simulator.api import simulate_plan

    calib = None if calibration is None else _calib(calibration)
    with bar("simulate", json_out=not progress):
        return simulate_plan(_plan(plan), iterations=iterations, seed=seed, config=config,
                             trace_path=trace, plots_dir=plots, calibration=calib,
                             workload=workload)


def execute(plan: PlanLike | Job, *, steps: int = 5, out: str | Path = "out/execute",
            address: str | None = None, backend: str = "torch", progress: bool = False,
            on_step: Callable[[Any], None] | None = None, **options: Any) -> ExecResult:
    """`placer execute`: `steps` RL steps on Ray (an embedded local Ray unless `address`); a job
    is planned first. `on_step` gets each step's figures (`executors.run.StepStat`); `options`
    go to `executors.run.execute` (deadlines, max_restarts, note, on_phase, ...). `progress=True`
    shows the set-up phases, then a bar of the steps, on a terminal."""
    import ray  # lazy: Ray (~1 s) only for a run

    from executors.run import execute as run
    from placer.progress import progress as bar

    p = _planned(plan)
    # The CLI's process ends after a run and takes its embedded Ray with it; a notebook's kernel
    # lives on, and a Ray left running there is killed with the kernel (SIGTERM: Ray's handler
    # prints stack traces). So the Ray this call started, it stops.
    started_here = not ray.is_initialized()
    try:
        with bar("execute", total=steps, unit="step", json_out=not progress, setup=True) as b:
            def step_done(st: Any) -> None:
                b.advance(info=f"reward {st.reward:.3f}")
                if on_step is not None:
                    on_step(st)

            theirs = options.pop("on_phase", None)

            def on_phase(name: str | None) -> None:  # the bar's phase row, and the caller's
                b.phase(name)
                if theirs is not None:
                    theirs(name)

            return run(p, steps, out, address=address, backend=backend, progress=step_done,
                       on_phase=on_phase, **options)
    finally:
        if started_here and ray.is_initialized():
            ray.shutdown()


def _planned(x: PlanLike | Job) -> Plan:
    """A plan, or a job (a Job or a job file, as `placer execute JOB.yaml`) planned first."""
    if isinstance(x, Job) or (not isinstance(x, Plan) and Path(x).suffix in (".yaml", ".yml")):
        return plan(x)
    return _plan(x)


def export(plan: PlanLike, framework: str, **options: Any) -> Export:
    """`placer export`: the plan as a verl, OpenRLHF, NeMo-RL, Miles or KubeRay configuration (not
    written to disk: `Export.files` maps names to text; `Export.warnings` names what does not fit).
    `options`: the target's own (`placer.interop.targets`; kuberay: image, steps)."""
    from placer.interop.targets import target_of
    target = target_of(framework)
    target.check_options(options)
    return target.export(_plan(plan), **options)


def import_run(framework: str, source: str | Path, *, device: str = "H100-SXM",
               name: str | None = None, variables: dict[str, str] | None = None,
               models: dict[str, str] | None = None) -> Job:
    """`placer import`: a job (its `current` placement recorded) from a verl config or launch
    script, an OpenRLHF command line or file, a NeMo-RL recipe or a Miles launch script. The
    assumptions made are in the CLI's notes. `variables`: shell variables the script takes from
    its environment (`--set`); `models`: fine-tuned checkpoints -> the catalog models they were
    tuned from (`--model`)."""
    from placer.interop.importers import with_models
    from placer.interop.targets import importer_of
    target = importer_of(framework)
    text, where = target.read_source(str(source))
    text = with_models(text, models or {})
    data, _notes = target.import_run(text, where, device=device,
                                     name=name or f"imported-{target.name}", variables=variables)
    return job_from_dict(data)
