"""The trainers' collective probe (executors/collprobe.py) on a real 2-rank gloo world: every kind
it times, in blocks a fit can use, and the fit of its per-call factors from what it measured
(placer/calibrate/fit.py, group "collective")."""
from __future__ import annotations

from typing import Any

import pytest
from calibdata import tiny_dp2_plan
from gloo_world import SPAWN, run_world

from executors import collprobe
from executors.model import build_policy, save_model_dir
from executors.roles import RunConfig
from executors.runplan import Layout
from executors.trainer import Trainer
from placer.calibrate.fit import fit_trace
from placer.spec.catalog import shipped_models
from traces.schema import Trace, TraceEvent

ARCH = shipped_models()["tiny-llama"]


def _probe(rank: int, tr: Trainer, q_out: Any) -> None:
    q_out.put((rank, tr.probe_collectives()))


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, list[dict]]]:
    model_dir = save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")
    cfg = RunConfig(algorithm="grpo", arch=ARCH.model_dump(), model_dir=str(model_dir), seed=0,
                    max_new_tokens=8, lr=1e-3, trainer=Layout(2, 1, 1))
    q_out = SPAWN.Queue()
    run_world(_probe, cfg, q_out)
    return sorted((q_out.get(timeout=5) for _ in range(2)), key=lambda x: x[0])


def test_every_kind_is_timed_in_blocks(probed):
    for _, out in probed:
        assert [p["collective"] for p in out] == [k for k in collprobe.KINDS
                                                  for _ in range(collprobe.BLOCKS)]
        per_round = {"all_reduce": 1, "fsdp_unit": 2, "gather": 1, "tp_pair": 2}
        for kind in collprobe.KINDS:
            mine = [p for p in out if p["collective"] == kind]
            assert sum(p["calls"] for p in mine) == collprobe.REPS * per_round[kind]
            assert all(p["ranks"] == 2 and p["dur"] > 0 for p in mine)


def test_the_probe_fits_each_kind_of_call(probed):
    """Each factor comes out of its own kind's events: the fit finds per call what the probe
    measured per call (the two ranks' mean, within their spread)."""
    plan = tiny_dp2_plan()
    events = [TraceEvent(f"probe {p['collective']}", "collective", p["t0"], p["dur"], "gpu:0",
                         f"actor{rank}", {"role": "actor", "devices": [f"gpu:0:{rank}"],
                                          **{k: p[k] for k in ("collective", "ranks", "bytes",
                                                               "calls")}})
              for rank, out in probed for p in out]
    fits = {f.name: f for f in fit_trace(Trace({"source": "execute"}, events), plan,
                                         "probe").factors}
    for kind, name in (("gather", "gather_call_s"), ("tp_pair", "tp_call_s")):
        per_call = [p["dur"] / p["calls"] for _, out in probed for p in out
                    if p["collective"] == kind]
        assert fits[name].status == "fitted", name
        assert min(per_call) * 0.9 <= fits[name].value <= max(per_call) * 1.1, name
    assert fits["coll_base_s"].status == "fitted"
