"""The Ray cluster a run uses (`executors.cluster`): an embedded Ray lives as long as the run
that started it, and a cluster the process was already connected to is checked against what the
plan's bundles ask for before any placement group waits on it.

A run that left its embedded Ray up made the next run in the same process reuse it, with the
first plan's resources: a plan whose rollout sits on an LPU pool, after one that had none, waited
two minutes for a placement group and failed ("the cluster lacks ... LPU").
"""
from __future__ import annotations

from pathlib import Path

import pytest

from executors import cluster
from executors.runplan import resolve_plan
from placer.base.errors import SpecError


def _runs():
    from exec_util import GRPO_LAYOUT, hand_plan  # lazy: the plan helpers load the planner

    from placer.cost.sharding import Parallel
    lpu = hand_plan(GRPO_LAYOUT)  # the rollout on the LPU pool
    gpu_only = hand_plan({**GRPO_LAYOUT, "rollout": ("gpu", Parallel(dp=2), "train")})
    return lpu, resolve_plan(lpu), resolve_plan(gpu_only)


def _totals(run) -> dict[str, float]:
    out: dict[str, float] = {}
    for res in cluster.node_resources(run).values():
        for k, v in res.items():
            out[k] = out.get(k, 0.0) + v
    return out


def test_the_shortfall_names_what_a_cluster_lacks() -> None:
    _, lpu, gpu_only = _runs()
    assert cluster.shortfall(lpu, _totals(lpu)) == ""  # its own embedded Ray has everything
    short = cluster.shortfall(lpu, _totals(gpu_only))
    assert "LPU" in short and "pool_lpu" in short and "GPU" not in short.replace("pool_", "")
    assert cluster.shortfall(gpu_only, _totals(gpu_only)) == ""


@pytest.mark.ray
def test_an_embedded_ray_stops_with_its_run_and_a_short_cluster_is_refused(
        tmp_path: Path) -> None:
    import ray  # lazy: Ray (~1 s) loads when a Ray test runs, not at collection

    from executors import ray_private
    from executors.run import execute
    plan, lpu, gpu_only = _runs()
    if ray.is_initialized():
        ray.shutdown()
    info = cluster.start(gpu_only)  # an embedded Ray with the GPU-only plan's resources
    try:
        assert info.embedded and ray.is_initialized()
        # a later run in this process: refused at once, not after a placement group's timeout
        with pytest.raises(SpecError, match=r"^Ray: .* lacks .*\bLPU \d+ \(has 0\)"):
            execute(plan, 1, tmp_path / "out")
        cluster.stop(info)
        assert not ray.is_initialized()
        # a Ray this process started itself, with every resource the plan asks for, is only
        # used: the run leaves it up
        have = _totals(lpu)
        ray.init(num_cpus=int(have.pop("CPU", 1)), num_gpus=int(have.pop("GPU", 0)),
                 resources=have, include_dashboard=False, **ray_private.loopback_init_args())
        theirs = cluster.start(lpu)
        assert not theirs.embedded and theirs.pinned
        cluster.stop(theirs)
        assert ray.is_initialized()
    finally:
        ray.shutdown()
