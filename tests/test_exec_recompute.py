"""Activation recomputation in the executor: the plan's `recompute` for a training role wraps
every decoder layer in non-reentrant activation checkpointing (`executors.sharding.
recompute_layers`), inside FSDP2 and after TP, on pipeline stages too, and for the PPO critic.

A step with recompute takes the same optimizer step as one without (same loss, gradients and
weights: the recompute is the same arithmetic), in one process and under FSDP2 at dp 2 on gloo
(marked slow: pp 2 and tp 2); the recompute really runs (each layer's attention runs once more
per trained micro-batch, in the backward pass); `metadata.executed_layout` records per training
role whether its layers recompute, as the plan says.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import SPAWN, run_world
from test_exec_sharding import ARCH, batch, config, model_dir, one_process  # noqa: F401 (fixture)
from torch import nn

from executors.model import ValueModel
from executors.modelroles import Critic
from executors.roles import plan_settings
from executors.sharding import Layout, decoder_layers, recompute_layers, recomputes
from executors.trainer import Trainer
from executors.training import partition

MINI = 2  # mini-batches (optimizer steps) of the step; one micro-batch each


def _count_attention(model: nn.Module) -> list[int]:
    """A counter of the calls of every decoder layer's attention (its inner module, below the
    checkpoint wrapper and FSDP: what the recompute runs again)."""
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1
    for name, m in model.named_modules():
        if name.endswith("self_attn"):
            m.register_forward_pre_hook(hook)
    return calls


def _step(tr: Trainer, rank: int = 0, layout: Layout | None = None) -> tuple[dict, int]:
    """One RL step of `tr` on the test batch; (info, attention calls per layer)."""
    calls = _count_attention(tr.model)
    s, adv = batch(1)
    info, _ = tr.train(partition(s, adv, None, layout or Layout(), MINI, 1)[rank])
    return info, calls[0] // len(decoder_layers(tr.model))


def test_one_process_recompute_is_the_same_step(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    plain = Trainer(config(model_dir, mini_batches=MINI))
    rc = Trainer(config(model_dir, mini_batches=MINI, trainer=Layout(recompute=True)))
    assert not recomputes(plain.model) and recomputes(rc.model)
    want, n_plain = _step(plain)
    got, n_rc = _step(rc)
    # proximal log-probs (no grad) and the loss's forward per mini-batch; recompute: + the backward's
    assert (n_plain, n_rc) == (2 * MINI, 3 * MINI)
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
    assert got["grad_norms"] == pytest.approx(want["grad_norms"], rel=1e-5)
    grads = {n: p.grad for n, p in plain.model.named_parameters()}
    for n, p in rc.model.named_parameters():  # the last mini-batch's gradients
        assert p.grad is not None
        torch.testing.assert_close(p.grad, grads[n.replace("_checkpoint_wrapped_module.", "")])
    w_plain, w_rc = plain.weights(), rc.weights()
    assert sorted(w_plain) == sorted(w_rc)  # the wrapper leaves the weights' names alone
    for k, v in w_plain.items():
        torch.testing.assert_close(w_rc[k], v)
    # checkpoints stay in the one format: a recomputing trainer resumes a plain one's
    resumed = Trainer(config(model_dir, trainer=Layout(recompute=True)))
    assert resumed.load(plain.save(str(tmp_path / "plain.pt"), 0)) == 1
    for k, v in w_plain.items():
        torch.testing.assert_close(resumed.weights()[k], v)
    want = {"dp": 1, "tp": 1, "pp": 1, "recompute": True}
    assert {k: rc.executed_layout(1)[k] for k in want} == want
    assert plain.executed_layout(1)["recompute"] is False


def _train_and_report(rank: int, tr: Trainer, cfg: Any, q_out: Any, out: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule
    layout = cfg.trainer
    info, calls = _step(tr, rank, layout)
    # checkpoint inside fully_shard: the layer FSDP holds is the checkpoint wrapper
    order = [isinstance(m, FSDPModule) and isinstance(m, CheckpointWrapper)
             for m in decoder_layers(tr.model)]
    full = tr.weights()  # a collective: every rank gathers, rank 0 gets them
    if rank == 0:
        torch.save(full, out)
    q_out.put((rank, info, tr.executed_layout(layout.world), calls, order))


@pytest.mark.parametrize("layout", [
    (2, 1, 1),
    pytest.param((1, 1, 2), marks=pytest.mark.slow),
    pytest.param((1, 2, 1), marks=pytest.mark.slow)], ids=["fsdp-dp2", "pp2", "tp2"])
def test_sharded_recompute_is_the_plain_step(layout: tuple[int, int, int], model_dir: Path,  # noqa: F811
                                             tmp_path: Path) -> None:
    """FSDP2 (and pipeline stages, TP) with recompute against one plain process."""
    cfg = config(model_dir, trainer=Layout(*layout, recompute=True), mini_batches=MINI)
    plain = dataclasses.replace(cfg.trainer, recompute=False)
    want, info = one_process(dataclasses.replace(cfg, trainer=plain))
    q_out = SPAWN.Queue()
    run_world(_train_and_report, cfg, cfg, q_out, str(tmp_path / "w.pt"))
    got = torch.load(tmp_path / "w.pt")
    bad = {k: float((got[k] - want[k]).abs().max()) for k in want
           if not torch.allclose(got[k], want[k], atol=5e-5, rtol=1e-4)}
    assert not bad, bad
    for _, r_info, executed, calls, order in (q_out.get(timeout=5) for _ in range(2)):
        assert r_info["grad_norms"] == pytest.approx(info["grad_norms"], rel=1e-4)
        want = {**Layout(*layout).as_dict(), "recompute": True}
        assert {k: executed[k] for k in want} == want  # read off the model
        assert calls == 3 * MINI  # every rank's layers ran again in its backward passes
        assert order and all(order)


def test_recompute_wraps_once_and_keeps_names(model_dir: Path) -> None:  # noqa: F811
    """Twice is once; the state dict's names are the plain model's (weight sync, checkpoints);
    the critic's value model recomputes its backbone's layers."""
    tr = Trainer(config(model_dir, trainer=Layout(recompute=True)))
    names = sorted(tr.model.state_dict())
    recompute_layers(tr.model)
    inner = decoder_layers(tr.model)[0]
    assert not any(isinstance(m, type(inner)) for m in inner.children())
    assert sorted(tr.model.state_dict()) == names and "_checkpoint" not in "".join(names)
    critic = Critic(config(model_dir, critic_recompute=True))
    assert isinstance(critic.model, ValueModel) and recomputes(critic.model)
    assert critic.executed_layout(1)["recompute"] is True
    assert not recomputes(Critic(config(model_dir)).model)


def test_executed_layout_records_the_plans_recompute(tmp_path: Path) -> None:
    """One local PPO step: actor and critic each record their own plan's `recompute` (set
    differently, so that neither can be a constant)."""
    from exec_util import PPO_LAYOUT, hand_plan, job_dict  # lazy: they load the planner

    from executors.run import execute
    from executors.runplan import resolve_plan
    from placer.cost.sharding import Parallel
    plan = hand_plan({**PPO_LAYOUT, "actor": ("gpu", Parallel(dp=2, recompute=False), "train"),
                      "critic": ("gpu", Parallel(dp=1, recompute=True), "train")},
                     job_dict(algorithm="ppo"))
    assert (plan.roles["actor"].recompute, plan.roles["critic"].recompute) == (False, True)
    settings = plan_settings(resolve_plan(plan))
    assert (settings["trainer"].recompute, settings["critic_recompute"]) == (False, True)
    layouts = execute(plan, 1, tmp_path / "out", local=True).trace.metadata["executed_layout"]
    for role in ("actor", "critic"):
        assert layouts[role]["recompute"] is plan.roles[role].recompute, layouts
    want = {"dp": 1, "tp": 1, "pp": 1, "recompute": False}  # one process
    assert {k: layouts["actor"][k] for k in want} == want
    assert layouts["actor"]["stage_layers"] == [[0, 1]] and layouts["actor"]["mesh"]["dims"] == []


def test_trainer_accumulates_the_plans_micro_batches() -> None:
    """The plan's chosen micro-batch size becomes the trainer's gradient accumulation: the
    rank's share of one mini-batch over the size, rounded up (checked by hand below)."""
    from executors.roles import accumulation
    from executors.runplan import resolve_plan
    assert accumulation(32, 1, 2, 8) == 2  # 16 sequences a rank, 8 a micro-batch
    assert accumulation(32, 2, 2, 8) == 1  # 8 a rank per mini-batch
    assert accumulation(30, 1, 4, 4) == 2  # 8 (7.5 rounded up) a rank
    assert accumulation(32, 1, 2, 0) == 1  # unset: the share in one
    import placer  # lazy: the planner
    plan = placer.plan(str(Path(__file__).parents[1] / "examples" / "tiny-cpu.yaml"))
    run, actor = resolve_plan(plan), plan.roles["actor"]
    share = run.job.samples // run.job.mini_batches // actor.dp
    assert actor.micro_batch > 0 and share % actor.micro_batch == 0
    assert plan_settings(run)["accumulate"] == share // actor.micro_batch
