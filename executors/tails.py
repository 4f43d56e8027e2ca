"""Slow calls and long tails in the RL loop (a mixin of `executors.loop.Loop`).

  deadlines      `_race`: a rollout or environment call still running at its role's deadline is
                 re-issued to another worker (`executors.stragglers.race`); each re-issue is a
                 `straggler` trace event on the slow worker's track and a row of
                 `Loop.stragglers`; re-issued rollout samples are noted in the ledger, counted once;
  overprovision  `launch_rollout` plans ceil(n (1 + f)) samples (`overprovision_extra`).
                 Single-turn: `_first_shards` waits for rollout shards in finish order until they
                 hold n samples and abandons the rest; multi-turn: once n trajectories are done
                 after a round, the others are abandoned. `_keep_first` keeps the first n to
                 finish (by round, shard finish order, then length: within a shard's lockstep
                 decode a sample is done when it emits EOS, shorter is sooner); the others are
                 `dropped` in the ledger and never trained.
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
import math
import time
from pathlib import Path
from typing import Any

from executors import rl
from executors.placement import Member
from executors.stragglers import race
from executors.trajectory import Traj
from placer.plan import atomic_write_text


def overprovision_extra(tail_policy: Any, n: int) -> int:
    """Samples generated beyond the `n` a step trains on: ceil(n (1 + f)) - n for an
    `overprovision` tail policy with fraction f, else 0."""
    if tail_policy.kind != "overprovision" or not tail_policy.fraction:
        return 0
    return math.ceil(n * (1 + tail_policy.fraction) - 1e-9) - n


def carry_steps(tail_policy: Any, max_tokens: int) -> int:
    """Steps a partial rollout's sample may wait beyond its own: a carried sample gains at least
    `token_budget` tokens per step until it is done (at most `max_tokens`: turns x per-turn
    cap), so it (and the group it holds back) is done within ceil(max_tokens / budget) steps;
    0 for other policies."""
    if tail_policy.kind != "partial":
        return 0
    return max(math.ceil(max_tokens / tail_policy.token_budget) - 1, 0)


class TailPolicies:
    """Needs the Loop's rt, lc, known, busy, ran_on, ledger, stragglers and `_event`."""

    def _race(self, calls: list[tuple[Member, str, tuple]], handles: list[Any], step: int,
              role: str) -> list[Any]:
        """Per-call deadline: re-issue late calls to another worker (`executors.stragglers`)."""
        def can_take(slow: Member, other: Member) -> bool:
            # a rollout must be redone with the same weights; any environment worker will do
            return role != "rollout" or self.known.get(other.rank) == self.known.get(slow.rank)
        out, reissues = race(self.rt, calls, handles, self.lc.deadlines[role], can_take, self.busy)
        for r in reissues:
            ids = list(calls[r.index][2][0])
            if r.winner == "reissue":
                self.ran_on[r.index] = r.to
            if role == "rollout" and r.to is not None:
                self.ledger.reissued(step, ids)
            rep = r.report(step)
            self.stragglers.append(rep)
            # an instant marker on the slow worker's track, at the moment it missed its deadline
            # (zero length: per-role times count the work events, not the waiting)
            self._event(f"straggler {rep['slow_worker']}", "straggler", r.t0 + r.deadline_s,
                        0.0, r.slow, step, policy_version=None, sample_ids=ids, straggler=True,
                        **{k: v for k, v in rep.items() if k not in ("step", "role")})
        return out

    def _first_shards(self, step: int, calls: list[tuple[Member, str, tuple]],
                      pending: dict[str, Any]) -> tuple[list[tuple[Member, str, tuple]], list[Any]]:
        """Overprovision (single turn): start the rollout shards and wait for them in the order
        they finish until they hold n samples; the later shards are abandoned (cancelled, their
        workers busy, their samples dropped)."""
        keep = pending["keep"]
        handles = [self.rt.call(m, meth, *args) for m, meth, args in calls]
        left, order, have = list(range(len(calls))), [], 0
        while have < keep and left:
            i = left.pop(self.rt.first([handles[j] for j in left]))
            order.append(i)
            have += len(calls[i][2][0])
        for i in left:
            self.rt.cancel(handles[i])
            self.busy.add(calls[i][0], handles[i])
        if left:
            ids = [x for i in left for x in calls[i][2][0]]
            pending["dropped"] |= set(ids)
            self.ledger.dropped(step, ids)
            self._event("overprovision: abandon", "tail", time.time(), 0.0, None, step,
                        policy_version=None, sample_ids=ids)
        return [calls[i] for i in order], [handles[i] for i in order]

    def _keep_first(self, step: int, done: list[Traj], keep: int) -> list[Traj]:
        """Overprovision: the first `keep` trajectories to finish (by round, shard finish order,
        then length); the others are dropped."""
        order = sorted(done, key=lambda t: (t.done_at, t.id))
        dropped = [t.id for t in order[keep:]]
        self.ledger.dropped(step, dropped)
        self._event("overprovision: keep first", "tail", time.time(), 0.0, None, step,
                    policy_version=None, sample_ids=dropped, kept=keep)
        return order[:keep]

    # ------------------------------------------------------------------ partial rollouts
    def _partial_budget(self) -> int | None:
        tp = self.job.tail_policy
        return tp.token_budget if tp.kind == "partial" else None

    def _settle_partial(self, pending: dict[str, Any]) -> rl.Samples | None:
        """What a partial step trains (finished samples; with GRPO of complete groups only,
        with finished ones held from earlier steps) and the new carry; None when nothing is
        complete yet (the caller runs another round)."""
        step, trajs = pending["step"], pending["trajs"]
        # GRPO's advantage needs the whole group's rewards; PPO's needs only the sample's own
        unit = (lambda t: t.id) if self.cfg.algorithm == "ppo" else (lambda t: t.group)
        waiting = {unit(t) for t in trajs if not t.done}
        everyone = pending["held"] + trajs
        train = [t for t in everyone if unit(t) not in waiting]
        self.carry = [t for t in everyone if unit(t) in waiting]
        self.ledger.carried_out(step, [t.id for t in self.carry])
        self._event("partial: carry", "tail", time.time(), 0.0, None, step, policy_version=None,
                    sample_ids=[t.id for t in self.carry], cut=sorted(pending["cut"]),
                    carried_tokens=sum(len(t.response) for t in self.carry if not t.done))
        if not train:
            return None
        return rl.Samples.concat([t.as_samples() for t in train])

    def _save_carry(self, d: Path, step: int) -> str:
        path = d / f"carry-{step:06d}.json"
        atomic_write_text(path, json.dumps([t.to_dict() for t in self.carry]))
        return str(path)

    def _load_carry(self, latest: dict[str, Any] | None) -> None:
        """The carry as of the checkpoint (nothing before the first one)."""
        path = (latest or {}).get("carry")
        self.carry = ([Traj.from_dict(d) for d in json.loads(Path(path).read_text())]
                      if path else [])
        self.targets.update({t.id: t.target for t in self.carry})
