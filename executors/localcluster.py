"""A multi-node Ray cluster on one machine, shaped like a plan, whose nodes can die and join.

Node loss is what the executor's recovery is for, and it cannot be shown on one Ray node: this
module starts a `ray.cluster_utils.Cluster` with one Ray node per plan node (a head without
resources, then each node with its pool's resources and node key, `executors.cluster`), runs a
plan on it and changes the cluster at step boundaries: `lose` removes a node without warning
(its raylet and workers are killed, as when a host dies), `join` adds one to a pool. The node-loss
tests and the recovery benchmark (`python -m bench faults`) both run through `run_with_changes`.

Ray declares a node dead after `health_check_failure_threshold` missed checks; the defaults (3 s x
5) would make every recovery wait ~15 s for that, so the cluster checks every second, 3 misses.
Token auth stays on (`cluster.ensure_token_auth`) and every node listens on loopback only.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors import cluster, ray_private
from executors.ray_private import LOOPBACK
from executors.run import execute
from executors.runplan import RunPlan, resolve_plan
from placer.solve.planfile import Plan

FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
               "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}


@dataclass(frozen=True)
class Change:
    """At the boundary before `step`: `lose` node `node` of `pool`, or `join` one to it."""

    step: int
    kind: str  # lose | join
    pool: str
    node: int


@dataclass
class Outcome:
    result: Any  # executors.run.ExecResult
    changed_at: dict[Change, float] = field(default_factory=dict)  # wall time of each change

    def recovery_rows(self) -> list[dict[str, Any]]:
        """Each recovery with the change behind it and how long Ray took to notice."""
        rows = []
        for rec, (ch, t) in zip(self.result.recoveries,
                                sorted(self.changed_at.items(), key=lambda x: x[1])):
            rows.append({"change": f"{ch.kind} {ch.pool}:{ch.node} before step {ch.step}",
                         "noticed_s": round(rec["detected_at"] - t, 2), **rec})
        return rows


class LocalCluster:
    """One Ray node per plan node; `lose` and `join` change it while a run goes on."""

    def __init__(self, run: RunPlan, health: dict[str, int] | None = None,
                 quiet: bool = False) -> None:
        """`quiet`: keep Ray's own logs (workers', and the lost raylet's last words) off this
        process's output, as a benchmark's tables want."""
        import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
        from ray.cluster_utils import Cluster  # lazy: Ray run only
        if quiet:
            logging.getLogger("ray").setLevel(logging.ERROR)
        if ray.is_initialized():
            ray.shutdown()
        cluster.ensure_token_auth()
        ray_private.loopback_only()
        self.c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "node_ip_address": LOOPBACK,
            **ray_private.system_config_args(health or FAST_HEALTH)})
        self.nodes: dict[tuple[str, int], Any] = {}
        self.spec = cluster.node_resources(run)  # what each plan node advertises
        for key in sorted(self.spec):
            self._add(key, self.spec[key])
        ray.init(address=self.c.address, log_to_driver=not quiet)
        self.c.wait_for_nodes()

    def _add(self, key: tuple[str, int], res: dict[str, float]) -> None:
        res = dict(res)
        self.nodes[key] = self.c.add_node(num_cpus=int(res.pop("CPU", 0)),
                                          num_gpus=int(res.pop("GPU", 0)), resources=res,
                                          node_ip_address=LOOPBACK)

    def lose(self, pool: str, node: int) -> None:
        """The node dies as a host does: its raylet and every process below it (the workers
        and what they started) are killed at once. Killing the raylet alone leaves its workers
        running until they notice, long enough on a quiet machine to finish the run's steps."""
        n = self.nodes.pop((pool, node))
        doomed = _descendants(n.all_processes["raylet"][0].process.pid)
        self.c.remove_node(n, allow_graceful=False)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def join(self, pool: str, node: int) -> None:
        """A node like the pool's first, advertising the pool and its own node key."""
        like = next(r for (p, _), r in sorted(self.spec.items()) if p == pool)
        res = {k: v for k, v in like.items() if not k.startswith("placer_node_")}
        self._add((pool, node), {**res, cluster.node_key(pool, node): cluster.NODE_UNITS})

    def close(self) -> None:
        import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
        ray.shutdown()
        self.c.shutdown()


def run_with_changes(plan: Plan, steps: int, out: str | Path, changes: list[Change],
                     note: Callable[[str], None] | None = None, quiet: bool = False,
                     **execute_kw: Any) -> Outcome:
    """Run `plan` for `steps` on a fresh local cluster, applying `changes` at step boundaries."""
    lc = LocalCluster(resolve_plan(plan), quiet=quiet)
    done: dict[Change, float] = {}

    def on_step(step: int) -> None:
        for ch in changes:
            if ch.step == step and ch not in done:
                (lc.lose if ch.kind == "lose" else lc.join)(ch.pool, ch.node)
                done[ch] = time.time()

    try:
        result = execute(plan, steps, out, on_step=on_step, note=note, **execute_kw)
    finally:
        lc.close()
    return Outcome(result, done)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from Linux's /proc (each process's parent in its `stat`)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile, or unreadable
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
