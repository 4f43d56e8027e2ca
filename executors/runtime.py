"""Where role workers live and how the loop calls them: Ray actors, or plain objects in-process.

The RL loop (`executors.loop`) is written once against `Runtime`: `call` starts a method on a
worker and returns a handle, `results` waits for several and says which ones lost their worker.
`RayRuntime` creates one actor per seat of the run plan (`placement.Member`) in its
placement-group bundle, with
`max_restarts` (Ray re-creates a dead actor in the same bundle; the loop re-runs its lost work);
`LocalRuntime` holds the same worker classes in this process (the benchmark's baseline and quick
tests of the math). Both satisfy the `Runtime` protocol, the only view of a runtime the loop and
its parts (`executors.context`) have. Fault injection (`kill`) exists so that recovery is tested
the way it happens: `ray.kill` of an actor, or SIGKILL to its worker process.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from executors.backends import Backend, backend_of
from executors.critic import Critic
from executors.judge import Judge
from executors.modelroles import ModelReward, Reference
from executors.placement import Member, PlacementError, actor_options, assign
from executors.roles import EnvWorker, RuleReward, RunConfig
from executors.runplan import RoleRun, RunPlan
from executors.trainer import Trainer
from placer.base.roles import Role

if TYPE_CHECKING:
    from ray import ObjectRef


@dataclass
class Outcome:
    ok: bool
    value: Any = None
    error: str = ""
    lost_node: bool = False  # the worker's node left the cluster: only a re-plan helps


# An in-flight call: a Ray ObjectRef, or the `Outcome` of a call that already ran (local). The
# loop only hands it back to the runtime that made it, or passes it on as a call's argument.
Handle = object


class Calls(Protocol):
    """Calls to workers by method name: what a weight refresh (`executors.weights`) needs."""

    def call(self, m: Member, method: str, *args: object) -> Handle:
        """Start `method` on the member's worker; a handle's argument is resolved first."""

    def results(self, handles: Sequence[Handle]) -> list[Outcome]:
        """Wait for every call; which ones failed, and which lost their worker's node."""

    def forget(self, handle: Handle) -> None:
        """A call whose result is consumed elsewhere (passed on to other workers)."""


class Runtime(Calls, Protocol):
    """Where the loop's calls run: one worker per `Member`, called by method name."""

    kind: str  # local | ray (a test's runtime names itself too)
    members: list[Member]
    concurrent: bool  # calls run at once (collectives across workers can pair up)

    def wait(self, handles: Sequence[Handle], timeout_s: float) -> list[bool]:
        """Which calls finished within `timeout_s` (from now)."""

    def first(self, handles: Sequence[Handle]) -> int:
        """Index of the first of `handles` to finish."""

    def cancel(self, handle: Handle) -> None:
        """Best effort: an abandoned call is dropped, or left to finish unread."""

    def dead_members(self) -> list[Member]:
        """Members whose node is no longer alive."""

    def kill(self, m: Member, how: str) -> None:
        """Fault injection: `ray.kill` or `signal` (SIGKILL to the worker's process)."""

    def restart(self, m: Member) -> None:
        """Force a restart of a hung worker and wait until it answers."""

    def wait_alive(self, m: Member, timeout_s: float = ...) -> None:
        """Wait until a restarted worker answers (raises when it cannot come back)."""

    def close(self) -> None:
        """Kill every worker."""


def _ran(h: Handle) -> Outcome:
    """A local handle: the call ran when it was made."""
    if not isinstance(h, Outcome):
        raise TypeError(f"not a local call's handle: {type(h).__name__}")
    return h


def worker_spec(m: Member, cfg: RunConfig, rollout: RoleRun | None, backend: Backend,
                members: Sequence[Member]) -> tuple[type, tuple[object, ...]]:
    """The class of a member's worker and its constructor's arguments: a rollout engine is the
    backend's, with its own engine group's config (`rollout`: the run plan's rollout role; a
    split rollout's part); a trainer rank learns the world its runtime made (`members`: one
    rank in the one-process runtime)."""
    if m.role == Role.ROLLOUT and rollout is not None:
        return backend.rollout_worker(cfg, rollout.group_of(m.rank), m.rank)
    if m.role in (Role.ACTOR, Role.CRITIC):  # a trainer's or a CP critic's group
        cls = Trainer if m.role == Role.ACTOR else Critic
        return cls, (cfg, m.rank, sum(1 for x in members if x.role == m.role))
    if m.role == Role.REWARD:
        if cfg.judge is not None:
            return Judge, (cfg, m.rank)
        return (RuleReward if cfg.reward_arch is None else ModelReward), (cfg, m.rank)
    workers: dict[str, type] = {Role.REFERENCE: Reference, Role.ENVIRONMENT: EnvWorker}
    return workers[m.role], (cfg, m.rank)


class LocalRuntime:
    """All workers as plain objects in this process; calls run when made."""

    kind = "local"
    concurrent = False  # a call runs when made: a collective's peers would wait forever

    def __init__(self, run: RunPlan, cfg: RunConfig, backend: Backend | None = None) -> None:
        # One worker per role: a single process has one trainer over the whole batch.
        chosen, rollout = backend or backend_of(), run.roles.get(Role.ROLLOUT)
        self.members = [m for m in assign(run.seats) if m.rank == 0]
        for m in self.members:
            cls, args = worker_spec(m, cfg, rollout, chosen, self.members)
            m.handle = cls(*args)

    def call(self, m: Member, method: str, *args: object) -> Outcome:
        # An earlier call's result passed as an argument (Ray resolves object refs the same way).
        args = tuple(a.value if isinstance(a, Outcome) else a for a in args)
        try:
            return Outcome(True, getattr(m.handle, method)(*args))
        except Exception as e:  # noqa: BLE001 - reported like a lost remote call
            return Outcome(False, error=f"{type(e).__name__}: {e}")

    def results(self, handles: Sequence[Handle]) -> list[Outcome]:
        return [_ran(h) for h in handles]

    def wait(self, handles: Sequence[Handle], timeout_s: float) -> list[bool]:
        """Calls ran when they were made: all are done."""
        return [True] * len(handles)

    def cancel(self, handle: Handle) -> None:
        """Nothing runs in the background."""

    def forget(self, handle: Handle) -> None:
        """Nothing is tracked."""

    def first(self, handles: Sequence[Handle]) -> int:
        return 0

    def dead_members(self) -> list[Member]:
        return []

    def kill(self, m: Member, how: str) -> None:
        raise RuntimeError("fault injection needs the Ray runtime")

    def restart(self, m: Member) -> None:
        """A local worker cannot die; nothing to do."""

    def wait_alive(self, m: Member, timeout_s: float = 0.0) -> None:
        """Always alive."""

    def close(self) -> None:
        self.members = []


class RayCalls:
    """Calls to started Ray actors (`Member.handle`) by method name, each outcome read as the
    loop reads it: a failed call or a dead actor is an `Outcome` with its error, not a raise.
    The multi-agent driver's weight refreshes (`executors.agentrun`) run over this alone."""

    concurrent = True

    def __init__(self) -> None:
        import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
        self.ray = ray
        self._owner: dict[Handle, Member] = {}  # in-flight call -> the member running it

    def call(self, m: Member, method: str, *args: object) -> Handle:
        h: Handle = getattr(m.handle, method).remote(*args)
        self._owner[h] = m
        return h

    def forget(self, handle: Handle) -> None:
        """A call whose result is consumed elsewhere (passed on to other actors)."""
        self._owner.pop(handle, None)

    def _outcome(self, h: Handle) -> Outcome:
        self._owner.pop(h, None)
        try:
            return Outcome(True, self.ray.get(cast("ObjectRef[Any]", h)))
        except self.ray.exceptions.RayActorError as e:
            return Outcome(False, error=f"{type(e).__name__}: {str(e).splitlines()[0]}")
        except self.ray.exceptions.RayTaskError as e:
            # A dying peer (a gloo rank whose partner was killed) fails the call, not the actor.
            return Outcome(False, error=f"{type(e).__name__}: {str(e).splitlines()[0]}")

    def results(self, handles: Sequence[Handle]) -> list[Outcome]:
        return [self._outcome(h) for h in handles]


class RayRuntime(RayCalls):
    """One Ray actor per member, in its placement-group bundle."""

    kind = "ray"

    def __init__(self, run: RunPlan, cfg: RunConfig, groups: dict[str, Any], pinned: bool,
                 backend: Backend | None = None, max_restarts: int = 3,
                 start_timeout_s: float = 180.0, reuse: dict[tuple[str, int], Any] | None = None,
                 concurrency: dict[str, int] | None = None) -> None:
        """`reuse`: (role, rank) -> a running actor to keep (a rebuild after a cluster change
        keeps the actors of unchanged slots; `executors.elastic.kept_slots`); `concurrency`:
        role -> calls each of its actors runs at once, in threads (a shared CPU pool's slots,
        `executors.envpool`; else one)."""
        super().__init__()
        ray = self.ray
        chosen, rollout = backend or backend_of(), run.roles.get(Role.ROLLOUT)
        self.members = assign(run.seats)
        for m in self.members:
            if reuse and (m.role, m.rank) in reuse:
                m.handle = reuse[(m.role, m.rank)]
                continue
            worker, args = worker_spec(m, cfg, rollout, chosen, self.members)
            cls: Any = ray.remote(worker)  # a Ray actor class
            opts = actor_options(m, groups[m.slot], pinned)
            if concurrency and concurrency.get(m.role, 1) > 1:
                opts["max_concurrency"] = concurrency[m.role]
            m.handle = cls.options(max_restarts=max_restarts, max_task_retries=0,
                                   name=None, **opts).remote(*args)
        try:  # all constructed (an actor whose resources the bundle lacks would wait forever)
            wheres = ray.get([m.handle.where.remote() for m in self.members],
                             timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise PlacementError(f"role actors not started after {start_timeout_s:.0f}s: a bundle "
                                 "lacks the resources its actors ask for") from None
        # Worker pids and nodes, known before any work is in flight: a busy actor answers
        # nothing else, and an actor on a dead node answers nothing at all.
        self.pids = {id(m): w["pid"] for m, w in zip(self.members, wheres)}
        self.nodes = {id(m): w.get("node_id") for m, w in zip(self.members, wheres)}
        # (monotonic time, alive node ids): a cached ray.nodes()
        self._alive_at: tuple[float, set[str]] = (0.0, set())

    def alive_nodes(self, max_age_s: float = 0.5) -> set[str]:
        t, alive = self._alive_at
        if time.monotonic() - t > max_age_s:
            alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
            self._alive_at = (time.monotonic(), alive)
        return alive

    def dead_members(self) -> list[Member]:
        """Members whose node is no longer alive in the cluster."""
        alive = self.alive_nodes()
        return [m for m in self.members if self.nodes.get(id(m)) not in alive]

    def wait(self, handles: Sequence[Handle], timeout_s: float) -> list[bool]:
        """Which calls finished within `timeout_s` (from now)."""
        ready, _ = self.ray.wait(list(handles), num_returns=len(handles), timeout=timeout_s,
                                 fetch_local=False)
        done = set(ready)
        return [h in done for h in handles]

    def cancel(self, handle: Handle) -> None:
        """Best effort: a queued call is dropped; a running one finishes and is ignored."""
        self._owner.pop(handle, None)
        try:
            self.ray.cancel(handle)
        except Exception:  # noqa: BLE001 - already finished, or not cancellable
            pass

    def first(self, handles: Sequence[Handle], poll_s: float = 0.5) -> int:
        """Index of the first of `handles` to finish; a copy whose node died loses the race."""
        while True:
            ready, _ = self.ray.wait(list(handles), num_returns=1, timeout=poll_s,
                                     fetch_local=False)
            if ready:
                return handles.index(ready[0])
            dead = {id(m) for m in self.dead_members()}
            alive = [i for i, h in enumerate(handles) if id(self._owner.get(h)) not in dead]
            if len(alive) < len(handles):
                return alive[0] if alive else 0

    def _settle(self, handles: Sequence[Handle], poll_s: float = 0.5) -> dict[Handle, Outcome]:
        """Wait for calls, but give up on those whose worker's node died: Ray would hold them
        until the actor restarts, which never happens while its bundle's node is gone."""
        lost: dict[Handle, Outcome] = {}
        pending = list(handles)
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=len(pending), timeout=poll_s,
                                           fetch_local=False)
            if not pending:
                break
            dead = {id(m) for m in self.dead_members()}
            for h in [h for h in pending if id(self._owner.get(h)) in dead]:
                m = self._owner[h]
                lost[h] = Outcome(False, error=f"node lost: {m.role}{m.rank} on "
                                  f"{m.trace_pid} ({self.nodes.get(id(m))})", lost_node=True)
            pending = [h for h in pending if h not in lost]
        return lost

    def results(self, handles: Sequence[Handle]) -> list[Outcome]:
        lost = self._settle(handles)
        for h in lost:
            self._owner.pop(h, None)
        return [lost[h] if h in lost else self._outcome(h) for h in handles]

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
            if any(d is m for d in self.dead_members()):  # its node is gone: it cannot return
                raise self.ray.exceptions.RayActorError(f"{m.role}{m.rank}: node lost")
            try:
                self.pids[id(m)] = self.ray.get(m.handle.pid.remote(), timeout=10)
                return
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def close(self, spare: Sequence[Any] = ()) -> None:
        """Kill every actor but the `spare` ones (handed to the next runtime)."""
        for m in self.members:
            if any(m.handle is h for h in spare):
                continue
            try:
                self.ray.kill(m.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead: nothing left to kill
                pass
        self.members = []
