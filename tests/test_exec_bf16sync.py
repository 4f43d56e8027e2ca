"""A weight refresh carries the engines' dtype (`executors.precision.wire_dtype`): a BF16 job's
trainer casts each tensor to BF16 as it builds the bucket it is in, so the refresh moves the
bytes the plan prices (`placer.cost.roofline.weight_bytes`, 2 B a parameter), and the engine
loads the BF16 tensors into its own weights; an fp32 job's refresh is FP32, exactly the
trainer's weights, as before. The weights' digests compare like with like: the trainer's is of
the weights cast as the refresh casts them (`Trainer.weights_digest`), whether the refresh read
the copy kept since the step's end or gathered from the shards, and equals the digest of the
engine it refreshed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import run_world
from test_exec_sharding import ARCH, batch, config

from executors.model import build_policy, save_model_dir, state_digest
from executors.modelroles import Rollout
from executors.precision import wire_dtype, wire_nbytes, wire_state
from executors.reshard import Bucket
from executors.runplan import EngineGroup, Layout
from executors.trainer import Trainer
from executors.training import partition
from placer.cost.roofline import weight_bytes

SIZE = 4096  # buckets far smaller than tiny-llama's weights: tensors straddle them


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


def _load(engine: Rollout, buckets: list[Bucket], version: int) -> int:
    """Every bucket into the engine (one stream, in order); the bytes it took."""
    outs = [engine.receive_bucket(b, version, 1, f"v{version}") for b in buckets]
    assert outs[-1]["done"] and engine.version == version
    return sum(o["bytes"] for o in outs)


def _engine_weights(engine: Rollout) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_refresh_carries_the_jobs_dtype_at_the_priced_bytes(precision: str, tp: int,
                                                              model_dir: Path) -> None:
    """One process, after a training step (weights off the BF16 grid): a bf16 job's buckets
    hold BF16 tensors, their bytes the plan's priced sync bytes for the model; the engine (at
    tp 2 through its TP shards) then holds the trainer's weights rounded to BF16, and its
    digest is the trainer's. An fp32 job sends FP32, twice the bytes, exactly the weights."""
    cfg = config(model_dir, precision=precision, engines=EngineGroup(tp=tp))
    tr, engine = Trainer(cfg), Rollout(cfg)
    s, adv = batch(1)
    tr.train(partition(s, adv, None, Layout(), 1, 1)[0])
    version, nbytes, count = tr.sync_open(SIZE, 0)
    buckets = [tr.sync_bucket(k) for k in range(count)]
    got = _load(engine, buckets, version)
    per = {"bf16": 2, "fp32": 4}[precision]
    assert got == nbytes == tr.weights_info()[1] == ARCH.params() * per
    if precision == "bf16":  # the plan's price of the refresh, to the byte
        assert got == weight_bytes(ARCH)
    assert {e.dtype for b in buckets for e in b.entries} == {
        torch.bfloat16 if precision == "bf16" else torch.float32}
    master = tr.weights()
    assert all(v.dtype == torch.float32 for v in master.values())  # the masters stay FP32
    want = wire_state(master, wire_dtype(precision))
    held = _engine_weights(engine)
    assert all(torch.equal(held[k], want[k].float()) for k in want)
    assert engine.weights_digest() == tr.weights_digest() == state_digest(want)
    rounded = state_digest(master) != tr.weights_digest()
    assert rounded == (precision == "bf16")  # BF16 really rounds; FP32 is exact


def test_an_engine_loads_bf16_into_its_own_dtype(model_dir: Path) -> None:
    """The engine keeps its weights' dtype (FP32 storage here, as vLLM's `load_weights` copies
    into its parameters whatever their dtype): the BF16 values arrive exactly, and a second
    refresh of the same weights changes nothing."""
    cfg = config(model_dir, precision="bf16")
    tr, engine = Trainer(cfg), Rollout(cfg)
    version, _, count = tr.sync_open(SIZE, 0)
    _load(engine, [tr.sync_bucket(k) for k in range(count)], version)
    first = _engine_weights(engine)
    assert all(v.dtype == torch.float32 for v in first.values())
    assert all(torch.equal(v, v.bfloat16().float()) for v in first.values())  # on the grid
    version, _, count = tr.sync_open(0, 0)  # unbucketed: one call a tensor, the same bytes
    assert _load(engine, [tr.sync_bucket(k) for k in range(count)], version) == \
        wire_nbytes(first, torch.bfloat16)
    assert all(torch.equal(first[k], v) for k, v in _engine_weights(engine).items())


# ----------------------------------------------------------------------------- on gloo
def _step_then_refresh(rank: int, tr: Any, cfg: Any, out: str) -> None:
    """A step, then rank 0 streams the refresh (the others take part in its gathers, when it
    gathers) and every rank joins the trainer's digest (a collective, as `weights()`)."""
    s, adv = batch(1)
    tr.train(partition(s, adv, None, cfg.trainer, cfg.mini_batches, cfg.accumulate)[rank])
    kept = bool(tr.weights_info()[2])
    if rank == 0:
        version, nbytes, count = tr.sync_open(SIZE, 0)
        buckets = [tr.sync_bucket(k) for k in range(count)]
    else:
        tr.sync_gather(SIZE)
    digest = tr.weights_digest()
    master = tr.weights()
    if rank == 0:
        torch.save({"version": version, "nbytes": nbytes, "buckets": buckets, "kept": kept,
                    "digest": digest, "master": master}, f"{out}/refresh.pt")


@pytest.mark.parametrize("keep", [True, False], ids=["kept-copy", "gathered"])
def test_a_sharded_bf16_trainers_digest_is_the_engines_from_either_source(
        keep: bool, model_dir: Path, tmp_path: Path) -> None:
    """dp 2 in bf16: whether the refresh read the copy kept since the step's end or gathered
    from the shards, it carries BF16 at the priced bytes, and the trainer's digest (of its
    FP32 masters cast as the refresh casts them) is the refreshed engine's."""
    cfg = config(model_dir, precision="bf16", trainer=Layout(2, 1, 1), keep_sync_copy=keep)
    run_world(_step_then_refresh, cfg, cfg, str(tmp_path))
    got = torch.load(tmp_path / "refresh.pt", weights_only=False)
    assert got["kept"] == keep
    engine = Rollout(config(model_dir, precision="bf16"))
    assert _load(engine, got["buckets"], got["version"]) == got["nbytes"] == weight_bytes(ARCH)
    assert engine.weights_digest() == got["digest"]
    assert got["digest"] == state_digest(wire_state(got["master"], torch.bfloat16))
    assert got["digest"] != state_digest(got["master"])


def test_the_sender_casts_per_bucket_and_leaves_the_fp32_masters(model_dir: Path) -> None:
    """The cast is the sender's, tensor by tensor as its buckets are built: the trainer's
    weights (and a kept copy, priced at FP32 by `hostmem.sync_copy_bytes`) stay FP32."""
    cfg = config(model_dir, precision="bf16")
    tr = Trainer(cfg)
    before = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    _, _, count = tr.sync_open(SIZE, 0)
    for k in range(count):
        tr.sync_bucket(k)
    after = tr.model.state_dict()
    assert all(after[k].dtype == torch.float32 and torch.equal(after[k], v)
               for k, v in before.items())



def test_rollout_log_probs_from_bf16_weights_match_the_trainers_within_bf16(
        model_dir: Path) -> None:
    """The importance weights a BF16 job trains with compare the engine's sampled log-probs
    (its forward over the BF16-rounded weights the refresh carried) with the trainer's old
    log-probs (BF16 autocast over its FP32 masters): they differ by BF16's rounding, not
    exactly (the rollout/training mismatch that verl, docs/advance/rollout_is.md, and NeMo-RL,
    docs/guides/prorlv2.md, correct with importance weights rather than assume away), and no
    token's weight reaches the truncation cap. Measured (this test, 2 steps, 32 samples):
    max |dlogp| 3.0e-3, mean 6.1e-4; the same engine refreshed in FP32 (the masters
    themselves): max 2.0e-3, mean 2.8e-4."""
    from executors import rl
    cfg = config(model_dir, precision="bf16")
    tr, engine = Trainer(cfg), Rollout(cfg)
    for i in range(2):  # the weights move off the version-0 values
        s, adv = batch(i)
        tr.train(partition(s, adv, None, Layout(), 1, 1)[0])
    version, _, count = tr.sync_open(SIZE, 0)
    _load(engine, [tr.sync_bucket(k) for k in range(count)], version)
    ctx = [[1] + [3 + (i * 7 + j) % 40 for j in range(10)] for i in range(32)]
    smp, _ = engine.generate([f"s{i}" for i in range(32)], ["g"] * 32, ctx, list(range(32)))
    old = tr._logprobs(smp)
    pairs = [(a, float(old[i, k])) for i, r in enumerate(smp.logprobs) for k, a in enumerate(r)]
    diff = [abs(a - b) for a, b in pairs]
    print(f"bf16 refresh: rollout vs trainer log-probs max |dlogp| {max(diff):.3g}, "
          f"mean {sum(diff) / len(diff):.3g} over {len(diff)} tokens")
    assert len(pairs) > 100 and max(diff) < 0.02 and any(d > 0 for d in diff)
    weights = rl.tis_weights(torch.tensor([[b for _, b in pairs]]),
                             torch.tensor([[a for a, _ in pairs]]))
    assert float(weights.max()) < rl.TIS_CAP
