"""Collective calls as the executor makes them, the collective probe's fit of `coll_base_s`,
and the host oversubscription of emulated devices (placer/cost/layercomm.py, placer/calibrate/fit.py,
placer/cost/model.py `oversubscription`, executors/collprobe.py)."""
from __future__ import annotations

import itertools

import pytest
from calibdata import tiny_dp2_plan

from executors.collprobe import BLOCKS
from placer.calibrate.fit import fit_trace
from placer.cost.collectives import all_gather, all_reduce
from placer.cost.efficiency import Efficiency
from placer.cost.estimate import reducing
from placer.cost.layercomm import fsdp_calls, fsdp_units, oversubscription, span_link, weight_gather_time
from placer.cost.model import train_time
from placer.cost.roofline import weight_tensors
from placer.cost.sharding import Parallel
from placer.spec.catalog import shipped_devices, shipped_models
from traces.schema import Trace, TraceEvent

TINY = shipped_models()["tiny-llama"]  # 2 decoder layers: 3 FSDP units with the root
EMU = shipped_devices()["emu-gpu"]
H100 = shipped_devices()["H100-SXM"]
# latency only: every call costs exactly one unit of its base (`coll_base_s`, or a TP
# all-reduce's own `tp_base_s`), nothing else
CALLS_ONLY = Efficiency(coll_base_s=0.0, tp_base_s=0.0, nvlink_hop_s=0.0, net_hop_s=0.0, tp_hop_s=0.0,
                        link_eff=1e30, tp_link_eff=1e30)


def calls(par: Parallel, steps: int = 1) -> float:
    """d train_time / d (coll_base_s and tp_base_s): the collective calls a training step makes."""
    one = CALLS_ONLY.override({"coll_base_s": 1.0, "tp_base_s": 1.0})
    return (train_time(TINY, EMU, par, 200.0, 20.0, steps, one)
            - train_time(TINY, EMU, par, 200.0, 20.0, steps, CALLS_ONLY))


# the vocabulary split's calls per training pass under TP (`placer.cost.vocabcomm`, what
# executors/vocab.py runs): the embedding's all-reduce, the LM head's input-gradient all-reduce
# in the backward, the log-prob's 3 and the entropy's 2 (not repeated by recompute)
VOCAB = 1 + 1 + 3 + 2


def test_fsdp_units_and_calls_per_micro_batch():
    assert fsdp_units(TINY) == 3
    assert fsdp_calls(TINY, 1) == 3  # a forward: one gather per unit
    # forward gather + backward gather + reduce-scatter per unit, less the root's backward
    # gather (FSDP2 keeps the root gathered)
    assert fsdp_calls(TINY, 3) == 8


@pytest.mark.parametrize("par, expected", [
    (Parallel(), 0),                                       # world 1: the plain model
    (Parallel(dp=2, recompute=False), 8 + 1),             # FSDP 8 + the step's gradient/norm call
    (Parallel(tp=2, recompute=False), 2 * 2 * 2 + VOCAB),  # 2 per layer forward, 2 backward
    (Parallel(tp=2, recompute=True), 2 * 2 * 3 + VOCAB),   # + the recomputed forward's 2 per layer
    (Parallel(dp=2, tp=2, recompute=False), 8 + 1 + 8 + VOCAB),  # both
    (Parallel(pp=2, recompute=False), 2),                 # one boundary, forward and backward
])
def test_train_step_collective_calls(par, expected):
    assert calls(par) == pytest.approx(expected, abs=1e-9)


def test_calls_scale_with_optimizer_steps():
    assert calls(Parallel(dp=2, recompute=False), steps=3) == pytest.approx(27, abs=1e-9)


@pytest.fixture(scope="module")
def plan():
    return tiny_dp2_plan()


def _trace(plan, truth: Efficiency, probe: bool, metadata: dict | None = None) -> Trace:
    """Executor-style events timed by the cost model at `truth`: the collective probe's (two
    kinds, two ranks, in blocks) and train events of several sizes on the dp-2 actor."""
    res = plan.resolved()
    actor = plan.roles["actor"]
    events = []
    if probe:
        # the probe's timed blocks (executors/collprobe.py: BLOCKS events per kind and rank)
        for rank, _ in itertools.product(range(2), range(BLOCKS)):
            for kind, nbytes, n in (("all_reduce", 1024, 10), ("fsdp_unit", 1024, 20)):
                fn = all_reduce if kind == "all_reduce" else all_gather
                # the executor's time: on an oversubscribed host, stretched
                dur = n * fn(nbytes, 2, span_link(EMU, 2, truth)) * oversubscription(EMU, 2, truth)
                events.append(TraceEvent(f"probe {kind}", "collective", 0.0, dur, "gpu:0",
                                         f"actor{rank}", {"role": "actor",
                                                          "devices": [f"gpu:0:{rank}"],
                                                          "collective": kind, "ranks": 2,
                                                          "bytes": nbytes, "calls": n}))
    m = res.model_of("actor")
    for k in range(6):
        tokens, samples = 400.0 + 300 * k, 8 + 4 * k
        # as the executor's FSDP2 loop runs it: its gradients reduced in fp32 (`reducing`)
        dur = train_time(m, EMU, reducing(res, actor.par), tokens, tokens / samples, 1, truth)
        events.append(TraceEvent("train actor", "train", 1.0 + k, dur, "gpu:0", "actor0",
                                 {"role": "actor", "devices": ["gpu:0:0", "gpu:0:1"],
                                  "tokens": tokens, "sample_ids": list(range(samples))}))
    return Trace({"source": "execute", **(metadata or {})}, events)


def _fits(result):
    return {(f.device, f.name): f for f in result.factors}


def test_probe_recovers_the_collective_latency_and_frees_the_train_overhead(plan):
    truth = Efficiency(coll_base_s=2e-3, train_overhead_s=0.03)
    fits = _fits(fit_trace(_trace(plan, truth, probe=True), plan, "exec.json"))
    assert fits[("emu-gpu", "coll_base_s")].status == "fitted"
    assert fits[("emu-gpu", "coll_base_s")].value == pytest.approx(2e-3, rel=1e-4)
    # the train events are priced at the probed latency: their overhead is the truth's
    assert fits[("emu-gpu", "train_overhead_s")].value == pytest.approx(0.03, rel=1e-3)


def test_without_the_probe_the_train_overhead_absorbs_the_collectives(plan):
    truth = Efficiency(coll_base_s=2e-3, train_overhead_s=0.03)
    fits = _fits(fit_trace(_trace(plan, truth, probe=False), plan, "exec.json"))
    assert ("emu-gpu", "coll_base_s") not in fits
    # 9 calls a step (dp 2, 3 FSDP units) at 2 ms, less the prior's 6.6 us each
    assert fits[("emu-gpu", "train_overhead_s")].value == pytest.approx(
        0.03 + 9 * (2e-3 - 6.6e-6), rel=1e-3)


@pytest.mark.parametrize("dev, cores, ranks, factor", [
    (EMU, 2, 4, 2.0),   # 4 ranks time-share 2 cores
    (EMU, 2, 2, 1.0),   # one core each
    (EMU, 4, 2, 1.0),   # spare cores do not speed a rank up
    (EMU, 2, 3, 1.5),
    (EMU, 0, 8, 1.0),   # cores unknown: no stretch
    (H100, 2, 8, 1.0),  # a real GPU: its own device per rank
])
def test_oversubscription_factor(dev, cores, ranks, factor):
    assert oversubscription(dev, ranks, Efficiency(host_cores=cores)) == factor


def test_oversubscription_stretches_training_on_emulated_devices_only():
    par = Parallel(dp=2, tp=2)
    for dev, factor in ((EMU, 2.0), (H100, 1.0)):
        base = train_time(TINY, dev, par, 400.0, 20.0, 1, Efficiency())
        crowded = train_time(TINY, dev, par, 400.0, 20.0, 1, Efficiency(host_cores=2))
        assert crowded == pytest.approx(factor * base, rel=1e-12)


def test_host_cores_come_from_the_trace_metadata(plan):
    truth = Efficiency(coll_base_s=2e-3, host_cores=1)  # the probe's 2 ranks on one core
    trace = _trace(plan, truth, probe=True, metadata={"host_cores": 1})
    result = fit_trace(trace, plan, "exec.json")
    fits = _fits(result)
    assert fits[("emu-gpu", "host_cores")].value == 1 and \
        fits[("emu-gpu", "host_cores")].status.startswith("measured")
    assert result.fitted()["emu-gpu"]["host_cores"] == 1
    # the probe's time is read through the factor: the latency per call is the truth's
    assert fits[("emu-gpu", "coll_base_s")].value == pytest.approx(2e-3, rel=1e-4)


@pytest.mark.parametrize("par, per_tensor", [
    (Parallel(), 0.0),                  # one rank holds the full weights
    (Parallel(dp=2, zero=1), 0.0),      # ZeRO-1: every rank holds them too
    (Parallel(dp=2), 1.0),              # FSDP: one all-gather per tensor
    (Parallel(tp=2), 1.0),              # TP shards: likewise
    (Parallel(dp=2, pp=2), 0.5),        # each stage gathers its own share of the tensors
])
def test_weight_gather_calls_once_per_tensor_of_a_sharded_trainer(par, per_tensor):
    tensors = weight_tensors(TINY)
    one = CALLS_ONLY.override({"coll_base_s": 1.0})
    assert weight_gather_time(TINY, EMU, par, tensors, one) == pytest.approx(per_tensor * tensors)


def test_executor_train_events_price_their_weight_gather(plan):
    """A train event that says it includes the gather (`gathers: 1`, as the executor's do) is
    priced with it: the fit recovers the truth's overhead, not the overhead plus the gather."""
    truth = Efficiency(coll_base_s=2e-3, train_overhead_s=0.03)
    trace = _trace(plan, truth, probe=True)
    m, par = plan.resolved().model_of("actor"), plan.roles["actor"].par
    gather = weight_gather_time(m, EMU, par, weight_tensors(m), truth)
    assert gather > 9 * 2e-3  # one call per tensor, at the probed latency
    events = [TraceEvent(e.name, e.cat, e.ts_s, e.dur_s + gather, e.pid, e.tid,
                         {**e.args, "gathers": 1}) if e.cat == "train" else e
              for e in trace.events]
    fits = _fits(fit_trace(Trace(trace.metadata, events), plan, "exec.json"))
    assert fits[("emu-gpu", "train_overhead_s")].value == pytest.approx(0.03, rel=1e-3)


def test_a_probed_fsdp_call_cost_prices_the_fsdp_units_only():
    """`fsdp_call_s`, when probed, is what each FSDP unit's gather and reduce-scatter cost; the
    step's other collective (the gradient norm's all-reduce) still pays `coll_base_s`."""
    par = Parallel(dp=2, recompute=False)  # 8 FSDP calls and 1 other a step (above)
    fsdp_only = CALLS_ONLY.override({"fsdp_call_s": 1.0})
    both = CALLS_ONLY.override({"fsdp_call_s": 1.0, "coll_base_s": 0.5})

    def t(e: Efficiency) -> float:
        return (train_time(TINY, EMU, par, 200.0, 20.0, 1, e)
                - train_time(TINY, EMU, par, 200.0, 20.0, 1, CALLS_ONLY))
    assert t(fsdp_only) == pytest.approx(8, abs=1e-9)
    assert t(both) == pytest.approx(8 + 0.5, abs=1e-9)
