"""Versioned weight sync: trainer rank 0's weights to every rollout worker that lacks them.

Version v is the number of optimizer steps so far. The weights go from the trainer's process to
each rollout worker through Ray's object store (the driver passes the reference on; it never
holds the tensors). The context's `known` records the version each rollout worker holds, so a
worker that has v is skipped; one still busy with an abandoned straggler call is synced later
(`known` None), and one that died while loading re-syncs before its next work.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from executors.context import LoopContext, TrainingLost
from executors.placement import Member
from placer.roles import Role


class WeightSync:
    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx

    def sync(self, step: int, force: Member | None = None) -> int:
        """Send the trainer's version to the free rollout workers without it (and to `force`);
        returns the version."""
        ctx = self.ctx
        t = time.time()
        trainer = ctx.by_role[Role.ACTOR][0]
        out = ctx.rt.results([ctx.rt.call(trainer, "weights_info")])[0]
        if not out.ok:
            raise TrainingLost(out.error)
        version, nbytes = out.value
        rollouts = ctx.by_role[Role.ROLLOUT]
        free = ctx.busy.free(ctx.rt, rollouts)
        for m in rollouts:
            if all(m is not f for f in free):  # still busy with an abandoned call: sync later
                ctx.known[m.rank] = None
        targets = [m for m in free if m is force or ctx.known.get(m.rank) != version]
        ctx.synced = version
        if not targets:
            return int(version)
        ref = ctx.rt.call(trainer, "weights")
        outs = ctx.rt.results([ctx.rt.call(m, "load_weights", ref, version) for m in targets])
        ctx.rt.forget(ref)
        failed = []
        for m, o in zip(targets, outs):
            if not o.ok:  # a rollout worker died while loading: it re-syncs before its next work
                ctx.known[m.rank] = None
                failed.append(o.error)
                continue
            ctx.known[m.rank] = version
            ctx.event("weight sync", "transfer", o.value["t0"], o.value["dur"], m, step,
                      policy_version=version, bytes=nbytes, src="actor0")
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

    def resync(self, step: int) -> Callable[[Member], None]:
        """What a rollout call's re-run needs first: its restarted worker holds no weights."""
        def fix(m: Member) -> None:
            self.ctx.known[m.rank] = None
            self.sync(step, force=m)
        return fix
