"""Recovery paths of the RL loop (`Recovery`, which `executors.loop.Loop` calls).

  lost process   a trainer or critic rank died (Ray restarts it in its bundle): every training
                 rank re-joins the process group and reloads the last checkpoint; the steps after
                 it run again (`Recovery.recover_training`);
  lost node      a node left the cluster (its actors cannot come back: their bundles' node is
                 gone): re-plan on the alive nodes, rebuild the groups and actors of the slots
                 that changed, keep the others (`executors.elastic.Elastic`), reload the last
                 checkpoint, run the steps after it again (`Recovery.recover_cluster`);
  joined node    the same re-plan and rebuild at a step boundary; a checkpoint is written first
                 if the last one is older than the previous step, so nothing is re-run.
Each recovery is a `restart` trace event; a cluster recovery also lands in `Recovery.recoveries`
with its measured time (from the moment the loop saw the change until training is restored) and
its parts (re-plan, placement groups, actor start) and the actors it kept.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from executors.context import LoopContext, TrainingLost
from executors.elastic import ClusterChanged, Elastic
from executors.training import Checkpoints, Training
from placer.base.roles import Role

__all__ = ["Recovery", "TrainingLost"]


class Recovery:
    """Brings training back after a lost process or a changed cluster; returns the step to
    run next. Owns the report of each cluster recovery."""

    def __init__(self, ctx: LoopContext, training: Training, checkpoints: Checkpoints,
                 note: Callable[[str], None] | None = None) -> None:
        self.ctx, self.training, self.checkpoints, self.note = ctx, training, checkpoints, note
        self.recoveries: list[dict[str, object]] = []

    def _resume(self) -> int:
        """Every training rank in its group, at the last checkpoint; the ledger forgets the
        steps after it. The step to redo."""
        self.training.setup()
        self.checkpoints.restore()
        self.ctx.ledger.rollback(self.checkpoints.last)
        return self.checkpoints.last + 1

    def recover_training(self, step: int, error: str) -> int:
        """Restart every training rank, reload the last checkpoint; returns the step to redo."""
        ctx, t = self.ctx, time.time()
        for m in ctx.by_role[Role.ACTOR] + ctx.workers(Role.CRITIC):
            # A killed rank comes back on its own (max_restarts); a survivor whose collective
            # failed is alive and re-joins; only one that does not answer is restarted by force.
            try:
                ctx.rt.wait_alive(m, timeout_s=30.0)
            except Exception:  # noqa: BLE001 - hung (e.g. in a collective that never returns)
                ctx.rt.restart(m)
        resume = self._resume()
        ctx.known.clear()
        ctx.event("restart training", "restart", t, time.time() - t, None, step, error=error,
                  resumed_from=resume - 1, policy_version=resume)
        return resume

    def recover_cluster(self, step: int, change: ClusterChanged) -> int:
        """Re-plan on the alive nodes, rebuild actors and groups, restore the last checkpoint;
        returns the step to run next."""
        ctx, t = self.ctx, time.time()
        elastic = ctx.elastic
        if elastic is None:  # only the Ray runtime loses nodes, and it always comes with one
            raise RuntimeError(f"{change.reason}: this runtime cannot re-plan") from change
        if not change.counts:  # noticed by a call before Ray marked the node dead
            change = self._await_change(elastic, change)
        was = elastic.planned()
        grown = all(change.counts[p] >= n for p, n in was.items())
        if grown and self.checkpoints.last < step - 1:  # a join: nothing is lost, keep every step
            self.checkpoints.save(step - 1)
        run, rt, moved = elastic.rebuild(change.counts)
        ctx.replace_world(run, rt)
        resume = self._resume()
        rec: dict[str, object] = {
            "step": step, "reason": change.reason, "nodes": change.counts,
            "resumed_from": resume - 1, "policy_version": resume, "moves": moved,
            "kept": elastic.kept, "detected_at": t, "recovery_s": round(time.time() - t, 3),
            **elastic.timing}
        self.recoveries.append(rec)
        ctx.event("restart cluster", "restart", t, time.time() - t, None, step,
                  **{k: v for k, v in rec.items() if k != "step"})
        if self.note:
            self.note(f"recovered from '{change.reason}' in {rec['recovery_s']:.1f} s: re-planned "
                      f"({'; '.join(moved) or 'no role moved'}; kept "
                      f"{', '.join(elastic.kept) or 'no actor'}), resuming at step "
                      f"{resume} from the step-{resume - 1} checkpoint")
        return resume

    @staticmethod
    def _await_change(elastic: Elastic, change: ClusterChanged,
                      timeout_s: float = 120.0) -> ClusterChanged:
        """A call saw its node go before Ray's health check did: wait for Ray to agree."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = elastic.changed()
            if now is not None:
                return now
            time.sleep(0.2)
        raise RuntimeError(f"{change.reason}, but Ray still lists every node alive")
