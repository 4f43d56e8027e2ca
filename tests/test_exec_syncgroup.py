"""The weight-sync group (`executors.syncgroup`, `executors.weights.GroupRefresh`): trainer
senders and every TP rank of the rollout engines in gloo process groups of their own; the bytes
go by broadcast, the engines' TP shards are exactly the trainer's tensors cut as vLLM cuts them
(on the receiving side, or by the senders), and Ray carries only the control messages.

Pure and in-process tests (the group's members as threads of this process, real gloo groups
over a loopback store), then one Ray test: a dp 2 x tp 2 trainer refreshes a TP 2 torch engine,
its first refresh in two round trips of the driver (the manifests, then the sends and receipts),
the next in one (each sender cuts and sends in one call against the kept manifests).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_exec_sharding import ARCH, config

from executors.gather import Gathered
from executors.model import build_policy, load_policy, save_model_dir
from executors.modelroles import Rollout
from executors.reshard import engine_shard, engine_state, engine_unshard
from executors.runplan import EngineGroup
from executors.syncgroup import GroupSender, GroupSpec, Manifest, manifest_digest

SIZES = (0, 4096)  # unbucketed, and buckets far smaller than the model (tiny-llama: ~0.2 MB)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


def _moved(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """The version-0 weights moved by seeded noise: what a trainer holds after a step (an
    engine that kept its own version-0 weights would not match it)."""
    g = torch.Generator().manual_seed(seed)
    return {k: v.detach() + torch.randn(v.shape, generator=g) for k, v in
            load_policy(str(model_dir)).state_dict().items()}


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_the_gather_inverts_every_tp_cut(kind: str) -> None:
    """`engine_unshard` of every rank's `engine_shard` is the tensor, dense and MoE (fused
    gate/up experts), KV heads cut or replicated."""
    import transformers as tf

    from executors.checkpoints import CONFIGS
    cfg = CONFIGS[kind]()
    torch.manual_seed(0)
    full = tf.AutoModelForCausalLM.from_config(cfg).state_dict()
    kv = cfg.num_key_value_heads
    for tp in (1, 2, 2 * kv):  # 2 kv: each KV head on two ranks
        shards = [engine_state(full, tp, r, kv) for r in range(tp)]
        for k, v in full.items():
            assert torch.equal(engine_unshard(k, [s[k] for s in shards], kv), v), (tp, k)


class _Sender(GroupSender):
    """A trainer's sending side alone: its stage's tensors, each "gathered" (copied, and the
    name recorded) as a sharded trainer gathers it, when a bucket first needs it."""

    def __init__(self, state: dict[str, torch.Tensor], kv_heads: int) -> None:
        self.state, self.kv = state, kv_heads
        self.gathered: list[str] = []
        self.sources: list[Gathered] = []

    def _sync_state(self, bucket_bytes: int) -> dict[str, torch.Tensor]:
        return self.state

    def _sync_source(self, bucket_bytes: int) -> Gathered:
        def whole(name: str, t: torch.Tensor) -> torch.Tensor:
            self.gathered.append(name)
            return t.clone()
        self.sources.append(Gathered(self.state, whole))
        return self.sources[-1]

    def _kv_heads(self) -> int | None:
        return self.kv


def _together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls in threads at once (as Ray runs each member's call in its own process)."""
    out: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return out


@pytest.mark.parametrize("send_shards", [False, True], ids=["engine-cuts", "sender-cuts"])
def test_two_stage_senders_reach_two_tp2_engines_exactly(send_shards: bool, model_dir: Path
                                                         ) -> None:
    """Two senders (the two halves of the model, as two pipeline stages stream them) and two
    engines of tp 2 in one group; every engine TP rank ends with its exact cut of every tensor,
    and the forward's gathered model is the senders' weights; a second refresh reuses the
    group, unbucketed."""
    want = _moved(model_dir, 7)
    names = list(want)
    stages = [{k: want[k] for k in names[:len(names) // 2]},
              {k: want[k] for k in names[len(names) // 2:]}]
    senders = [_Sender(s, ARCH.kv_heads) for s in stages]
    cfg = config(model_dir, engines=EngineGroup(tp=2))
    engines = [Rollout(cfg, r) for r in range(2)]
    addr, port = senders[0].sync_host()
    spec = GroupSpec("g1", 0, addr, port, 2, (2, 2), "gloo", send_shards, timeout_s=30)
    _together([lambda i=i, s=s: s.sync_join(spec, i) for i, s in enumerate(senders)]
              + [lambda j=j, e=e: e.sync_join(spec, j) for j, e in enumerate(engines)])
    kept: dict[int, list[list[Manifest]]] = {}
    # each size twice: first cut by `sync_prepare`, then (the driver keeping the manifests)
    # cut and sent in one call that checks them by digest
    for version, size in enumerate([s for s in SIZES for _ in range(2)], start=1):
        if size in kept:
            per = kept[size]
            sends = [lambda s=s, i=i, ms=ms, n=size: s.sync_send("g1", n, i, manifest_digest(ms))
                     for i, (s, ms) in enumerate(zip(senders, per))]
        else:
            per = kept[size] = [s.sync_prepare("g1", size, i) for i, s in enumerate(senders)]
            sends = [lambda s=s: s.sync_send("g1") for s in senders]
        manifests: list[Manifest] = [m for ms in per for m in ms]
        assert len(manifests) == (4 if send_shards else 2)  # a channel per sender (and TP rank)
        outs = _together(sends + [lambda e=e, m=manifests, v=version: e.sync_receive("g1", m, v)
                                  for e in engines])
        for s in senders:  # each tensor made whole once, in order, whatever the channels;
            assert s.gathered == list(s.state)  # never the whole stage held at once
            stage = sum(v.numel() * v.element_size() for v in s.state.values())
            big = max(v.numel() * v.element_size() for v in s.state.values())
            assert s.sources[-1].peak <= max(size * (2 if send_shards else 1) + 2 * big, big)
            assert s.sources[-1].peak < stage and not s.sources[-1].held, (size, stage)
            s.gathered = []
        for e, got in zip(engines, outs[2:]):
            assert got["done"] and e.version == version
            for r, shard in enumerate(e.engine_shards()):
                bad = [k for k in want if not torch.equal(
                    shard[k], engine_shard(k, want[k], 2, r, ARCH.kv_heads))]
                assert not bad, (size, r, bad)
            assert all(torch.equal(v, want[k]) for k, v in e.model.state_dict().items())
        full = sum(v.numel() * v.element_size() for v in want.values())
        # a rank takes the full weights when it cuts them, its own slice (< full) when sent cut
        assert (outs[2]["bytes"] < full) if send_shards else (outs[2]["bytes"] == full)
        want = {k: v + 1.0 for k, v in want.items()}
        for s, st in zip(senders, stages):
            s.state = {k: want[k] for k in st}


def test_a_send_whose_stream_no_longer_matches_its_kept_manifests_is_refused(
        model_dir: Path) -> None:
    """A one-call send checks its cut against the digest of the manifests the driver kept
    (which the receivers were handed): another stream is refused before a byte moves, and the
    sender's gathers still run to the end (a sharded trainer's ranks stay paired)."""
    state = _moved(model_dir, 3)
    sender = _Sender(state, ARCH.kv_heads)
    addr, port = sender.sync_host()
    spec = GroupSpec("g2", 0, addr, port, 1, (1,), "gloo", timeout_s=30)
    engine = Rollout(config(model_dir))
    _together([lambda: sender.sync_join(spec, 0), lambda: engine.sync_join(spec, 0)])
    kept = sender.sync_prepare("g2", 4096, 0)
    sender._sync_sending = None  # the driver kept the manifests; this refresh never ran
    sender.state = {k: v for k, v in list(state.items())[:-1]}  # one tensor fewer now
    with pytest.raises(RuntimeError, match="no longer matches the manifests"):
        sender.sync_send("g2", 4096, 0, manifest_digest(kept))
    assert sender.gathered == list(state)[:-1] and not sender.sources[-1].held


def test_an_engine_of_another_tp_is_refused(model_dir: Path) -> None:
    engine = Rollout(config(model_dir, engines=EngineGroup(tp=2)))
    spec = GroupSpec("g", 0, "127.0.0.1", 1, 1, (1,), "gloo")
    with pytest.raises(RuntimeError, match="engine 0 runs tp 2, the group expects 1"):
        engine.sync_join(spec, 0)


# ----------------------------------------------------------------------------- on Ray
class _RayMember:
    def __init__(self, role: str, rank: int, handle: Any) -> None:
        self.role, self.rank, self.handle = role, rank, handle


class _RayCalls:
    """The runtime's `call`/`results` over plain Ray actors (no run plan needed)."""

    kind = "ray-actors"
    concurrent = True

    def call(self, m: _RayMember, method: str, *args: object) -> Any:
        return getattr(m.handle, method).remote(*args)

    def results(self, handles: list[Any]) -> list[Any]:
        import ray  # lazy: only this test loads Ray

        from executors.runtime import Outcome
        out = []
        for h in handles:
            try:
                out.append(Outcome(True, ray.get(h)))
            except Exception as e:  # noqa: BLE001 - the outcome carries it
                out.append(Outcome(False, error=str(e)))
        return out


@pytest.mark.slow  # ~2 min on 2 cores: five actors load torch; the in-process tests cover the group
@pytest.mark.ray
def test_a_dp2_tp2_trainer_refreshes_a_tp2_torch_engine_over_gloo(tmp_path: Path) -> None:
    """Four `Trainer` actors (dp 2 x tp 2, their own gloo group) and a tp 2 torch engine actor:
    one refresh through the weight-sync group. The engine's TP shards are exactly the trainer's
    gathered weights cut for tp 2, and the control messages, all Ray carried for the refresh,
    are a few kB against megabytes of weights."""
    import ray

    from executors import ray_private
    from executors.runplan import Layout
    from executors.trainer import Trainer
    from executors.weights import GroupRefresh
    arch = ARCH.model_copy(update={"hidden": 256, "mlp": 512})  # ~4 MB of weights
    model_dir = save_model_dir(build_policy(arch, 5), arch, tmp_path / "v0")
    cfg = config(model_dir, trainer=Layout(dp=2, tp=2), engines=EngineGroup(tp=2))
    cfg = type(cfg)(**{**cfg.__dict__, "arch": arch.model_dump()})
    if ray.is_initialized():  # another test's run left its cluster
        ray.shutdown()
    ray_private.loopback_only()
    ray.init(num_cpus=5, include_dashboard=False, **ray_private.loopback_init_args())
    try:
        trainers = [ray.remote(Trainer).options(num_cpus=1).remote(cfg, r, 4) for r in range(4)]
        engine = ray.remote(Rollout).options(num_cpus=1).remote(cfg, 0)
        addr = ray.get(trainers[0].rendezvous.remote())
        assert all(ray.get([t.init_group.remote(*addr) for t in trainers]))
        zeros = {k: torch.zeros_like(v) for k, v in load_policy(str(model_dir)).state_dict().items()}
        ray.get(engine.load_weights.remote(zeros, 0))  # the engine starts far from the trainer
        rt = _RayCalls()
        actors = [_RayMember("actor", r, t) for r, t in enumerate(trainers)]
        target = _RayMember("rollout", 0, engine)
        group = GroupRefresh(rt)  # type: ignore[arg-type]
        spec = group.group(0, actors[:1], [target])
        assert spec.tps == (2,)
        before, trips = group.control_bytes, group.round_trips
        # the ranks that send nothing take part in the sender's gathers (no rank holds the
        # full weights between steps)
        [(err, got)] = group.refresh(spec, actors[:1], [target], 1, 64_000, actors)
        assert err is None and got["backend"] == "gloo"
        want = ray.get([t.weights.remote() for t in trainers])[0]  # a collective: rank 0's
        shards = ray.get(engine.engine_shards.remote())
        assert ray.get(engine.current_version.remote()) == 1
        for r in range(2):
            bad = [k for k in want if not torch.equal(
                shards[r][k], engine_shard(k, want[k], 2, r, arch.kv_heads))]
            assert not bad and len(shards[r]) == len(want), (r, bad)
        nbytes = sum(v.numel() * v.element_size() for v in want.values())
        assert got["bytes"] == nbytes > 4_000_000
        assert got["control_bytes"] == group.control_bytes - before < 32_000
        # the group's next refresh: the driver hands the engine the manifests it kept and each
        # sender cuts and sends in the same call (one round trip, where the first took two)
        assert group.round_trips - trips == 2
        ray.get(engine.load_weights.remote(zeros, 0))
        trips = group.round_trips
        [(err, again)] = group.refresh(spec, actors[:1], [target], 2, 64_000, actors)
        assert err is None and group.round_trips - trips == 1
        assert ray.get(engine.current_version.remote()) == 2
        shards = ray.get(engine.engine_shards.remote())
        for r in range(2):
            bad = [k for k in want if not torch.equal(
                shards[r][k], engine_shard(k, want[k], 2, r, arch.kv_heads))]
            assert not bad and len(shards[r]) == len(want), (r, bad)
        assert again["bytes"] == nbytes and again["control_bytes"] < got["control_bytes"]
    finally:
        ray.shutdown()
