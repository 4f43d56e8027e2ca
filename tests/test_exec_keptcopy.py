"""The weight refresh's two sources on a sharded trainer: the full copy its senders keep from
the step's end (`RunConfig.keep_sync_copy`, the plan's host-memory decision) and the shards
gathered as the stream is built; and the batched gathers both use (`executors.gather`): one
all-gather per run of tensors, equal to torch's own `full_tensor` byte for byte."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import SPAWN, run_world
from test_exec_sharding import ARCH, batch, config

from executors.gather import batches
from executors.model import build_policy, save_model_dir
from executors.reshard import Stream
from executors.runplan import EngineGroup, Layout
from executors.training import partition
from placer.solve.hostmem import sync_copy_bytes

SIZE = 4096  # buckets far smaller than tiny-llama's ~0.3 MB


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


def test_runs_are_cut_from_the_sizes_alone() -> None:
    assert batches([3, 3, 3, 10, 1], 6) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert batches([3, 3, 3], 0) == [(0, 1), (1, 2), (2, 3)]  # unbatched: one each
    assert batches([], 6) == []


def _torch_whole(tr: Any) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in tr.model.state_dict().items()}


def _step_then_refresh(rank: int, tr: Any, cfg: Any, q_out: Any) -> None:
    """Before a step the refresh gathers (batched, equal to torch's `full_tensor`); after one,
    with the copy kept, the refresh reads it and gathers nothing, and the copy is the step's
    weights exactly."""
    before = tr._sync_source(SIZE)
    stream = Stream(before, SIZE)
    got0 = torch.cat([stream.bucket(k).data for k in range(stream.count)])
    want0 = _torch_whole(tr)
    same0 = bool(torch.equal(got0, torch.cat([Stream(want0, SIZE).bucket(k).data
                                              for k in range(stream.count)])))
    batched = before.gathers  # collectives the refresh made
    gathering = (tr.handover_gathers(), tr.weights_info()[2])
    s, adv = batch(1)
    tr.train(partition(s, adv, None, cfg.trainer, cfg.mini_batches, cfg.accumulate)[rank])
    want = _torch_whole(tr)  # the step's weights, gathered by torch (every rank)
    kept = tr._kept_now()
    src = tr._sync_source(SIZE)
    lay = Stream(src, SIZE)
    got = torch.cat([lay.bucket(k).data for k in range(lay.count)]) if kept else None
    exact = got is not None and torch.equal(got, torch.cat(
        [Stream(want, SIZE).bucket(k).data for k in range(lay.count)]))
    held = sum(v.numel() * v.element_size() for v in (kept or {}).values())
    q_out.put((rank, same0, batched, len(want0), gathering, sorted(kept or {}), sorted(want),
               exact, src.gathers, tr.handover_gathers(), tr.weights_info()[2], held))


@pytest.mark.parametrize("colocated", [True, False])
def test_the_senders_keep_the_steps_weights_and_gather_nothing_at_the_refresh(
        model_dir: Path, colocated: bool) -> None:
    """dp 2 with `keep_sync_copy`: before any step (nothing kept) a refresh gathers in runs of
    a bucket, one all-gather each rather than one per tensor, byte for byte torch's
    `full_tensor`; after a step the senders (every rank beside a colocated engine, else rank 0)
    hold the step's weights exactly, the others nothing, and the refresh's source gathers
    nothing, so no rank but the senders takes part (`handover_gathers` False). A sender holds
    exactly the bytes the plan prices for the copy (`hostmem.sync_copy_bytes`)."""
    cfg = config(model_dir, engines=EngineGroup(tp=1, colocated=colocated),
                 trainer=Layout(2, 1, 1), keep_sync_copy=True)
    q_out = SPAWN.Queue()
    run_world(_step_then_refresh, cfg, cfg, q_out)
    out = sorted((q_out.get(timeout=5) for _ in range(2)), key=lambda x: x[0])
    priced = sync_copy_bytes(ARCH)  # the plan's host-memory part for one copy
    for (rank, same0, batched, tensors, gathering, kept, names, exact, gathers, ho_gathers,
         from_copy, held) in out:
        assert same0 and 0 < batched < tensors, (rank, batched, tensors)
        assert gathering == (True, False)  # nothing kept before the first step
        sender = colocated or rank == 0
        assert (kept == names) if sender else not kept, rank
        assert exact == sender and gathers == 0, rank
        assert held == (priced if sender else 0), (rank, held, priced)  # the bytes it holds
        assert not ho_gathers and from_copy, rank


def _gather_only(rank: int, tr: Any, cfg: Any, q_out: Any) -> None:
    s, adv = batch(1)
    tr.train(partition(s, adv, None, cfg.trainer, cfg.mini_batches, cfg.accumulate)[rank])
    q_out.put((rank, tr._kept_now(), tr.handover_gathers(), tr.weights_info()[2]))


def test_without_the_plans_leave_nothing_is_kept(model_dir: Path) -> None:
    """`keep_sync_copy` False (the plan's host memory has no room): after a step no rank holds
    a copy, and a refresh gathers from the shards (every rank taking part)."""
    cfg = config(model_dir, engines=EngineGroup(tp=1, colocated=True), trainer=Layout(2, 1, 1))
    q_out = SPAWN.Queue()
    run_world(_gather_only, cfg, cfg, q_out)
    for _, kept, ho_gathers, from_copy in (q_out.get(timeout=5) for _ in range(2)):
        assert kept is None and ho_gathers and not from_copy


def _whole_2d(rank: int, tr: Any, cfg: Any, q_out: Any) -> None:
    """After a step (weights and Adam moments both sharded): every tensor made whole in one
    batch by `whole_tensors`, against torch's `full_tensor` one by one, and the all-gathers the
    batch made counted."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from executors import gather
    s, adv = batch(1)
    tr.train(partition(s, adv, None, cfg.trainer, cfg.mini_batches, cfg.accumulate)[rank])
    ts = [v for v in tr.model.state_dict().values()]
    ts += [v for st in tr.opt.state.values() for v in st.values()
           if isinstance(v, DTensor) and v.dim() > 0]
    kinds = sorted({"/".join(type(p).__name__ for p in t.placements)
                    for t in ts if isinstance(t, DTensor)})
    two_d = sum(1 for t in ts if isinstance(t, DTensor) and len(gather.cuts(t) or ()) == 2)
    alone = sum(1 for t in ts if isinstance(t, DTensor) and gather.cuts(t) is None)
    calls = []
    real = dist.all_gather

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)
    dist.all_gather = counted
    try:
        got = gather.whole_tensors(ts)
    finally:
        dist.all_gather = real
    want = [t.full_tensor() if isinstance(t, DTensor) else t for t in ts]
    same = all(g.dtype == w.dtype and g.shape == w.shape
               and torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8))
               for g, w in zip(got, want))
    q_out.put((rank, same, len(calls), two_d, alone, len(ts), kinds))


def test_two_d_shards_are_gathered_in_one_batch_equal_to_full_tensor(model_dir: Path) -> None:
    """dp 2 x tp 2 (FSDP2 over TP: `_StridedShard` on dp and `Shard` on tp for a column-cut
    tensor, `Shard(0)`/`Shard(1)` for a row-cut one): the weights and Adam moments, every one
    of them, made whole byte for byte as torch's `full_tensor`, in one all-gather per mesh dim
    a tensor is cut on and group (a handful), not one per tensor."""
    cfg = config(model_dir, trainer=Layout(2, 2, 1))
    q_out = SPAWN.Queue()
    run_world(_whole_2d, cfg, cfg, q_out)
    out = sorted((q_out.get(timeout=5) for _ in range(4)), key=lambda x: x[0])
    for rank, same, calls, two_d, alone, n, kinds in out:
        assert same, rank
        assert "_StridedShard/Shard" in kinds and "Shard/Shard" in kinds, kinds
        # every weight and moment but the norms' is cut on both mesh dims; none gathered alone
        assert alone == 0 and two_d >= 40 and calls <= 4, (rank, calls, two_d, n)
