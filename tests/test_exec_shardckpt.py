"""A sharded trainer's checkpoint, rank by rank (`executors.shardckpt`): each rank writes its own
shards (nothing gathered onto rank 0's host), into a temporary folder renamed when complete,
and any layout restores it exactly (one process here; a dp 2 x tp 2 one in
tests/test_exec_sharding.py)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import SPAWN, run_world
from test_exec_sharding import ARCH, batch, config

from executors import shardckpt
from executors.model import build_policy, save_model_dir
from executors.runplan import Layout
from executors.sharding import full_state
from executors.trainer import Trainer
from executors.training import partition


def _save_twice(rank: int, tr: Any, cfg: Any, out: str, q_out: Any) -> None:
    s, adv = batch(1)
    tr.train(partition(s, adv, None, cfg.trainer, cfg.mini_batches, cfg.accumulate)[rank])
    tr.save(out, 0)
    tr.save(out, 0)  # the same step again (a rollback re-runs it): replaced whole
    weights, optim = full_state(tr.model), shardckpt.full_optim(tr.opt)  # collectives: every rank
    if rank == 0:  # by file: a queued tensor's memory goes with its process
        torch.save((weights, optim, tr.optimizer_steps), out + ".want")
    q_out.put(rank)


def test_each_rank_writes_its_shards_and_one_process_restores_them(tmp_path: Path) -> None:
    """dp 2 after a step: the checkpoint is a folder of one file per rank, no temporary left;
    each rank's file holds about half of the weights and moments (its shards; only the plain
    tensors, Adam's step counts and buffers, are rank 0's alone), and a one-process trainer
    loads exactly the gathered weights and Adam state."""
    model_dir = save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path / "v0")
    cfg = config(model_dir, trainer=Layout(2, 1, 1))
    out = tmp_path / "ck" / "actor-000000.pt"
    q_out = SPAWN.Queue()
    run_world(_save_twice, cfg, cfg, str(out), q_out)
    assert sorted(q_out.get(timeout=5) for _ in range(2)) == [0, 1]
    weights, optim, steps = torch.load(str(out) + ".want", weights_only=False)
    assert sorted(p.name for p in out.parent.iterdir()) == ["actor-000000.pt",
                                                            "actor-000000.pt.want"]
    assert sorted(p.name for p in out.iterdir()) == ["rank-00000.pt", "rank-00001.pt"]
    whole = sum(v.nbytes for v in weights.values())
    for r in range(2):
        part = torch.load(out / f"rank-{r:05d}.pt", weights_only=False)
        mine = sum(p["local"].nbytes for k, p in part["pieces"].items() if k[0] == "model")
        assert 0.3 * whole < mine < 0.7 * whole, (r, mine, whole)
    plain = Trainer(dataclasses.replace(cfg, trainer=Layout()))
    assert plain.load(str(out)) == 1 and plain.optimizer_steps == steps
    for k, v in plain.weights().items():
        assert torch.equal(v, weights[k]), k
    st = plain.opt.state_dict()["state"]
    for i, want in optim["state"].items():
        for name, v in want.items():
            assert torch.equal(st[i][name], v), (i, name)
    assert shardckpt.load(str(out))["step"] == 0


def _save_and_gather(rank: int, tr: Any, cfg: Any, out: str, q_out: Any) -> None:
    s, adv = batch(1)
    tr.train(partition(s, adv, None, cfg.trainer, cfg.mini_batches, cfg.accumulate)[rank])
    tr.save(out, 0)
    weights, optim = tr.weights(), shardckpt.full_optim(tr.opt)  # collectives: every rank
    if tr.pipe is not None:
        optim = tr._stages_optim(optim)
    if rank == 0:
        torch.save((weights, optim, tr.optimizer_steps), out + ".want")
    q_out.put(rank)


@pytest.mark.parametrize("layout", [(2, 2, 1), (1, 1, 2), (2, 1, 2)],
                         ids=["dp2tp2", "pp2", "dp2pp2"])
def test_tp_and_pipelined_trainers_write_their_shards_too(tmp_path: Path,
                                                          layout: tuple[int, int, int]) -> None:
    """TP's 2-D shards (FSDP2's strided shard of TP's cut) and pipeline stages: a folder of one
    file per rank, every element of the weights written once (no rank writes the whole model:
    nothing gathered onto one host), and a one-process trainer loads exactly the weights and
    Adam state the layout gathers."""
    model_dir = save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path / "v0")
    cfg = config(model_dir, trainer=Layout(*layout))
    world = cfg.trainer.world
    out = tmp_path / "ck" / "actor-000000.pt"
    q_out = SPAWN.Queue()
    run_world(_save_and_gather, cfg, cfg, str(out), q_out)
    assert sorted(q_out.get(timeout=5) for _ in range(world)) == list(range(world))
    weights, optim, steps = torch.load(str(out) + ".want", weights_only=False)
    assert sorted(p.name for p in out.iterdir()) == [f"rank-{r:05d}.pt" for r in range(world)]
    whole = sum(v.nbytes for v in weights.values())
    written = []
    for r in range(world):
        part = torch.load(out / f"rank-{r:05d}.pt", weights_only=False)
        written.append(sum(p["local"].nbytes for k, p in part["pieces"].items() if k[0] == "model")
                       + sum(v.nbytes for k, v in part["whole"].items() if k[0] == "model"))
    assert sum(written) == whole and max(written) < 0.7 * whole, (written, whole)
    plain = Trainer(dataclasses.replace(cfg, trainer=Layout()))
    assert plain.load(str(out)) == 1 and plain.optimizer_steps == steps
    got = plain.weights()
    assert sorted(got) == sorted(weights)
    assert all(torch.equal(v, weights[k]) for k, v in got.items())
    st = plain.opt.state_dict()["state"]
    assert sorted(st) == sorted(optim["state"])
    for i, want in optim["state"].items():
        for name, v in want.items():
            assert torch.equal(st[i][name], v), (i, name)
