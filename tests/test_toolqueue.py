"""Tool calls queueing for CPU cores while the engines decode (`placer.cost.toolqueue`): the pool
mirrors the simulator's FIFO core pool, and the pair term `timing.rollout_tool_time` prices the
simulator's variance-off rollout when the replicas hold more sequences than the cores serve."""
from __future__ import annotations

import random

import pytest
from simplans import SMALL_PLACEMENT, small_job, small_plan

from placer.cost.batching import step_terms
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.model import tool_waves
from placer.cost.pricer import Pricer
from placer.cost.rollout_tail import Replicas
from placer.cost.rolloutcost import rollout_shape
from placer.cost.sharding import Parallel
from placer.cost.tail_samples import at_means
from placer.cost.timing import Placed
from placer.cost.toolqueue import FifoPool, queue_delay, queue_delays, rollout_span, rollout_spans
from placer.solve.assemble import reprice
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from simulator.api import simulate_plan
from simulator.config import SimConfig
from simulator.environment import CorePool
from simulator.handplans import place


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fifo_pool_matches_core_pool(seed: int) -> None:
    """Groups of identical calls served in chunks end when the simulator's pool, fed the same
    calls one by one, ends them."""
    rng = random.Random(seed)
    slots, lat = rng.randint(1, 9), rng.uniform(0.1, 3.0)
    ours, theirs = FifoPool(slots, lat), CorePool("cpu", slots)
    t = 0.0
    for _ in range(200):
        t += rng.choice([0.0, 0.0, rng.uniform(0.0, 2.0)])
        calls = rng.randint(1, 3 * slots)
        got = [end for end, n in ours.submit(t, calls) for _ in range(n)]
        want = [theirs.submit(t, lat)[1] for _ in range(calls)]
        assert got == pytest.approx(want, abs=1e-9)


def _pair(plan, calib: Calibration | None = None) -> tuple[float, float]:
    """(the pair term, the lockstep charge: every queued round delays the whole wave)."""
    res = resolve(at_means(plan.spec))
    calib = calib or Calibration()
    placed = {}
    for role in ("rollout", "environment"):
        r = plan.roles[role]
        pool = res.cluster.pool(r.pool)
        placed[role] = Placed(r.slot, Pricer(res, calib).estimate(role, pool, Parallel(r.tp, r.pp, r.dp)))
    env = res.job.environment
    dev = res.device_of(plan.roles["rollout"].pool)
    shape = rollout_shape(Pricer(res), dev, placed["rollout"].est.par, calib.for_device(dev))
    cores = placed["environment"].est.devices * res.device_of(plan.roles["environment"].pool).cores
    lat = env.tool_latency_s.mean_value() + calib.for_device(
        res.device_of(plan.roles["environment"].pool)).tool_overhead_s
    rounds = tool_waves(shape.replicas * shape.concurrency, env.cpu_per_call, cores) - 1
    lockstep = (env.turns - 1) * shape.waves * rounds * lat
    return Pricer(res, calib).tool_time(placed["rollout"], placed["environment"]), lockstep


@pytest.mark.parametrize("turns, prompts, latency", [(2, 32, 1.0), (3, 64, 1.0), (3, 128, 0.5),
                                                     (4, 96, 2.0)])
def test_queued_tools_agree_with_simulator(turns: int, prompts: int, latency: float) -> None:
    plan = small_plan(environment__turns=turns, batch__prompts=prompts,
                      environment__tool_latency_s={"kind": "fixed", "value": latency})
    tool, lockstep = _pair(plan)
    assert 0 < tool < lockstep  # the calls queue, and the queueing overlaps decoding
    pred = reprice(plan, at_means(plan.spec), Calibration()).iteration_s
    sim = simulate_plan(plan, iterations=1, seed=0, config=SimConfig.no_variance())
    got = sim.metrics.iteration_s.mean
    assert abs(got - pred) <= 0.005 * pred, f"simulated {got:.3f} s vs predicted {pred:.3f} s"


def test_overprovisioned_queue_can_end_the_stage_sooner() -> None:
    """Over-provisioned, a pool a little short of cores staggers the last turn's returns: the
    first groups back decode in a smaller batch and the kept count is reached sooner than when
    every call returns at once. The replay's pair term is negative (not clipped to 0) and the
    simulator agrees exactly. Whether the staggered returns end the stage sooner turns on the
    decode step's speed, so the case fixes it (`decode_bw_eff` 0.60, where they win from 0.50
    to 0.65 on today's pricing and not from 0.70) rather than follow the shipped defaults."""
    calib = Calibration(default=Efficiency(decode_bw_eff=0.60))
    job = job_from_dict(small_job(environment__turns=4,
                                  lengths__response={"kind": "fixed", "value": 256},
                                  tail_policy={"kind": "overprovision", "fraction": 0.25}))
    plan = place(resolve(job), dict(SMALL_PLACEMENT, environment=("cpu", 2, "env")), calib)
    assert _pair(plan, calib)[0] < 0
    pred = reprice(plan, at_means(plan.spec), calib).iteration_s
    sim = simulate_plan(plan, iterations=1, seed=0, config=SimConfig.no_variance(),
                        calibration=calib)
    assert sim.metrics.iteration_s.mean == pytest.approx(pred, rel=1e-9)


def test_no_queue_no_charge() -> None:
    """With a core for every sequence the engines hold, no call waits."""
    plan = small_plan(batch__prompts=8)
    assert _pair(plan)[0] == 0.0


@pytest.mark.parametrize("reps, per, conc, slots", [(4, 96, 48, 60), (16, 96, 48, 200),
                                                    (12, 300, 40, 100), (24, 40, 40, 300)])
def test_reduced_replay_tracks_the_exact_one(reps: int, per: int, conc: int, slots: int) -> None:
    """Many replicas or waves are priced on fewer (`queue_delay`): exact within its bounds,
    within 5% of the full replay's queueing beyond them (measured: -3.2% .. +2.4%)."""
    res = resolve(small_plan().spec)
    dev = res.device_of("h100")
    st = step_terms(res.arch_of("rollout"), dev, Parallel(1, 1, 1), Calibration().for_device(dev))
    shape = Replicas(reps, per, conc, reps * per, reps * per)
    args = (256, [256, 256, 256], 64, 1.5)
    exact = rollout_span(st, shape, *args, slots) - rollout_span(st, shape, *args, None)
    got = queue_delay(st, shape, *args, slots)
    assert exact > 0
    if reps <= 8 and per <= 4 * conc:
        assert got == exact
    assert got == pytest.approx(exact, rel=0.05)


@pytest.mark.parametrize("turns, prompts, latency", [(3, 32, 1.0), (3, 64, 0.5), (4, 40, 1.0)])
def test_uneven_replicas_agree_with_simulator(turns: int, prompts: int, latency: float) -> None:
    """Three replicas of 4 x prompts samples (one holds one fewer, so it reaches its tool calls
    first): the replay resumes replicas in time order from the start, as the simulator does,
    and its rollout stage is the simulator's (to 1e-4; the replay before resumed them in list
    order and priced +5e-4 .. +1.4e-3 here)."""
    placement = dict(SMALL_PLACEMENT, rollout=("h100", 3, "gen"))
    plan = small_plan(placement, environment__turns=turns, batch__prompts=prompts,
                      environment__tool_latency_s={"kind": "fixed", "value": latency})
    assert plan.roles["rollout"].dp == 3 and plan.spec.batch.samples % 3
    assert _pair(plan)[0] > 0  # the calls queue
    pred = reprice(plan, at_means(plan.spec), Calibration()).stage_s["rollout"]
    sim = simulate_plan(plan, iterations=1, seed=0, config=SimConfig.no_variance())
    assert sim.metrics.stage_s.rollout == pytest.approx(pred, rel=1e-4)


# latencies: the parts' calls arrive 0.53 s apart on TP2 and TP1 (none on one layout), so 0.5 s
# keeps their bursts apart and 1.0 s and 3.0 s make the later one wait part of a latency
@pytest.mark.parametrize("tps, latency", [((1, 1), 1.5), ((2, 1), 0.5), ((1, 2), 0.5),
                                          ((2, 1), 1.0), ((1, 2), 3.0)])
def test_split_parts_share_one_pool(monkeypatch, tps: tuple[int, int], latency: float) -> None:
    """Two parts, one replica of n identical samples each (one wave, two turns), on n cores
    shared: the part whose calls arrive first (at T_a) takes every core, and the other's calls
    (at T_b >= T_a) wait for them, so its stage grows by max(T_a + latency - T_b, 0) and the
    first one's not at all - on the same layout (T_a = T_b) one whole latency, on layouts far
    enough apart none. Static shares of the cores in proportion to each part's engine slots
    (what the planner priced before) charge both parts."""
    res = resolve(small_plan().spec)
    dev = res.device_of("h100")
    n, args = 16, (256, [256, 256], 64, latency)
    sts = [step_terms(res.arch_of("rollout"), dev, Parallel(tp, 1, 1),
                      Calibration().for_device(dev)) for tp in tps]
    groups = tuple((st, Replicas(1, n, n, n, n)) for st in sts)
    seen: list[tuple[float, int]] = []

    class Arrivals(FifoPool):  # records when each group of calls arrives
        def submit(self, t: float, calls: int) -> list[tuple[float, int]]:
            seen.append((t, calls))
            return super().submit(t, calls)

    monkeypatch.setattr("placer.cost.toolqueue.FifoPool", Arrivals)
    arrivals = []
    for g in groups:  # unlimited cores, each part alone: when its calls arrive
        seen.clear()
        rollout_spans((g,), *args, None)
        assert len(seen) == 1 and seen[0][1] == n
        arrivals.append(seen[0][0])
    monkeypatch.undo()
    a, b = (0, 1) if arrivals[0] <= arrivals[1] else (1, 0)
    want = [0.0, 0.0]
    want[b] = max(arrivals[a] + latency - arrivals[b], 0.0)
    got = queue_delays(groups, *args, n)
    assert got[a] == pytest.approx(0.0, abs=1e-9)
    assert got[b] == pytest.approx(want[b], rel=1e-9, abs=1e-9)
    static = [queue_delay(st, Replicas(1, n, n, n, n), *args, n // 2) for st in sts]
    assert all(d > 0 for d in static)


def test_replicas_submit_their_calls_in_time_order(monkeypatch) -> None:
    """Replicas of uneven sample counts reach their tool calls at different times; the replay
    submits them to the pool in time order (the pool refuses a call from the past, as the
    simulator's `CorePool` does), and the queued calls take the servers the earliest calls
    free: with 3 replicas of 43, 43 and 42 samples on 100 cores, the 42 arrive first at T_2,
    the first 43 at T_0 > T_2 and of the second 43 (at T_0) 15 find a core, the other 28 one
    of the first 42's, free at T_2 + latency."""
    pool = FifoPool(4, 1.0)
    pool.submit(2.0, 1)
    with pytest.raises(ValueError, match="time order"):
        pool.submit(1.0, 1)
    res = resolve(small_plan().spec)
    dev = res.device_of("h100")
    st = step_terms(res.arch_of("rollout"), dev, Parallel(1, 1, 1), Calibration().for_device(dev))
    args = (256, [256, 256], 64, 1.0)
    got: list[tuple[float, int, list[tuple[float, int]]]] = []

    class Calls(FifoPool):
        def submit(self, t: float, calls: int) -> list[tuple[float, int]]:
            out = super().submit(t, calls)
            got.append((t, calls, out))
            return out

    monkeypatch.setattr("placer.cost.toolqueue.FifoPool", Calls)
    rollout_span(st, Replicas(3, 43, 43, 128, 128), *args, 100)
    first = [(t, n) for t, n, _ in got[:3]]
    assert [n for _, n in first] == [42, 43, 43] and first[0][0] < first[1][0] == first[2][0]
    t2, t0 = first[0][0], first[1][0]
    assert got[2][2] == [(t0 + 1.0, 15), (t2 + 2.0, 28)]
