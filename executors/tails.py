"""Slow calls and long tails in the RL loop (a mixin of `executors.loop.Loop`).

  deadlines      `_race`: a rollout or environment call still running at its role's deadline is
                 re-issued to another worker (`executors.stragglers.race`); each re-issue is a
                 `straggler` trace event on the slow worker's track and a row of
                 `Loop.stragglers`; re-issued rollout samples are noted in the ledger, counted once;
  overprovision  `launch_rollout` plans ceil(n (1 + f)) samples (`overprovision_extra`);
                 `_first_shards` waits for rollout shards in finish order until they hold n
                 samples and abandons the rest; `_keep_first` keeps the first n to finish (within
                 a shard's lockstep decode a sample is done when it emits EOS: shorter is sooner);
                 the others are `dropped` in the ledger and never trained.
  partial        every rollout call stops a sample once it generated `token_budget` tokens in
                 this step (`rl.Resume`); a cut sample is *carried*: next step it is resumed
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from executors import rl
from executors.placement import Member
from executors.stragglers import race
from placer.plan import atomic_write_text


def overprovision_extra(tail_policy: Any, n: int) -> int:
    """Samples generated beyond the `n` a step trains on: ceil(n (1 + f)) - n for an
    `overprovision` tail policy with fraction f, else 0."""
    if tail_policy.kind != "overprovision" or not tail_policy.fraction:
        return 0
    return math.ceil(n * (1 + tail_policy.fraction) - 1e-9) - n


def carry_steps(tail_policy: Any, max_new: int) -> int:
    """Steps a partial rollout's sample may wait beyond its own: a carried sample gains at least
    `token_budget` tokens per step until EOS or `max_new`, so it (and the group it holds back)
    is done within ceil(max_new / budget) steps; 0 for other policies."""
    if tail_policy.kind != "partial":
        return 0
    return max(math.ceil(max_new / tail_policy.token_budget) - 1, 0)


@dataclass
class Carried:
    """A sample a step did not train: cut at the token budget, or finished (`done`) and waiting
    for a cut sibling of its group."""

    id: str
    group: str
    prompt: list[int]
    target: int
    seed: int  # its first call's sampling seed (`rl.resume_seed` derives the next ones)
    response: list[int]
    logprobs: list[float]
    started: int  # version of its first token
    version: int  # version of its newest token
    done: bool

    def as_samples(self) -> rl.Samples:
        return rl.Samples([self.id], [self.prompt], [self.response], [self.logprobs],
                          self.version, [self.group], [self.started], [False])


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

    def _first_shards(self, step: int, calls: list[tuple[Member, str, tuple]], keep: int
                      ) -> tuple[list[tuple[Member, str, tuple]], list[Any]]:
        """Overprovision: wait for rollout shards in the order they finish until they hold
        `keep` samples; the later shards are abandoned (cancelled, their workers busy)."""
        handles = [self.rt.call(m, meth, *args) for m, meth, args in calls]
        left, order, have = list(range(len(calls))), [], 0
        while have < keep:
            i = left.pop(self.rt.first([handles[j] for j in left]))
            order.append(i)
            have += len(calls[i][2][0])
        for i in left:
            self.rt.cancel(handles[i])
            self.busy.add(calls[i][0], handles[i])
        if left:
            ids = [x for i in left for x in calls[i][2][0]]
            self.ledger.dropped(step, ids)
            self._event("overprovision: abandon", "tail", time.time(), 0.0, None, step,
                        policy_version=None, sample_ids=ids)
        return [calls[i] for i in order], [handles[i] for i in order]

    def _keep_first(self, step: int, s: rl.Samples, parts: list[rl.Samples], keep: int
                    ) -> rl.Samples:
        """Overprovision: the first `keep` samples to finish. Shards come in finish order; in a
        shard's lockstep decode a sample is done at the step it emits EOS (shorter: sooner)."""
        shard = [k for k, p in enumerate(parts) for _ in p.ids]  # `s` is `parts` concatenated
        order = sorted(range(len(s.ids)), key=lambda i: (shard[i], len(s.responses[i]), i))
        kept = sorted(order[:keep])
        dropped = [s.ids[i] for i in order[keep:]]
        self.ledger.dropped(step, dropped)
        self._event("overprovision: keep first", "tail", time.time(), 0.0, None, step,
                    policy_version=s.version, sample_ids=dropped, kept=keep)
        return s.take(kept)


    # ------------------------------------------------------------------ partial rollouts
    def _partial_budget(self) -> int | None:
        tp = self.job.tail_policy
        return tp.token_budget if tp.kind == "partial" else None

    def _resumed_rows(self) -> list[dict[str, Any]]:
        """The carried samples still generating, as rollout rows (resumed before fresh ones)."""
        return [{"id": c.id, "group": c.group, "toks": c.prompt, "target": c.target,
                 "seed": c.seed, "carried": c} for c in self.carry if not c.done]

    def _resume_args(self, rows: list[dict[str, Any]]) -> tuple[list[int], rl.Resume]:
        """Sampling seeds and the `rl.Resume` of a rollout call's rows."""
        cs = [r.get("carried") for r in rows]
        seeds = [rl.resume_seed(r["seed"], len(c.response) if c else 0) for r, c in zip(rows, cs)]
        return seeds, rl.Resume([c.response if c else [] for c in cs],
                                [c.logprobs if c else [] for c in cs],
                                [c.started if c else None for c in cs], self._partial_budget())

    def _settle_partial(self, step: int, s: rl.Samples, pending: dict[str, Any]
                        ) -> rl.Samples | None:
        """Split a partial step's samples into what it trains (finished samples of complete
        groups, with finished ones carried from earlier) and the new carry; None when no group
        is complete yet (the caller runs another round)."""
        held = [c for c in self.carry if c.done]
        rows = {c.id: c for c in self.carry}
        carry: list[Carried] = []
        for i, sid in enumerate(s.ids):
            old = rows.get(sid)
            carry.append(Carried(sid, s.group[i], s.prompts[i], self.targets[sid],
                                 old.seed if old else pending["seeds"][sid], s.responses[i],
                                 s.logprobs[i], s.started_at(i), s.version, not s.is_cut(i)))
        # GRPO's advantage needs the whole group's rewards; PPO's needs only the sample's own
        unit = (lambda c: c.id) if self.cfg.algorithm == "ppo" else (lambda c: c.group)
        waiting = {unit(c) for c in carry if not c.done}
        everyone = held + carry
        train = [c for c in everyone if unit(c) not in waiting]
        self.carry = [c for c in everyone if unit(c) in waiting]
        self.ledger.carried_out(step, [c.id for c in self.carry])
        cut = [c.id for c in carry if not c.done]
        self._event("partial: carry", "tail", time.time(), 0.0, None, step,
                    policy_version=s.version, sample_ids=[c.id for c in self.carry], cut=cut,
                    carried_tokens=sum(len(c.response) for c in self.carry if not c.done))
        if not train:
            return None
        return rl.Samples.concat([c.as_samples() for c in train])

    def _save_carry(self, d: Path, step: int) -> str:
        path = d / f"carry-{step:06d}.json"
        atomic_write_text(path, json.dumps([asdict(c) for c in self.carry]))
        return str(path)

    def _load_carry(self, latest: dict[str, Any] | None) -> None:
        """The carry as of the checkpoint (nothing before the first one)."""
        path = (latest or {}).get("carry")
        self.carry = ([Carried(**c) for c in json.loads(Path(path).read_text())]
                      if path else [])
        self.targets.update({c.id: c.target for c in self.carry})
