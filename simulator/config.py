"""Simulation settings: every source of variance, as typed nested dataclasses with help text.

The defaults simulate the job as written: lengths and tool latencies drawn from the job's
distributions, no stragglers, no failures, the links as the plan's cluster states them.
`SimConfig.no_variance()` turns every source of variance off (lengths and latencies at their
means); with it the simulator reproduces the placer's prediction (the agreement contract).

Each field carries its meaning in `metadata["help"]`; `describe()` lists them for `--help`-style
output and the notebooks.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Literal

from placer.spec import SpecError


def _f(default: Any, help: str, **kw: Any) -> Any:  # noqa: A002 - mirrors argparse's name
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class Workload:
    lengths: Literal["draw", "mean"] = _f(
        "draw", "prompt/response lengths: 'draw' from the job's distributions per sample and "
        "turn, or 'mean' (every sample at the distribution's mean: no long tail)")
    tool_latency: Literal["draw", "mean"] = _f(
        "draw", "tool-call latencies: 'draw' per call, or 'mean' for every call")
    response_scale: float = _f(
        1.0, "multiply every drawn response length (a what-if knob; 1 = the job as written)")


@dataclass(frozen=True)
class Stragglers:
    fraction: float = _f(0.0, "share of devices that run slow in an iteration (0 = none)")
    slowdown_median: float = _f(1.5, "median slowdown factor of a slow device (lognormal)")
    slowdown_sigma: float = _f(0.3, "lognormal shape of the slowdown factor")
    slowdown_cap: float = _f(5.0, "largest slowdown factor")
    persistent: bool = _f(False, "the same devices stay slow every iteration (else redrawn)")


@dataclass(frozen=True)
class Failures:
    mtbf_hours: dict[str, float] = _f(
        {}, "mean time between failures of ONE device, per device type name or kind "
        "(gpu/cpu/lpu), hours; absent types never fail. A job on n devices fails n times as often")
    restart_s: float = _f(300.0, "seconds from a failure until the job runs again")
    checkpoint_every: int = _f(10, "iterations between checkpoints")
    checkpoint_s: float = _f(30.0, "seconds a checkpoint blocks the step after training")


@dataclass(frozen=True)
class Network:
    bandwidth_factor: float = _f(1.0, "scale every link's bandwidth (0.5 = links half as fast)")
    link_factors: dict[str, float] = _f(
        {}, "scale named links: send, recv, cross, local (see simulator.network)")


@dataclass(frozen=True)
class SimConfig:
    workload: Workload = _f(Workload(), "lengths and tool latencies")
    stragglers: Stragglers = _f(Stragglers(), "slow devices")
    failures: Failures = _f(Failures(), "failures, checkpoints and restarts")
    network: Network = _f(Network(), "weight-sync links")
    record_tools: bool = _f(True, "one trace event per tool call (off: only aggregate metrics)")

    @staticmethod
    def no_variance() -> "SimConfig":
        """Every source of variance off: the model the placer prices."""
        return SimConfig(workload=Workload(lengths="mean", tool_latency="mean"))

    def validate(self) -> "SimConfig":
        w, s, f, n = self.workload, self.stragglers, self.failures, self.network
        checks = [
            ("workload.lengths", w.lengths, w.lengths in ("draw", "mean")),
            ("workload.tool_latency", w.tool_latency, w.tool_latency in ("draw", "mean")),
            ("workload.response_scale", w.response_scale, w.response_scale > 0),
            ("stragglers.fraction", s.fraction, 0 <= s.fraction <= 1),
            ("stragglers.slowdown_median", s.slowdown_median, s.slowdown_median >= 1),
            ("stragglers.slowdown_sigma", s.slowdown_sigma, s.slowdown_sigma >= 0),
            ("stragglers.slowdown_cap", s.slowdown_cap, s.slowdown_cap >= 1),
            ("failures.restart_s", f.restart_s, f.restart_s >= 0),
            ("failures.checkpoint_every", f.checkpoint_every, f.checkpoint_every >= 1),
            ("failures.checkpoint_s", f.checkpoint_s, f.checkpoint_s >= 0),
            ("network.bandwidth_factor", n.bandwidth_factor, n.bandwidth_factor > 0),
        ]
        checks += [(f"failures.mtbf_hours.{k}", v, v > 0) for k, v in f.mtbf_hours.items()]
        checks += [(f"network.link_factors.{k}", v, v > 0) for k, v in n.link_factors.items()]
        for name, value, ok in checks:
            if not ok:
                raise SpecError(f"config.{name}: out of range (got {value!r})")
        return self


def config_from_dict(data: dict[str, Any], source: str = "config") -> SimConfig:
    """Nested dict (YAML/JSON) to a SimConfig; unknown keys are errors naming the path."""
    return _build(SimConfig, data, source).validate()


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping (got {data!r})")
    known = {f.name: f for f in fields(cls)}
    bad = sorted(set(data) - set(known))
    if bad:
        raise SpecError(f"{where}.{bad[0]}: unknown key; known: {', '.join(known)}")
    kw = {}
    for name, value in data.items():
        default = getattr(cls(), name)
        if is_dataclass(default):
            kw[name] = _build(type(default), value, f"{where}.{name}")
        else:
            kw[name] = _typed(default, value, f"{where}.{name}")
    return replace(cls(), **kw)


def _typed(default: Any, value: Any, where: str) -> Any:
    """`value` if it has the default's type (ints accepted for floats), else SpecError."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = number
    elif isinstance(default, dict):
        ok = isinstance(value, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise SpecError(f"{where}: expected {type(default).__name__} (got {value!r})")
    return float(value) if isinstance(default, float) else value


def describe(cls: type = SimConfig, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted name, help) of every knob."""
    out = []
    for f in fields(cls):
        default = getattr(cls(), f.name)
        if is_dataclass(default):
            out += describe(type(default), f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", f.metadata.get("help", "")))
    return out
