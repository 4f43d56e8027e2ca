"""Expert parallelism in the trainer (`executors.experts`): a Qwen3-MoE's experts split over
the dp ranks (ep 2: two experts of four on each), tokens dispatched and combined by all-to-all
on gloo, take the same optimizer steps as one process holding every expert, in fp32, alone and
with TP 2, PP 2 or CP 2 (4 processes each; under CP with ep 2 over the dp ranks of each CP
index, or ep 4 folded over dp x cp), and ep 2 over dp 4 (8 processes with CP 2): ep groups of
two dp ranks, the experts replicated over the two groups; EP folded over TP (expert TP 1: ep 4
over dp 2 x tp 2, ep 2 over tp 2, ep 4 over cp 2 x tp 2, ep 2 over tp 2 x pp 2, and ep 2
within tp 4, its shards replicated over the two ep groups); under TP each TP rank dispatches
half the tokens (the bytes its all-to-alls send, counted at the collective); the executed
layout reports the experts each rank holds, its expert group and its replicas; layouts EP
cannot run are refused.

Measured (tiny Qwen3-MoE, 8 samples, 2 mini-batches, lr 1e-3; `python -m pytest -q -s
tests/test_exec_experts.py`): fp32, max |weight difference| from one process 2.2e-6 (the weights
moved 2.0e-3); bf16, summed |difference| from one process in bf16 4.06% of the summed move
(dp 2 without EP: 4.05%; fp32 against bf16 in one process: 5.70%); ep 2 x tp 2, max |weight
difference| 1.1e-5, ep 2 x pp 2, 2.2e-6; ep 2 x tp 2, each rank's dispatch 24 of the 48 tokens'
routed copies (24,576 bytes; every TP rank sent all 48, 49,152 bytes, before each TP rank
dispatched its slice); ep 2 x cp 2, 1.2e-6, and ep 4 over dp 2 x cp 2, 1.2e-6 (without the
experts' gradients summed over CP, ep 2 x cp 2 ends 4.0e-3 away: measured by removing the sum);
ep 2 over dp 4, 3.2e-6, and with cp 2, 2.5e-6 (without the sum over the replicas 4.0e-3 away,
with it done twice 1.7e-4: measured by removing it and by repeating it). EP folded over TP:
ep 4 over dp 2 x tp 2, 1.1e-5, ep 2 over tp 2, 1.1e-5, ep 4 over cp 2 x tp 2, 1.0e-5, ep 2
over tp 2 x pp 2, 1.1e-5 (the experts' weights 3.4e-6 in each, the largest difference a
TP-split weight's, as with ep 2 x tp 2 not folded; 4.0e-3 away when the experts' gradients are
also summed over TP, as with EP not folded over it, measured on the first three); ep 2 within
tp 4, 3.9e-6 (4.0e-3 away without the sum over the replicas, 1.7e-4 with it
done twice, 4.0e-3 summed over the whole TP group instead).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import SPAWN, run_world
from test_exec_sharding import config, distributed, one_process

from executors.checkpoints import build_checkpoint
from executors.experts import experts_per_rank
from executors.model import load_policy
from executors.roles import RunConfig
from executors.sharding import Layout, check_layout
from executors.trainer import Trainer
from placer.base.errors import SpecError


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("moe") / "v0", seed=3)


def _run_pair(cfg: RunConfig, tmp_path: Path
              ) -> tuple[dict[str, torch.Tensor], dict, dict[str, torch.Tensor], list]:
    """One step of one process holding every expert and one of `cfg.trainer`'s world, from the
    same weights: (the process's weights, its info, the world's weights, per rank (rank, info,
    sample ids, executed layout)). Every expert must have moved, and the world's experts (and
    every stage's) come back whole under the one process's names."""
    want, info = one_process(dataclasses.replace(cfg, trainer=Layout()))
    got, ranks = distributed(cfg, tmp_path)
    start = load_policy(Path(cfg.model_dir)).state_dict()
    moved = {k: float((want[k] - start[k]).abs().max()) for k in want}
    assert min(v for k, v in moved.items() if "experts" in k) > 1e-4  # every expert trained
    assert sorted(got) == sorted(want)
    diff = {k: float((got[k] - want[k]).abs().max()) for k in want}
    print(f"{cfg.trainer} vs one process: max |weight diff| {max(diff.values()):.2e}, experts "
          f"{max(v for k, v in diff.items() if 'experts' in k):.2e} "
          f"(moved {max(moved.values()):.2e})")
    return want, info, got, ranks


def _off(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, float]:
    """The weights further from one process's than fp32 reordering explains: a token sent to
    the wrong expert, or an expert gradient summed over the wrong ranks, shows as ~1e-3."""
    return {k: float((got[k] - want[k]).abs().max()) for k in want
            if not torch.allclose(got[k], want[k], atol=5e-5, rtol=1e-4)}


def test_ep2_step_matches_one_process(moe_dir: Path, tmp_path: Path) -> None:
    cfg = config(moe_dir, trainer=Layout(2, 1, 1, ep=2), mini_batches=2)
    want, info = one_process(cfg)
    got, ranks = distributed(cfg, tmp_path)
    start = load_policy(moe_dir).state_dict()
    moved = {k: float((want[k] - start[k]).abs().max()) for k in want}
    assert min(v for k, v in moved.items() if "experts" in k) > 1e-4  # every expert trained
    assert sorted(got) == sorted(want)  # the experts gathered whole, under their names
    assert experts_per_rank(load_policy(moe_dir)) == 4
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    print(f"ep 2 vs one process: max |weight diff| {diff:.2e} (moved {max(moved.values()):.2e})")
    assert diff < 5e-5  # a token sent to the wrong expert, or dropped, shows as ~1e-3
    for r in ranks:
        assert r[1]["grad_norms"] == pytest.approx(info["grad_norms"], rel=1e-4)
        # read off the model: two experts of four on each rank, Shard(0) over the dp ranks
        assert (r[3]["ep"], r[3]["experts_per_rank"]) == (2, 2), r[3]
        assert r[3]["placements"]["experts"] == {"mesh": ["dp"], "placements": ["S(0)"]}
        assert r[3]["expert_ranks"] == [0, 1]
    assert abs(sum(r[1]["loss"] for r in ranks) - info["loss"]) < 1e-5
    # the checkpoint is in the one-process format: a plain trainer resumes it, every expert
    plain = Trainer(dataclasses.replace(cfg, trainer=Layout()))
    assert plain.load(str(tmp_path / "w.pt.ckpt")) == 1
    for k, v in plain.weights().items():
        torch.testing.assert_close(v, got[k])


def test_ep2_runs_in_bf16(moe_dir: Path, tmp_path: Path) -> None:
    """BF16 tokens through the all-to-all (FSDP2's BF16 layer inputs), FP32 expert masters:
    as close to one process in bf16 as dp 2 without EP (summed difference over summed move,
    as tests/test_exec_bf16.py measures it)."""
    cfg = config(moe_dir, trainer=Layout(2, 1, 1, ep=2), mini_batches=2, precision="bf16")
    want, _ = one_process(cfg)
    fp32, _ = one_process(dataclasses.replace(cfg, precision="fp32"))
    got, _ = distributed(cfg, tmp_path)
    dp2, _ = distributed(dataclasses.replace(cfg, trainer=Layout(2, 1, 1)), tmp_path)
    start = load_policy(moe_dir).state_dict()
    moved = sum(float((want[k] - start[k]).abs().sum()) for k in want)

    def rel(a: dict[str, torch.Tensor]) -> float:
        return sum(float((a[k] - want[k]).abs().sum()) for k in want) / moved
    print(f"ep 2 in bf16 vs one process in bf16: {rel(got):.2%} of the step's move; "
          f"dp 2 (ep 1) in bf16 {rel(dp2):.2%}; one process fp32 {rel(fp32):.2%}")
    # BF16 rounding flips near-tied routing choices, so a MoE's bf16 runs differ from one
    # process by more than a dense model's (~1%: tests/test_exec_bf16.py) even without EP:
    # EP must add nothing to what dp 2 alone shows (a misrouted token moves far more)
    assert rel(got) < 1.25 * rel(dp2) and rel(got) < 0.05
    assert all(v.dtype == torch.float32 for v in got.values())


def test_layouts_ep_cannot_run_are_refused() -> None:
    args = (4, 2, 128)
    with pytest.raises(SpecError, match=r"plan.roles.actor: layout dp2 tp2 pp1 ep8: expert "
                                        r"parallelism runs over the dp ranks.* plan with ep 1 "
                                        r"or ep 2 or ep 4$"):
        check_layout("actor", Layout(2, 2, 1, ep=8), *args, experts=8)
    # above dp x cp, dividing dp x cp x tp: folded over TP (expert TP 1)
    check_layout("actor", Layout(2, 2, 1, ep=4), *args, experts=4)
    check_layout("actor", Layout(1, 2, 1, ep=2), *args, experts=4)
    check_layout("actor", Layout(dp=1, cp=2, tp=2, ep=4), *args, experts=4)
    with pytest.raises(SpecError, match=r"divide the model's 4 experts"):
        check_layout("actor", Layout(3, 1, 1, ep=3), *args, experts=4)
    check_layout("actor", Layout(2, 2, 1, ep=2), *args, experts=4)
    # ep dividing dp: an ep sub-group of the dp ranks, the experts replicated over dp / ep
    check_layout("actor", Layout(4, 1, 1, ep=2), *args, experts=4)
    check_layout("actor", Layout(dp=4, cp=2, ep=2), *args, experts=4)
    with pytest.raises(SpecError, match=r"layout dp6 tp1 pp1 ep4: .*folded over TP.* plan with "
                                        r"ep 1 or ep 2 or ep 3 or ep 6"):
        check_layout("actor", Layout(6, 1, 1, ep=4), *args, experts=4)
    # under CP (tp 1): ep equal to dp or to dp x cp (EP folded over CP), nothing else
    check_layout("actor", Layout(dp=2, cp=2, ep=2), *args, experts=4)
    check_layout("actor", Layout(dp=2, cp=2, ep=4), *args, experts=4)
    with pytest.raises(SpecError, match=r"layout dp2 tp1 pp1 cp2 ep8: expert parallelism runs "
                                        r"over the dp ranks .* plan with ep 1 or ep 2 or ep 4"):
        check_layout("actor", Layout(dp=2, cp=2, ep=8), *args, experts=8)
    assert Layout(2, 1, 1, ep=2).as_dict() == {"dp": 2, "tp": 1, "pp": 1, "ep": 2}


def test_a_plan_with_expert_tensor_parallelism_is_refused_before_ray() -> None:
    """The executor never TP-splits experts under EP: a plan (or a pinned current layout)
    with etp > 1 would run at expert TP 1 under another price; exit 2 naming the field."""
    from exec_util import GRPO_LAYOUT, hand_plan  # lazy: the plan helpers load the planner

    from executors.backends import backend_of
    from executors.run import check_layouts
    from executors.runplan import resolve_plan
    run = resolve_plan(hand_plan(GRPO_LAYOUT))
    actor = run.roles["actor"]
    check_layouts(run, backend_of())  # as planned: runs
    etp = dataclasses.replace(run, roles={**run.roles, "actor": dataclasses.replace(
        actor, ep=2, etp=2)})
    with pytest.raises(SpecError, match=r"^plan\.roles\.actor\.etp: .*expert TP 1 only "
                                        r"\(got ep 2, etp 2\)"):
        check_layouts(etp, backend_of())



# (dp, tp, pp) with ep = dp, and each rank's expert group read off its model: under TP one TP
# index across the dp ranks (Megatron-Core's default, groups orthogonal to TP; ranks
# (d * tp + t)), under PP the dp ranks of its own stage (ranks (p * dp + d))
@pytest.mark.parametrize("layout,groups", [
    ((2, 2, 1), [[0, 2], [1, 3], [0, 2], [1, 3]]),
    ((2, 1, 2), [[0, 1], [0, 1], [2, 3], [2, 3]])], ids=["ep2xtp2", "ep2xpp2"])
def test_ep2_with_tp_or_pp_matches_one_process(layout: tuple[int, int, int],
                                               groups: list[list[int]], moe_dir: Path,
                                               tmp_path: Path) -> None:
    want, info, got, ranks = _run_pair(config(moe_dir, trainer=Layout(*layout, ep=2),
                                              mini_batches=2), tmp_path)
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert diff < 5e-5  # a token sent to the wrong expert, or dropped, shows as ~1e-3
    for r in ranks:
        assert r[1]["grad_norms"] == pytest.approx(info["grad_norms"], rel=1e-4)
        assert (r[3]["ep"], r[3]["experts_per_rank"]) == (2, 2), r[3]
        assert r[3]["placements"]["experts"] == {"mesh": ["dp"], "placements": ["S(0)"]}
    assert [r[3]["expert_ranks"] for r in ranks] == groups




def _check_experts(want: dict[str, torch.Tensor], info: dict[str, Any],
                   got: dict[str, torch.Tensor], ranks: list[Any], layout: Layout,
                   groups: list[list[int]], mesh: str) -> None:
    """A distributed MoE run against one process: the weights and grad norms, and the layout
    read off each rank's model (its degrees, experts per rank, the experts' mesh dim and
    expert group)."""
    bad = _off(got, want)
    assert not bad, bad
    for r in ranks:
        assert r[1]["grad_norms"] == pytest.approx(info["grad_norms"], rel=1e-4)
        read = r[3]
        assert (read["dp"], read.get("cp", 1), read["tp"], read.get("pp", 1)) == (
            layout.dp, layout.cp, layout.tp, layout.pp), read
        assert (read["ep"], read["experts_per_rank"]) == (layout.ep, 4 // layout.ep), read
        assert read["placements"]["experts"] == {"mesh": [mesh], "placements": ["S(0)"]}
    assert [r[3]["expert_ranks"] for r in ranks] == groups


# (dp, cp, tp) with ep = dp: each CP rank dispatches its slice of the sequences over the dp
# ranks of its own CP (and TP) index (ranks ((d * cp + c) * tp + t)), and the experts'
# gradients are summed over CP (and TP) before the step; with ep = dp x cp the experts are
# split over FSDP's flattened ("dp", "cp") dim, every rank its own, nothing summed over CP
@pytest.mark.parametrize("layout,groups,mesh", [
    (Layout(dp=2, cp=2, ep=2), [[0, 2], [1, 3], [0, 2], [1, 3]], "dp"),
    (Layout(dp=2, cp=2, ep=4), [[0, 1, 2, 3]] * 4, "dp_cp")], ids=["ep2xcp2", "ep4-over-dp2xcp2"])
def test_ep_with_cp_matches_one_process(layout: Layout, groups: list[list[int]], mesh: str,
                                        moe_dir: Path, tmp_path: Path) -> None:
    want, info, got, ranks = _run_pair(config(moe_dir, trainer=layout, mini_batches=2),
                                       tmp_path)
    # a CP slice's tokens sent to the wrong expert, or the experts' gradients left unsummed
    # over CP (each CP rank's experts then step on half the tokens) show as ~1e-3
    _check_experts(want, info, got, ranks, layout, groups, mesh)
    leaders = [r for k, r in enumerate(ranks) if layout.leads(k)]
    assert sum(r[1]["loss"] for r in leaders) == pytest.approx(info["loss"], abs=1e-5)


def _count_dispatch_bytes(rank: int, tr: Trainer, q_out: Any) -> None:
    """The bytes this rank's all-to-alls send in one forward of a fixed batch of TOKENS
    tokens, counted at the collective (`all_to_all_single_autograd`'s inputs; its backward,
    the reverse all-to-all of the same sizes, runs inside the op): (the dispatches, every
    call), and a token's routed copies' bytes over the MoE layers (k copies, h FP32 values
    each). A layer's calls alternate dispatch (the rank's own tokens' routed copies) and
    combine (the copies it received, computed). The backward runs too, to check it goes."""
    from torch.distributed import _functional_collectives as fc
    sent: list[int] = []
    real = fc.all_to_all_single_autograd

    def counting(x: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        sent.append(x.numel() * x.element_size())
        return real(x, *args, **kw)
    fc.all_to_all_single_autograd = counting  # type: ignore[assignment]
    ids = torch.arange(TOKENS).reshape(2, -1) % 97 + 3  # the same on every rank
    out = tr.model(input_ids=ids).logits.float().sum()
    out.backward()
    c: Any = tr.model.config
    copy = c.num_experts_per_tok * c.hidden_size * 4 * c.num_hidden_layers
    q_out.put((rank, sum(sent[0::2]), sum(sent), copy))


TOKENS = 48


@pytest.mark.parametrize("layout", [Layout(2, 2, 1, ep=2), Layout(2, 2, 1, ep=4)],
                         ids=["ep2xtp2", "ep4-over-dp2xtp2"])
def test_each_tp_rank_dispatches_its_slice_of_the_tokens(layout: Layout, moe_dir: Path) -> None:
    """EP 2 x TP 2: each TP rank dispatches its half of its DP group's tokens, as the cost model
    prices a rank's all-to-all (tokens / (tp x cp)); every TP rank sent all of them before.
    EP 4 folded over dp 2 x tp 2 (expert TP 1) the same, over all four ranks. The combine
    sends back what a rank received, which depends on the routing, so per rank only the
    dispatch is exact; over the world the dispatches and the combines each move every routed
    copy of the two DP groups' tokens once."""
    q_out = SPAWN.Queue()
    run_world(_count_dispatch_bytes, config(moe_dir, trainer=layout), q_out)
    got = sorted(q_out.get(timeout=5) for _ in range(4))
    print(f"all-to-all bytes per rank (rank, dispatch, all calls, a token's copies): {got}")
    copy = got[0][3]  # a token's routed copies over the MoE layers, in bytes
    assert [dispatch for _, dispatch, _, _ in got] == [TOKENS // 2 * copy] * 4  # TOKENS before
    assert sum(total for _, _, total, _ in got) == 2 * 2 * TOKENS * copy


# ep 2 < dp 4: ep groups of two consecutive dp ranks of one CP index, each rank's shard
# replicated in the other group (`expert_replicas`), its gradient summed over them; under CP 2
# (ranks d * cp + c) also summed over CP
@pytest.mark.parametrize("layout,groups,replicas", [
    (Layout(4, 1, 1, ep=2), [[0, 1], [0, 1], [2, 3], [2, 3]], [[0, 2], [1, 3]] * 2),
    (Layout(dp=4, cp=2, ep=2), [[0, 2], [1, 3]] * 2 + [[4, 6], [5, 7]] * 2,
     [[0, 4], [1, 5], [2, 6], [3, 7]] * 2)], ids=["dp4-ep2", "dp4xcp2-ep2"])
def test_ep_below_dp_matches_one_process(layout: Layout, groups: list[list[int]],
                                         replicas: list[list[int]], moe_dir: Path,
                                         tmp_path: Path) -> None:
    """ep 2 < dp 4: two ep groups, each holding every expert (two per rank), each rank's shard
    replicated in the other group and its gradient summed over the replicas before the step:
    one process's steps. Measured by removing that sum: each group steps its experts on its own
    half of the tokens, 4.0e-3 away (dp 4 ep 2); summing it twice, 1.7e-4 away."""
    want, info, got, ranks = _run_pair(config(moe_dir, trainer=layout, mini_batches=2),
                                       tmp_path)
    _check_experts(want, info, got, ranks, layout, groups, "ep")
    assert [r[3]["expert_replicas"] for r in ranks] == replicas
    leaders = [r for k, r in enumerate(ranks) if layout.leads(k)]
    assert sum(r[1]["loss"] for r in leaders) == pytest.approx(info["loss"], abs=1e-5)


# ep > dp x cp: EP folded over TP (expert TP 1, Megatron-Core's expert RankGenerator order
# tp-ep-dp): ep consecutive ranks of the flattened ("dp", "tp") dims (ranks d * tp + t), every
# TP rank holding its own experts and dispatching its slice of its DP group's tokens over them;
# each expert on one rank, so its gradient is whole there and summed over nothing
@pytest.mark.parametrize("layout,groups", [
    (Layout(2, 2, 1, ep=4), [[0, 1, 2, 3]] * 4),
    (Layout(1, 2, 1, ep=2), [[0, 1]] * 2),
    (Layout(dp=1, cp=2, tp=2, ep=4), [[0, 1, 2, 3]] * 4),
    (Layout(1, 2, 2, ep=2), [[0, 1], [0, 1], [2, 3], [2, 3]])],  # each stage's own TP ranks
    ids=["ep4-over-dp2xtp2", "ep2-over-tp2", "ep4-over-cp2xtp2", "ep2-over-tp2xpp2"])
def test_ep_folded_over_tp_matches_one_process(layout: Layout, groups: list[list[int]],
                                               moe_dir: Path, tmp_path: Path) -> None:
    want, info, got, ranks = _run_pair(config(moe_dir, trainer=layout, mini_batches=2),
                                       tmp_path)
    _check_experts(want, info, got, ranks, layout, groups, "ep")  # the group spans TP
    assert all("expert_replicas" not in r[3] for r in ranks)  # ep == dp x tp: one copy each
    leaders = [r for k, r in enumerate(ranks) if layout.leads(k)]
    assert sum(r[1]["loss"] for r in leaders) == pytest.approx(info["loss"], abs=1e-5)


@pytest.fixture(scope="module")
def moe4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-MoE with 4 KV heads, so that TP 4 divides them."""
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("moe4") / "v0", seed=3,
                            num_key_value_heads=4)


def test_ep_folded_over_tp_below_tp_sums_over_replicas(moe4_dir: Path, tmp_path: Path) -> None:
    """tp 4, dp 1, ep 2: ep groups of two consecutive TP ranks, {0, 1} and {2, 3}, each holding
    every expert; each rank's shard is replicated in the other group (Megatron-Core's
    expert-data-parallel group with expert TP 1) and its gradient summed over the replicas
    (not over all of TP): one process's steps. Measured by removing that sum, by doing it
    twice, and by summing over the whole TP group as with experts not folded over TP (see the
    module docstring)."""
    layout = Layout(1, 4, 1, ep=2)
    want, info, got, ranks = _run_pair(config(moe4_dir, trainer=layout, mini_batches=2),
                                       tmp_path)
    # an expert gradient summed over no replica, twice, or over all of TP shows as >= 1.7e-4
    _check_experts(want, info, got, ranks, layout, [[0, 1], [0, 1], [2, 3], [2, 3]], "ep")
    assert [r[3]["expert_replicas"] for r in ranks] == [[0, 2], [1, 3]] * 2
    assert ranks[0][1]["loss"] == pytest.approx(info["loss"], abs=1e-5)
