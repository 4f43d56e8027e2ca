"""A role's calls in parallel: injected faults, per-call deadlines, re-runs of lost work.

`Dispatcher.call_all` is how the loop's parts run a batch of calls (one shard per worker) and
read their values:
  faults     a `Fault` of the loop's config for this step and role kills its worker right after
             the batch was dispatched (how recovery is tested: the way it happens);
  deadlines  a role with a per-call deadline races its calls (`executors.stragglers.race`): a call
             still running at the deadline is re-issued to another worker and the first copy to
             finish is taken; each re-issue is a `straggler` trace event on the slow worker's
             track and a row of `Dispatcher.stragglers`; re-issued rollout samples are noted in
             the ledger, counted once;
  lost work  a call whose worker died is re-run on the restarted worker (Ray's `max_restarts`),
             up to the config's `retries`; a lost node is no worker to wait for: ClusterChanged.
`Ran` says which worker's result was taken for each call and which calls were re-run: the trace
puts an event on that worker's track, and the ledger counts a re-run sample once.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from executors.context import Fault, LoopContext
from executors.elastic import ClusterChanged
from executors.placement import Member
from executors.runtime import Handle
from executors.stragglers import Call, race
from placer.base.roles import Role


@dataclass
class Ran:
    """A batch's values, the worker whose result was taken for each call, the re-run calls."""

    values: list[Any]  # what the workers returned
    workers: list[Member]
    rerun: set[int] = field(default_factory=set)


class Dispatcher:
    """Runs batches of calls for the loop's parts; owns the faults still to inject and the
    straggler reports."""

    def __init__(self, ctx: LoopContext, faults: list[Fault]) -> None:
        self.ctx = ctx
        self.faults = list(faults)
        self.stragglers: list[dict[str, object]] = []

    def inject(self, step: int, role: Role) -> None:
        """Kill the workers the config's faults name for this step and role (once each)."""
        for f in [f for f in self.faults if f.step == step and f.role == role]:
            self.faults.remove(f)
            m = self.ctx.by_role[role][f.rank]
            t = time.time()
            self.ctx.rt.kill(m, f.kind)
            self.ctx.event(f"kill {role}{f.rank}", "failure", t, 0.0, m, step, kind=f.kind,
                           policy_version=None)

    def call_all(self, calls: Sequence[Call], step: int, role: Role,
                 on_retry: Callable[[Member], None] | None = None,
                 handles: Sequence[Handle] | None = None) -> Ran:
        """Run calls in parallel (or wait for `handles` already started); a call whose worker
        died is re-run on the restarted worker (after `on_retry`, e.g. a weight re-sync)."""
        rt, lc = self.ctx.rt, self.ctx.lc
        ran = Ran([], [c[0] for c in calls])
        if handles is None:
            handles = [rt.call(m, meth, *args) for m, meth, args in calls]
        self.inject(step, role)
        if lc.deadlines.get(role):
            handles = self._race(calls, handles, step, role, ran)
        outs = rt.results(handles)
        for attempt in range(lc.retries + 1):
            bad = [i for i, o in enumerate(outs) if not o.ok]
            if not bad:
                break
            self.ctx.check_cluster()
            if any(outs[i].lost_node for i in bad):  # Ray has not marked the node dead yet
                raise ClusterChanged({}, outs[bad[0]].error)
            if attempt == lc.retries:
                raise RuntimeError(f"{role}: calls keep failing: {outs[bad[0]].error}")
            for i in bad:
                m, meth, args = calls[i]
                ran.workers[i] = m
                self._await_restart(m, step, outs[i].error)
                if on_retry:
                    on_retry(m)
                self.ctx.counters.reruns += 1
                ran.rerun.add(i)
                outs[i] = rt.results([rt.call(m, meth, *args)])[0]
        ran.values = [o.value for o in outs]
        return ran

    def _await_restart(self, m: Member, step: int, error: str) -> None:
        """Wait for Ray to bring the worker back; a `restart` event on its track."""
        t = time.time()
        try:
            self.ctx.rt.wait_alive(m)
        except Exception:  # its node may have gone meanwhile: check, then re-raise
            self.ctx.check_cluster()
            raise
        self.ctx.event(f"restart {m.role}{m.rank}", "restart", t, time.time() - t, m, step,
                       error=error, policy_version=None)

    def _race(self, calls: Sequence[Call], handles: Sequence[Handle], step: int, role: Role,
              ran: Ran) -> list[Handle]:
        """Per-call deadline: re-issue late calls to another worker (`executors.stragglers`)."""
        ctx = self.ctx

        def can_take(slow: Member, other: Member) -> bool:
            # a rollout must be redone with the same weights; any environment worker will do
            return role != Role.ROLLOUT or ctx.known.get(other.rank) == ctx.known.get(slow.rank)
        out, reissues = race(ctx.rt, list(calls), list(handles), ctx.lc.deadlines[role],
                             can_take, ctx.busy)
        for r in reissues:
            ids = list(calls[r.index][2][0])  # the call's sample ids
            if r.winner == "reissue" and r.to is not None:
                ran.workers[r.index] = r.to
            if role == Role.ROLLOUT and r.to is not None:
                ctx.ledger.reissued(step, ids)
            rep = r.report(step)
            self.stragglers.append(rep)
            # an instant marker on the slow worker's track, at the moment it missed its deadline
            # (zero length: per-role times count the work events, not the waiting)
            ctx.event(f"straggler {rep['slow_worker']}", "straggler", r.t0 + r.deadline_s,
                      0.0, r.slow, step, policy_version=None, sample_ids=ids, straggler=True,
                      **{k: v for k, v in rep.items() if k not in ("step", "role")})
        return out

