"""Execute a plan: cluster, placement groups, actors, the loop; traces, ledger and a summary.

`execute()` is what `placer execute`, the tests and the benchmark call. With `local=True` the same
loop runs every role in this process (no Ray): the benchmark's baseline.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from executors.loop import Fault, Loop, LoopConfig, StepStat
from executors.roles import Delay, RunConfig
from placer.plan import Plan
from placer.spec import SpecError
from traces.schema import Trace

BACKENDS = ("torch", "vllm")
MAX_PARAMS_CPU = 200_000_000  # random-init models are built in RAM on every worker


def _cuda() -> bool:
    from executors.cluster import cuda_devices  # noqa: PLC0415
    return cuda_devices() > 0


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


def run_config(plan: Plan, backend: str = "torch", lr: float | None = None,
               model_dir: str = "", delays: tuple = ()) -> RunConfig:
    res = plan.resolved()
    job = res.job
    reward = res.model_of("reward")
    return RunConfig(algorithm=job.algorithm.value, arch=res.model_of("actor").model_dump(),
                     model_dir=model_dir, seed=job.seed,
                     max_new_tokens=int(job.lengths.response.max_value()),
                     **({"lr": lr} if lr is not None else {}),
                     reward_arch=reward.model_dump() if reward is not None else None,
                     delays=tuple(delays))


def prepare_model(plan: Plan, out_dir: Path) -> str:
    """Version 0 of the policy, written once: every worker loads the same weights from it."""
    from executors.model import build_policy, save_model_dir  # noqa: PLC0415
    res = plan.resolved()
    arch = res.model_of("actor")
    path = out_dir / "model-v0"
    if not (path / "config.json").is_file():
        save_model_dir(build_policy(arch, res.job.seed), arch, path)
    return str(path)


def execute(plan: Plan, steps: int, out_dir: str | Path, *, address: str | None = None,
            backend: str = "torch", local: bool = False, faults: list[Fault] | None = None,
            progress: Callable[[StepStat], None] | None = None, max_restarts: int = 3,
            lr: float | None = None, checkpoint_every: int = 1,
            note: Callable[[str], None] | None = None,
            deadlines: dict[str, float] | None = None, delays: list[Delay] | None = None,
            on_step: Callable[[int], None] | None = None) -> ExecResult:
    """Run `steps` RL steps of `plan`.

    deadlines  per-call deadlines in seconds for `rollout` and `environment` calls: a call still
               running then is re-issued to another worker of the role and the first result wins
               (a `reissue` tail policy sets the environment's from `deadline_s`);
    delays     test-only: make a worker's n-th call slow (`executors.roles.Delay`);
    on_step    called at every step boundary with the next step (tests change the cluster there).
    """
    if backend not in BACKENDS:
        raise SpecError(f"--backend: unknown backend {backend!r} (expected torch or vllm)")
    if steps < 1:
        raise SpecError(f"--steps: must be at least 1 (got {steps})")
    arch = plan.resolved().model_of("actor")
    if arch.params() > MAX_PARAMS_CPU and not _cuda():
        raise SpecError(f"plan.job.models.policy: {arch.name} has {arch.params() / 1e9:.2f}B "
                        f"parameters; without CUDA the executor runs models up to "
                        f"{MAX_PARAMS_CPU / 1e6:.0f}M (use a tiny model, or run on GPUs)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = plan.resolved()
    job = res.job
    cfg = run_config(plan, backend, lr, prepare_model(plan, out), tuple(delays or ()))
    trace = Trace(metadata={"source": "execute", "job": job.name, "seed": job.seed,
                            "algorithm": job.algorithm.value, "mode": job.pipeline.mode,
                            "backend": backend, "runtime": "local" if local else "ray",
                            "predicted_iteration_s": plan.predicted_iteration_s})
    placement: list[dict[str, Any]] = []
    elastic = None
    if local:
        from executors.runtime import LocalRuntime  # noqa: PLC0415
        rt = LocalRuntime(plan, cfg, backend)
        info_text, emulated = "local (one process, no Ray)", []
    else:
        from executors import cluster, placement as pl  # noqa: PLC0415
        from executors.runtime import RayRuntime  # noqa: PLC0415
        info = cluster.start(plan, address)
        emulated = info.emulated
        info_text = info.describe()
        if note:
            note(f"cluster: {info_text}")
        groups = pl.create_groups(plan, info.pinned)
        rt = RayRuntime(plan, cfg, groups, info.pinned, backend, max_restarts)
        placement = pl.verify(plan, rt.members, groups)
        pl.check(placement, info.pinned)
        from executors.elastic import Elastic  # noqa: PLC0415
        elastic = Elastic(plan, cfg, groups, rt, info.pinned, backend, max_restarts, placement=placement)
    trace.metadata.update(emulated_pools=emulated, cluster=info_text)
    setup_s = time.time() - t0
    lc = LoopConfig(steps=steps, out_dir=out, mode=job.pipeline.mode,
                    max_staleness=job.pipeline.max_staleness, checkpoint_every=checkpoint_every,
                    faults=list(faults or []), retries=max(max_restarts, 1),
                    deadlines={**tail_deadlines(job), **(deadlines or {})})
    loop = Loop(plan, rt, cfg, lc, trace, progress, elastic=elastic, note=note, on_step=on_step)
    try:
        stats = loop.run()
    finally:
        if elastic is not None:
            elastic.close()  # the current actors and groups (a rebuild replaced the first ones)
            placement = elastic.placement
        else:
            rt.close()
    problems = loop.ledger.problems(steps)
    return ExecResult(stats, not problems, problems, trace, placement, info_text, emulated,
                      setup_s, str(out), loop.ledger, loop.recoveries, loop.stragglers)


def tail_deadlines(job: Any) -> dict[str, float]:
    """A `reissue` tail policy re-issues environment calls slower than its `deadline_s`."""
    tp = job.tail_policy
    return {"environment": tp.deadline_s} if tp.kind == "reissue" and tp.deadline_s else {}
