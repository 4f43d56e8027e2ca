"""What a checkpoint costs on a plan's layouts, and how a trace's checkpoints and whole-tensor
gathers fit its factors (placer/solve/hostmem.py `checkpoint_time`, placer/cost/layercomm.py
`gather_link`, placer/calibrate/fit.py, workflows/fidelity.py)."""
from __future__ import annotations

import pytest
from calibdata import tiny_dp2_plan
from test_fidelity import OTHER, executed

from placer.calibrate.fit import fit_trace
from placer.cost.collectives import all_gather, all_reduce
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.layercomm import gather_link, span_link, weight_gather_time
from placer.cost.roofline import GB, weight_tensors
from placer.cost.sharding import Parallel
from placer.solve.hostmem import CHECKPOINT_BYTES, checkpoint_time, plan_checkpoint_s
from placer.spec.catalog import shipped_devices, shipped_models
from traces.schema import Trace, TraceEvent
from workflows.fidelity import fidelity, measured_spans, measured_stages

TINY = shipped_models()["tiny-llama"]
EMU = shipped_devices()["emu-gpu"]
# latency only: every call costs exactly its per-call latency, nothing else
CALLS_ONLY = Efficiency(coll_base_s=1.0, nvlink_hop_s=0.0, net_hop_s=0.0, link_eff=1e30)


@pytest.fixture(scope="module")
def plan():
    return tiny_dp2_plan()


def test_a_measured_gather_latency_prices_whole_tensor_gathers_only():
    """`gather_call_s`, when measured, is what the weight sync's gathers pay per call; a
    collective inside training still pays `coll_base_s`; unmeasured (0), the gathers fall back
    to `coll_base_s`."""
    par, tensors = Parallel(dp=2), weight_tensors(TINY)
    measured = CALLS_ONLY.override({"gather_call_s": 0.25})
    assert gather_link(EMU, 2, measured).base_s == 0.25
    assert span_link(EMU, 2, measured).base_s == 1.0
    assert gather_link(EMU, 2, CALLS_ONLY).base_s == 1.0
    assert weight_gather_time(TINY, EMU, par, tensors, measured) == pytest.approx(0.25 * tensors)


def test_checkpoint_time_is_the_write_and_overhead_on_every_layout(plan):
    """Every rank writes its own shards (executors/shardckpt.py), so no layout pays a gather:
    a sharded plan's checkpoint costs what a one-rank plan's does."""
    eff = Efficiency(checkpoint_overhead_s=0.004)
    write = CHECKPOINT_BYTES * TINY.params() / GB / 20.0
    assert checkpoint_time(TINY, eff, 20.0) == pytest.approx(write + 0.004)
    res = plan.resolved()  # the plan's one trained role, sharded dp 2: its own checkpoint time
    assert plan.roles["actor"].par.dp == 2
    assert plan_checkpoint_s(plan, Calibration(default=eff)) == pytest.approx(checkpoint_time(
        res.model_of("actor"), eff, res.job.cluster.storage_gbs))


def _probe(kind: str, truth: Efficiency, rank: int, n: int = 20) -> TraceEvent:
    fn = all_reduce if kind == "all_reduce" else all_gather
    link = gather_link(EMU, 2, truth) if kind == "gather" else span_link(EMU, 2, truth)
    return TraceEvent(f"probe {kind}", "collective", 0.0, n * fn(1024, 2, link), "gpu:0",
                      f"actor{rank}", {"role": "actor", "devices": [f"gpu:0:{rank}"],
                                       "collective": kind, "ranks": 2, "bytes": 1024, "calls": n})


def _checkpoints(plan, truth: Efficiency, steps: int) -> list[TraceEvent]:
    res = plan.resolved()
    dur = checkpoint_time(res.model_of("actor"), truth, res.job.cluster.storage_gbs)
    return [TraceEvent("checkpoint", "checkpoint", 1.0 + s, dur, "driver", "loop", {"step": s})
            for s in range(steps)]


def _fits(trace: Trace, plan) -> dict:
    return {(f.device, f.name): f for f in fit_trace(trace, plan, "exec.json").factors}


def test_the_probe_and_the_checkpoints_fit_their_own_factors(plan):
    """A gloo-like host: a plain gather costs half an all-reduce's call. The probe's gather kind
    fits `gather_call_s` apart from `coll_base_s`, and the checkpoints, priced with both, fit
    their fixed cost."""
    truth = Efficiency(coll_base_s=1.8e-3, gather_call_s=0.9e-3, checkpoint_overhead_s=0.006)
    # the probe's two timed blocks per kind on each of two ranks (executors/collprobe.py)
    events = [_probe(k, truth, r, 10) for r in range(2) for k in ("all_reduce", "gather")
              for _ in range(2)]
    fits = _fits(Trace({"source": "execute"}, events + _checkpoints(plan, truth, 4)), plan)
    for name, value in (("coll_base_s", 1.8e-3), ("gather_call_s", 0.9e-3),
                        ("checkpoint_overhead_s", 0.006)):
        assert fits[("emu-gpu", name)].status == "fitted", name
        assert fits[("emu-gpu", name)].value == pytest.approx(value, rel=1e-4), name


def test_too_few_checkpoints_keep_the_prior_without_refusing_the_fit(plan):
    truth = Efficiency(coll_base_s=1.8e-3, checkpoint_overhead_s=0.006)
    events = [_probe("all_reduce", truth, r, 10) for r in range(2) for _ in range(2)]
    events += _checkpoints(plan, truth, 2)
    result = fit_trace(Trace({"source": "execute"}, events), plan, "exec.json")
    assert ("emu-gpu", "checkpoint_overhead_s") not in {(f.device, f.name)
                                                        for f in result.factors}
    assert any(k.startswith("checkpoint: 2 on emu-gpu") for k in result.skipped)


def test_fidelity_prices_the_checkpoints_the_run_saved(plan):
    """A run that saves after steps 1 and 2: the measured checkpoint is its own stage (not
    "other"), and the simulated steps that saved one last the priced checkpoint longer."""
    save = 0.02
    tr = executed(plan)
    for s in (1, 2):
        end = measured_spans(tr)[s][1]
        tr.add("checkpoint", "checkpoint", end - save, save, "driver", "loop", step=s)
    st = measured_stages(tr, measured_spans(tr))
    assert st[1]["checkpoint"] == pytest.approx(save)
    assert st[1]["other"] == pytest.approx(OTHER - save)  # the driver's own time only
    eff = Efficiency(checkpoint_overhead_s=0.5)
    rep, sim = fidelity(plan, tr, Calibration(default=eff))
    priced = plan_checkpoint_s(plan, Calibration(default=eff))
    assert priced > 0.5
    assert rep.stages["checkpoint"].measured == pytest.approx(save)
    assert rep.stages["checkpoint"].simulated == pytest.approx(priced)
    recs = sim.run.iterations
    assert rep.steps[0].simulated == pytest.approx(recs[0].end - recs[0].start)  # no save
    assert rep.steps[2].simulated == pytest.approx(recs[2].end - recs[2].start + priced)


def test_the_simulated_failure_model_charges_the_priced_checkpoint(plan):
    """Unset, a checkpoint under the failure model costs what the cost model prices for the
    plan (a failure-free run charges none); set, what the config says."""
    from simulator.api import simulate_plan
    from simulator.config import Failures, SimConfig
    eff = Efficiency(checkpoint_overhead_s=2.0)  # large enough to show in the wall time
    calib = Calibration(default=eff)
    priced = plan_checkpoint_s(plan, calib)
    runs = {}
    for name, failures in (("priced", Failures(mtbf_hours={"gpu": 1e9}, checkpoint_every=2)),
                           ("given", Failures(mtbf_hours={"gpu": 1e9}, checkpoint_every=2,
                                              checkpoint_s=7.0)),
                           ("no failures", Failures(checkpoint_every=2))):
        r = simulate_plan(plan, iterations=4, seed=0, calibration=calib,
                          config=SimConfig.no_variance().model_copy(update={"failures": failures}))
        runs[name] = r
    work = runs["no failures"].timeline.useful_s
    assert runs["no failures"].metrics.checkpoint_s == 0.0
    assert runs["no failures"].timeline.wall_s == pytest.approx(work)
    assert runs["priced"].metrics.checkpoint_s == pytest.approx(priced)
    assert runs["priced"].timeline.wall_s == pytest.approx(work + 2 * priced)
    assert runs["given"].timeline.wall_s == pytest.approx(work + 2 * 7.0)
