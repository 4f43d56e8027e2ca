"""Each source of variance moves the result the right way, by a measured margin.

Sizes are asserted as directions with a margin (ratios of simulated seconds, never wall-clock
timings of the test itself)."""
from __future__ import annotations

from simplans import SMALL_PLACEMENT, small_plan

from simulator.api import simulate_plan
from simulator.config import Failures, Network, SimConfig, Stragglers, Workload


def _sim(plan, cfg=None, iterations=1, seed=0):
    return simulate_plan(plan, iterations=iterations, seed=seed, config=cfg).metrics


def test_longer_tail_raises_p99_and_bubble():
    short = small_plan(lengths__response={"kind": "lognormal", "median": 256, "sigma": 0.2,
                                          "cap": 2048})
    long_ = small_plan(lengths__response={"kind": "lognormal", "median": 256, "sigma": 1.0,
                                          "cap": 2048})
    a, b = _sim(short, iterations=3), _sim(long_, iterations=3)
    assert b.iteration_s.p99 > 1.3 * a.iteration_s.p99
    assert b.bubble_s > 1.3 * a.bubble_s
    assert b.why.long_tail_s > 2 * a.why.long_tail_s


def test_more_cpu_cores_cut_tool_queueing():
    few = small_plan({**SMALL_PLACEMENT, "environment": ("cpu", 1, "env")},
                     batch__prompts=64)  # 256 samples, 64 cores: calls queue
    many = small_plan({**SMALL_PLACEMENT, "environment": ("cpu", 3, "env")}, batch__prompts=64)
    a, b = _sim(few), _sim(many)
    assert a.why.queueing_s > 0.5  # seconds per sample waiting for a core
    assert b.why.queueing_s < 0.5 * a.why.queueing_s
    assert b.iteration_s.mean < a.iteration_s.mean


def test_slower_link_lengthens_weight_sync():
    plan = small_plan()
    fast = _sim(plan, SimConfig(network=Network(bandwidth_factor=1.0)))
    slow = _sim(plan, SimConfig(network=Network(bandwidth_factor=0.1)))
    assert slow.role_s["sync"] > 5 * fast.role_s["sync"]
    assert slow.iteration_s.mean - fast.iteration_s.mean > 0.5 * (
        slow.role_s["sync"] - fast.role_s["sync"])


def test_async_staleness_one_beats_sync_when_rollouts_dominate():
    # long responses: generation dominates the step; training on its own slot can overlap
    over = dict(lengths__response={"kind": "fixed", "value": 2048},
                environment__tool_latency_s={"kind": "fixed", "value": 8.0})
    sync = small_plan(**over)
    asyn = small_plan(pipeline={"mode": "async", "max_staleness": 1}, **over)
    s = _sim(sync, SimConfig.no_variance(), iterations=5)
    a = _sim(asyn, SimConfig.no_variance(), iterations=5)
    st = s.stage_s
    assert st.rollout > st.score + st.train  # rollouts dominate the sync step
    assert a.iteration_s.mean < 0.85 * s.iteration_s.mean


def test_failures_lower_goodput_as_mtbf_falls():
    plan = small_plan()
    goodput = []
    for mtbf_h in (1e6, 2.0, 0.5, 0.1):  # per GPU; the plan holds 8
        cfg = SimConfig(workload=Workload(lengths="mean", tool_latency="mean"),
                        failures=Failures(mtbf_hours={"gpu": mtbf_h}, restart_s=60.0,
                                          checkpoint_every=5, checkpoint_s=0.5))
        goodput.append(_sim(plan, cfg, iterations=60).goodput)
    assert goodput[0] > 0.95  # only checkpoint costs
    # measured (seed 0): 0.99, 0.75, 0.58, 0.18
    for higher, lower in zip(goodput, goodput[1:]):
        assert higher > lower + 0.1


def test_stragglers_slow_the_step():
    plan = small_plan()
    base = _sim(plan, SimConfig.no_variance(), iterations=3)
    slow = _sim(plan, SimConfig(workload=Workload(lengths="mean", tool_latency="mean"),
                                stragglers=Stragglers(fraction=0.5, slowdown_median=2.0)),
                iterations=3)
    assert slow.why.max_slowdown > 1.5
    assert slow.iteration_s.mean > 1.2 * base.iteration_s.mean
