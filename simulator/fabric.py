"""Links that several jobs' transfers cross at once, shared max-min fairly as time passes.

`simulator.network` prices one job's weight sync when all its flows start together. A fleet's
jobs start transfers whenever their own steps reach them: weight syncs that cross the spine
between two pools, checkpoints written to the one storage. `Fabric.send(gb, path)` starts a
transfer now and returns the event that fires when it is done; the rates of every transfer in
flight are re-shared (progressive filling, `simulator.network`'s rule) whenever one starts or
ends, so a transfer alone on its path takes gb / (its slowest link), and two on one link take
twice as long.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import simpy

from simulator.network import _fair_rates

EPS = 1e-12


@dataclass
class _Transfer:
    left: float  # GB still to move
    path: tuple[str, ...]
    done: simpy.Event
    rate: float = 0.0


@dataclass
class Fabric:
    """Links (name -> GB/s) and the transfers now on them."""

    env: simpy.Environment
    links: dict[str, float]
    _flows: list[_Transfer] = field(default_factory=list)
    _t: float = 0.0
    _epoch: int = 0  # the wake-up that is still current (older ones are stale)
    gb_moved: dict[str, float] = field(default_factory=dict)  # link -> GB that crossed it

    def send(self, gb: float, path: tuple[str, ...]) -> simpy.Event:
        """A transfer of `gb` over `path` from now on."""
        unknown = [k for k in path if k not in self.links]
        if unknown:
            raise ValueError(f"fabric: no link {unknown[0]!r}")
        done = self.env.event()
        if gb <= 0 or not path:
            done.succeed()
            return done
        self._advance()
        self._flows.append(_Transfer(gb, path, done))
        for k in path:
            self.gb_moved[k] = self.gb_moved.get(k, 0.0) + gb
        self._reshare()
        return done

    def _advance(self) -> None:
        dt = self.env.now - self._t
        if dt > 0:
            for f in self._flows:
                f.left -= f.rate * dt
        self._t = self.env.now

    def _reshare(self) -> None:
        finished = [f for f in self._flows if f.left <= EPS * max(1.0, f.rate)]
        for f in finished:
            self._flows.remove(f)
            f.done.succeed()
        self._epoch += 1
        if not self._flows:
            return
        rates = _fair_rates(self.links, {i: f.path for i, f in enumerate(self._flows)})
        for i, f in enumerate(self._flows):
            f.rate = rates[i]
        nxt = min(f.left / f.rate for f in self._flows)
        self.env.process(self._wake(self._epoch, nxt))

    def _wake(self, epoch: int, after: float) -> Generator:
        yield self.env.timeout(after)
        if epoch != self._epoch:
            return  # a transfer started or ended since: a later wake-up holds
        self._advance()
        for f in self._flows:  # the one(s) meant to end now; rounding must not leave a sliver
            if f.left <= f.rate * 1e-9:
                f.left = 0.0
        self._reshare()
