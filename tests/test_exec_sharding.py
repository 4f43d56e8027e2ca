"""The trainer as the plan lays it out: FSDP2 over DP and TP via DTensor on gloo (4 processes,
dp 2 x tp 2) take the same optimizer steps as one process on the whole batch; the job's
mini-batch count is the number of optimizer steps; gradient accumulation changes nothing.
Pipeline stages: tests/test_exec_pipeline.py."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import SPAWN, run_world

from executors import rl
from executors.checkpoints import build_checkpoint
from executors.model import build_policy, load_policy, save_model_dir
from executors.roles import RunConfig
from executors.sharding import Layout, check_layout
from executors.trainer import Trainer
from executors.training import partition
from placer.base.errors import SpecError
from placer.cost.sharding import Parallel
from placer.spec.catalog import shipped_models

ARCH = shipped_models()["tiny-llama"]


def batch(seed: int, n: int = 8) -> tuple[rl.Samples, list[list[float]]]:
    """Random prompts and responses with behaviour log-probs off the trainer's (stale)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, ARCH.vocab) for _ in range(rng.randint(3, 6))] for _ in range(n)]
    resps = [[rng.randrange(4, ARCH.vocab) for _ in range(rng.randint(2, 5))] for _ in range(n)]
    lps = [[-4.0 + rng.uniform(-0.3, 0.3) for _ in r] for r in resps]
    s = rl.Samples([f"s{i}" for i in range(n)], prompts, resps, lps, 0, [f"g{i // 4}" for i in range(n)])
    adv = [[rng.uniform(-1, 1)] * len(r) for r in resps]
    return s, adv


def config(model_dir: Path, **kw: Any) -> RunConfig:
    return RunConfig(algorithm="grpo", arch=ARCH.model_dump(), model_dir=str(model_dir), seed=0,
                     max_new_tokens=8, lr=1e-3, **kw)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3-MoE: TP splits attention, the experts stay whole on each TP rank."""
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("moe") / "v0", seed=3)


def one_process(cfg: RunConfig, accumulate: int = 1) -> tuple[dict[str, torch.Tensor], dict]:
    s, adv = batch(1)
    tr = Trainer(cfg)
    info, _ = tr.train(partition(s, adv, None, Layout(), cfg.mini_batches, accumulate)[0])
    assert tr.optimizer_steps == info["optimizer_steps"]
    return tr.weights(), info


def _train_one_step(rank: int, tr: Trainer, cfg: RunConfig, q_out: Any, out: str) -> None:
    layout = cfg.trainer
    s, adv = batch(1)
    info, timing = tr.train(partition(s, adv, None, layout, cfg.mini_batches,
                                      cfg.accumulate)[rank])
    tr.save(out + ".ckpt", 0)  # every rank writes its own shards (executors.shardckpt)
    full = tr.weights()  # a collective too
    if rank == 0:
        torch.save(full, out)
    q_out.put((rank, info, timing["sample_ids"], tr.executed_layout(layout.world)))


def distributed(cfg: RunConfig, tmp: Path) -> tuple[dict[str, torch.Tensor], list]:
    """Train one step on `cfg.trainer`'s world of gloo processes: rank 0's full weights
    and, per rank, (rank, info, sample ids, executed layout)."""
    q_out = SPAWN.Queue()
    out = tmp / "w.pt"
    run_world(_train_one_step, cfg, cfg, q_out, str(out))
    world = cfg.trainer.world
    return torch.load(out), sorted((q_out.get(timeout=5) for _ in range(world)),
                                   key=lambda x: x[0])


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_fsdp2_tp_step_matches_one_process(kind: str, request: pytest.FixtureRequest,
                                           tmp_path: Path) -> None:
    path = request.getfixturevalue("model_dir" if kind == "llama" else "moe_dir")
    cfg = config(path, trainer=Layout(2, 2, 1), mini_batches=2)
    want, info = one_process(cfg)
    got, ranks = distributed(cfg, tmp_path)
    start = load_policy(path).state_dict()
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    assert moved > 1e-4  # the step did something, so agreeing is not trivial
    # Adam's first steps move every weight by about lr whatever its gradient's size, so float
    # noise in a near-zero gradient shows as a few 1e-5 here (a wrong sum shows as 1e-3)
    bad = {k: float((got[k] - want[k]).abs().max()) for k in want
           if not torch.allclose(got[k], want[k], atol=5e-5, rtol=1e-4)}
    assert not bad, bad
    assert [r[1]["optimizer_steps"] for r in ranks] == [2] * 4
    # the layout read off each rank's model: the mesh, and the attention's DTensor placements
    # (FSDP2's strided shard over dp of TP's row shard), the LM head split by vocabulary
    for r in ranks:
        assert r[3]["mesh"] == {"dims": ["dp", "tp"], "shape": [2, 2]}, r[3]
        assert r[3]["placements"]["attention"]["placements"] == ["_S(0, 2)", "S(0)"], r[3]
        assert r[3]["placements"]["lm_head"]["placements"][-1] == "S(0)", r[3]
        assert (r[3]["dp"], r[3]["tp"], r[3]["pp"]) == (2, 2, 1)
        assert r[3].get("experts_per_rank") == (4 if kind == "qwen3_moe" else None)
    # Adam hides a uniform gradient scale: the global norms before clipping must agree too
    for r in ranks:
        assert r[1]["grad_norms"] == pytest.approx(info["grad_norms"], rel=1e-4)
    # TP ranks of one DP group train the same samples; the DP groups split the batch
    assert ranks[0][2] == ranks[1][2] and ranks[2][2] == ranks[3][2]
    assert sorted(ranks[0][2] + ranks[2][2]) == sorted(batch(1)[0].ids)
    assert abs(sum(r[1]["loss"] for r in ranks[::2]) - info["loss"]) < 1e-5
    # the sharded run's checkpoint is in the one-process format: a plain trainer resumes it
    plain = Trainer(dataclasses.replace(cfg, trainer=Layout()))
    assert plain.load(str(tmp_path / "w.pt.ckpt")) == 1
    for k, v in plain.weights().items():
        torch.testing.assert_close(v, got[k])
    assert all(plain.opt.state[p]["exp_avg"].shape == p.shape for p in plain.model.parameters())


def test_mini_batch_count_is_honoured(model_dir: Path) -> None:
    one, info1 = one_process(config(model_dir, mini_batches=1))
    four, info4 = one_process(config(model_dir, mini_batches=4))
    assert (info1["optimizer_steps"], info4["optimizer_steps"]) == (1, 4)
    assert any(not torch.equal(one[k], four[k]) for k in one)
    assert info1["clip_frac"] == 0.0  # one step from the proximal weights: ratio 1
    assert info4["clip_frac"] >= 0.0
    parts = partition(*batch(1), None, Layout(dp=2, tp=2), 3, 2)
    assert [len(p) for p in parts] == [3] * 4 and all(len(mb) == 2 for p in parts for mb in p)


def test_gradient_accumulation_matches_whole_micro_batch(model_dir: Path) -> None:
    cfg = config(model_dir, mini_batches=2)
    whole, _ = one_process(cfg, accumulate=1)
    accum, _ = one_process(dataclasses.replace(cfg, accumulate=3), accumulate=3)
    for k in whole:
        torch.testing.assert_close(accum[k], whole[k], atol=2e-5, rtol=1e-4, msg=k)


def test_a_build_that_differs_from_the_plan_is_named() -> None:
    from executors.layoutread import mismatch
    read = {"dp": 2, "tp": 1, "pp": 1, "ep": 1}  # TP not applied
    assert mismatch(read, Layout(2, 2, 1)) == "tp 1 (plan: 2)"
    assert mismatch({**read, "tp": 2}, Layout(2, 2, 1)) is None
    assert mismatch({**read, "tp": 2}, Layout(2, 2, 1, ep=2)) == "ep 1 (plan: 2)"


def test_layout_the_executor_cannot_run_is_refused() -> None:
    with pytest.raises(SpecError, match=r"plan.roles.actor: layout dp1 tp3 pp1.*query heads 4"):
        check_layout("actor", Layout(tp=3), ARCH.heads, ARCH.kv_heads, ARCH.mlp)
    with pytest.raises(SpecError, match=r"plan.roles.actor: layout dp2 tp1 pp2.*tied"):
        check_layout("actor", Layout(dp=2, pp=2), ARCH.heads, ARCH.kv_heads, ARCH.mlp, tied=True)
    check_layout("actor", Layout(dp=2, tp=2), ARCH.heads, ARCH.kv_heads, ARCH.mlp)


def test_execute_refuses_the_layout_before_any_actor_starts(tmp_path: Path) -> None:
    from exec_util import GRPO_LAYOUT, hand_plan, job_dict  # lazy: the helpers load the planner

    from executors.run import execute
    pools = [{"name": "gpu", "device": "emu-gpu", "devices_per_node": 4, "nodes": 1},
             {"name": "lpu", "device": "emu-lpu", "devices_per_node": 4, "nodes": 1},
             {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 1}]
    plan = hand_plan({**GRPO_LAYOUT, "actor": ("gpu", Parallel(pp=3), "train")},
                     job_dict(cluster={"pools": pools}))
    with pytest.raises(SpecError, match=r"plan.roles.actor: layout dp1 tp1 pp3: pp 3 is more "
                                        r"pipeline stages than the model's 2 decoder layers"):
        execute(plan, 1, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before the run made anything


def _count_tp_all_reduces(rank: int, tr: Trainer, q_out: Any) -> None:
    """One forward and backward of the TP-sharded model, its functional all-reduces counted."""
    ids = torch.tensor([[5, 9, 14, 3, 7, 11]])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        tr.model(input_ids=ids).logits.float().sum().backward()
    q_out.put(sum(e.count for e in prof.key_averages()
                  if e.key == "_c10d_functional::all_reduce"))


def test_tp_all_reduces_once_per_block_and_pass(model_dir: Path) -> None:
    """Megatron's count, which the cost model prices (`placer.cost.layercomm.layer_comm`): per decoder
    layer one all-reduce after the attention's and the MLP's row-parallel projection forward,
    and one for each block's input gradient backward (its column-parallel projections' partial
    sums added first, not all-reduced one by one)."""
    cfg = config(model_dir, trainer=Layout(1, 2, 1))
    q_out = SPAWN.Queue()
    run_world(_count_tp_all_reduces, cfg, q_out)
    counts = [q_out.get(timeout=5) for _ in range(2)]
    # + the vocabulary split's two (`executors.vocab`): the embedding's partial lookups summed
    # forward, the LM head's input gradient backward (Megatron's; not priced per layer)
    assert counts == [4 * ARCH.layers + 2] * 2


def _count_clip_collectives(rank: int, tr: Trainer, q_out: Any) -> None:
    """The gradient clip's collectives after one backward of the dp x tp sharded model."""
    from executors.sharding import clip_grad_norm
    ids = torch.tensor([[5, 9, 14, 3, 7, 11]])
    tr.model(input_ids=ids).logits.float().sum().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        clip_grad_norm(list(tr.model.parameters()), 1.0)
    q_out.put({e.key: e.count for e in prof.key_averages()
               if e.key.startswith(("c10d::", "_c10d_functional::"))})


def test_clip_reduces_once_per_class_of_gradients(model_dir: Path) -> None:
    """dp 2 x tp 2: FSDP2's strided shards of TP shards sum their squares locally like any shard,
    so the clip makes one all-reduce per class of gradients and sharded dim (column- and
    row-parallel weights: dp and tp; the rest: dp), not a gather of every TP-sharded gradient."""
    cfg = config(model_dir, trainer=Layout(2, 2, 1))
    q_out = SPAWN.Queue()
    run_world(_count_clip_collectives, cfg, q_out)
    for calls in (q_out.get(timeout=5) for _ in range(4)):
        assert calls == {"c10d::allreduce_": 5}, calls
