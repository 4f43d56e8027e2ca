"""Role workers: plain classes that Ray wraps as actors (and the one-process baseline uses as is).

  Trainer      the `actor` role (`executors.trainer`): policy training, one instance per device
               of the plan's layout (FSDP2 over DP, TP via DTensor; `executors.sharding`).
  Rollout      generation with the `torch` backend (sampling loop with a KV cache, in the actor);
               `executors.vllm_rollout.VllmRollout` (`vllm`) and `executors.sglang_rollout.
               SglangRollout` (`sglang`) have the same methods (`executors.backends`).
  Reference    frozen policy copy: log-probs for the KL term (at the rollout's temperature).
  RuleReward   the verifier: scores the sandbox's result of each answer (`executors.task`).
  ModelReward  a reward model (Llama backbone + scalar head, frozen).
  Critic       PPO value model: values for GAE, trained on returns (one process; its layers
               recompute activations when the plan's critic layout says so); checkpoints.
  EnvWorker    environment worker: runs answers as untrusted code in the sandbox.

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
from typing import Any

import torch

from executors import rl
from executors.model import Codec, ValueModel, codec_for
from executors.precision import autocast, of_job
from executors.reshard import BucketLoading, engine_shard, engine_state, engine_unshard
from executors.runplan import EngineGroup, Layout, RunPlan
from executors.sandbox import Limits, Sandbox
from executors.sharding import recompute_layers, recomputes
from executors.syncgroup import BUCKETS, IPC, GroupReceiver
from executors.task import Target, task_of
from executors.vlm import encoder_spans, load_model
from placer.base.roles import Role
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
    precision: str = "fp32"  # the trainer's: bf16 (as the plan prices) | fp32 (`executors.precision`)

    @property
    def kl(self) -> rl.KLTerm:
        return rl.KLTerm(self.kl_coef, self.kl_in, self.kl_estimator)

    @property
    def model_arch(self) -> ModelArch:
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
    actor, critic = run.roles[Role.ACTOR], run.roles.get(Role.CRITIC)
    rollout = run.roles.get(Role.ROLLOUT)
    # the plan prices training in BF16 (FP8 GEMMs, where it chose them, also run in BF16 here)
    out: dict[str, Any] = {"trainer": actor.layout,
                           "max_model_len": run.job.max_context + 1,  # + BOS
                           "critic_recompute": critic is not None and critic.layout.recompute,
                           "precision": of_job("fp8" if actor.precision.fp8_train else "bf16")}
    if rollout is not None:
        out["engines"] = rollout.engines[0]
    out["accumulate"] = accumulation(run.job.samples, run.job.mini_batches, actor.layout.dp,
                                     actor.micro_batch)
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

    def __init__(self, cfg: RunConfig, role: str, rank: int = 0) -> None:
        self.cfg, self.role, self.rank = cfg, role, rank
        self.calls = 0  # work calls so far (for the test-only delays)
        torch.set_num_threads(cfg.threads)

    def _straggle(self) -> float:
        """Sleep if a test asked this worker's current call to be slow; returns the delay."""
        n, self.calls = self.calls, self.calls + 1
        wait = sum(d.seconds for d in self.cfg.delays
                   if (d.role, d.rank, d.call) == (self.role, self.rank, n))
        if wait:
            time.sleep(wait)
        return wait

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


class Rollout(Worker, BucketLoading, GroupReceiver):
    """Generation with the torch backend. At tp > 1 the engine holds each TP rank's shards
    of the weights (`executors.reshard.engine_shard`), as a refresh delivers them, and gathers
    them whole for its forward on one device (`engine_unshard`): the shards are the engine's
    weights, the model its view of them. It generates in the plan's precision (`cfg.precision`:
    BF16 autocast, as vLLM and SGLang run `dtype=bfloat16`, its sampled log-probs from FP32
    log-softmax); its weights stay FP32, so a refresh leaves them exactly the trainer's."""

    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "rollout", rank)
        self.model = load_model(cfg.model_dir)
        self._own = self.model.state_dict()  # views of the weights, for a refresh to fill
        self.version = 0
        self.tp, self._kv = cfg.engines.tp, cfg.model_arch.kv_heads
        self._shards = [{k: v.clone() for k, v in engine_state(self._own, self.tp, t,
                                                               self._kv).items()}
                        for t in range(self.tp)] if self.tp > 1 else []
        self._touched: set[str] = set()  # tensors a refresh in progress replaced

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> dict:
        t0 = time.time()
        for name, t in state.items():
            for r in range(self.tp):
                self._load_shard(r, name, engine_shard(name, t, self.tp, r, self._kv))
        self._refreshed()
        self.version = version
        return _timing(t0, version=version)

    def _load_part(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Full tensors of a refresh bucket by bucket (`executors.reshard`): each TP rank's
        cut of each, as it arrives."""
        for name, t in tensors:
            for r in range(self.tp):
                self._load_shard(r, name, engine_shard(name, t, self.tp, r, self._kv))

    def _engine_tp(self) -> int:
        return self.tp

    def sync_member(self) -> tuple[str, int, int, str]:
        """As `GroupReceiver.sync_member`, with the protocol the plan implies: an engine
        colocated with the trainer takes its refreshes as shared memory (`executors.ipc`),
        others over the group in buckets."""
        return "cpu", self.tp, os.getpid(), IPC if self.cfg.engines.colocated else BUCKETS

    def _kv_heads(self) -> int | None:
        return self._kv

    def _load_shard(self, t: int, name: str, shard: torch.Tensor) -> None:
        """TP rank `t`'s shard of tensor `name` into its place (at tp 1 the model's own)."""
        if name not in self._own:
            raise KeyError(f"weight sync: the engine has no tensor {name!r}")
        with torch.no_grad():
            if self.tp == 1:
                self._own[name].copy_(shard)
            else:
                self._shards[t][name].copy_(shard)
                self._touched.add(name)

    def _refreshed(self) -> None:
        """The forward's weights: every replaced tensor gathered whole from its shards."""
        with torch.no_grad():
            for name in self._touched:
                self._own[name].copy_(engine_unshard(name, [s[name] for s in self._shards],
                                                     self._kv))
        self._touched.clear()

    def _expected_names(self) -> set[str]:
        return set(self._own)

    def sleep_engine(self) -> bool:
        """A colocated engine's training-phase sleep: the torch engine keeps its weights
        in host memory already (nothing to free)."""
        return False

    def wake_engine(self) -> bool:
        return False

    def engine_shards(self) -> list[dict[str, torch.Tensor]]:
        """Each TP rank's weights, as the engine holds them."""
        return self._shards if self.tp > 1 else [self._own]

    def current_version(self) -> int:
        return self.version

    def executed_layout(self, replicas: int) -> dict[str, int]:
        """One engine per data-parallel replica, each holding the plan's TP shards."""
        return {"dp": replicas, "tp": self.tp, "pp": 1}

    def generate(self, ids: list[str], groups: list[str], contexts: list[list[int]],
                 seeds: list[int], limits: list[int] | None = None) -> tuple[rl.Samples, dict]:
        """Continue each context (a prompt, or a trajectory so far: `executors.rollouts`) by up
        to `limits[i]` tokens (default `max_new_tokens`), stopping at EOS. The samples hold the
        contexts as prompts and the new tokens as responses."""
        t0 = time.time()
        delayed = self._straggle()
        with autocast(self.cfg.precision):  # the plan's BF16, over the refreshed FP32 weights
            resp, lps = rl.generate(self.model, contexts, self.cfg.max_new_tokens, seeds,
                                    self.cfg.temperature, limits, eos=self.cfg.codec.eos)
        s = rl.Samples(list(ids), contexts, resp, lps, self.version, list(groups))
        return s, _timing(t0, tokens=sum(len(r) for r in resp), sample_ids=list(ids),
                          version=self.version, batch=len(ids), delayed_s=delayed,
                          **encoder_spans(self.model))


class Reference(Worker):
    """The frozen reference policy's log-probs, its forward in the plan's precision
    (`cfg.precision`: BF16 autocast over its FP32 weights, as the actor's old-log-prob pass;
    the log-softmax in FP32, `rl.scaled_logprobs`)."""

    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "reference", rank)
        self.model = load_model(cfg.model_dir)

    @torch.no_grad()
    def logprobs(self, s: rl.Samples) -> tuple[list[list[float]], dict]:
        t0 = time.time()
        with autocast(self.cfg.precision):
            lp = rl.response_logprobs(self.model, s, self.cfg.temperature)
        rows = [lp[i, :len(r)].tolist() for i, r in enumerate(s.responses)]
        return rows, _timing(t0, tokens=s.tokens(), sample_ids=s.ids, **encoder_spans(self.model))


class RuleReward(Worker):
    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "reward", rank)
        # the run's task, kept for the whole run: the code task's verdicts live in it
        self.task = task_of(cfg.data, True if cfg.unsafe_sandbox else None)

    def score(self, s: rl.Samples, results: list[dict], targets: list[Target]) -> tuple[list[float], dict]:
        t0 = time.time()
        codec = self.cfg.codec
        judged = self.task.judge([codec.decode(s.answer(i)) for i in range(len(s.ids))], results,
                            targets)
        reasons = {sid: j.reason for sid, j in zip(s.ids, judged) if j.reason}
        # the verdicts' exactness travels back with the rewards: the driver never re-judges
        return [j.reward for j in judged], _timing(t0, sample_ids=s.ids,
                                                   exact=[j.exact for j in judged],
                                                   **({"reasons": reasons} if reasons else {}))


class ModelReward(Worker):
    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "reward", rank)
        if cfg.reward_arch is None:  # `run_config` sets it whenever the job has a reward model
            raise ValueError("a model reward worker needs the reward model's architecture")
        self.model = ValueModel(ModelArch(**cfg.reward_arch), cfg.seed + 17)
        self.model.eval()

    @torch.no_grad()
    def score(self, s: rl.Samples, results: list[dict], targets: list[Target]) -> tuple[list[float], dict]:
        t0 = time.time()
        return rl.sequence_scores(self.model, s), _timing(t0, tokens=s.tokens(), sample_ids=s.ids)


class Critic(Worker):
    """PPO's value model: one process, its forward in the job's training precision
    (`cfg.precision`: BF16 autocast over FP32 weights and Adam, as the actor trains)."""

    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "critic", rank)
        self.model = ValueModel(cfg.model_arch, cfg.seed + 29)
        if cfg.critic_recompute:
            recompute_layers(self.model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.critic_lr)

    def executed_layout(self, ranks: int) -> dict[str, int | bool]:
        """One process trains the whole value model (the role's other ranks stand by)."""
        return {"dp": 1, "tp": 1, "pp": 1, "recompute": recomputes(self.model)}

    def _values(self, s: rl.Samples) -> torch.Tensor:
        """Values in the job's training precision (BF16 autocast over the FP32 weights, as the
        actor: `executors.precision`), returned in FP32 for the loss and GAE."""
        with autocast(self.cfg.precision):
            v = rl.response_values(self.model, s)
        return v.float()

    @torch.no_grad()
    def values(self, s: rl.Samples) -> tuple[list[list[float]], dict]:
        t0 = time.time()
        v = self._values(s)
        rows = [v[i, :len(r)].tolist() for i, r in enumerate(s.responses)]
        return rows, _timing(t0, tokens=s.tokens(), sample_ids=s.ids)

    def train(self, s: rl.Samples, returns: list[list[float]], old: list[list[float]]
              ) -> tuple[dict, dict]:
        t0 = time.time()
        self.opt.zero_grad()
        v = self._values(s)
        _, _, rmask = rl.pack(s)
        w = rmask.shape[1]
        loss = rl.value_loss(v, rl.to_padded(old, w), rl.to_padded(returns, w), rmask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return {"value_loss": float(loss.detach())}, _timing(t0, tokens=s.tokens(), sample_ids=s.ids)

    def save(self, path: str, step: int) -> str:
        return save_checkpoint(path, {"model": self.model.state_dict(),
                                      "optim": self.opt.state_dict(), "step": step})

    def load(self, path: str) -> int:
        ck = torch.load(path, weights_only=False)
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optim"])
        return ck["step"]


class EnvWorker(Worker):
    """Runs each answer as untrusted code; one sandboxed interpreter per batch."""

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
    torch.save(state, tmp)
    os.replace(tmp, p)
    return str(p)
