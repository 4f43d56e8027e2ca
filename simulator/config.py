"""Simulation settings: every source of variance, as typed nested models with help text.

The defaults simulate the job as written: lengths and tool latencies drawn from the job's
distributions, no stragglers, no failures, the links as the plan's cluster states them.
`SimConfig.no_variance()` turns every source of variance off (lengths and latencies at their
means); with it the simulator reproduces the placer's prediction (the agreement contract).

The models are pydantic like the job specs (`placer.spec.base.Strict`: frozen, unknown keys are
errors, no inf/nan, strict types: a YAML `true` is not a number); a config file is the nested
mapping of their fields (YAML or JSON), read by `config_from_dict`. Each field carries its meaning
in its description; `describe()` lists them for `--help`-style output and the notebooks.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from placer.base.errors import SpecError
from placer.spec.base import Strict
from placer.spec.errorlines import format_validation_error

# strict numbers, as in the job specs (a YAML `true` or "8" is a wrong type); an int is accepted
# where a float is meant. `MAX_NUMBER` is far beyond any real setting and keeps every product of
# settings and sizes finite.
MAX_NUMBER = 1e9
Number = Annotated[float, Field(strict=True)]
Positive = dict[str, Annotated[float, Field(strict=True, gt=0, le=MAX_NUMBER)]]


def _f(default: Any, help: str, **bounds: Any) -> Any:
    if isinstance(default, (dict, list)):
        return Field(default_factory=lambda: type(default)(default), description=help, **bounds)
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        # here, not in `Number`: pydantic keeps one `le` per field, the last one it meets
        bounds.setdefault("le", MAX_NUMBER)
    return Field(default, description=help, **bounds)


class Workload(Strict):
    lengths: Literal["draw", "mean"] = _f(
        "draw", "prompt/response lengths: 'draw' from the job's distributions per sample and "
        "turn, or 'mean' (every sample at the distribution's mean: no long tail)")
    tool_latency: Literal["draw", "mean"] = _f(
        "draw", "tool-call latencies: 'draw' per call, or 'mean' for every call")
    response_scale: Number = _f(
        1.0, "multiply every drawn response length (a what-if knob; 1 = the job as written)",
        gt=0, le=1000)  # lengths stay 64-bit integers


class Stragglers(Strict):
    fraction: Number = _f(0.0, "share of devices that run slow in an iteration (0 = none)",
                          ge=0, le=1)
    slowdown_median: Number = _f(1.5, "median slowdown factor of a slow device (lognormal)", ge=1)
    slowdown_sigma: Number = _f(0.3, "lognormal shape of the slowdown factor", ge=0)
    slowdown_cap: Number = _f(5.0, "largest slowdown factor", ge=1)
    persistent: bool = _f(False, "the same devices stay slow every iteration (else redrawn)",
                          strict=True)


class Failures(Strict):
    mtbf_hours: Positive = _f(
        {}, "mean time between failures of ONE device, per device type name or kind "
        "(gpu/cpu/lpu), hours; absent types never fail. A job on n devices fails n times as often")
    restart_s: Number = _f(300.0, "seconds from a failure until the job runs again", ge=0)
    checkpoint_every: int = _f(10, "iterations between checkpoints", ge=1, strict=True)
    checkpoint_s: Number | None = _f(
        None, "seconds a checkpoint blocks the job after a step's training; unset: priced on the "
        "plan's layouts (placer.solve.hostmem.plan_checkpoint_s: the sharded optimizer state gathered, "
        "14 B/param written at the cluster's storage_gbs, a fixed overhead)", ge=0,
        le=MAX_NUMBER)


class Network(Strict):
    bandwidth_factor: Number = _f(1.0, "scale every link's bandwidth (0.5 = links half as fast)",
                                  gt=0)
    link_factors: Positive = _f(
        {}, "scale named links: send, recv, cross, local (see simulator.network)")


class SimConfig(Strict):
    workload: Workload = _f(Workload(), "lengths and tool latencies")
    stragglers: Stragglers = _f(Stragglers(), "slow devices")
    failures: Failures = _f(Failures(), "failures, checkpoints and restarts")
    network: Network = _f(Network(), "weight-sync links")
    record_tools: bool = _f(True, "one trace event per tool call (off: only aggregate metrics)",
                            strict=True)

    @staticmethod
    def no_variance() -> SimConfig:
        """Every source of variance off: the model the placer prices."""
        return SimConfig(workload=Workload(lengths="mean", tool_latency="mean"))


def config_from_dict(data: dict[str, Any], source: str = "config") -> SimConfig:
    """Nested dict (YAML/JSON) to a SimConfig; SpecError naming the path of a bad or unknown key."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping (got {data!r:.80})")
    try:
        return SimConfig.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, f"{source}.", SimConfig)) from None


def describe(cls: type[BaseModel] = SimConfig, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted name, help) of every knob."""
    out = []
    for name, f in cls.model_fields.items():
        sub = f.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out += describe(sub, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", f.description or ""))
    return out
