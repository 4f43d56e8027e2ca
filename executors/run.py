"""Execute a plan: cluster, placement groups, actors, the loop; traces, ledger and a summary.

`execute()` is what `placer execute`, the tests and the benchmark call. With `local=True` the same
loop runs every role in this process (no Ray): the benchmark's baseline.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors import cluster
from executors import placement as pl
from executors.backends import backend_of
from executors.context import Fault, LoopConfig, StepStat
from executors.elastic import Elastic
from executors.loop import Loop
from executors.model import build_policy, save_model_dir, tokenizer_problem
from executors.roles import Delay, RunConfig, actor_layout, plan_settings
from executors.runtime import LocalRuntime, RayRuntime, Runtime
from executors.sandbox import SandboxUnavailable, probe
from executors.sharding import Layout, check_layout
from executors.task import task_of
from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.solve.planfile import Plan
from placer.spec.arch import ModelArch
from traces.schema import Trace

MAX_PARAMS_CPU = 200_000_000  # random-init models are built in RAM on every worker


def _cuda() -> bool:
    return cluster.cuda_devices() > 0


@dataclass
class ExecResult:
    stats: list[StepStat]
    ledger_ok: bool
    ledger_problems: list[str]
    trace: Trace
    placement: list[dict[str, Any]] = field(default_factory=list)
    cluster: str = ""
    emulated: list[str] = field(default_factory=list)
    setup_s: float = 0.0
    out_dir: str = ""
    ledger: Any = None
    recoveries: list[dict[str, Any]] = field(default_factory=list)  # re-plans after node changes
    stragglers: list[dict[str, Any]] = field(default_factory=list)  # re-issued slow calls

    def summary(self) -> dict[str, Any]:
        return {"steps": [{"step": s.step, "reward": round(s.reward, 4), "exact": s.exact,
                           "step_s": round(s.step_s, 4), "loss": round(s.loss, 5),
                           "role_s": {k: round(v, 4) for k, v in s.role_s.items()},
                           "policy_versions": s.versions, "reruns": s.reruns}
                          for s in self.stats],
                "ledger_balanced": self.ledger_ok, "ledger_problems": self.ledger_problems,
                "cluster": self.cluster, "emulated_pools": self.emulated,
                "setup_s": round(self.setup_s, 2), "out_dir": self.out_dir,
                "placement": self.placement, "recoveries": self.recoveries,
                "stragglers": self.stragglers}


def run_config(plan: Plan, lr: float | None = None, model_dir: str = "",
               delays: tuple[Delay, ...] = ()) -> RunConfig:
    res = plan.resolved()
    job = res.job
    reward = res.model_of("reward")
    cfg = RunConfig(algorithm=job.algorithm.value, arch=policy_arch(plan).model_dump(),
                    model_dir=model_dir, seed=job.seed,
                    max_new_tokens=int(job.lengths.response.max_value()),
                    reward_arch=reward.model_dump() if reward is not None else None,
                    delays=tuple(delays), mini_batches=job.batch.mini_batches,
                    data=job.data.model_dump() if job.data is not None else None,
                    **plan_settings(plan))
    return cfg if lr is None else dataclasses.replace(cfg, lr=lr)


def check_layouts(plan: Plan, arch: ModelArch, backend: str = "torch") -> None:
    """SpecError (exit 2) before any actor starts when the trainer's layout, or the layout of
    a rollout engine (each part's, for a rollout split over pools), cannot be run."""
    check_layout(str(Role.ACTOR), Layout(*actor_layout(plan)), arch.heads, arch.kv_heads,
                 arch.mlp, layers=arch.layers, tied=arch.tie_embeddings)
    r = plan.roles.get(Role.ROLLOUT)
    if r is None:
        return
    engines = [(f"plan.roles.{Role.ROLLOUT}.parts.{i} (pool {p.pool})", Layout(p.dp, p.tp, p.pp))
               for i, p in enumerate(r.parts)] or [(f"plan.roles.{Role.ROLLOUT}",
                                                    Layout(r.dp, r.tp, r.pp))]
    for where, lay in engines:
        why = backend_of(backend).layout_problem(lay, arch)
        if why:
            raise SpecError(f"{where}: layout {lay}: {why}")
    if r.parts:
        try:
            pl.part_bundles(plan, Role.ROLLOUT)
        except pl.PlacementError as e:
            raise SpecError(f"plan: {e}") from None


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


def check_data(plan: Plan) -> None:
    """SpecError (exit 2) before any actor starts when the job's dataset cannot be used: a
    missing or unreadable file, a missing column, a null cell, tests that do not parse. Reads
    every row (the loop's task then finds them cached)."""
    data = plan.resolved().job.data
    if data is not None:
        task_of(data.model_dump())


def policy_arch(plan: Plan) -> ModelArch:
    """The policy's architecture (the reward model's is checked too), as the executor builds it."""
    res = plan.resolved()
    arch = res.model_of("actor")
    if arch is None:  # every job has a policy; a plan without one is not this project's
        raise SpecError("plan.job.models.policy: missing (the executor needs a policy model)")
    paths = res.job.models.paths
    if "policy" not in paths:  # a checkpoint folder is loaded with its own model class
        _check_buildable(arch, "policy")
    elif (why := tokenizer_problem(paths["policy"], arch.vocab)) is not None:
        raise SpecError(f"plan.job.models.paths.policy: {paths['policy']!r}: {why}")
    reward = res.model_of("reward")
    if reward is not None and "reward" not in paths:
        _check_buildable(reward, "reward")
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


def prepare_model(plan: Plan, out_dir: Path) -> str:
    """Version 0 of the policy, written once: every worker loads the same weights from it.

    It is built in a temporary folder and renamed into place, and `MODEL_STAMP` (written last)
    records the architecture, the seed and every file's size: a `model-v0` without it (a run
    killed while writing it), with a file missing or cut short, or built for another job is
    rebuilt, so a later run into the same `--out` never loads it."""
    res = plan.resolved()
    if "policy" in res.job.models.paths:  # the job's own checkpoint is version 0 as it is
        return res.job.models.paths["policy"]
    arch = res.model_of("actor")
    path = out_dir / "model-v0"
    if arch is None:  # every job trains a policy; a plan without one was not made by the planner
        raise SpecError("plan.job.models.policy: the plan's job names no policy model")
    stamp = {"arch": arch.model_dump(mode="json"), "seed": res.job.seed}
    try:
        have = json.loads((path / MODEL_STAMP).read_text())
        if ({k: have.get(k) for k in stamp} == stamp and have["files"]
                and all((path / f).stat().st_size == n for f, n in have["files"].items())):
            return str(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # missing, unreadable or half-written: rebuild
    tmp = Path(tempfile.mkdtemp(prefix=".model-v0.", dir=out_dir))
    try:
        save_model_dir(build_policy(arch, res.job.seed), arch, tmp)
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
            backend: str = "torch", local: bool = False, faults: list[Fault] | None = None,
            progress: Callable[[StepStat], None] | None = None, max_restarts: int = 3,
            lr: float | None = None, checkpoint_every: int = 1,
            note: Callable[[str], None] | None = None,
            deadlines: dict[str, float] | None = None, delays: list[Delay] | None = None,
            on_step: Callable[[int], None] | None = None, start: int = 0,
            unsafe_sandbox: bool = False) -> ExecResult:
    """Run `steps` RL steps of `plan` (from step `start`: a resumed run, see `resume_point`).

    deadlines  per-call deadlines in seconds for `rollout` and `environment` calls: a call still
               running then is re-issued to another worker of the role and the first result wins
               (a `reissue` tail policy sets the environment's from `deadline_s`);
    delays     test-only: make a worker's n-th call slow (`executors.roles.Delay`);
    on_step    called at every step boundary with the next step (tests change the cluster there).
    """
    backend_of(backend)  # SpecError (exit 2) for an unknown one
    if steps < 1:
        raise SpecError(f"--steps: must be at least 1 (got {steps})")
    arch = policy_arch(plan)  # the plan's own checks first, then the machine's
    if not local:  # one process trains the whole batch locally: no layout to refuse
        check_layouts(plan, arch, backend)
    check_sandbox(unsafe_sandbox)
    check_data(plan)
    if arch.params() > MAX_PARAMS_CPU and not _cuda():
        raise SpecError(f"plan.job.models.policy: {arch.name} has {arch.params() / 1e9:.2f}B "
                        f"parameters; without CUDA the executor runs models up to "
                        f"{MAX_PARAMS_CPU / 1e6:.0f}M (use a tiny model, or run on GPUs)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = plan.resolved()
    job = res.job
    cfg = run_config(plan, lr, prepare_model(plan, out), tuple(delays or ()))
    if unsafe_sandbox:
        cfg = dataclasses.replace(cfg, unsafe_sandbox=True)
    trace = Trace(metadata={"source": "execute", "job": job.name, "seed": job.seed,
                            "algorithm": job.algorithm.value, "mode": job.pipeline.mode,
                            "backend": backend, "runtime": "local" if local else "ray",
                            "predicted_iteration_s": plan.predicted_iteration_s})
    placement: list[dict[str, Any]] = []
    rt: Runtime
    elastic: Elastic | None = None
    if local:
        rt = LocalRuntime(plan, cfg, backend)
        info_text, emulated = "local (one process, no Ray)", []
    else:
        info = cluster.start(plan, address)
        emulated = info.emulated
        info_text = info.describe()
        if note:
            note(f"cluster: {info_text}")
        groups = pl.create_groups(plan, info.pinned)
        rt = RayRuntime(plan, cfg, groups, info.pinned, backend, max_restarts)
        placement = pl.verify(plan, rt.members, groups)
        pl.check(placement, info.pinned)
        elastic = Elastic(plan, cfg, groups, rt, info.pinned, backend, max_restarts, placement=placement)
    trace.metadata.update(emulated_pools=emulated, cluster=info_text)
    if address is None:  # embedded: every emulated device's work runs on this host's cores,
        # which calibration reads as the emulated devices' `host_cores` (placer/calibrate/fit.py)
        trace.metadata["host_cores"] = len(os.sched_getaffinity(0))
    setup_s = time.time() - t0
    lc = LoopConfig(steps=steps, out_dir=out, mode=job.pipeline.mode,
                    max_staleness=job.pipeline.max_staleness, checkpoint_every=checkpoint_every,
                    faults=list(faults or []), retries=max(max_restarts, 1),
                    deadlines={**tail_deadlines(job), **(deadlines or {})}, start=start)
    loop = Loop(plan, rt, cfg, lc, trace, progress, elastic=elastic, note=note, on_step=on_step)
    try:
        stats = loop.run()
    finally:
        if elastic is not None:
            elastic.close()  # the current actors and groups (a rebuild replaced the first ones)
            placement = elastic.placement
        else:
            rt.close()
    problems = loop.ledger.problems(steps, first=start)
    return ExecResult(stats, not problems, problems, trace, placement, info_text, emulated,
                      setup_s, str(out), loop.ledger, loop.recoveries, loop.stragglers)


def resume_point(out_dir: str | Path, steps: int) -> int:
    """The step a run resumed in `out_dir` starts at: the one after its last checkpoint
    (`checkpoints/latest.json`, written after the files it names). SpecError, before anything
    starts, when there is no complete checkpoint or the run already reached `steps`."""
    d = Path(out_dir) / "checkpoints"
    try:
        latest = json.loads((d / "latest.json").read_text())
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
        if f is not None and not (isinstance(f, str) and Path(f).is_file()):
            raise SpecError(f"--resume: the checkpoint of step {step} names a missing file "
                            f"(got {f!r:.120})")
    if step + 1 >= steps:
        raise SpecError(f"--steps: the run in {str(out_dir)!r} already finished step {step}; "
                        f"give more than {step + 1} steps to continue it (got {steps})")
    return step + 1


def tail_deadlines(job: Any) -> dict[str, float]:
    """A `reissue` tail policy re-issues environment calls slower than its `deadline_s`."""
    deadline_s = job.tail_policy.mechanism.tool_deadline_s
    return {"environment": deadline_s} if deadline_s else {}
