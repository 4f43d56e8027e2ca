"""Same plan, same seed: the same metrics bit for bit; another seed: different draws."""
from __future__ import annotations

import json

from simplans import small_plan

from simulator.api import simulate_plan
from simulator.config import Failures, SimConfig, Stragglers

CFG = SimConfig(stragglers=Stragglers(fraction=0.2),
                failures=Failures(mtbf_hours={"gpu": 20.0}, checkpoint_every=2))


def _metrics(seed: int) -> str:
    r = simulate_plan(small_plan(), iterations=3, seed=seed, config=CFG)
    return json.dumps(r.metrics.to_dict(), sort_keys=True)  # repr of every float: bit-for-bit


def test_same_seed_same_metrics_bit_for_bit():
    assert _metrics(7) == _metrics(7)


def test_other_seed_other_draws():
    assert _metrics(7) != _metrics(8)


def test_same_seed_same_trace():
    a = simulate_plan(small_plan(), iterations=2, seed=3, config=CFG).trace.to_chrome()
    b = simulate_plan(small_plan(), iterations=2, seed=3, config=CFG).trace.to_chrome()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
