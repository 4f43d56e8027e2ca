"""Weight sync between layouts (`executors.reshard`, `executors.weights`): the trainer's
FSDP2 / TP / PP shards gathered and streamed in buckets reach the rollout engines bit for bit;
the TP cut an engine rank keeps is the one a DTensor-sharded model (the trainer's column/row
plan, vocab-parallel embedding and LM head) holds on gloo; a refresh makes ceil(bytes / bucket)
calls per sender (one per tensor unbucketed); the trace's `weight sync` events carry bytes,
calls, senders and dst, and `placer calibrate` fits them.

Distributed runs: 2 gloo processes per trainer layout (dp 2, tp 2, pp 2), no training step (the
version-0 weights are known exactly)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_world import run_world
from test_exec_sharding import ARCH, config

from executors.model import build_policy, load_policy, save_model_dir
from executors.modelroles import Rollout
from executors.reshard import (
    Assembler,
    Stream,
    bucket_count,
    engine_shard,
    engine_state,
    shard_range,
    split_of,
)
from executors.roles import RunConfig
from executors.sharding import Layout
from executors.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]

SIZES = (0, 4096)  # unbucketed, and buckets far smaller than the model (tiny-llama: ~0.2 MB)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


def source(model_dir: Path) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in load_policy(str(model_dir)).state_dict().items()}


# ----------------------------------------------------------------------------- pure parts
def test_the_tp_cut_follows_the_column_row_and_vocab_split() -> None:
    assert split_of("model.layers.0.self_attn.q_proj.weight", 2) == ("column", 0)
    assert split_of("model.layers.0.self_attn.k_proj.bias", 1) == ("column", 0)
    assert split_of("model.layers.0.self_attn.o_proj.weight", 2) == ("row", 1)
    assert split_of("model.layers.0.self_attn.o_proj.bias", 1) == ("whole", None)
    assert split_of("model.layers.1.mlp.experts.3.down_proj.weight", 2) == ("row", 1)
    assert split_of("model.layers.1.block_sparse_moe.experts.0.w3.weight", 2) == ("column", 0)
    assert split_of("model.layers.1.mlp.gate.weight", 2) == ("whole", None)  # the MoE router
    assert split_of("model.layers.0.self_attn.q_norm.weight", 1) == ("whole", None)
    assert split_of("model.embed_tokens.weight", 2) == ("vocab", 0)
    assert split_of("lm_head.weight", 2) == ("vocab", 0)
    with pytest.raises(ValueError, match="no tensor-parallel rule for 'model.mystery.weight'"):
        split_of("model.mystery.weight", 2)
    # KV heads fewer than tp are replicated: 2 KV heads of 8 rows over tp 4
    assert [shard_range("a.k_proj.weight", (16, 32), 4, r, kv_heads=2)[1:]
            for r in range(4)] == [(0, 8), (0, 8), (8, 16), (8, 16)]
    # the vocabulary pads to 64 per rank: 100 rows over tp 2 -> 64 + 36 real rows
    assert [shard_range("lm_head.weight", (100, 8), 2, r)[1:] for r in range(2)] == [(0, 64),
                                                                                   (64, 100)]
    with pytest.raises(ValueError, match="tp 3 does not divide dim 0"):
        shard_range("a.q_proj.weight", (16, 8), 3, 0)


def test_the_tp_shards_of_an_engine_cover_each_tensor_once(model_dir: Path) -> None:
    full = source(model_dir)
    for tp in (1, 2):
        parts = [engine_state(full, tp, r, kv_heads=ARCH.kv_heads) for r in range(tp)]
        for k, v in full.items():
            dim = split_of(k, v.dim())[1]
            if dim is None or tp == 1:
                assert all(p[k] is v for p in parts), k
            else:
                assert torch.equal(torch.cat([p[k] for p in parts], dim), v), k


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"])
def test_every_architecture_has_a_cut_and_an_mlp_cut_computes_the_same(kind: str) -> None:
    """Every tensor of each executor architecture has a rule; tp 2 shards cover each tensor
    once; and the MLP (dense, or an expert of the fused MoE tensors transformers 5 keeps) run
    on each rank's column and row shards sums to the full MLP's output (Megatron's pairing)."""
    import transformers as tf

    from executors.checkpoints import CONFIGS
    cfg = CONFIGS[kind]()
    torch.manual_seed(0)
    full = tf.AutoModelForCausalLM.from_config(cfg).state_dict()
    parts = [engine_state(full, 2, r, kv_heads=cfg.num_key_value_heads) for r in range(2)]
    for k, v in full.items():
        cut, dim = split_of(k, v.dim())
        if dim is None:
            assert all(p[k] is v for p in parts), k
        elif cut == "fused":  # each rank: its gate rows, then its up rows
            halves = [p[k].chunk(2, dim) for p in parts]
            assert torch.equal(torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim), v)
        else:
            assert torch.equal(torch.cat([p[k] for p in parts], dim), v), k
    x = torch.randn(3, cfg.hidden_size)
    act = torch.nn.functional.silu
    mlp = "model.layers.0.mlp."

    def run(sd: dict[str, torch.Tensor]) -> torch.Tensor:
        if mlp + "experts.gate_up_proj" in sd:  # expert 0 of the fused tensors
            g, u = torch.nn.functional.linear(x, sd[mlp + "experts.gate_up_proj"][0]).chunk(2, -1)
            return torch.nn.functional.linear(act(g) * u, sd[mlp + "experts.down_proj"][0])
        g = torch.nn.functional.linear(x, sd[mlp + "gate_proj.weight"])
        u = torch.nn.functional.linear(x, sd[mlp + "up_proj.weight"])
        return torch.nn.functional.linear(act(g) * u, sd[mlp + "down_proj.weight"])
    torch.testing.assert_close(run(parts[0]) + run(parts[1]), run(full))


def test_buckets_rebuild_every_tensor_in_any_order_and_count_as_priced() -> None:
    g = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g).bfloat16(),
             "c": torch.arange(4), "empty": torch.zeros(0), "scalar": torch.tensor(2.5)}
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    for size in (0, 1, 3, 16, 60, 10**6):
        s = Stream(state, size)
        want = len(state) if size == 0 else math.ceil(nbytes / size)
        assert s.count == bucket_count(nbytes, len(state), size) == want, size
        assert sum(s.bucket(k).nbytes for k in range(s.count)) == nbytes
        asm, got = Assembler(), {}
        for k in reversed(range(s.count)):  # a tensor straddling buckets, received backwards
            assert not asm.complete(1)
            got.update(asm.add(s.bucket(k)))
        assert asm.complete(1) and set(got) == set(state), size
        for k, v in state.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), (size, k)


# ----------------------------------------------------------------------------- on gloo
def _stream_every_size(rank: int, tr: Trainer, cfg: RunConfig, out: str) -> None:
    layout = cfg.trainer
    for size in SIZES:
        senders = tr.sync_senders(size > 0)
        if rank in senders:
            version, nbytes, count = tr.sync_open(size, senders.index(rank))
            torch.save({"senders": senders, "nbytes": nbytes, "version": version,
                        "buckets": [tr.sync_bucket(k) for k in range(count)]},
                       f"{out}/b{size}.{rank}.pt")
        else:  # a rank that streams nothing takes part in its senders' gathers
            tr.sync_gather(size)
    if layout.tp > 1:
        torch.save(_dtensor_shards(cfg.model_dir, layout.tp), f"{out}/tp.{rank}.pt")


def _dtensor_shards(model_dir: str, tp: int) -> dict[str, torch.Tensor]:
    """This rank's part of every tensor of a TP-sharded model: the trainer's column/row plan
    on every layer, the embedding and LM head vocab-parallel (as vLLM's engines hold them)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from executors.sharding import decoder_layers, layer_tp_plan
    model = load_policy(model_dir)
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
                                     "lm_head": ColwiseParallel(output_layouts=Replicate())})
    for layer in decoder_layers(model):
        parallelize_module(layer, mesh, layer_tp_plan(layer))
    return {k: (v.to_local() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.state_dict().items()}


def _run(cfg: RunConfig, tmp: Path) -> None:
    run_world(_stream_every_size, cfg, cfg, str(tmp))


@pytest.mark.parametrize("layout", [(2, 1, 1), (1, 2, 1), (1, 1, 2)], ids=["dp2", "tp2", "pp2"])
def test_a_sharded_trainer_streams_its_weights_exactly(layout: tuple[int, int, int],
                                                       model_dir: Path, tmp_path: Path) -> None:
    cfg = config(model_dir, trainer=Layout(*layout))
    _run(cfg, tmp_path)
    want = source(model_dir)
    total = sum(v.numel() * v.element_size() for v in want.values())
    for size in SIZES:
        files = sorted(tmp_path.glob(f"b{size}.*.pt"))
        streams = [torch.load(f, weights_only=False) for f in files]
        senders = streams[0]["senders"]
        # bucketed, each pipeline stage streams its own layers; unbucketed rank 0 sends all
        assert senders == ([0, 1] if layout[2] == 2 and size else [0])
        assert len(streams) == len(senders) and sum(s["nbytes"] for s in streams) == total
        names: list[str] = []
        for s in streams:
            mine = {e.name for b in s["buckets"] for e in b.entries}
            names += sorted(mine)
            assert len(s["buckets"]) == bucket_count(s["nbytes"], len(mine), size)
        assert sorted(names) == sorted(want)  # every tensor from exactly one sender
        # a torch engine (tp 1) receives the streams interleaved, as the driver sends them
        engine = Rollout(cfg)
        for k in range(max(len(s["buckets"]) for s in streams)):
            for s in streams:
                if k < len(s["buckets"]):
                    t = engine.receive_bucket(s["buckets"][k], 5, len(streams), "r1")
        assert t["done"] and engine.version == 5
        got = engine.model.state_dict()
        for tp in (1, 2):
            for r in range(tp):
                cut, ref = engine_state(got, tp, r), engine_state(want, tp, r)
                bad = [k for k in want if not torch.equal(cut[k], ref[k])]
                assert not bad, (size, tp, r, bad)
    if layout[1] == 2:  # the engine's TP cut is the DTensor-sharded model's local part
        for r in range(2):
            local = torch.load(tmp_path / f"tp.{r}.pt")
            bad = [k for k in want if not torch.equal(
                engine_shard(k, want[k], 2, r, ARCH.kv_heads), local[k])]
            assert not bad and len(local) == len(want), (r, bad)


def test_an_interrupted_refresh_is_dropped_by_the_next(model_dir: Path) -> None:
    cfg = config(model_dir)
    want = source(model_dir)
    engine = Rollout(cfg)
    with torch.no_grad():
        for p in engine.model.parameters():
            p.zero_()
    s = Stream(want, 2048)
    engine.receive_bucket(s.bucket(0), 1, 1, "a")  # the sender died after one bucket
    assert engine.version == 0
    for k in range(s.count):
        t = engine.receive_bucket(s.bucket(k), 1, 1, "b")
    assert t["done"] and engine.version == 1
    assert all(torch.equal(v, want[k]) for k, v in engine.model.state_dict().items())


# ----------------------------------------------------------------------------- the loop
def _executed(tmp: Path, bucket_gb: float, steps: int = 2) -> tuple[Any, Any]:
    """A local run of the tiny CPU job with the plan's `sync_bucket_gb` set: (plan, result)."""
    from executors.run import execute
    from placer.api import plan as make_plan
    from placer.cost.calibration import calibration_from_dict
    from placer.solve.planfile import calibration_of
    plan = make_plan(str(ROOT / "examples" / "tiny-cpu.yaml"))
    doc = calibration_of(plan).to_dict()
    doc["default"] = {**(doc.get("default") or {}), "sync_bucket_gb": bucket_gb}
    plan = plan.model_copy(update={"calibration": calibration_from_dict(doc)})
    return plan, execute(plan, steps, tmp / "out", local=True)


@pytest.mark.parametrize("bucket_gb", [1e-5, 0.0], ids=["10kB", "unbucketed"])
def test_the_trace_records_each_refresh_and_calibrate_fits_it(bucket_gb: float, model_dir: Path,
                                                             tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    from executors.runplan import resolve_plan
    from executors.weights import bucket_bytes
    from placer.base.roles import Role
    from placer.cli import main
    from placer.cost.roofline import weight_bytes, weight_tensors
    from placer.solve.planfile import save_plan
    plan, result = _executed(tmp_path, bucket_gb)
    result.trace.check()  # calls and senders are keys the schema names
    syncs = [e for e in result.trace.events if e.cat == "transfer" and e.name == "weight sync"]
    assert [e.args["policy_version"] for e in syncs] == [0, 1]  # one refresh per step
    size = bucket_bytes(resolve_plan(plan))
    assert size == (int(bucket_gb * 1e9) if bucket_gb else 0)
    arch = plan.resolved().arch_of(Role.ROLLOUT)
    tensors = weight_tensors(arch)  # as the planner counts
    for e in syncs:
        nbytes = e.args["bytes"]
        # the planned job trains in BF16, so its refresh carries BF16: the bytes the plan
        # prices (2 B a parameter; the buckets frame the stream, adding nothing)
        assert nbytes == syncs[0].args["bytes"] == weight_bytes(arch)
        assert e.args["calls"] == (math.ceil(nbytes / size) if size else tensors) > 1
        assert e.args["senders"] == 1 and e.args["src"] == "actor0"
        assert e.args["dst"] == e.pid and e.pid.count(":") == 1  # pool:node of the engine
        assert e.dur_s > 0
    save_plan(plan, tmp_path / "plan.json")
    result.trace.write(tmp_path / "trace.json")
    out = tmp_path / "profile.yaml"
    assert main(["calibrate", str(tmp_path / "trace.json"), "--plan", str(tmp_path / "plan.json"),
                 "-o", str(out), "--events-only", "--json", "--min-events", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # every refresh is priced: its bytes, calls and dst name the factors of the transfer group
    pool = syncs[0].pid.split(":")[0]
    dev = plan.resolved().device_of(pool).name
    assert doc["fit"]["counts"][f"transfer@{dev}"] == len(syncs)
    fitted = doc["fit"]["factors"][dev]
    # a call: a bucket's (`sync_call_s`), or one tensor's loader walk (`sync_load_entry_s`)
    per_call = "sync_call_s" if size else "sync_load_entry_s"
    assert all(fitted[f]["events"] == len(syncs) for f in ("sync_latency_s", per_call))


@pytest.mark.slow  # the local runtime's test covers the rule; this one the Ray path
@pytest.mark.ray
def test_under_ray_each_pipeline_stage_streams_its_own_layers(tmp_path: Path) -> None:
    """One step of the whole loop on Ray with the actor planned pp 2 and 64 kB buckets: the
    refresh has two senders (the stages' ranks), each its share in ceil(bytes / bucket) calls."""
    from exec_util import GRPO_LAYOUT, hand_plan  # lazy: the plan helpers load the planner

    from executors.pipeline import stage_bounds
    from executors.run import execute
    from placer.cost.calibration import calibration_from_dict
    from placer.cost.sharding import Parallel
    plan = hand_plan({**GRPO_LAYOUT, "actor": ("gpu", Parallel(pp=2), "train")})
    plan = plan.model_copy(update={"calibration": calibration_from_dict(
        {"default": {"sync_bucket_gb": 64e-6}})})
    import ray  # lazy: Ray (~1 s) loads when a Ray test runs, not at collection
    r = execute(plan, 1, tmp_path / "out")
    # the embedded Ray went with the run: a later run starts its own with its plan's resources
    # (one left up was reused by the next test's run, short of this plan's LPU pool)
    assert not ray.is_initialized()
    assert r.ledger_ok and r.trace.metadata["executed_layout"]["actor"]["pp"] == 2
    [sync] = [e for e in r.trace.events if e.name == "weight sync"]
    model = load_policy(str(tmp_path / "out" / "model-v0"))  # the run's version 0
    assert sync.args["senders"] == 2 and sync.args["src"] == "actor0,actor1"
    size = 64_000
    lo, _ = stage_bounds(model.config.num_hidden_layers, 2, 1)  # stage 0: layers [0, lo)
    sd = model.state_dict()
    wire = 2  # a planned job trains in BF16: its refresh carries BF16 (`executors.precision`)
    first = sum(v.numel() * wire for k, v in sd.items()
                if k.startswith("model.embed") or any(k.startswith(f"model.layers.{i}.")
                                                       for i in range(lo)))
    total = sum(v.numel() * wire for v in sd.values())
    assert sync.args["bytes"] == total
    assert sync.args["calls"] == max(math.ceil(first / size), math.ceil((total - first) / size))
    assert sync.args["calls"] > 1
