"""Seeded draws from the job's distributions (lengths, tool latencies).

Every random draw in the project goes through a `numpy.random.Generator` made from a seed the user
sets (`--seed`, or the job's `seed`); nothing reads global random state.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from placer.spec.distributions import Distribution


def rng(seed: int, *stream: int) -> np.random.Generator:
    """An independent generator per (seed, stream...) so that adding draws in one place does not
    shift the draws of another."""
    return np.random.default_rng([seed, *stream])


def draw(dist: Distribution, gen: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
    """`n` values of `dist` as floats, clipped to [min, cap], plus its `offset`."""
    out: npt.NDArray[np.float64]
    if dist.kind == "fixed":
        out = np.full(n, float(dist.fixed_value()))
    elif dist.kind == "normal":
        mean, std = dist.params()
        out = gen.normal(mean, std, n)
    elif dist.kind == "lognormal":
        median, sigma = dist.params()
        out = median * np.exp(sigma * gen.standard_normal(n))
    else:
        vals = np.asarray(dist.samples(), dtype=float)
        out = vals[gen.integers(0, len(vals), n)]
    hi = dist.cap if dist.cap is not None else np.inf
    return np.clip(out, dist.min, hi) + dist.offset if dist.offset else np.clip(out, dist.min, hi)


def draw_lengths(dist: Distribution, gen: np.random.Generator, n: int) -> npt.NDArray[np.int64]:
    """Token counts: rounded, at least 1."""
    return np.maximum(np.rint(draw(dist, gen, n)), 1).astype(np.int64)
