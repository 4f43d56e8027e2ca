"""HSDP in the executor: a plan's trainer `shard` (verl's fsdp_size) runs FSDP2 over a 2-D
("rep", "shard") mesh -- 4 gloo processes as 2 replicas of a 2-rank shard group -- and takes the
same optimizer steps as one process on the whole batch."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import SPAWN, run_world
from test_exec_sharding import batch, config, model_dir, one_process  # noqa: F401 (fixture)

from executors.model import load_policy
from executors.roles import RunConfig
from executors.sharding import Layout
from executors.trainer import Trainer
from executors.training import partition


def _train_and_report(rank: int, tr: Trainer, cfg: RunConfig, q_out: Any, out: str) -> None:
    layout = cfg.trainer
    s, adv = batch(1)
    info, timing = tr.train(partition(s, adv, None, layout, cfg.mini_batches,
                                      cfg.accumulate)[rank])
    w: Any = next(iter(tr.model.parameters()))  # a DTensor once sharded
    mesh = (tuple(w.device_mesh.mesh_dim_names), tuple(w.device_mesh.shape),
            tuple(type(p).__name__ for p in w.placements))
    full = tr.weights()  # a collective: every rank gathers, rank 0 gets them
    if rank == 0:
        torch.save(full, out)
    q_out.put((rank, info, timing["sample_ids"], tr.executed_layout(layout.world), mesh))


def test_hsdp_2x2_step_matches_one_process(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    cfg = config(model_dir, trainer=Layout(4, 1, 1, 2), mini_batches=2)
    want, info = one_process(cfg)
    q_out = SPAWN.Queue()
    out = tmp_path / "w.pt"
    run_world(_train_and_report, cfg, cfg, q_out, str(out))
    ranks = sorted((q_out.get(timeout=5) for _ in range(4)), key=lambda x: x[0])
    got = torch.load(out)
    start = load_policy(model_dir).state_dict()
    assert max(float((want[k] - start[k]).abs().max()) for k in want) > 1e-4
    bad = {k: float((got[k] - want[k]).abs().max()) for k in want
           if not torch.allclose(got[k], want[k], atol=5e-5, rtol=1e-4)}
    assert not bad, bad
    for r in ranks:
        assert r[1]["optimizer_steps"] == 2
        assert r[1]["grad_norms"] == pytest.approx(info["grad_norms"], rel=1e-4)
        want_layout = {"dp": 4, "tp": 1, "pp": 1, "shard": 2, "recompute": False}
        assert {k: r[3][k] for k in want_layout} == want_layout  # read off the model
        # FSDP2's HSDP: replicated over "rep", sharded over "shard"
        assert r[4] == (("rep", "shard"), (2, 2), ("Replicate", "Shard"))
    # the four dp ranks split the batch between them
    assert sorted(sum((r[2] for r in ranks), [])) == sorted(batch(1)[0].ids)


def test_layout_names_the_shard_group() -> None:
    assert str(Layout(4, 1, 1, 2)) == "dp4 tp1 pp1 shard2"
    assert Layout(4, 1, 1, 4).as_dict() == {"dp": 4, "tp": 1, "pp": 1}  # all of dp: plain FSDP
