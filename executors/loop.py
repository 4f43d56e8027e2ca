"""The RL loop (GRPO, PPO) over a `Runtime`: versioned weight sync, traces, checkpoints, recovery.

One step, in the plan's four stages:
  sync     trainer rank 0's weights (version v = optimizer steps so far) go to every rollout
           worker that does not hold v yet (one object in Ray's store, fetched by each);
  rollout  prompts for the step (seeded) x samples per prompt, sharded over rollout workers, in
           rounds and turns (`executors.rollouts`): between a multi-turn sample's turns the
           environment runs its code in the sandbox and the output joins its context; every
           token carries the version it was generated with; then each final answer runs in
           the sandbox for the verifier;
  score    rule or model reward, reference log-probs (KL), critic values (PPO);
  train    advantages (GRPO: group-normalised rewards; PPO: GAE over critic values; the job's
           KL once, in the reward or in the loss), one optimizer step on each data-parallel
           rank (gradients all-reduced), critic step; the step's RL statistics (`rl_stats`) go
           to the trace as counter events; checkpoint every `checkpoint_every` steps (atomic files).
Sync mode: a step's samples are generated with version == step. Async mode: the rollout of step
s+1 starts before step s scores and trains (its first round runs meanwhile), so its version is s
(staleness 1 <= max_staleness).

Recovery: a rollout, environment, reference or reward worker that dies mid-call is restarted by
Ray (`max_restarts`) and its in-flight samples are re-run (rollouts after re-syncing weights); a
trainer or critic that dies restarts every training rank, re-forms the process group, reloads the
last checkpoint and re-runs the steps after it. The ledger (`executors.ledger`) records sample ids
per step and proves nothing was lost or counted twice. A node that dies (or joins) changes the
plan itself: see `executors.recovery` and `executors.elastic`. Slow calls: `executors.stragglers`.

Tail policy (the job's `tail_policy`, `executors.tails`): `overprovision` generates ceil(n (1 + f))
samples and trains the first n to finish; `reissue` sets the environment's per-call deadline;
`partial` cuts samples at the token budget and resumes them next step under the newer weights.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from executors import rl
from executors.calls import Dispatcher
from executors.context import Fault, LoopConfig, LoopContext, StepStat, TrainingLost
from executors.elastic import ClusterChanged, Elastic
from executors.ledger import Ledger
from executors.placement import Member
from executors.recovery import Recovery
from executors.roles import RunConfig
from executors.rollouts import EnvironmentCalls, RolloutDriver, StepRollout
from executors.runplan import RunPlan
from executors.runtime import Runtime
from executors.tails import TailPolicies
from executors.task import Target, task_of
from executors.training import EXACT, Checkpoints, Scored, Training
from executors.weights import WeightSync
from placer.base.phases import PhaseClock
from placer.base.roles import Role
from traces.schema import Trace

__all__ = ["EngineTurn", "Fault", "Loop", "LoopConfig", "StepStat"]


class EngineTurn(Protocol):
    """A job's turn on rollout engines it time-shares with other jobs (`executors.fleetrun`)."""

    def take(self, step: int) -> None:
        """Wait for this job's turn before step `step`'s weight sync."""

    def synced(self, step: int) -> None:
        """Step `step`'s weights are in the engines (its rollout launches next)."""

    def done(self, step: int) -> None:
        """Step `step`'s rollout is collected: the engines go to the next job."""


class Loop:
    """The step sequence; its parts do the work over one shared `LoopContext`."""

    def __init__(self, run: RunPlan, rt: Runtime, cfg: RunConfig, lc: LoopConfig, trace: Trace,
                 progress: Callable[[StepStat], None] | None = None, *,
                 elastic: Elastic | None = None, note: Callable[[str], None] | None = None,
                 on_step: Callable[[int], None] | None = None,
                 phases: PhaseClock | None = None, turn: EngineTurn | None = None) -> None:
        """`progress`: called with each finished step's stats; `note`: one line per cluster
        recovery; `on_step`: called at every step boundary (tests change the cluster there);
        `phases`: the run's set-up phases, which the loop's own set-up continues and ends;
        `turn`: the rollout engines are time-shared with other jobs (`executors.fleetrun`):
        each weight sync waits for this job's turn on them, which its rollout's end hands on."""
        self.ctx = ctx = LoopContext(run, rt, cfg, lc, trace, elastic)
        self.task = task_of(cfg.data)
        self.calls = Dispatcher(ctx, lc.faults)
        self.weights = WeightSync(ctx)
        self.tails = TailPolicies(ctx)
        self.env = EnvironmentCalls(ctx, self.calls)
        self.rollouts = RolloutDriver(ctx, self.calls, self.tails, self.weights, self.env)
        self.training = Training(ctx, self.calls)
        self.checkpoints = Checkpoints(ctx, self.tails)
        self.recovery = Recovery(ctx, self.training, self.checkpoints, note)
        self.progress, self.on_step = progress, on_step
        self.phases = phases or PhaseClock()
        self.turn = turn
        self.stats: list[StepStat] = []

    # ------------------------------------------------------------------ what callers read
    @property
    def cfg(self) -> RunConfig:
        return self.ctx.cfg

    @property
    def trace(self) -> Trace:
        return self.ctx.trace

    @property
    def ledger(self) -> Ledger:
        return self.ctx.ledger

    @property
    def by_role(self) -> dict[str, list[Member]]:
        return self.ctx.by_role

    @property
    def stragglers(self) -> list[dict[str, object]]:
        return self.calls.stragglers

    @property
    def recoveries(self) -> list[dict[str, object]]:
        return self.recovery.recoveries

    def sync_weights(self, step: int) -> int:
        return self.weights.sync(step)

    def launch_rollout(self, step: int) -> StepRollout:
        return self.rollouts.launch(step)

    def collect_rollout(self, r: StepRollout) -> rl.Samples:
        return self.rollouts.collect(r)

    # ------------------------------------------------------------------ the loop
    def run(self) -> list[StepStat]:
        """Every step, recovering from lost training processes and cluster changes (each
        recovery counts against the config's `retries`); the stats of the steps kept."""
        lc = self.ctx.lc
        self.phases.begin("forming the trainers' process group"
                          if len(self.ctx.workers(Role.ACTOR)) > 1 else "reading the workers' layouts")
        self.training.setup()
        self.rollouts.record_layout()  # a split rollout's parts (after the roles' layouts)
        step, pending, restarts = lc.start, None, 0
        if step:  # a resumed run: trainer, critic and carry from the checkpoint before `start`
            self.phases.begin(f"restoring the checkpoint of step {step - 1}")
            self.checkpoints.last = step - 1
            self.checkpoints.restore()
        self.phases.end()  # the set-up is over: the steps begin
        while step < lc.steps:
            try:
                try:
                    if pending is None or pending.step != step:
                        self._boundary(step)
                        self._sync(step)
                        pending = self.rollouts.launch(step)
                    pending = self._step(step, pending)
                    step += 1
                except TrainingLost as e:
                    self.ctx.check_cluster()  # a lost node, not a lost process: re-plan instead
                    restarts += 1
                    if restarts > lc.retries:
                        raise RuntimeError(f"training keeps failing: {e}") from None
                    try:
                        step, pending = self.recovery.recover_training(step, str(e)), None
                    except Exception:
                        self.ctx.check_cluster()
                        raise
                    self.rollouts.record_layout()  # the recovery's setup recorded the roles'
            except ClusterChanged as e:
                restarts += 1
                if restarts > lc.retries:
                    raise RuntimeError(f"the cluster keeps changing: {e}") from None
                step, pending = self.recovery.recover_cluster(step, e), None
                self.rollouts.record_layout()
            self.stats = [st for st in self.stats if st.step < step]
        return self.stats

    def _sync(self, step: int) -> None:
        """The weight sync before step `step`'s rollout; on time-shared engines it first
        waits for this job's turn (a swap when another job's weights are in them)."""
        if self.turn is not None:
            self.turn.take(step)
        self.weights.sync(step)
        if self.turn is not None:
            self.turn.synced(step)

    def _boundary(self, step: int) -> None:
        """Between steps: the test hook, then a check that the cluster is still the plan's (a
        joined node is used from here on; a lost one is usually noticed earlier, by a call)."""
        if self.on_step is not None:
            self.on_step(step)
        self.ctx.check_cluster()

    def _step(self, step: int, pending: StepRollout) -> StepRollout | None:
        """One step from its launched rollout; the next step's rollout when async mode
        launched it already."""
        ctx, lc, t = self.ctx, self.ctx.lc, time.time()
        ctx.new_step()
        s = self.rollouts.collect(pending)
        if self.turn is not None:
            self.turn.done(step)
        nxt = None
        if lc.pipeline.overlaps_steps and step + 1 < lc.steps:
            self._sync(step + 1)  # version == step: one behind the next step
            nxt = self.rollouts.launch(step + 1)
        targets = [ctx.targets.pop(i) for i in s.ids]
        started = self.training.dispatch_score(s)
        results = self._verify(step, s)
        scored = self.training.score(step, s, results, targets, started)
        adv, extra = self.training.advantages(s, scored)
        loss, trained = self.training.train(step, s, adv, extra, scored.get(Role.REFERENCE))
        ctx.ledger.commit(step)
        if self.checkpoints.due(step):
            self.checkpoints.save(step)
        ctx.ledger.write(lc.out_dir / "ledger.json")
        self._record(step, t, s, scored, results, targets, loss, trained)
        return nxt

    def _answers(self, s: rl.Samples) -> list[str]:
        codec = self.ctx.cfg.codec
        return [codec.decode(s.answer(i)) for i in range(len(s.ids))]

    def _verify(self, step: int, s: rl.Samples) -> list[dict[str, Any]]:
        """Each sample's final answer run as code in the sandbox (what the rule reward checks);
        nothing for a task whose reward runs the answers itself (code: its unit tests), so
        that each answer runs once."""
        if not self.task.reads_results:
            return [{} for _ in s.ids]
        return self.env.run(step, s.ids, self._answers(s), "verify")

    def _record(self, step: int, t: float, s: rl.Samples, scored: Scored,
                results: list[dict[str, Any]], targets: list[Target], loss: float,
                trained: dict[str, float]) -> None:
        """The step's stats, its trace event and `rl` counter, and the progress callback
        (`trained`: the trainer's statistics, `training.trainer_stats`). Exact answers are the
        reward worker's verdicts (a rule reward: judged once, never re-run here); with a
        reward model, the task's own check of the sandbox's results."""
        counters, rewards, end = self.ctx.counters, scored[Role.REWARD], time.time()
        exact = scored.get(EXACT)
        if exact is None:
            exact = [self.task.exact(a, r, tg)
                     for a, r, tg in zip(self._answers(s), results, targets)]
        rank_s = counters.rank_s()
        device_s = {r: v * self.ctx.run.devices_per_rank(r) for r, v in rank_s.items()}
        st = StepStat(step, sum(rewards) / len(rewards), sum(map(bool, exact)) / len(rewards),
                      end - t, counters.wall_s(t, end), rank_s, device_s,
                      sorted({s.version, *s.started}), loss, counters.reruns,
                      rl_stats(s, rewards, trained))
        self.ctx.event(f"step {step}", "step", t, st.step_s, None, step,
                       policy_version=s.version, sample_ids=s.ids, tokens=s.tokens(),
                       reward=st.reward)
        self.trace.count("rl", max(end - self.ctx.t0, 0.0), "driver", **st.rl)
        self.stats.append(st)
        if self.progress:
            self.progress(st)


def rl_stats(s: rl.Samples, rewards: list[float], trained: dict[str, float]) -> dict[str, float]:
    """A step's RL statistics: the trainer's (clip and truncation fractions, KL, entropy,
    gradient norm) and its samples' generated response tokens and rewards (mean, min, max)."""
    gens = s.gen_mask or [[1] * len(r) for r in s.responses]
    out = dict(trained)
    for key, xs in (("response_len", [float(sum(g)) for g in gens]), ("reward", list(rewards))):
        xs = xs or [0.0]
        out.update({f"{key}_mean": sum(xs) / len(xs), f"{key}_min": min(xs),
                    f"{key}_max": max(xs)})
    return out
