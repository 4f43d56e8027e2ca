"""Context parallelism in the trainer (`executors.cpattn`) on gloo: each sequence split over
the cp ranks (Megatron's 2 * cp load-balanced chunks), keys and values all-gathered over the
CP group, losses and statistics summed over it, gradients over dp x cp.

  - cp 2 log-probs equal one process's; with the K/V gather replaced by each rank's own
    keys alone (the others' zeroed) they do not: the gather is what makes them agree;
  - one RL step (2 optimizer steps) with cp 2, cp 2 x tp 2, dp 2 x cp 2 and HSDP (2 replicas)
    x cp 2, in bf16 and on Qwen3-MoE ends at one process's weights, gradient norms and loss
    (with expert parallelism too: tests/test_exec_experts.py);
    the executed layout reads cp off the built model;
  - the bytes the gather sends (forward all-gather, backward reduce-scatter, each call's
    buffers counted as the code hands them to torch.distributed) are what
    `placer.cost.sharding.cp_kv_exchange` prices, per TP rank under TP, with the recomputed
    forward's third gather.

Measured (tiny-llama, 8 samples, fp32 unless named, 2 mini-batches, lr 1e-3; `python -m pytest
-q -s tests/test_exec_cp.py`): cp 2 log-probs equal one process's (max |difference| 0), 0.13
apart without the gather; one step's weights within 3.5e-7 (cp 2), 2.1e-6 (cp 2 x tp 2) and
2.0e-7 (dp 2 x cp 2) of one process's (each moved 2.0e-3); in bf16, cp 2 is 0.93% of the
step's summed move from one process in bf16 (one process fp32 against bf16: 0.77%).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import SPAWN, run_world
from test_exec_bf16 import bf16_step_against_one_process
from test_exec_sharding import ARCH, batch, config, distributed, one_process

from executors import cpattn, rl
from executors.model import build_policy, load_policy, save_model_dir
from executors.sharding import Layout, check_layout
from executors.trainer import Trainer
from placer.base.errors import SpecError
from placer.cost.sharding import Parallel, cp_kv_bytes


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


def test_columns_pair_an_early_and_a_late_chunk() -> None:
    """Megatron's split: rank r holds chunks r and 2cp-1-r; every column once."""
    assert cpattn.columns(11, 2, 0)[1].tolist() == [0, 1, 2, 9, 10, 11]
    assert cpattn.columns(11, 2, 1)[1].tolist() == [3, 4, 5, 6, 7, 8]
    cols = torch.cat([cpattn.columns(13, 3, r)[1] for r in range(3)])
    assert sorted(cols.tolist()) == list(range(cpattn.columns(13, 3, 0)[0]))


def _own_keys_only(k: torch.Tensor, v: torch.Tensor, group: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gather dropped: this rank's keys in its own place, zeros where the others' go."""
    import torch.distributed as dist
    n, r = dist.get_world_size(group), dist.get_rank(group)
    k2, v2 = (torch.cat([x if i == r else torch.zeros_like(x) for i in range(n)], 2)
              for x in (k, v))
    return k2, v2


def _logprobs(rank: int, tr: Trainer, q_out: Any) -> None:
    s, _ = batch(1)
    got = tr._logprobs(s)
    own = float(tr._cp_logprobs(s, entropy=False)[2].sum())  # the positions it scored
    cpattn.gather_kv = _own_keys_only  # this rank's process only
    dropped = tr._logprobs(s)
    q_out.put((rank, got.tolist(), dropped.tolist(), own))  # lists: a tensor's memory dies with the rank


def test_cp2_logprobs_match_one_process_and_need_the_gather(model_dir: Path) -> None:
    s, _ = batch(1)
    want = rl.response_logprobs(load_policy(model_dir), s).detach()
    q_out = SPAWN.Queue()
    run_world(_logprobs, config(model_dir, trainer=Layout(cp=2)), q_out)
    owns = []
    for rank, got, dropped, own in (q_out.get(timeout=5) for _ in range(2)):
        owns.append(own)
        diff = float((torch.tensor(got) - want).abs().max())
        off = float((torch.tensor(dropped) - want).abs().max())
        print(f"rank {rank}: cp 2 vs one process {diff:.2e}; without the gather {off:.2e}")
        assert diff < 1e-5, diff
        assert off > 1e-2, off  # the second chunk's queries lose the first chunk's keys
    assert min(owns) > 0 and sum(owns) == float(rl.pack(s)[2].sum())  # each scores its share


@pytest.mark.parametrize("layout", [Layout(cp=2), Layout(tp=2, cp=2), Layout(dp=2, cp=2),
                                    Layout(dp=2, shard=1, cp=2)],
                         ids=["cp2", "cp2xtp2", "dp2xcp2", "hsdp-rep2xcp2"])
def test_cp_step_matches_one_process(layout: Layout, model_dir: Path, tmp_path: Path) -> None:
    cfg = config(model_dir, trainer=layout, mini_batches=2)
    want, info = one_process(cfg)
    got, ranks = distributed(cfg, tmp_path)
    start = load_policy(model_dir).state_dict()
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    print(f"{layout}: max |weight diff| vs one process {diff:.2e} (moved {moved:.2e})")
    assert moved > 1e-4
    bad = {k: float((got[k] - want[k]).abs().max()) for k in want
           if not torch.allclose(got[k], want[k], atol=5e-5, rtol=1e-4)}
    assert not bad, bad
    for r in ranks:
        assert r[1]["grad_norms"] == pytest.approx(info["grad_norms"], rel=1e-4)
        group = [q for q in ranks if layout.coords(q[0])[0] == layout.coords(r[0])[0]]
        assert all(q[1]["loss"] == pytest.approx(r[1]["loss"], abs=1e-7) for q in group)
        if layout.dp == 1:  # every CP rank reports its DP group's sums: here the whole batch's
            assert r[1]["entropy"] == pytest.approx(info["entropy"], rel=1e-5)
        read = r[3]
        assert (read["dp"], read["cp"], read["tp"], read["pp"]) == (layout.dp, 2, layout.tp, 1)
        if layout.hsdp:  # replicas of a shard group of shard x cp ranks
            assert read["mesh"] == {"dims": ["rep", "shard_cp"], "shape": [2, 2]}, read
            assert read["shard"] == layout.shard, read
        else:
            dims = ["dp_cp", "tp"] if layout.tp > 1 else ["dp_cp"]
            shape = [2 * layout.dp] + [2] * (layout.tp > 1)
            assert read["mesh"] == {"dims": dims, "shape": shape}, read
    # the DP groups split the batch; a DP group's losses (each CP rank's the group's) add up
    leaders = [r for k, r in enumerate(ranks) if layout.leads(k)]
    assert len(leaders) == layout.dp
    assert sum(r[1]["loss"] for r in leaders) == pytest.approx(info["loss"], abs=1e-6)


def test_cp2_bf16_step_matches_one_process_in_bf16(model_dir: Path, tmp_path: Path) -> None:
    """BF16 autocast: keys and values gathered (and their gradients reduce-scattered) in BF16;
    the measure of tests/test_exec_bf16.py, the summed |difference| from one process in bf16
    over the step's summed move (BF16 rounding alone leaves ~1%, a wrong sum all of it)."""
    cfg = config(model_dir, trainer=Layout(cp=2), mini_batches=2, precision="bf16")
    ranks, info = bf16_step_against_one_process(cfg, tmp_path, model_dir, "cp 2")
    for r in ranks:  # every rank holds its DP group's loss (one group here)
        assert r[1]["loss"] == pytest.approx(info["loss"], abs=1e-2)


def test_cp2_moe_step_matches_one_process(tmp_path: Path) -> None:
    """Qwen3-MoE (per-head q/k norms before RoPE, experts whole on each rank, each CP rank
    routing its own slice's tokens): a cp 2 step against one process."""
    from executors.checkpoints import build_checkpoint
    path = build_checkpoint("qwen3_moe", tmp_path / "moe" / "v0", seed=3)
    cfg = config(path, trainer=Layout(cp=2), mini_batches=2)
    want, info = one_process(cfg)
    got, ranks = distributed(cfg, tmp_path)
    bad = {k: float((got[k] - want[k]).abs().max()) for k in want
           if not torch.allclose(got[k], want[k], atol=5e-5, rtol=1e-4)}
    assert not bad, bad
    for r in ranks:
        assert r[1]["grad_norms"] == pytest.approx(info["grad_norms"], rel=1e-4)
        assert r[3]["cp"] == 2 and r[3]["experts_per_rank"] == 4  # all experts on each rank


def _count_gather_bytes(rank: int, tr: Trainer, q_out: Any) -> None:
    """One forward and backward of the CP model, every all-gather and reduce-scatter this
    rank's process makes counted with the bytes of its list of per-rank buffers."""
    import torch.distributed as dist
    out: dict[str, int] = {}

    def counted(name: str, fn: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            buffers = args[0] if name == "all_gather" else args[1]
            out[name] = out.get(name, 0) + sum(b.numel() * b.element_size() for b in buffers)
            out[name + " calls"] = out.get(name + " calls", 0) + 1
            return fn(*args, **kw)
        return call

    dist.all_gather = counted("all_gather", dist.all_gather)  # this rank's process only
    dist.reduce_scatter = counted("reduce_scatter", dist.reduce_scatter)
    s, _ = batch(1)
    lp, _, _ = tr._cp_logprobs(s, entropy=False)
    lp.sum().backward()
    q_out.put(out)


@pytest.mark.parametrize("layout", [Layout(cp=2), Layout(cp=2, recompute=True),
                                    Layout(tp=2, cp=2)], ids=["cp2", "recompute", "cp2xtp2"])
def test_cp_traffic_is_what_layercomm_prices(layout: Layout, model_dir: Path) -> None:
    """Per layer and pass, the K and V of the CP group's tokens (`cp_kv_bytes`): the forward's
    all-gather and the backward's reduce-scatter each move the padded batch's, in fp32 here
    (4 bytes; the price's BF16 is `BYTES`); under TP each rank its own KV heads'. With
    recomputation the backward's forward gathers them again: the third pass
    `placer.cost.model.train_time` prices (passes // 2 - 1)."""
    q_out = SPAWN.Queue()
    run_world(_count_gather_bytes, config(model_dir, trainer=layout), q_out)
    s, _ = batch(1)
    ids, _, _ = rl.pack(s)
    tokens = ids.shape[0] * cpattn.columns(ids.shape[1], 2, 0)[0]  # padded to 2 * cp chunks
    priced = ARCH.layers * cp_kv_bytes(ARCH, tokens, layout.tp) / 2 * 4  # BF16 priced, fp32 sent
    forwards = 2 if layout.recompute else 1
    for got in (q_out.get(timeout=5) for _ in range(layout.world)):
        # one call for K and one for V per layer and pass
        assert got["all_gather calls"] == forwards * 2 * ARCH.layers, got
        assert got["reduce_scatter calls"] == 2 * ARCH.layers, got
        assert got["all_gather"] == forwards * priced, (got, priced)
        assert got["reduce_scatter"] == priced, (got, priced)


def test_cp_layouts_the_trainer_cannot_run_are_refused() -> None:
    args = (ARCH.heads, ARCH.kv_heads, ARCH.mlp)
    # cp x ep runs, ep over dp or folded over dp x cp (tests/test_exec_experts.py)
    check_layout("actor", Layout(dp=2, cp=2, ep=2), *args, experts=4)
    check_layout("actor", Layout(dp=2, cp=2, ep=4), *args, experts=4)
    with pytest.raises(SpecError, match=r"layout dp4 tp1 pp1 cp2 shard2 ep4: expert "
                                        r"parallelism runs over the dp ranks .* without an HSDP"):
        check_layout("actor", Layout(dp=4, shard=2, cp=2, ep=4), *args, experts=4)
    check_layout("actor", Layout(pp=2, cp=2), *args, layers=ARCH.layers)  # tests/test_exec_cp_pp.py
    check_layout("actor", Layout(dp=2, tp=2, cp=2), *args)
    check_layout("actor", Layout(dp=4, shard=2, cp=2), *args)
    assert Parallel(cp=2).cp == 2


@pytest.mark.slow
@pytest.mark.ray
def test_execute_runs_a_cp2_plan(tmp_path: Path) -> None:
    """One RL step of the whole loop with the actor planned cp 2: two trainer processes, the
    executed layout read off their models, the step's loss from the CP group's sum."""
    from exec_util import GRPO_LAYOUT, hand_plan  # lazy: the plan helpers load the planner

    from executors.run import execute
    plan = hand_plan({**GRPO_LAYOUT, "actor": ("gpu", Parallel(cp=2), "train")})
    assert plan.roles["actor"].cp == 2 and plan.roles["actor"].devices == 2
    r = execute(plan, 1, tmp_path / "out")
    executed = r.trace.metadata["executed_layout"]["actor"]
    want = {"dp": 1, "cp": 2, "tp": 1, "pp": 1, "recompute": plan.roles["actor"].recompute}
    assert {k: executed[k] for k in want} == want, executed
    assert r.trace.metadata["optimizer_steps"] == plan.resolved().job.batch.mini_batches
    assert len([p for p in r.placement if p["role"] == "actor"]) == 2
    assert r.ledger_ok and r.stats[0].loss != 0.0
