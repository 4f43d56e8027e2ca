"""Turns on rollout engines that several jobs of a fleet time-share (a shared rollout pool).

`placer fleet` prices a shared rollout pool (`placer.fleet.rolloutpool`) as one set of engines
serving its member jobs' rollouts in turn, every switch between jobs a weight swap: the next
job's weights re-sent to the engines by the cost model's weight sync (the engines keep no copy
of another job's weights). `EngineGate` runs exactly that on Ray (`executors.fleetrun`): each
member's loop (`executors.loop.Loop`, its own trainer, reward, environment) asks for its turn
before each weight sync (`JobTurn`, the loop's `EngineTurn`), and the turns go round in the
group's order (the charged job first, as the plan lists the members). When the engines hold
another job's weights, the turn forgets the versions the job's loop believes its engines hold,
so the loop's weight sync re-sends its current version over the job's own weight-sync group
(`executors.weights`, scoped by job: the engines hold one group per job). The job's rollout
then runs, and its collection hands the engines to the next job. A job that finished its steps
(or failed) leaves the rotation.

Each turn is recorded (`TurnRecord`): its swap (the sync's time when the engines held another
job's weights) and its rollout on the engines; with `check` on, the engines' weights and the
job's trainer's (`state_digest`) are read after the sync, before the rollout starts.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from executors.context import LoopContext
from placer.base.roles import Role


@dataclass
class TurnRecord:
    """One job's turn on the shared engines before step `step`'s rollout."""

    job: str
    step: int
    previous: str  # the job whose weights the engines held before the sync
    waited_s: float  # from asking for the turn to getting it
    sync_s: float  # the weight sync (a swap when `previous` is another job)
    rollout_s: float = 0.0  # from the sync's end to the rollout collected
    t0: float = 0.0  # the turn's start (time.time())
    weights_match: bool | None = None  # engines == trainer after the sync (None: not checked)

    @property
    def swapped(self) -> bool:
        return self.previous != self.job

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "step": self.step, "previous": self.previous,
                "swapped": self.swapped, "waited_s": round(self.waited_s, 4),
                "sync_s": round(self.sync_s, 4), "rollout_s": round(self.rollout_s, 4),
                "weights_match": self.weights_match}


@dataclass
class EngineGate:
    """The turns of one shared rollout pool's jobs, round robin in `order`; `holder`: the job
    whose weights the engines hold (at the start, the job whose version 0 they loaded)."""

    pool: str
    order: list[str]
    holder: str
    records: list[TurnRecord] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _turn: int = 0
    _holding: str | None = None
    _left: set[str] = field(default_factory=set)

    def turn_of(self, job: str, ctx: LoopContext, check: bool = False) -> JobTurn:
        return JobTurn(self, job, ctx, check)

    def _take(self, job: str) -> float:
        """Wait for `job`'s turn; the seconds waited."""
        t = time.time()
        with self._cond:
            if self._holding == job:  # a re-sync within its own turn (a recovery)
                return 0.0
            while self.order[self._turn] != job or self._holding is not None:
                self._cond.wait()
            self._holding = job
        return time.time() - t

    def _give(self, job: str) -> None:
        with self._cond:
            if self._holding != job:
                return
            self._holding = None
            self._advance()
            self._cond.notify_all()

    def leave(self, job: str) -> None:
        """`job` runs no more turns (its steps are done, or it failed)."""
        with self._cond:
            self._left.add(job)
            if self._holding == job:
                self._holding = None
            if self.order[self._turn] == job:
                self._advance()
            self._cond.notify_all()

    def _advance(self) -> None:
        """The turn to the next job in order that still runs (unchanged when none does)."""
        n = len(self.order)
        for k in range(1, n + 1):
            nxt = (self._turn + k) % n
            if self.order[nxt] not in self._left:
                self._turn = nxt
                return


@dataclass
class JobTurn:
    """One job's side of the gate: what its loop calls around each weight sync and rollout
    (`executors.loop.EngineTurn`)."""

    gate: EngineGate
    job: str
    ctx: LoopContext
    check: bool = False
    _open: TurnRecord | None = None
    _t: float = 0.0

    def take(self, step: int) -> None:
        waited = self.gate._take(self.job)
        if self._open is not None and self._open.step == step:
            return  # a recovery's re-sync within the turn
        previous = self.gate.holder
        if previous != self.job:  # another job's weights: the engines hold none of ours
            for m in self.ctx.by_role[Role.ROLLOUT]:
                self.ctx.known[m.rank] = None
        self._t = time.time()
        self._open = TurnRecord(self.job, step, previous, waited, 0.0, t0=self._t)

    def synced(self, step: int) -> None:
        rec = self._open
        assert rec is not None and rec.step == step
        now = time.time()
        rec.sync_s = now - self._t
        self.gate.holder = self.job
        if self.check:
            rec.weights_match = self._weights_match()
        self._t = time.time()

    def done(self, step: int) -> None:
        rec = self._open
        if rec is None or rec.step != step:
            return
        rec.rollout_s = time.time() - self._t
        self.gate.records.append(rec)
        self._open = None
        self.gate._give(self.job)

    def leave(self) -> None:
        self.gate.leave(self.job)

    def _weights_match(self) -> bool:
        """Every engine's weights are the job's trainer's (rank 0's full weights)."""
        rt = self.ctx.rt
        trainer = self.ctx.by_role[Role.ACTOR][0]
        engines = self.ctx.by_role[Role.ROLLOUT]
        outs = rt.results([rt.call(m, "weights_digest") for m in [trainer, *engines]])
        bad = next((o.error for o in outs if not o.ok), None)
        if bad is not None:
            raise RuntimeError(f"reading the weights' digests: {bad}")
        return all(o.value == outs[0].value for o in outs[1:])
