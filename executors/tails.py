"""Long tails in the RL loop: the job's `tail_policy`, as `TailPolicies` applies it to a step.

  reissue        sets the environment's per-call deadline (`executors.run.tail_deadlines`); the
                 race itself is every role's (`executors.calls.Dispatcher`);
  overprovision  `RolloutDriver.launch` plans ceil(n (1 + f)) samples (`overprovision_extra`).
                 Single-turn: `first_shards` waits for rollout shards in finish order until they
                 hold n samples and abandons the rest; multi-turn: once n trajectories are done
                 after a round, the others are abandoned (`overprovision_round`). `keep_first`
                 keeps the first n to finish (by round, shard finish order, then length: within
                 a shard's lockstep decode a sample is done when it emits EOS, shorter is
                 sooner); the others are `dropped` in the ledger and never trained.
  partial        every round stops a trajectory once it generated `token_budget` tokens in this
                 step (`executors.rollouts`); a cut one is *carried*: next step it is resumed
                 first (its prompt and response so far prefilled again, sampling continued from
                 a seed of its own and its length, under the newer weights), and fresh prompts
                 fill the step up to n samples in whole groups. A step trains the finished
                 samples; with GRPO only those of complete groups (it normalises rewards within
                 a group, so a finished sample whose sibling was cut waits for it, `done` in the
                 carry; PPO trains each sample when it finishes); when no group completes,
                 the step runs another round on its carried samples (none is ever empty). The
                 carry is part of the checkpoint (`carry` in latest.json), so a rollback resumes
                 the same samples; the ledger follows each sample from the step that planned it
                 to the step that trained it (`carried_in`, `carried_out`).
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from executors import rl
from executors.context import LoopContext
from executors.runtime import Handle
from executors.stragglers import Call
from executors.trajectory import Traj
from placer.base.fileio import atomic_write_text
from placer.spec.tailpolicy import TailPolicy


def overprovision_extra(tail_policy: TailPolicy, n: int) -> int:
    """Samples generated beyond the `n` a step trains on (`TailMechanism.generated`)."""
    return tail_policy.mechanism.generated(n) - n


def carry_steps(tail_policy: TailPolicy, max_tokens: int) -> int:
    """Steps a sample may wait beyond its own before it is done (`TailMechanism.carry_steps`:
    a partial rollout's carry; 0 for the other policies)."""
    return tail_policy.mechanism.carry_steps(max_tokens)


class TailPolicies:
    """The job's tail policy over a step's trajectories; owns the partial-rollout carry."""

    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx
        self.policy = ctx.job.tail_policy.mechanism
        self.carry: list[Traj] = []  # partial rollouts: samples not trained yet

    @property
    def budget(self) -> int | None:
        """Partial rollouts' tokens per sample and step; None under the other policies."""
        return self.policy.token_budget

    @property
    def overprovision(self) -> bool:
        return self.policy.keeps_first

    # ------------------------------------------------------------------ overprovision
    def first_shards(self, step: int, calls: Sequence[Call], keep: int
                     ) -> tuple[list[Call], list[Handle], list[str]]:
        """Single turn: start the rollout shards and wait for them in the order they finish
        until they hold `keep` samples; the later shards are abandoned (cancelled, their
        workers busy, their samples dropped). Returns the calls taken in finish order, their
        handles and the dropped sample ids."""
        ctx = self.ctx
        handles = [ctx.rt.call(m, meth, *args) for m, meth, args in calls]
        left, order, have = list(range(len(calls))), [], 0
        while have < keep and left:
            i = left.pop(ctx.rt.first([handles[j] for j in left]))
            order.append(i)
            have += len(calls[i][2][0])
        for i in left:
            ctx.rt.cancel(handles[i])
            ctx.busy.add(calls[i][0], handles[i])
        ids = [x for i in left for x in calls[i][2][0]]
        if left:
            ctx.ledger.dropped(step, ids)
            ctx.event("overprovision: abandon", "tail", time.time(), 0.0, None, step,
                      policy_version=None, sample_ids=ids)
        return [calls[i] for i in order], [handles[i] for i in order], ids

    def overprovision_round(self, step: int, trajs: list[Traj], keep: int,
                            dropped: set[str]) -> list[str]:
        """Multi-turn: once `keep` trajectories are done after a round, the rest are abandoned
        (returned, and dropped in the ledger)."""
        if not self.overprovision or sum(t.done for t in trajs) < keep:
            return []
        left = [t.id for t in trajs if not t.done and t.id not in dropped]
        self.ctx.ledger.dropped(step, left)
        return left

    def keep_first(self, step: int, done: list[Traj], keep: int) -> list[Traj]:
        """The first `keep` trajectories to finish (by round, shard finish order, then length);
        the others are dropped."""
        order = sorted(done, key=lambda t: (t.done_at, t.id))
        dropped = [t.id for t in order[keep:]]
        self.ctx.ledger.dropped(step, dropped)
        self.ctx.event("overprovision: keep first", "tail", time.time(), 0.0, None, step,
                       policy_version=None, sample_ids=dropped, kept=keep)
        return order[:keep]

    # ------------------------------------------------------------------ partial rollouts
    def settle_partial(self, step: int, trajs: list[Traj], held: list[Traj],
                       cut: set[str]) -> rl.Samples | None:
        """What a partial step trains (finished samples; with GRPO of complete groups only,
        with the finished ones `held` from earlier steps) and the new carry; None when nothing
        is complete yet (the caller runs another round)."""
        ctx = self.ctx
        # GRPO's advantage needs the whole group's rewards; PPO's needs only the sample's own
        unit = (lambda t: t.id) if ctx.cfg.algorithm == "ppo" else (lambda t: t.group)
        waiting = {unit(t) for t in trajs if not t.done}
        everyone = held + trajs
        train = [t for t in everyone if unit(t) not in waiting]
        self.carry = [t for t in everyone if unit(t) in waiting]
        ctx.ledger.carried_out(step, [t.id for t in self.carry])
        ctx.event("partial: carry", "tail", time.time(), 0.0, None, step, policy_version=None,
                  sample_ids=[t.id for t in self.carry], cut=sorted(cut),
                  carried_tokens=sum(len(t.response) for t in self.carry if not t.done))
        if not train:
            return None
        return rl.Samples.concat([t.as_samples() for t in train])

    def save_carry(self, d: Path, step: int) -> str:
        path = d / f"carry-{step:06d}.json"
        atomic_write_text(path, json.dumps([t.to_dict() for t in self.carry]))
        return str(path)

    def load_carry(self, latest: dict[str, Any] | None) -> None:
        """The carry as of the checkpoint (nothing before the first one); its samples' answers
        are known again until they train."""
        path = (latest or {}).get("carry")
        self.carry = ([Traj.from_dict(d) for d in json.loads(Path(path).read_text())]
                      if path else [])
        self.ctx.targets.update({t.id: t.target for t in self.carry})
