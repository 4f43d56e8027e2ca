"""Where role workers live and how the loop calls them: Ray actors, or plain objects in-process.

The RL loop (`executors.loop`) is written once against `Runtime`: `call` starts a method on a
worker and returns a handle, `results` waits for several and says which ones lost their worker.
`RayRuntime` creates one actor per `placement.Member` in its placement-group bundle, with
`max_restarts` (Ray re-creates a dead actor in the same bundle; the loop re-runs its lost work);
`LocalRuntime` holds the same worker classes in this process (the benchmark's baseline and quick
tests of the math). Fault injection (`kill`) exists so that recovery is tested the way it happens:
`ray.kill` of an actor, or SIGKILL to its worker process.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from executors.placement import Member, PlacementError, actor_options, assign
from executors.roles import (Critic, EnvWorker, ModelReward, Reference, Rollout, RuleReward,
                             RunConfig, Trainer)
from placer.plan import Plan


@dataclass
class Outcome:
    ok: bool
    value: Any = None
    error: str = ""


def worker_class(role: str, cfg: RunConfig, backend: str) -> type:
    if role == "rollout" and backend == "vllm":
        from executors.vllm_rollout import VllmRollout  # noqa: PLC0415  (gpu extra)
        return VllmRollout
    if role == "reward":
        return RuleReward if cfg.reward_arch is None else ModelReward
    return {"actor": Trainer, "rollout": Rollout, "reference": Reference, "critic": Critic,
            "environment": EnvWorker}[role]


def worker_args(m: Member, cfg: RunConfig, members: list[Member]) -> tuple:
    if m.role == "actor":
        return cfg, m.rank, sum(1 for x in members if x.role == "actor")
    return cfg, m.rank


class LocalRuntime:
    """All workers as plain objects in this process; calls run when made."""

    kind = "local"

    def __init__(self, plan: Plan, cfg: RunConfig, backend: str = "torch") -> None:
        # One worker per role: a single process has one trainer over the whole batch.
        self.members = [m for m in assign(plan) if m.rank == 0]
        for m in self.members:
            m.handle = worker_class(m.role, cfg, backend)(*worker_args(m, cfg, self.members))

    def call(self, m: Member, method: str, *args: Any) -> Outcome:
        # An earlier call's result passed as an argument (Ray resolves object refs the same way).
        args = tuple(a.value if isinstance(a, Outcome) else a for a in args)
        try:
            return Outcome(True, getattr(m.handle, method)(*args))
        except Exception as e:  # noqa: BLE001 - reported like a lost remote call
            return Outcome(False, error=f"{type(e).__name__}: {e}")

    def results(self, handles: list[Outcome]) -> list[Outcome]:
        return handles

    def put(self, obj: Any) -> Any:
        return obj

    def kill(self, m: Member, how: str) -> None:
        raise RuntimeError("fault injection needs the Ray runtime")

    def restart(self, m: Member) -> None:
        """A local worker cannot die; nothing to do."""

    def wait_alive(self, m: Member, timeout_s: float = 0.0) -> None:
        """Always alive."""

    def close(self) -> None:
        self.members = []


class RayRuntime:
    """One Ray actor per member, in its placement-group bundle."""

    kind = "ray"

    def __init__(self, plan: Plan, cfg: RunConfig, groups: dict[str, Any], pinned: bool,
                 backend: str = "torch", max_restarts: int = 3,
                 start_timeout_s: float = 180.0) -> None:
        import ray  # noqa: PLC0415
        self.ray = ray
        self.members = assign(plan)
        for m in self.members:
            cls = ray.remote(worker_class(m.role, cfg, backend))
            opts = actor_options(m, groups[m.slot], pinned)
            m.handle = cls.options(max_restarts=max_restarts, max_task_retries=0,
                                   name=None, **opts).remote(*worker_args(m, cfg, self.members))
        try:  # all constructed (an actor whose resources the bundle lacks would wait forever)
            pids = ray.get([m.handle.pid.remote() for m in self.members], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise PlacementError(f"role actors not started after {start_timeout_s:.0f}s: a bundle "
                                 "lacks the resources its actors ask for") from None
        # Worker pids, known before any work is in flight: a busy actor answers nothing else.
        self.pids = {id(m): pid for m, pid in zip(self.members, pids)}

    def call(self, m: Member, method: str, *args: Any) -> Any:
        return getattr(m.handle, method).remote(*args)

    def results(self, handles: list[Any]) -> list[Outcome]:
        out = []
        for h in handles:
            try:
                out.append(Outcome(True, self.ray.get(h)))
            except self.ray.exceptions.RayActorError as e:
                out.append(Outcome(False, error=f"{type(e).__name__}: {str(e).splitlines()[0]}"))
            except self.ray.exceptions.RayTaskError as e:
                # A dying peer (a gloo rank whose partner was killed) fails the call, not the actor.
                out.append(Outcome(False, error=f"{type(e).__name__}: {str(e).splitlines()[0]}"))
        return out

    def put(self, obj: Any) -> Any:
        return self.ray.put(obj)

    def kill(self, m: Member, how: str) -> None:
        """Fault injection: `ray.kill` (Ray restarts it) or SIGKILL to the worker process."""
        if how == "ray.kill":
            self.ray.kill(m.handle, no_restart=False)
        elif how == "signal":
            os.kill(self.pids[id(m)], signal.SIGKILL)
        else:
            raise ValueError(f"unknown fault kind {how!r} (ray.kill or signal)")

    def restart(self, m: Member, timeout_s: float = 120.0) -> None:
        """Force a restart (a hung gloo peer) and wait until the actor answers again."""
        try:
            self.ray.kill(m.handle, no_restart=False)
        except Exception:  # noqa: BLE001 - already dead and restarting
            pass
        self.wait_alive(m, timeout_s)

    def wait_alive(self, m: Member, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.pids[id(m)] = self.ray.get(m.handle.pid.remote(), timeout=10)
                return
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        for m in self.members:
            try:
                self.ray.kill(m.handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.members = []
