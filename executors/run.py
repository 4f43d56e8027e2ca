"""Execute a plan: cluster, placement groups, actors, the loop; traces, ledger and a summary.

`execute()` is what `placer execute`, the tests and the benchmark call. It resolves the plan once
into its run plan (`executors.runplan`) and hands each part its piece: the checks here read the
job's facts and the roles' layouts, the cluster and placement the pools, slots and seats, the
runtime the seats and engine groups, the loop the job. Only `executors.elastic` keeps the `Plan`
(a re-plan starts from it). With `local=True` the same loop runs every role in this process (no
Ray): the benchmark's baseline.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors import cluster
from executors.backends import DEFAULT_BACKEND, Backend, backend_of
from executors.ckptindex import read_latest
from executors.context import Fault, LoopConfig, StepStat
from executors.ledger import Ledger
from executors.loop import Loop
from executors.model import save_model_dir, tokenizer_problem
from executors.roles import Delay, run_config
from executors.runplan import JobFacts, RunPlan, resolve_plan
from executors.sandbox import SandboxUnavailable, probe
from executors.sharding import check_layout
from executors.task import task_of
from executors.vlm import build_model, vision_problem
from executors.world import World
from placer.base.errors import SpecError
from placer.base.phases import PhaseClock, PhaseListener
from placer.base.roles import Role
from placer.solve.planfile import Plan
from placer.spec.arch import ModelArch
from placer.spec.tailpolicy import TailPolicy
from traces.schema import Trace

MAX_PARAMS_CPU = 200_000_000  # random-init models are built in RAM on every worker
# Samples x turns of one executed step: each is a live sequence in a worker's memory, so a batch
# beyond this would not fit in a worker (the largest example has 32,768 samples).
MAX_STEP_SAMPLE_TURNS = 65_536


def _cuda() -> bool:
    return cluster.cuda_devices() > 0


@dataclass
class ExecResult:
    stats: list[StepStat]
    ledger_ok: bool
    ledger_problems: list[str]
    trace: Trace
    ledger: Ledger  # every sample's record: planned, generated, trained, dropped, rolled back
    placement: list[dict[str, Any]] = field(default_factory=list)
    cluster: str = ""
    emulated: list[str] = field(default_factory=list)
    setup_s: float = 0.0  # from the call to the first step: the sum of `setup_phases`
    out_dir: str = ""
    recoveries: list[dict[str, object]] = field(default_factory=list)  # re-plans after node loss
    stragglers: list[dict[str, object]] = field(default_factory=list)  # re-issued slow calls
    setup_phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, s), in order

    def summary(self) -> dict[str, Any]:
        """The --json document. Per step and role: `role_wall_s`, the wall time within the step
        the role had a call running (never above `step_s`), `role_rank_s`, its calls'
        seconds summed over its ranks (two trainer ranks busy 1 s: wall 1 s, rank-s 2 s), and
        `role_device_s`, those times the devices each rank holds (an engine replica of TP 2
        busy 1 s: 2 device-s); `rl`, the step's RL statistics (`executors.loop.rl_stats`)."""
        return {"steps": [{"step": s.step, "reward": round(s.reward, 4), "exact": s.exact,
                           "step_s": round(s.step_s, 4), "loss": round(s.loss, 5),
                           "role_wall_s": {k: round(v, 4) for k, v in s.role_wall_s.items()},
                           "role_rank_s": {k: round(v, 4) for k, v in s.role_rank_s.items()},
                           "role_device_s": {k: round(v, 4)
                                             for k, v in s.role_device_s.items()},
                           "policy_versions": s.versions, "reruns": s.reruns,
                           "rl": {k: round(v, 6) for k, v in s.rl.items()}}
                          for s in self.stats],
                "mean_per_step": self.means(),
                "ledger_balanced": self.ledger_ok, "ledger_problems": self.ledger_problems,
                "cluster": self.cluster, "emulated_pools": self.emulated,
                "setup_s": round(self.setup_s, 2),
                "setup_phases": [{"phase": p, "s": round(t, 2)} for p, t in self.setup_phases],
                "out_dir": self.out_dir,
                "placement": self.placement, "recoveries": self.recoveries,
                "stragglers": self.stragglers}

    def means(self) -> dict[str, Any]:
        """The steps' means: step time, and per role its wall time, rank- and device-seconds per step
        (a step the role had no call in counts as 0)."""
        n = len(self.stats) or 1

        def mean(key: str) -> dict[str, float]:
            roles = sorted({r for s in self.stats for r in getattr(s, key)})
            return {r: round(sum(getattr(s, key).get(r, 0.0) for s in self.stats) / n, 4)
                    for r in roles}
        return {"step_s": round(sum(s.step_s for s in self.stats) / n, 4),
                "role_wall_s": mean("role_wall_s"), "role_rank_s": mean("role_rank_s"),
                "role_device_s": mean("role_device_s")}


def check_layouts(run: RunPlan, backend: Backend) -> None:
    """SpecError (exit 2) before any actor starts when the trainer's layout, or the layout of
    a rollout engine (each part's, for a rollout split over pools), cannot be run."""
    arch = run.job.policy
    actor = run.roles[Role.ACTOR]
    if actor.ep > 1 and actor.etp > 1:  # the executor's experts are never TP-split under EP
        raise SpecError(f"plan.roles.{Role.ACTOR}.etp: the executor runs expert parallelism "
                        f"with expert TP 1 only (got ep {actor.ep}, etp {actor.etp}); plan "
                        "with etp 1, or run the plan on a framework target (placer export)")
    trainer = dataclasses.replace(actor.layout, recompute=False)
    check_layout(str(Role.ACTOR), trainer, arch.heads, arch.kv_heads, arch.mlp,
                 layers=arch.layers, tied=arch.tie_embeddings, experts=arch.experts,
                 vocab=arch.vocab)
    r = run.roles.get(Role.ROLLOUT)
    if r is None:
        return
    engines = [(f"plan.roles.{Role.ROLLOUT}.parts.{p.index} (pool {p.pool})", p.layout)
               for p in r.parts] or [(f"plan.roles.{Role.ROLLOUT}", r.layout.degrees)]
    for where, lay in engines:
        why = backend.layout_problem(lay, arch)
        if why:
            raise SpecError(f"{where}: layout {lay}: {why}")


def check_batch(job: JobFacts) -> None:
    """SpecError, before Ray starts, when one step's batch would not fit in a worker."""
    work = job.samples * job.turns
    if work > MAX_STEP_SAMPLE_TURNS:
        raise SpecError(f"plan.job.batch: {job.samples:,} samples x {job.turns} turn(s) per "
                        f"step exceed the {MAX_STEP_SAMPLE_TURNS:,} the executor holds in memory "
                        f"(got {work:,})")


def check_sandbox(unsafe: bool) -> None:
    """Every run executes generated answers (the verifier, tool calls): refuse to start one
    where the sandbox cannot isolate them, before any actor exists, unless the user opted out."""
    try:
        probe(allow_weak=True if unsafe else None)
    except SandboxUnavailable as e:
        raise SpecError(f"{e} (or pass --unsafe-sandbox)") from None
    if unsafe:
        print("WARNING: --unsafe-sandbox: generated code may run without kernel isolation",
              file=sys.stderr, flush=True)


def check_data(job: JobFacts) -> None:
    """SpecError (exit 2) before any actor starts when the job's dataset cannot be used: a
    missing or unreadable file, a missing column, a null cell, tests that do not parse. Reads
    every row (the loop's task then finds them cached)."""
    if job.data is not None:
        task_of(job.data.model_dump())


def policy_arch(job: JobFacts) -> ModelArch:
    """The policy's architecture (the reward model's is checked too), as the executor builds it."""
    arch, paths = job.policy, job.paths
    if "policy" not in paths:  # a checkpoint folder is loaded with its own model class
        _check_buildable(arch, "policy")
    elif (why := tokenizer_problem(paths["policy"], arch.vocab)) is not None:
        raise SpecError(f"plan.job.models.paths.policy: {paths['policy']!r}: {why}")
    if job.reward is not None and "reward" not in paths:
        _check_buildable(job.reward, "reward")
    return arch


def _check_buildable(arch: ModelArch, field: str) -> None:
    """Workers build Llama-shaped models (GQA attention, SwiGLU MLP) from the architecture's
    numbers; a mixture of experts, latent attention or per-head q/k norms would silently become
    another model, so they are refused before any actor starts."""
    unsupported = [name for name, on in (("a mixture of experts", arch.experts > 0),
                                         ("latent attention (MLA)", arch.mla),
                                         ("q/k norm", arch.qk_norm)) if on]
    if unsupported:
        raise SpecError(f"plan.job.models.{field}: {arch.name} uses {', '.join(unsupported)}; the "
                        f"executor builds Llama-shaped models only (GQA attention, SwiGLU MLP): "
                        f"plan and simulate it, or execute a Llama-shaped model")


MODEL_STAMP = "placer-model.json"  # what model-v0 was built from; written last


def prepare_model(job: JobFacts, out_dir: Path) -> str:
    """Version 0 of the policy, written once: every worker loads the same weights from it.

    It is built in a temporary folder and renamed into place, and `MODEL_STAMP` (written last)
    records the architecture, the seed and every file's size: a `model-v0` without it (a run
    killed while writing it), with a file missing or cut short, or built for another job is
    rebuilt, so a later run into the same `--out` never loads it."""
    if "policy" in job.paths:  # the job's own checkpoint is version 0 as it is
        return job.paths["policy"]
    arch = job.policy
    path = out_dir / "model-v0"
    stamp = {"arch": arch.model_dump(mode="json"), "seed": job.seed}
    try:
        have = json.loads((path / MODEL_STAMP).read_text())
        if ({k: have.get(k) for k in stamp} == stamp and have["files"]
                and all((path / f).stat().st_size == n for f, n in have["files"].items())):
            return str(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # missing, unreadable or half-written: rebuild
    tmp = Path(tempfile.mkdtemp(prefix=".model-v0.", dir=out_dir))
    try:
        save_model_dir(build_model(arch, job.seed), arch, tmp)
        files = {f.name: f.stat().st_size for f in tmp.iterdir() if f.is_file()}
        (tmp / MODEL_STAMP).write_text(json.dumps({**stamp, "files": files}))
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(path)


def execute(plan: Plan, steps: int, out_dir: str | Path, *, address: str | None = None,
            backend: str = DEFAULT_BACKEND, local: bool = False,
            faults: list[Fault] | None = None,
            progress: Callable[[StepStat], None] | None = None, max_restarts: int = 3,
            lr: float | None = None, checkpoint_every: int = 1,
            note: Callable[[str], None] | None = None,
            deadlines: dict[str, float] | None = None, delays: list[Delay] | None = None,
            on_step: Callable[[int], None] | None = None, start: int = 0,
            unsafe_sandbox: bool = False, on_phase: PhaseListener | None = None) -> ExecResult:
    """Run `steps` RL steps of `plan` (from step `start`: a resumed run, see `resume_point`).

    deadlines  per-call deadlines in seconds for `rollout` and `environment` calls: a call still
               running then is re-issued to another worker of the role and the first result wins
               (a `reissue` tail policy sets the environment's from `deadline_s`);
    delays     test-only: make a worker's n-th call slow (`executors.roles.Delay`);
    on_step    called at every step boundary with the next step (tests change the cluster there);
    on_phase   told each set-up phase as it begins (checking the plan, starting Ray, placing
               actors, loading models, ...) and None when the first step begins
               (`placer.base.phases`); the result's `setup_phases` times them.
    """
    chosen = backend_of(backend)  # SpecError (exit 2) for an unknown one
    if steps < 1:
        raise SpecError(f"--steps: must be at least 1 (got {steps})")
    clock = PhaseClock(on_phase)
    clock.begin("checking the plan")
    if plan.resolved().job.agents is not None:  # several policies: `executors.agentrun`
        if local or faults or delays or deadlines or start or unsafe_sandbox:
            raise SpecError("a multi-agent plan executes on Ray, from step 0, without fault "
                            "injection, deadlines or the sandbox (drop --local, --resume, "
                            "--deadline, --unsafe-sandbox)")
        try:
            return _execute_agents(plan, steps, Path(out_dir), chosen, address, lr, progress,
                                   note, clock)
        finally:
            clock.end()
    run = resolve_plan(plan)  # the one resolve: every part below takes its piece of `run`
    preflight(run, chosen, local, unsafe_sandbox)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    job = run.job
    clock.begin("preparing the initial model")
    cfg = run_config(run, lr, prepare_model(job, out), tuple(delays or ()))
    if unsafe_sandbox:
        cfg = dataclasses.replace(cfg, unsafe_sandbox=True)
    trace = Trace(metadata={"source": "execute", "job": job.name, "seed": job.seed,
                            "algorithm": job.algorithm, "mode": job.mode,
                            "backend": chosen.name, "runtime": "local" if local else "ray",
                            "predicted_iteration_s": run.predicted_iteration_s})
    world = World.local(run, cfg, chosen, clock) if local else World.ray(
        plan, run, cfg, chosen, address, max_restarts, note, clock)
    trace.metadata.update(emulated_pools=world.emulated, cluster=world.described)
    if address is None:  # embedded: every emulated device's work runs on this host's cores,
        # which calibration reads as the emulated devices' `host_cores` (placer/calibrate/fit.py)
        trace.metadata["host_cores"] = len(os.sched_getaffinity(0))
    lc = LoopConfig(steps=steps, out_dir=out, mode=job.mode, max_staleness=job.max_staleness,
                    checkpoint_every=checkpoint_every, faults=list(faults or []),
                    retries=max(max_restarts, 1), start=start,
                    deadlines={**tail_deadlines(job.tail_policy), **(deadlines or {})})
    loop = Loop(run, world.rt, cfg, lc, trace, progress, elastic=world.elastic, note=note,
                on_step=on_step, phases=clock)
    try:
        stats = loop.run()  # ends the clock's set-up phases when its first step begins
    finally:
        clock.end()  # a run that failed in its set-up: the phase it failed in is timed too
        placement = world.close()
    problems = loop.ledger.problems(steps, first=start)
    return ExecResult(stats, not problems, problems, trace, loop.ledger, placement,
                      world.described, world.emulated, clock.total_s(), str(out), loop.recoveries,
                      loop.stragglers, clock.spans)


def _execute_agents(plan: Plan, steps: int, out: Path, backend: Backend, address: str | None,
                    lr: float | None, progress: Callable[[StepStat], None] | None,
                    note: Callable[[str], None] | None, clock: PhaseClock) -> ExecResult:
    """A multi-agent plan (`executors.agentrun`): refused, one line, when it asks for what
    that driver does not run; each agent's policy checked as a single policy's is."""
    from executors.agentrun import agent_problem, run_agents  # lazy: multi-agent runs only
    run = resolve_plan(plan, agents=True)
    res = plan.resolved()
    if (why := agent_problem(res, run)) is not None:
        raise SpecError(why)
    check_batch(run.job)
    for role in run.roles:
        arch = res.model_of(role)
        if arch is not None:
            _check_buildable(arch, f"{role} policy")
            if arch.params() > MAX_PARAMS_CPU and not _cuda():
                raise SpecError(f"plan.roles.{role}: {arch.name} has {arch.params() / 1e9:.2f}B "
                                f"parameters; without CUDA the executor runs models up to "
                                f"{MAX_PARAMS_CPU / 1e6:.0f}M")
    out.mkdir(parents=True, exist_ok=True)
    job = run.job
    trace = Trace(metadata={"source": "execute", "job": job.name, "seed": job.seed,
                            "algorithm": job.algorithm, "mode": job.mode,
                            "backend": backend.name, "runtime": "ray", "agents": True,
                            "predicted_iteration_s": run.predicted_iteration_s})
    loop, stats, placement, described, emulated = run_agents(
        run, res, out, backend, address, lr, steps, trace, prepare_model, clock, progress, note)
    problems = loop.ledger.problems(steps)
    loop.ledger.write(out / "ledger.json")
    return ExecResult(stats, not problems, problems, trace, loop.ledger, placement, described,
                      emulated, clock.total_s(), str(out), setup_phases=clock.spans)


def preflight(run: RunPlan, backend: Backend, local: bool, unsafe_sandbox: bool) -> None:
    """Every check that needs no actor: the plan's own first, then the machine's."""
    arch = policy_arch(run.job)
    if not local:  # one process trains the whole batch locally: no layout to refuse
        check_layouts(run, backend)
    if (why := vision_problem(run, backend)) is not None:
        raise SpecError(why)
    check_batch(run.job)
    check_sandbox(unsafe_sandbox)
    check_data(run.job)
    if arch.params() > MAX_PARAMS_CPU and not _cuda():
        raise SpecError(f"plan.job.models.policy: {arch.name} has {arch.params() / 1e9:.2f}B "
                        f"parameters; without CUDA the executor runs models up to "
                        f"{MAX_PARAMS_CPU / 1e6:.0f}M (use a tiny model, or run on GPUs)")


def resume_point(out_dir: str | Path, steps: int, plan: Plan | None = None) -> int:
    """The step a run resumed in `out_dir` starts at: the one after its last checkpoint
    (`checkpoints/latest.json`, written after the files it names). SpecError, before anything
    starts, when there is no complete checkpoint, the run already reached `steps`, or `plan`
    is a multi-agent one (its driver writes each agent's weights after the last step only,
    `executors.agentrun`: nothing to resume from)."""
    if plan is not None and plan.resolved().job.agents is not None:
        raise SpecError("--resume: a multi-agent plan (job.agents) keeps no per-step "
                        "checkpoint to resume from (each agent's OUT/AGENT/final.pt is written "
                        "after its last step only): run it again without --resume")
    d = Path(out_dir) / "checkpoints"
    try:
        latest = read_latest(out_dir)
        step = latest["step"]
        files = [latest["actor"], latest.get("critic"), latest.get("carry")]
    except FileNotFoundError:
        raise SpecError(f"--resume: no checkpoint in {str(out_dir)!r} (no "
                        "checkpoints/latest.json): run without --resume") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SpecError(f"--resume: {str(d / 'latest.json')!r} is unreadable or incomplete "
                        f"({type(e).__name__})") from None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise SpecError(f"--resume: {str(d / 'latest.json')!r}: step must be a whole number >= 0 "
                        f"(got {step!r:.40})")
    for f in files:
        # a file, or a sharded trainer's folder of rank files (`executors.shardckpt`)
        if f is not None and not (isinstance(f, str) and (
                Path(f).is_file() or (Path(f) / "rank-00000.pt").is_file())):
            raise SpecError(f"--resume: the checkpoint of step {step} names a missing file "
                            f"(got {f!r:.120})")
    if step + 1 >= steps:
        raise SpecError(f"--steps: the run in {str(out_dir)!r} already finished step {step}; "
                        f"give more than {step + 1} steps to continue it (got {steps})")
    return step + 1


def tail_deadlines(tp: TailPolicy) -> dict[str, float]:
    """A `reissue` tail policy re-issues environment calls slower than its `deadline_s`."""
    deadline_s = tp.mechanism.tool_deadline_s
    return {"environment": deadline_s} if deadline_s else {}
