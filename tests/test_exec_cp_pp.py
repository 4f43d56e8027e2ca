"""Context parallelism with pipeline stages (`executors.cpattn`, `executors.pipeline`) on gloo:
each pipeline is one (dp, cp, tp) coordinate's, every stage running its CP rank's columns, so
stage 0's CP rank c sends its slice's hidden states to stage 1's CP rank c and gets their
gradients back; the last stage scores the response tokens its columns predict, and the CP
group sums the loss, its statistics and the old log-probs.

  - pp 2 x cp 2 (4 processes, 1F1B over 2 micro-batches) and, marked slow, pp 2 x cp 2 x tp 2
    (8 processes: the last stage's logits split by vocabulary too) take the same two optimizer
    steps as one process on the whole batch: weights, gradient norms, the loss and its
    statistics; the executed layout reads cp and pp off each rank's stage; the checkpoint
    (every stage's weights and Adam state gathered onto rank 0) is the one-process format;
  - with the stage's K/V gather dropped (each rank attending to its own columns only) the
    step no longer matches: the cross-rank gather inside every stage is what makes it agree.

Measured (tiny-llama, 8 samples, 2 mini-batches, lr 1e-3; `python -m pytest -q -s
tests/test_exec_cp_pp.py -m ''`): max |weight difference| vs one process 9.1e-8 (pp 2 x cp 2)
and 2.1e-6 (pp 2 x cp 2 x tp 2); the weights moved 2.0e-3.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import SPAWN, run_world
from test_exec_pipeline import one_process
from test_exec_sharding import ARCH, batch, config, distributed

from executors import cpattn
from executors.model import build_policy, load_policy, save_model_dir
from executors.pipeline import stage_bounds
from executors.sharding import Layout
from executors.trainer import Trainer
from executors.training import partition


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


@pytest.mark.parametrize("layout", [
    Layout(pp=2, cp=2),
    pytest.param(Layout(tp=2, pp=2, cp=2), marks=pytest.mark.slow)],  # 8 processes
    ids=["pp2xcp2", "pp2xcp2xtp2"])
def test_cp_pp_step_matches_one_process(layout: Layout, model_dir: Path, tmp_path: Path) -> None:
    cfg = config(model_dir, trainer=layout, mini_batches=2, accumulate=2)
    want, info = one_process(cfg)
    got, ranks = distributed(cfg, tmp_path)
    start = load_policy(model_dir).state_dict()
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    assert moved > 1e-4  # the step did something, so agreeing is not trivial
    assert sorted(got) == sorted(want)  # rank 0 gathered every stage's weights
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    print(f"{layout}: max |weight diff| vs one process {diff:.2e} (moved {moved:.2e})")
    bad = {k: float((got[k] - want[k]).abs().max()) for k in want
           if not torch.allclose(got[k], want[k], atol=5e-5, rtol=1e-4)}
    assert not bad, bad
    for r in ranks:  # the global norm sums every stage's and CP rank's gradients
        assert r[1]["optimizer_steps"] == 2
        assert r[1]["grad_norms"] == pytest.approx(info["grad_norms"], rel=1e-4)
        read = r[3]
        assert (read["dp"], read["cp"], read["tp"], read["pp"]) == (1, 2, layout.tp, 2), read
        assert read["layers"] == list(range(*stage_bounds(ARCH.layers, 2, layout.stage(r[0]))))
        if layout.stage(r[0]) == 1:  # every last-stage CP rank holds the group's sums
            assert r[1]["loss"] == pytest.approx(info["loss"], abs=1e-6)
            for k in ("entropy", "kl", "clip_frac"):
                assert r[1][k] == pytest.approx(info[k], rel=1e-4, abs=1e-7)
        else:  # the first stage computes no loss
            assert r[1]["loss"] == 0.0
    assert info["entropy"] > 0
    leaders = [r for r in ranks if layout.leads(r[0])]
    assert len(leaders) == 1 and sorted(leaders[0][2]) == sorted(batch(1)[0].ids)
    plain = Trainer(dataclasses.replace(cfg, trainer=Layout()))  # the one-process format
    assert plain.load(str(tmp_path / "w.pt.ckpt")) == 1
    for k, v in plain.weights().items():
        torch.testing.assert_close(v, got[k])


def _own_keys_only(k: torch.Tensor, v: torch.Tensor, group: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gather dropped: this rank's keys in its own place, zeros where the others' go."""
    import torch.distributed as dist
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return tuple(torch.cat([x if i == r else torch.zeros_like(x) for i in range(n)], 2)
                 for x in (k, v))  # type: ignore[return-value]


def _step_without_gather(rank: int, tr: Trainer, q_out: Any) -> None:
    cpattn.gather_kv = _own_keys_only  # this rank's process only
    s, adv = batch(1)
    lay = tr.layout
    info, _ = tr.train(partition(s, adv, None, lay, 2, 2)[rank])
    q_out.put((rank, info["grad_norms"]))


def test_cp_pp_needs_the_gather_in_every_stage(model_dir: Path) -> None:
    cfg = config(model_dir, trainer=Layout(pp=2, cp=2), mini_batches=2, accumulate=2)
    _, info = one_process(cfg)
    q_out = SPAWN.Queue()
    run_world(_step_without_gather, cfg, q_out)
    for _, norms in (q_out.get(timeout=5) for _ in range(4)):
        assert norms != pytest.approx(info["grad_norms"], rel=1e-2), norms
