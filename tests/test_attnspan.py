"""The attention span of a trained batch (`placer.cost.attnspan`): E[s^2] / E[s] of its
samples' contexts, which prices the causal attention of packed sequences of unequal lengths."""
from __future__ import annotations

import numpy as np

from placer.cost.attnspan import attention_span
from placer.cost.roofline import attention_flops_per_token
from placer.spec.catalog import shipped_models
from placer.spec.distributions import Distribution

_PROMPT = Distribution(kind="normal", mean=256, std=64, min=32, cap=2048)
_RESP = Distribution(kind="lognormal", median=768, sigma=1.0, cap=20480)


def test_fixed_lengths_span_is_the_length() -> None:
    p, r = Distribution(kind="fixed", value=100), Distribution(kind="fixed", value=900)
    assert attention_span(1000.0, p, r, 1, 1.0, 0) == 1000.0


def test_span_prices_the_sum_of_squares_of_drawn_samples() -> None:
    """Per token, the attention FLOPs of sequences drawn from the job's distributions are those
    of one sequence of the span's length (to Monte Carlo error), not of the mean's."""
    rng = np.random.default_rng(7)
    prompt = np.clip(rng.normal(256, 64, 400_000), 32, 2048)
    resp = np.clip(768 * np.exp(rng.normal(0, 1.0, 400_000)), 0, 20480)
    s = prompt + resp
    m = shipped_models()["Qwen2.5-7B"]
    per_token = sum(attention_flops_per_token(m, x) * x for x in (s[:2000])) / s[:2000].sum()
    span = attention_span(float(s.mean()), _PROMPT, _RESP, 1, 1.0, 0)
    assert abs(span / float((s * s).sum() / s.sum()) - 1) < 0.02
    assert span > 2 * s.mean()  # a sigma-1 lognormal: E[s^2] / E[s] ~ 2.2 x the mean here
    assert per_token > attention_flops_per_token(m, float(s[:2000].mean()))


def test_keeping_the_shortest_narrows_the_span() -> None:
    full = attention_span(1500.0, _PROMPT, _RESP, 1, 1.0, 0)
    kept = attention_span(1500.0, _PROMPT, _RESP, 1, 0.8, 0)
    assert 1500.0 < kept < full


def test_turns_add_their_spread() -> None:
    one = attention_span(3000.0, _PROMPT, _RESP, 1, 1.0, 3)
    two = attention_span(3000.0, _PROMPT, _RESP, 2, 1.0, 3)
    assert two > one
