"""PPO's critic with context parallelism (`executors.critic`) on gloo: the plan's critic cp 2
makes its two ranks one process group; each runs a slice of every sequence (the actor's CP
attention, `executors.cpattn`), the value head over its own columns' hidden states, the CP
group summing the values and the loss, FSDP2 over ("dp", "cp") the gradients.

  - two value steps (the head starts at zero, so the first moves only the head and the
    second's gradient reaches the backbone through the CP attention), with the values read
    after the first, end at one process's values, losses and weights, in fp32;
  - with the K/V gather dropped (each rank attending to its own columns) the values differ;
  - the executed layout reads cp 2 off the built value model's mesh; the checkpoint is a
    folder of each CP rank's own shards (nothing gathered onto rank 0), which a one-process
    critic loads.

Measured (tiny-llama, 8 samples, critic lr 1e-2; `python -m pytest -q -s
tests/test_exec_critic_cp.py`): values after the first step within 2.2e-8 of one process's;
weights after the second within 1.8e-5 (Adam moved them 2.0e-2).
"""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import SPAWN, run_world
from test_exec_sharding import ARCH, batch, config

from executors import cpattn
from executors.critic import Critic
from executors.model import build_policy, save_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


def _targets(seed: int) -> tuple[list[list[float]], list[list[float]]]:
    """(returns, old values) for `batch(1)`'s responses, from `seed`."""
    s, _ = batch(1)
    rng = random.Random(seed)
    ret = [[rng.uniform(-1, 1) for _ in r] for r in s.responses]
    old = [[rng.uniform(-0.1, 0.1) for _ in r] for r in s.responses]
    return ret, old


def _steps(critic: Critic) -> tuple[list[float], list[list[float]], dict[str, torch.Tensor]]:
    """Two value steps, the values read between them: (losses, values, weights)."""
    s, _ = batch(1)
    ret, old = _targets(5)
    first = critic.train(s, ret, old)[0]["value_loss"]
    values = critic.values(s)[0]
    second = critic.train(s, ret, old)[0]["value_loss"]
    return [first, second], values, critic.weights()


def _shard_bytes(part: dict[str, Any]) -> int:
    """The tensor bytes one rank's checkpoint file holds (its pieces and whole tensors)."""
    ts = [p["local"] for p in part["pieces"].values()] + list(part["whole"].values())
    return sum(t.numel() * t.element_size() for t in ts if torch.is_tensor(t))


def _cp_body(rank: int, critic: Critic, q_out: Any, out: str, drop: bool) -> None:
    if drop:
        from test_exec_cp import _own_keys_only
        cpattn.gather_kv = _own_keys_only  # this rank's process only
    losses, values, weights = _steps(critic)
    critic.save(out + ".ckpt", 3)
    if rank == 0:
        torch.save(weights, out)
    q_out.put((rank, losses, values, critic.executed_layout(2)))


def _cp_run(model_dir: Path, tmp: Path, drop: bool = False
            ) -> tuple[dict[str, torch.Tensor], list[Any]]:
    cfg = config(model_dir, critic_cp=2)
    q_out = SPAWN.Queue()
    run_world(_cp_body, cfg, q_out, str(tmp / "c.pt"), drop, make=Critic, world=2)
    got = sorted((q_out.get(timeout=5) for _ in range(2)), key=lambda x: x[0])
    return torch.load(tmp / "c.pt"), got


def test_cp2_critic_matches_one_process(model_dir: Path, tmp_path: Path) -> None:
    cfg = config(model_dir, critic_cp=2)
    one = Critic(cfg)  # a world of one: the whole value model in this process
    start = {k: v.clone() for k, v in one.weights().items()}
    losses, values, want = _steps(one)
    got, ranks = _cp_run(model_dir, tmp_path)
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    back = [k for k in want if k.startswith("backbone.layers")]
    assert moved > 1e-3 and max(float((want[k] - start[k]).abs().max()) for k in back) > 1e-4
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    vdiff = max(abs(a - b) for r in ranks for ra, rb in zip(r[2], values) for a, b in zip(ra, rb))
    print(f"critic cp 2: max |weight diff| {diff:.2e} (moved {moved:.2e}), values {vdiff:.2e}")
    bad = {k: float((got[k] - want[k]).abs().max()) for k in want
           if not torch.allclose(got[k], want[k], atol=5e-5, rtol=1e-4)}
    assert not bad, bad
    assert max(abs(v) for row in values for v in row) > 1e-3  # values after a step: not zeros
    assert vdiff < 1e-5
    for _, got_losses, _, layout in ranks:  # every CP rank holds the group's sum
        assert got_losses == pytest.approx(losses, rel=1e-5)
        assert (layout["dp"], layout["cp"], layout["tp"], layout["pp"]) == (1, 2, 1, 1), layout
        assert layout["mesh"] == {"dims": ["dp_cp"], "shape": [2]}, layout
    ckpt = tmp_path / "c.pt.ckpt"  # one file per CP rank, each with its own shards
    assert sorted(p.name for p in ckpt.iterdir()) == ["rank-00000.pt", "rank-00001.pt"]
    sizes = [_shard_bytes(torch.load(ckpt / p.name, weights_only=False))
             for p in sorted(ckpt.iterdir())]
    assert min(sizes) > 0 and max(sizes) < 0.75 * sum(sizes), sizes
    plain = Critic(dataclasses.replace(cfg, critic_cp=1))  # any layout restores it
    assert plain.load(str(ckpt)) == 3
    for k, v in plain.weights().items():
        torch.testing.assert_close(v, got[k])
    assert all(plain.opt.state[p]["exp_avg"].shape == p.shape for p in plain.model.parameters())


def test_cp2_critic_needs_the_gather(model_dir: Path, tmp_path: Path) -> None:
    _, values, _ = _steps(Critic(config(model_dir, critic_cp=2)))
    _, ranks = _cp_run(model_dir, tmp_path, drop=True)
    off = max(abs(a - b) for r in ranks for ra, rb in zip(r[2], values) for a, b in zip(ra, rb))
    assert off > 1e-3, off  # the second chunk's queries lose the first chunk's keys


@pytest.mark.slow
@pytest.mark.ray
def test_execute_runs_a_cp2_critic(tmp_path: Path) -> None:
    """One PPO step of the whole loop with the critic planned cp 2: its two processes form
    their group, both compute the values and take the value step, the executed layout reads
    cp 2 off the critic's model, and the checkpoint is written by both its ranks."""
    from exec_util import PPO_LAYOUT, hand_plan, job_dict  # lazy: the plan helpers load the planner

    from executors.run import execute
    from placer.cost.sharding import Parallel
    job = job_dict(algorithm="ppo", models={"policy": "tiny-llama", "reward": "rule",
                                            "critic": "tiny-llama"})
    plan = hand_plan({**PPO_LAYOUT, "critic": ("gpu", Parallel(cp=2), "train")}, job)
    assert plan.roles["critic"].cp == 2 and plan.roles["critic"].devices == 2
    r = execute(plan, 1, tmp_path / "out")
    executed = r.trace.metadata["executed_layout"]["critic"]
    assert {k: executed[k] for k in ("dp", "cp", "tp", "pp")} == {"dp": 1, "cp": 2, "tp": 1, "pp": 1}
    trains = [e for e in r.trace.of("train") if e.name == "train critic"]
    assert len({e.tid for e in trains}) == len(trains) == 2  # both CP ranks, one step each
    assert r.ledger_ok and r.stats[0].loss != 0.0
