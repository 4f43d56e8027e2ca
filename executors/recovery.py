"""Recovery paths of the RL loop (a mixin of `executors.loop.Loop`).

  lost process   a trainer or critic rank died (Ray restarts it in its bundle): every training
                 rank re-joins the process group and reloads the last checkpoint; the steps after
                 it run again (`recover_training`);
  lost node      a node left the cluster (its actors cannot come back: their bundles' node is
                 gone): re-plan on the alive nodes, rebuild the groups and actors of the slots
                 that changed, keep the others (`executors.elastic.Elastic`), reload the last
                 checkpoint, run the steps after it again (`recover_cluster`);
  joined node    the same re-plan and rebuild at a step boundary; a checkpoint is written first
                 if the last one is older than the previous step, so nothing is re-run.
Each recovery is a `restart` trace event; a cluster recovery also lands in `Loop.recoveries`
with its measured time (from the moment the loop saw the change until training is restored) and
its parts (re-plan, placement groups, actor start) and the actors it kept.
"""
from __future__ import annotations

import json
import time

from executors.elastic import ClusterChanged
from executors.stragglers import Busy


class TrainingLost(RuntimeError):
    """A trainer or critic rank died; the loop rolls back to the last checkpoint."""


class Recovery:
    """Needs the Loop's rt, by_role, ledger, elastic, known, busy, last_ckpt, lc and helpers."""

    def _check_cluster(self) -> None:
        """Raise ClusterChanged when nodes died or joined (only a re-plan helps then)."""
        change = self.elastic.changed() if self.elastic is not None else None
        if change is not None:
            raise change

    def recover_training(self, step: int, error: str) -> int:
        """Restart every training rank, reload the last checkpoint; returns the step to redo."""
        t = time.time()
        members = self.by_role["actor"] + self.by_role.get("critic", [])
        for m in members:
            # A killed rank comes back on its own (max_restarts); a survivor whose collective
            # failed is alive and re-joins; only one that does not answer is restarted by force.
            try:
                self.rt.wait_alive(m, timeout_s=30.0)
            except Exception:  # noqa: BLE001 - hung (e.g. in a collective that never returns)
                self.rt.restart(m)
        self.setup_training()
        self._restore()
        self.ledger.rollback(self.last_ckpt)
        self.known.clear()
        self._event("restart training", "restart", t, time.time() - t, None, step, error=error,
                    resumed_from=self.last_ckpt, policy_version=self.last_ckpt + 1)
        return self.last_ckpt + 1

    def _restore(self) -> None:
        """Every trainer and critic rank loads the last checkpoint (none yet: version 0), and
        the loop its partial-rollout carry."""
        if self.last_ckpt < 0:
            self._load_carry(None)
            return
        latest = json.loads((self.lc.out_dir / "checkpoints" / "latest.json").read_text())
        self._load_carry(latest)
        outs = self.rt.results([self.rt.call(m, "load", latest["actor"]) for m in self.by_role["actor"]]
                               + [self.rt.call(m, "load", latest["critic"])
                                  for m in self.by_role.get("critic", [])])
        if not all(o.ok for o in outs):
            raise RuntimeError(f"reloading checkpoint failed: {[o.error for o in outs if not o.ok]}")

    def recover_cluster(self, step: int, change: ClusterChanged) -> int:
        """Re-plan on the alive nodes, rebuild actors and groups, restore the last checkpoint;
        returns the step to run next."""
        t = time.time()
        if not change.counts:  # noticed by a call before Ray marked the node dead
            change = self._await_change(change)
        was = self.elastic.planned()
        grown = all(change.counts[p] >= n for p, n in was.items())
        if grown and self.last_ckpt < step - 1:  # a join: nothing is lost, keep every step
            self.checkpoint(step - 1)
        plan, rt, moved = self.elastic.rebuild(change.counts)
        self.plan, self.rt = plan, rt
        self._index_members()
        self.busy, self.known = Busy(), {}
        self.setup_training()
        self._restore()
        self.ledger.rollback(self.last_ckpt)
        rec = {"step": step, "reason": change.reason, "nodes": change.counts,
               "resumed_from": self.last_ckpt, "policy_version": self.last_ckpt + 1,
               "moves": moved, "kept": self.elastic.kept, "detected_at": t,
               "recovery_s": round(time.time() - t, 3), **self.elastic.timing}
        self.recoveries.append(rec)
        self._event("restart cluster", "restart", t, time.time() - t, None, step,
                    **{k: v for k, v in rec.items() if k != "step"})
        if self.note:
            self.note(f"recovered from '{change.reason}' in {rec['recovery_s']:.1f} s: re-planned "
                      f"({'; '.join(moved) or 'no role moved'}; kept "
                      f"{', '.join(self.elastic.kept) or 'no actor'}), resuming at step "
                      f"{self.last_ckpt + 1} from the step-{self.last_ckpt} checkpoint")
        return self.last_ckpt + 1

    def _await_change(self, change: ClusterChanged, timeout_s: float = 120.0) -> ClusterChanged:
        """A call saw its node go before Ray's health check did: wait for Ray to agree."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = self.elastic.changed()
            if now is not None:
                return now
            time.sleep(0.2)
        raise RuntimeError(f"{change.reason}, but Ray still lists every node alive")

