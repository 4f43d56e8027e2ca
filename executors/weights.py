"""Versioned weight sync: the trainer's weights to every rollout worker that lacks them.

Version v is the number of optimizer steps so far. A refresh streams the weights from the
trainer's senders (each pipeline stage's first rank when bucketed, rank 0 otherwise) in buckets
of the plan's `sync_bucket_gb` to every rollout engine of every part (`executors.reshard`): one
call per bucket and engine, through Ray's object store (the driver passes each bucket's
reference on; it never holds the tensors). The bucket size is each engine's own device's: the
parts of a split rollout on different device types each get a stream of their own. Each
engine's `weight sync` trace event carries the bytes it received, the calls per sender
(`calls`), the senders, and its node (`dst` pool:node); its time runs from the refresh's start
to the engine's last bucket loaded, as `placer.calibrate.fit_events` prices it
(`costmodel.transfer_time`: the wire, `sync_latency_s`, and per further call `costmodel.sync_call_cost`).
The context's `known` records the version each rollout worker holds, so a worker that has v is
skipped; one still busy with an abandoned straggler call is synced later (`known` None), and one
that died while loading re-syncs before its next work.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from executors.context import LoopContext, TrainingLost
from executors.placement import Member
from executors.runplan import RunPlan
from executors.runtime import Handle
from placer.base.roles import Role


def bucket_bytes(run: RunPlan, pool: str | None = None) -> int:
    """The refresh's bucket size in bytes for engines on `pool` (default: the rollout's pool):
    the plan's `sync_bucket_gb` for that pool's device, as `placer.cost.timing.sync_time` prices
    each part of a split rollout with its own device's (0: a call per tensor)."""
    rollout = run.roles.get(Role.ROLLOUT)
    if rollout is None:
        return 0
    return run.pools[pool if pool is not None else rollout.pool].sync_bucket_bytes


def by_bucket(run: RunPlan, targets: list[Member]) -> dict[int, list[Member]]:
    """The targets grouped by their bucket size (each engine's own pool's device: the parts of
    a split rollout may differ), in first-seen order."""
    out: dict[int, list[Member]] = {}
    for m in targets:
        out.setdefault(bucket_bytes(run, m.bundle.pool), []).append(m)
    return out


class WeightSync:
    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx
        self.refreshes = 0

    def _trainer_call(self, m: Member, method: str, *args: object) -> Any:
        out = self.ctx.rt.results([self.ctx.rt.call(m, method, *args)])[0]
        if not out.ok:
            raise TrainingLost(out.error)
        return out.value

    def sync(self, step: int, force: Member | None = None) -> int:
        """Send the trainer's version to the free rollout workers without it (and to `force`);
        returns the version."""
        ctx = self.ctx
        t = time.time()
        actors = ctx.by_role[Role.ACTOR]
        version = int(self._trainer_call(actors[0], "weights_info")[0])
        rollouts = ctx.by_role[Role.ROLLOUT]
        free = ctx.busy.free(ctx.rt, rollouts)
        for m in rollouts:
            if all(m is not f for f in free):  # still busy with an abandoned call: sync later
                ctx.known[m.rank] = None
        targets = [m for m in free if m is force or ctx.known.get(m.rank) != version]
        ctx.synced = version
        if not targets:
            return int(version)
        # one stream per bucket size: a split rollout's parts each get their device's buckets
        groups = by_bucket(ctx.run, targets)
        outs = [o for size, ms in groups.items() for o in self._stream(ms, int(version), size)]
        targets = [m for ms in groups.values() for m in ms]
        failed = []
        for m, (err, got) in zip(targets, outs):
            if err is not None:  # a rollout worker died while loading: it re-syncs first
                ctx.known[m.rank] = None
                failed.append(err)
                continue
            ctx.known[m.rank] = version
            ctx.event("weight sync", "transfer", t, max(got["end"] - t, 0.0), m, step,
                      policy_version=version, bytes=got["bytes"], calls=got["calls"],
                      senders=got["senders"], src=got["src"], dst=m.trace_pid)
        if failed and not any(ctx.known.get(m.rank) == version for m in rollouts):
            # No rollout worker holds version v: the trainer's copy was lost with its process or
            # its node (a process can answer for a moment after its node is gone). Rolling
            # out with older weights would break the mode's staleness bound: recover instead.
            ctx.check_cluster()
            raise TrainingLost(f"weight sync of version {version} reached no rollout worker: "
                               f"{failed[0]}")
        ctx.event("sync", "stage", t, time.time() - t, None, step, policy_version=version)
        ctx.synced = version
        return int(version)

    def _stream(self, targets: list[Member], version: int, size: int
                ) -> list[tuple[str | None, dict[str, Any]]]:
        """One refresh (`executors.reshard`): every sender's buckets of `size` bytes, in order,
        to every target; per target (error or None, {end, bytes, calls, senders, src}). The
        trainer holds one open stream per sender: a second refresh opens after the first's
        bucket calls, which its actor runs first (an actor runs its calls in order)."""
        ctx, rt = self.ctx, self.ctx.rt
        actors = {m.rank: m for m in ctx.by_role[Role.ACTOR]}
        ranks = self._trainer_call(actors[min(actors)], "sync_senders", size > 0)
        senders = [actors[r] for r in ranks]
        opened = [self._trainer_call(s, "sync_open", size, i) for i, s in enumerate(senders)]
        counts = [int(o[2]) for o in opened]
        self.refreshes += 1
        refresh = f"v{version}.{self.refreshes}"
        handles: list[list[Handle]] = [[] for _ in targets]
        for k in range(max(counts)):  # the streams interleaved: they run in parallel
            for i, s in enumerate(senders):
                if k < counts[i]:
                    ref = rt.call(s, "sync_bucket", k)
                    for hs, m in zip(handles, targets):
                        hs.append(rt.call(m, "receive_bucket", ref, version, len(senders), refresh))
                    rt.forget(ref)
        src = ",".join(f"{s.role}{s.rank}" for s in senders)
        out: list[tuple[str | None, dict[str, Any]]] = []
        for hs in handles:
            res = rt.results(hs)
            bad = next((o.error for o in res if not o.ok), None)
            if bad is None and not res[-1].value["done"]:
                bad = "the refresh ended before every stream was received"
            vals = [o.value for o in res if o.ok]
            out.append((bad, {"end": max((v["t0"] + v["dur"] for v in vals), default=0.0),
                              "bytes": sum(v["bytes"] for v in vals), "calls": max(counts),
                              "senders": len(senders), "src": src}))
        return out

    def resync(self, step: int) -> Callable[[Member], None]:
        """What a rollout call's re-run needs first: its restarted worker holds no weights."""
        def fix(m: Member) -> None:
            self.ctx.known[m.rank] = None
            self.sync(step, force=m)
        return fix
