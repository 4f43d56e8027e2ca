"""Role workers: plain classes that Ray wraps as actors (and the one-process baseline uses as is).

  RuleReward   the verifier: scores the sandbox's result of each answer (`executors.task`).
  EnvWorker    environment worker: runs answers as untrusted code in the sandbox.

What every worker shares is here too: `RunConfig` (the same object goes to every actor) and
`Worker`. This module does not import torch, so that the rule reward's and the environment's
actor processes start without it (about 2 s of CPU each); `Worker` sets torch's threads only in
the workers that hold a model: the trainer (`executors.trainer`), the rollout, reference, model
reward and critic (`executors.modelroles`), the engines and the judge.

Every method that does work returns `(result, timing)` where timing is `{"t0": wall-clock start,
"dur": seconds, ...}`, so that the driver writes trace events with the worker's own times.
Weights reach rollout engines over the weight-sync group (`executors.syncgroup`) under Ray, and
as call arguments in one process.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from executors.codec import Codec, codec_for
from executors.layouts import EngineGroup, Layout
from executors.sandbox import Limits, Sandbox
from executors.task import Target, task_of
from placer.base.roles import Role

if TYPE_CHECKING:
    from executors import rl
    from executors.runplan import RunPlan
    from executors.samples import Samples
    from placer.spec.arch import ModelArch


@dataclass(frozen=True)
class Delay:
    """Test-only straggler: the `call`-th work call (0-based) of worker `role``rank` first sleeps
    `seconds` (a slow host, a thermal throttle, a noisy neighbour)."""

    role: str
    rank: int
    call: int
    seconds: float


@dataclass(frozen=True)
class RunConfig:
    """Everything a worker needs; the same object goes to every actor."""

    algorithm: str
    arch: dict[str, Any]  # ModelArch fields of the policy
    model_dir: str  # initial policy weights + tokenizer (version 0)
    seed: int
    max_new_tokens: int
    lr: float = 1e-2  # measured: reward rises steadily on tiny-llama (3e-2 plateaus at 0.2)
    critic_lr: float = 1e-2
    kl_coef: float = 0.0  # the job's `kl`: counted once, in the reward or the loss
    kl_in: str = "loss"  # reward | loss
    kl_estimator: str = "k3"  # k1 | k2 | k3
    temperature: float = 1.0  # rollout sampling; the trainer's log-probs divide by it too
    reward_arch: dict[str, Any] | None = None  # a reward model's shape, None for the rule
    images_per_prompt: int = 0  # a vision-language policy's images in every prompt (executors.vlm)
    judge: dict[str, Any] | None = None  # a generative judge's `reward_model` (executors.judge)
    threads: int = 1
    delays: tuple[Delay, ...] = ()
    unsafe_sandbox: bool = False  # `--unsafe-sandbox`: run answers even without kernel isolation
    trainer: Layout = Layout()  # the plan's actor layout (dp, tp, pp, HSDP shard, recompute)
    mini_batches: int = 1  # optimizer steps per RL step (the job's batch.mini_batches)
    data: dict[str, Any] | None = None  # the job's prompt set (`Dataset`); None: arithmetic
    engines: EngineGroup = EngineGroup()  # a rollout worker's engine replicas: TP, memory share
    max_model_len: int = 128  # the job's longest context, tokens (+1 for BOS)
    accumulate: int = 1  # micro-batches per mini-batch on each rank (gradient accumulation)
    critic_recompute: bool = False  # the plan's critic `recompute`
    critic_cp: int = 1  # the plan's critic context parallelism (`executors.critic`)
    precision: str = "fp32"  # the trainer's: bf16 (as the plan prices) | fp32 (`executors.precision`)
    # the refresh's senders keep the gathered weights between steps (the plan's host-memory
    # decision, `RunPlan.keep_sync_copy`); else they gather at each refresh
    keep_sync_copy: bool = False

    @property
    def kl(self) -> rl.KLTerm:
        from executors import rl  # lazy: torch, which the rule reward and environment never load
        return rl.KLTerm(self.kl_coef, self.kl_in, self.kl_estimator)

    @property
    def model_arch(self) -> ModelArch:
        from placer.spec.arch import ModelArch  # lazy: pydantic, for the workers with a model
        return ModelArch(**self.arch)

    def for_engines(self, engines: EngineGroup) -> RunConfig:
        """The config of a rollout worker of the engine group `engines` (a split rollout's
        part)."""
        return replace(self, engines=engines)

    def for_run(self, run: RunPlan) -> RunConfig:
        """This run's config on another plan of its job (a re-plan after the cluster changed):
        the new plan's trainer layout and rollout engines (`plan_settings`)."""
        return replace(self, **plan_settings(run))

    @property
    def codec(self) -> Codec:
        """The policy's tokenizer (its checkpoint's own, or the character one), once a process."""
        return codec_for(self.model_dir, int(self.arch["vocab"]))


def plan_settings(run: RunPlan) -> dict[str, Any]:
    """The `RunConfig` fields a plan decides: the trainer's layout and precision, the critic's
    recompute, the engines' context length and the first engine group (a rollout worker gets
    its own group: `RunConfig.for_engines`; a re-plan may join or split the rollout:
    `RunConfig.for_run`)."""
    from executors.precision import of_job  # lazy: torch (the driver's, never a worker's)
    actor, critic = run.roles[Role.ACTOR], run.roles.get(Role.CRITIC)
    rollout = run.roles.get(Role.ROLLOUT)
    # the plan prices training in BF16 (FP8 GEMMs, where it chose them, also run in BF16 here)
    out: dict[str, Any] = {"trainer": actor.layout,
                           "max_model_len": run.job.max_context + 1,  # + BOS
                           "critic_recompute": critic is not None and critic.layout.recompute,
                           "critic_cp": critic.layout.cp if critic is not None else 1,
                           "precision": of_job("fp8" if actor.precision.fp8_train else "bf16")}
    if rollout is not None:
        out["engines"] = rollout.engines[0]
    out["accumulate"] = accumulation(run.job.samples, run.job.mini_batches, actor.layout.dp,
                                     actor.micro_batch)
    out["keep_sync_copy"] = run.keep_sync_copy
    return out


def accumulation(samples: int, mini_batches: int, dp: int, micro_batch: int) -> int:
    """Micro-batches per mini-batch on one data-parallel rank when each holds `micro_batch`
    sequences (the plan's chosen size, as verl's `ppo_micro_batch_size_per_gpu`): the rank's
    share of a mini-batch over the size, rounded up. An unset size (0) trains the share as one."""
    if micro_batch <= 0:
        return 1
    share = -(-samples // max(mini_batches, 1) // max(dp, 1))
    return max(1, -(-share // micro_batch))


def run_config(run: RunPlan, lr: float | None = None, model_dir: str = "",
               delays: tuple[Delay, ...] = ()) -> RunConfig:
    """What every worker of the run gets: the job's facts and the plan's layouts."""
    job = run.job
    cfg = RunConfig(algorithm=job.algorithm, arch=job.policy.model_dump(), model_dir=model_dir,
                    seed=job.seed, max_new_tokens=job.max_new_tokens,
                    reward_arch=job.reward.model_dump() if job.reward is not None else None,
                    delays=tuple(delays), mini_batches=job.mini_batches,
                    data=job.data.model_dump() if job.data is not None else None,
                    kl_coef=job.kl.coef, kl_in=job.kl.where, kl_estimator=job.kl.estimator,
                    temperature=job.temperature,
                    judge=job.judge.model_dump() if job.judge is not None else None,
                    images_per_prompt=job.images_per_prompt,
                    **plan_settings(run))
    return cfg if lr is None else replace(cfg, lr=lr)


def _timing(t0: float, **extra: Any) -> dict[str, Any]:
    return {"t0": t0, "dur": time.time() - t0, "pid": os.getpid(), **extra}


class Worker:
    """Identity and placement of a worker process."""

    holds_model: ClassVar[bool] = True  # False: the worker's process never loads torch

    def __init__(self, cfg: RunConfig, role: str, rank: int = 0) -> None:
        self.cfg, self.role, self.rank = cfg, role, rank
        self.calls = 0  # work calls so far (for the test-only delays)
        if self.holds_model:
            import torch  # lazy: see the module's docstring
            torch.set_num_threads(cfg.threads)

    def _straggle(self) -> float:
        """Sleep if a test asked this worker's current call to be slow; returns the delay."""
        n, self.calls = self.calls, self.calls + 1
        wait = sum(d.seconds for d in self.cfg.delays
                   if (d.role, d.rank, d.call) == (self.role, self.rank, n))
        if wait:
            time.sleep(wait)
        return wait

    def set_micro_batches(self, accumulate: int) -> int:
        """Take a re-plan's micro-batch in place (`RunConfig.accumulate`: micro-batches per
        mini-batch on each rank; the driver cuts the batches, `executors.training.partition`):
        a kept worker's process, model and optimizer stay as they are."""
        self.cfg = replace(self.cfg, accumulate=accumulate)
        return accumulate

    def where(self) -> dict[str, Any]:
        """Node, placement group and bundle this worker runs in (empty outside Ray)."""
        out: dict[str, Any] = {"role": self.role, "rank": self.rank, "pid": os.getpid()}
        try:
            import ray  # lazy: the one-process runtime uses these workers without Ray
            ctx = ray.get_runtime_context()
            pg = ctx.get_placement_group_id()
            out.update(node_id=ctx.get_node_id(), placement_group=pg,
                       gpu_ids=[str(g) for g in ray.get_gpu_ids()],
                       resources=ctx.get_assigned_resources())
        except Exception:  # noqa: BLE001 - not in a Ray worker
            pass
        return out

    def pid(self) -> int:
        return os.getpid()


class RuleReward(Worker):
    holds_model = False

    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "reward", rank)
        # the run's task, kept for the whole run: the code task's verdicts live in it
        self.task = task_of(cfg.data, True if cfg.unsafe_sandbox else None)

    def score(self, s: Samples, results: list[dict], targets: list[Target]) -> tuple[list[float], dict]:
        t0 = time.time()
        codec = self.cfg.codec
        judged = self.task.judge([codec.decode(s.answer(i)) for i in range(len(s.ids))], results,
                            targets)
        reasons = {sid: j.reason for sid, j in zip(s.ids, judged) if j.reason}
        # the verdicts' exactness travels back with the rewards: the driver never re-judges
        return [j.reward for j in judged], _timing(t0, sample_ids=s.ids,
                                                   exact=[j.exact for j in judged],
                                                   **({"reasons": reasons} if reasons else {}))


class EnvWorker(Worker):
    """Runs each answer as untrusted code; one sandboxed interpreter per batch."""

    holds_model = False

    def __init__(self, cfg: RunConfig, rank: int = 0, limits: Limits | None = None) -> None:
        super().__init__(cfg, "environment", rank)
        self.sandbox = Sandbox(limits or Limits(wall_s=5.0, cpu_s=2, per_item_s=1.0),
                               allow_weak=True if cfg.unsafe_sandbox else None)

    def execute(self, ids: list[str], answers: list[str]) -> tuple[list[dict], dict]:
        t0 = time.time()
        delayed = self._straggle()
        res = self.sandbox.run_batch(answers)
        values = res.values or [{"status": res.status, "error": res.stderr[-200:]}] * len(answers)
        return values, _timing(t0, sample_ids=list(ids), protections=res.protections,
                               sandbox_status=res.status, delayed_s=delayed)

    def run_code(self, code: str) -> dict:
        r = self.sandbox.run(code)
        return {"status": r.status, "stdout": r.stdout, "stderr": r.stderr[-500:],
                "protections": r.protections, "wall_s": r.wall_s}


def save_checkpoint(path: str, state: dict) -> str:
    """torch.save to a temporary file in the same folder, then rename (never half a file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    import torch  # lazy: see the module's docstring
    torch.save(state, tmp)
    os.replace(tmp, p)
    return str(p)
