"""Stragglers and failures.

Stragglers: in every iteration (or once, if persistent) each device is slow with probability
`fraction`, by a lognormal factor (median, sigma, capped). Work that spans several devices runs
in lockstep collectives, so it goes at the pace of its slowest device: a rollout replica takes
the maximum over its tp*pp devices, a training or scoring role over all of its devices. A rollout
split over pools holds its slot's devices part by part, so a slow device slows only a replica of
the part it belongs to (`simulator.groups`).

Failures, checkpoints and restarts are composed over the failure-free iterations: the
simulation first produces each iteration's duration d_i; failures then
arrive as a Poisson process whose rate is the sum over the plan's devices of 1 / MTBF of the
device's type. Walking the iterations in wall time: an iteration that completes before the next
failure commits (every `checkpoint_every` commits a checkpoint costs `checkpoint_s`, by default
priced on the plan's layouts: `placer.solve.hostmem.plan_checkpoint_s`); a failure
throws away the partial iteration and everything since the last checkpoint, costs `restart_s`,
and the walk resumes from the checkpoint. Re-run iterations take the same d_i (the same work
again). Goodput = sum of d_i / wall time. This is exact for the model stated (a failure stops the
whole job, as synchronous RL does) and needs no re-simulation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from placer.solve.planfile import Plan
from placer.spec.catalog import Resolved
from placer.spec.sampling import rng
from simulator.config import Failures, Stragglers

STREAM_STRAGGLER, STREAM_FAILURE = 100, 200
MAX_FAILURES = 100_000  # a plan whose MTBF is far below its checkpoint interval never finishes


def device_slowdowns(plan: Plan, cfg: Stragglers, seed: int, iteration: int) -> dict[str, np.ndarray]:
    """Slot -> per-device slowdown factors (1.0 = nominal)."""
    out = {}
    it = 0 if cfg.persistent else iteration
    for k, slot in enumerate(plan.slots):
        if cfg.fraction <= 0:
            out[slot.name] = np.ones(slot.devices)
            continue
        g = rng(seed, it, STREAM_STRAGGLER + k)
        slow = g.random(slot.devices) < cfg.fraction
        factor = cfg.slowdown_median * np.exp(cfg.slowdown_sigma * g.standard_normal(slot.devices))
        out[slot.name] = np.where(slow, np.clip(factor, 1.0, cfg.slowdown_cap), 1.0)
    return out


def role_slowdown(factors: np.ndarray, devices: int) -> float:
    """A role on the first `devices` devices of its slot goes at its slowest device's pace."""
    return float(factors[:max(devices, 1)].max()) if len(factors) else 1.0


def replica_slowdowns(factors: np.ndarray, replicas: int, size: int) -> list[float]:
    """Per rollout replica (devices [k*size, (k+1)*size)), the slowest device's factor."""
    need = replicas * size
    f = factors[:need] if len(factors) >= need else np.resize(factors, need)
    return f.reshape(replicas, size).max(axis=1).tolist()


def failure_rate_per_s(res: Resolved, plan: Plan, cfg: Failures) -> float:
    """Failures per second of the whole job: devices / MTBF, per device type (name or kind)."""
    rate = 0.0
    for slot in plan.slots:
        for pool, devices in slot.pool_devices():  # a split role's slot: each part's type
            dev = res.device_of(pool)
            mtbf = cfg.mtbf_hours.get(dev.name, cfg.mtbf_hours.get(dev.kind.value))
            if mtbf:
                rate += devices / (mtbf * 3600.0)
    return rate


@dataclass
class Attempt:
    iteration: int
    start_s: float  # wall time it began
    dur_s: float  # how long it ran (cut short when a failure hit it)
    done: bool


@dataclass
class Timeline:
    wall_s: float
    useful_s: float
    attempts: list[Attempt] = field(default_factory=list)
    failures: list[tuple[float, float]] = field(default_factory=list)  # (time, work lost s)
    checkpoints: list[float] = field(default_factory=list)  # start times
    finished: bool = True

    @property
    def goodput(self) -> float:
        return self.useful_s / self.wall_s if self.wall_s > 0 else 1.0


def compose(durations: list[float], rate_per_s: float, cfg: Failures, seed: int,
            checkpoint_s: float) -> Timeline:
    """Wall-time timeline of running `durations` under failures and checkpoints of
    `checkpoint_s` seconds each (`cfg.checkpoint_s`, or the plan's priced one)."""
    n = len(durations)
    if rate_per_s <= 0:
        starts: np.ndarray | list[float] = (np.concatenate([[0.0], np.cumsum(durations)[:-1]])
                                            if n else [])
        return Timeline(float(sum(durations)), float(sum(durations)),
                        [Attempt(i, float(s), d, True) for i, (s, d) in
                         enumerate(zip(starts, durations))])
    g = rng(seed, STREAM_FAILURE)
    tl = Timeline(0.0, float(sum(durations)))
    wall, i, ckpt = 0.0, 0, 0
    next_fail = g.exponential(1 / rate_per_s)
    while i < n:
        d = durations[i]
        c = checkpoint_s if (i + 1) % cfg.checkpoint_every == 0 else 0.0
        if wall + d + c <= next_fail:
            tl.attempts.append(Attempt(i, wall, d, True))
            wall += d
            i += 1
            if c:
                tl.checkpoints.append(wall)
                wall += c
                ckpt = i
            continue
        tl.attempts.append(Attempt(i, wall, min(d, next_fail - wall), False))
        lost = next_fail - wall + sum(durations[ckpt:i])
        tl.failures.append((next_fail, lost))
        wall = next_fail + cfg.restart_s
        i = ckpt
        next_fail = wall + g.exponential(1 / rate_per_s)
        if len(tl.failures) >= MAX_FAILURES:
            tl.finished = False
            break
    tl.wall_s = wall
    if not tl.finished:
        tl.useful_s = float(sum(durations[:ckpt]))
    return tl
