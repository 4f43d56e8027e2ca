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
"""
from __future__ import annotations

import math
import time
from typing import Any

from executors import rl
from executors.placement import Member
from executors.stragglers import race


def overprovision_extra(tail_policy: Any, n: int) -> int:
    """Samples generated beyond the `n` a step trains on: ceil(n (1 + f)) - n for an
    `overprovision` tail policy with fraction f, else 0."""
    if tail_policy.kind != "overprovision" or not tail_policy.fraction:
        return 0
    return math.ceil(n * (1 + tail_policy.fraction) - 1e-9) - n


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

