"""Length and latency distributions of a job: fixed, normal, lognormal (capped), empirical.

A draw is clipped to [min, cap] (`placer.spec.sampling.draw`), so `mean_value` and `max_value` are those
of the clipped variable, in closed form for the normal and the lognormal; the planner prices work
at these means, and the simulator draws from the same clipped variable.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import Field, model_validator

from placer.spec.base import PosFloat, Strict
from traces.workload import file_version, read_field


class Distribution(Strict):
    """A length or latency distribution.

    fixed: always `value`. normal: `mean`, `std`. lognormal: median `median` and shape `sigma`
    (the long tail). empirical: replay values from a JSONL workload trace (`path`, `field`; a
    relative path is read from the job file's folder). Every draw is clipped to [min, cap]
    (`placer.spec.sampling.draw`), so `mean_value` and `max_value` are those of the clipped variable.
    """

    kind: Literal["fixed", "normal", "lognormal", "empirical"] = "fixed"
    value: PosFloat | None = None
    mean: PosFloat | None = None
    std: Annotated[float, Field(strict=True, ge=0)] | None = None
    median: PosFloat | None = None
    # sigma <= 10 keeps exp(sigma^2/2) finite; a median x e^40 tail is beyond any length anyway.
    sigma: Annotated[float, Field(strict=True, ge=0, le=10)] | None = None
    min: Annotated[float, Field(strict=True, ge=0)] = 0.0
    cap: PosFloat | None = None
    path: str | None = None
    field: str | None = None
    offset: Annotated[float, Field(strict=True, ge=0, le=1e9)] = Field(
        0.0, description="tokens added to every draw after clipping; on lengths.prompt of a "
        "vision-language job, set when the job is resolved to its image tokens "
        "(images_per_prompt x the policy's vision.tokens_per_image)")

    @model_validator(mode="after")
    def _params_present(self) -> Distribution:
        need = {"fixed": ("value",), "normal": ("mean", "std"), "lognormal": ("median", "sigma"),
                "empirical": ("path", "field")}[self.kind]
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            raise ValueError(f"a {self.kind} distribution needs {', '.join(missing)}")
        if self.cap is not None and self.cap < self.min:
            raise ValueError(f"cap {self.cap:g} is below min {self.min:g}")
        return self

    def fixed_value(self) -> float:
        """`value` of a fixed distribution (the validator requires it)."""
        assert self.value is not None, "a fixed distribution without its value"
        return self.value

    def params(self) -> tuple[float, float]:
        """(mean, std) of a normal, (median, sigma) of a lognormal distribution (the validator
        requires them)."""
        a, b = (self.mean, self.std) if self.kind == "normal" else (self.median, self.sigma)
        assert a is not None and b is not None, f"a {self.kind} distribution without its parameters"
        return a, b

    def source(self) -> tuple[str, str]:
        """(path, field) of an empirical distribution (the validator requires them)."""
        assert self.path is not None and self.field is not None, \
            f"a {self.kind} distribution without a path and field"
        return self.path, self.field

    def _clip(self, x: float) -> float:
        return min(max(x, self.min), self.cap if self.cap is not None else math.inf)

    def mean_value(self) -> float:
        """Expected value of a draw clipped to [min, cap] (closed form for normal and lognormal),
        plus `offset`."""
        return self._clipped_mean() + self.offset

    def _clipped_mean(self) -> float:
        if self.kind == "fixed":
            return self._clip(float(self.fixed_value()))
        if self.kind == "normal":
            return _clipped_normal_mean(*self.params(), self.min, self.cap)
        if self.kind == "lognormal":
            return _clipped_lognormal_mean(*self.params(), self.min, self.cap)
        return _empirical_stats(*self.source(), self.min, self.cap, file_version(self.source()[0]))[0]

    def max_value(self) -> float:
        """The largest value a draw can take: the cap, else a far (4 sigma) quantile; plus
        `offset`."""
        return self._clipped_max() + self.offset

    def _clipped_max(self) -> float:
        if self.kind == "fixed":
            return self._clip(float(self.fixed_value()))
        if self.cap is not None:
            return float(self.cap)
        if self.kind == "normal":
            mean, std = self.params()
            return self._clip(mean + 4 * std)
        if self.kind == "lognormal":
            median, sigma = self.params()
            return self._clip(median * math.exp(4 * sigma))
        return _empirical_stats(*self.source(), self.min, self.cap, file_version(self.source()[0]))[1]

    def samples(self) -> list[float]:
        """Values of an empirical distribution, read from its JSONL file."""
        return read_field(*self.source())


@lru_cache(maxsize=64)
def _empirical_stats(path: str, field: str, lo: float, hi: float | None,
                     version: tuple[int, int] | None) -> tuple[float, float]:
    """(mean, max) of a trace field's values clipped to [lo, hi]; cached by the file's version,
    as estimates ask often."""
    vals = [min(max(v, lo), math.inf if hi is None else hi) for v in read_field(path, field)]
    return sum(vals) / len(vals), max(vals)


def _Phi(x: float) -> float:
    """Standard normal CDF (accepts +-inf)."""
    return 0.5 * (1 + math.erf(x / math.sqrt(2))) if math.isfinite(x) else float(x > 0)


def _phi(x: float) -> float:
    return math.exp(-x * x / 2) / math.sqrt(2 * math.pi) if math.isfinite(x) else 0.0


def _clipped_normal_mean(mu: float, sd: float, lo: float, hi: float | None) -> float:
    """E[clip(X, lo, hi)] for X ~ N(mu, sd^2): mass below lo sits at lo, above hi at hi."""
    hi_ = math.inf if hi is None else hi
    if sd == 0:
        return min(max(mu, lo), hi_)
    a, b = (lo - mu) / sd, (hi_ - mu) / sd
    inner = mu * (_Phi(b) - _Phi(a)) + sd * (_phi(a) - _phi(b))
    return lo * _Phi(a) + (hi_ * (1 - _Phi(b)) if hi is not None else 0.0) + inner


def _clipped_lognormal_mean(median: float, sigma: float, lo: float, hi: float | None) -> float:
    """E[clip(X, lo, hi)] for ln X ~ N(ln median, sigma^2) (the capped long tail)."""
    hi_ = math.inf if hi is None else hi
    if sigma == 0:
        return min(max(median, lo), hi_)
    mu = math.log(median)
    a = (math.log(lo) - mu) / sigma if lo > 0 else -math.inf
    b = (math.log(hi_) - mu) / sigma if hi is not None else math.inf
    # E[X; a < Z < b] = e^(mu + sigma^2/2) (Phi(b - sigma) - Phi(a - sigma))
    inner = math.exp(mu + sigma**2 / 2) * (_Phi(b - sigma) - _Phi(a - sigma))
    return lo * _Phi(a) + (hi_ * (1 - _Phi(b)) if hi is not None else 0.0) + inner
