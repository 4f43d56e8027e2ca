"""The colocated hand-over (`executors.ipc`, `executors.weights.GroupRefresh.handover`): an
engine that shares its slot with the trainer takes every bucket as shared memory, not over the
group. The driver's own code runs the refresh; the engines live in processes of their own, made
unrelated to this one (a fresh authentication key, as Ray's workers have), so a handle that
needed the default `file_descriptor` sharing would fail there.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from gloo_world import SPAWN
from test_exec_sharding import ARCH, batch, config
from test_exec_syncgroup import _moved, _Sender

from executors import ipc
from executors.model import build_policy, save_model_dir
from executors.modelroles import Rollout
from executors.placement import Member
from executors.reshard import Stream, engine_shard
from executors.roles import RunConfig
from executors.runplan import EngineGroup
from executors.runtime import Outcome
from executors.sharding import full_state
from executors.syncgroup import BUCKETS, IPC, PROTOCOLS
from executors.training import partition
from executors.weights import GroupRefresh, path_key


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() * v.element_size() for v in state.values())


def test_the_plan_chooses_the_protocol(model_dir: Path) -> None:
    """A torch engine colocated with the trainer (the plan's `EngineGroup.colocated`) names the
    hand-over; one in a slot of its own, the group's buckets; the registry says which forms a
    group."""
    on = Rollout(config(model_dir, engines=EngineGroup(tp=2, colocated=True)))
    off = Rollout(config(model_dir, engines=EngineGroup(tp=2)))
    assert on.sync_member()[::3] == ("cpu", IPC) and off.sync_member()[::3] == ("cpu", BUCKETS)
    assert not PROTOCOLS[IPC].forms_group and PROTOCOLS[BUCKETS].forms_group


def test_the_rank_beside_each_engine_hands_it_over() -> None:
    """Per stream and engine TP rank: the trainer rank on that TP rank's device when every rank
    holds the whole model (a TP rank with none beside it: the first beside any); the streaming
    ranks (pipeline stage leaders) to every TP rank otherwise, or when no rank shares the
    engine's devices."""
    assert ipc.handover_senders([[2, 3]], [0], True) == [[2]]
    assert ipc.handover_senders([[2], [3]], [0], True) == [[2, 3]]  # tp 2: each its own rank
    assert ipc.handover_senders([[3], []], [0], True) == [[3, 3]]
    assert ipc.handover_senders([[2], [3]], [0, 4], False) == [[0, 0], [4, 4]]
    assert ipc.handover_senders([[], []], [0], True) == [[0, 0]]


def test_each_member_sits_on_its_share_of_its_bundle() -> None:
    """Two trainer ranks and two engine replicas in one two-device bundle (a node's): rank r
    and replica r are on device r; a tp 2 replica takes both devices, its first the rank 0's."""
    from executors.placement import device_of

    def m(role: str, rank: int) -> Member:
        return Member(role, rank, "train", SimpleNamespace(index=0, devices=[4, 5]), 0)
    actors, engines = [m("actor", 0), m("actor", 1)], [m("rollout", 0), m("rollout", 1)]
    assert [device_of(a, actors) for a in actors] == [(0, 4), (0, 5)]
    assert [device_of(e, engines) for e in engines] == [(0, 4), (0, 5)]
    assert device_of(engines[0], engines[:1]) == (0, 4)  # one tp 2 replica: devices 4 and 5


def test_an_unconsumed_handle_is_reclaimed() -> None:
    """A bucket whose receiver never mapped it (it died) is released by the sender: no
    segment of this process outlives the hand-over."""
    before = set(ipc.segments(os.getpid()))
    ho = ipc.HandOver("r", Stream({"w": torch.arange(4000.0)}, 4096), torch.device("cpu"))
    handles = ho.export(0, 2).handles
    assert set(ipc.segments(os.getpid())) - before  # the bucket lives in shared memory
    big = ipc.export(torch.zeros(1 << 22, dtype=torch.uint8))  # 4 MB: a handle as small
    assert len(handles[0]) < 512 and abs(len(big) - len(handles[0])) < 16
    ipc.rebuild(big)  # consumed: its segment goes with the tensor
    assert torch.equal(ipc.rebuild(handles[0])[:8], ho.stream.bucket(0).data[:8])
    ho.acked(0, {ho.ident: [0]})  # one receiver took it; the other never came
    assert ho.reclaim() == 1 and not ho.live
    assert set(ipc.segments(os.getpid())) == before


# ----------------------------------------------------------- engines in unrelated processes
def _serve(conn: Any, cfg: RunConfig) -> None:
    """A colocated torch engine in its own process, answering calls (pickled by value)."""
    mp.current_process().authkey = os.urandom(32)  # unrelated to the driver's process
    engine = Rollout(cfg, 0)
    while True:
        msg = pickle.loads(conn.recv_bytes())
        if msg is None:
            return
        name, args = msg
        try:
            conn.send_bytes(pickle.dumps((True, getattr(engine, name)(*args))))
        except Exception as e:  # noqa: BLE001 - the caller's outcome carries it
            conn.send_bytes(pickle.dumps((False, f"{type(e).__name__}: {e}")))


class _Remote:
    """A member's worker in another process: each method call goes over a pipe."""

    def __init__(self, cfg: RunConfig) -> None:
        self.conn, child = SPAWN.Pipe()
        self.proc = SPAWN.Process(target=_serve, args=(child, cfg))
        self.proc.start()

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self.conn.send_bytes(pickle.dumps((name, args)))
            ok, value = pickle.loads(self.conn.recv_bytes())
            if not ok:
                raise RuntimeError(value)
            return value
        return call

    def close(self) -> None:
        self.conn.send_bytes(pickle.dumps(None))
        self.proc.join(timeout=60)


class _InOrder:
    """The runtime's `call`/`results` as calls that run when made (an argument that is an
    earlier call's outcome is its value): the order the driver issues them is one a
    concurrent runtime may run them in."""

    kind = "in-order"
    concurrent = True

    def call(self, m: Member, method: str, *args: object) -> Outcome:
        args = tuple(a.value if isinstance(a, Outcome) else a for a in args)
        try:
            return Outcome(True, getattr(m.handle, method)(*args))
        except Exception as e:  # noqa: BLE001 - the outcome carries it
            return Outcome(False, error=f"{type(e).__name__}: {e}")

    def results(self, handles: list[Outcome]) -> list[Outcome]:
        return list(handles)


class _Beside(_Sender):
    """A trainer rank that can build any bucket of the whole model, as every rank can under a
    colocated engine (it gathers each bucket at export)."""

    def _whole_everywhere(self) -> bool:
        return True


def _member(role: str, rank: int, bundle: int, handle: Any) -> Member:
    return Member(role, rank, "train", SimpleNamespace(index=bundle, pool="gpu", node=0,
                                                       devices=[bundle]), bundle, handle=handle)


@pytest.mark.parametrize("size", [4096, 0], ids=["buckets", "per-tensor"])
def test_colocated_engines_take_the_trainers_weights_as_shared_memory(model_dir: Path,
                                                                      size: int) -> None:
    """Two trainer ranks and two colocated tp 2 torch engines, one per bundle, each engine in a
    process of its own: each engine is handed the refresh by the rank beside it, ends with
    exactly the trainer's weights (every TP rank's cut), Ray's share is the handles, bucket
    heads and acknowledgements alone (a bounded size per bucket, no weight bytes), every
    bucket was acknowledged, and no shared-memory segment is left by either side."""
    want = _moved(model_dir, 11)
    cfg = config(model_dir, engines=EngineGroup(tp=2, colocated=True))
    engines = [_Remote(cfg), _Remote(cfg)]
    try:
        actors = [_member("actor", r, r, _Beside(dict(want), ARCH.kv_heads)) for r in range(2)]
        targets = [_member("rollout", j, j, e) for j, e in enumerate(engines)]
        pids = [os.getpid()] + [e.proc.pid for e in engines]
        before = {p: set(ipc.segments(p)) for p in pids}
        drive = GroupRefresh(_InOrder())  # type: ignore[arg-type]
        outs = drive.run(path_key(size, True), actors, actors[:1], targets, 1, size)
        for j, (err, got) in enumerate(outs):
            assert err is None, err
            assert got["src"] == f"actor{j}" and got["backend"] == "shm"
            assert got["bytes"] == _nbytes(want)
        for e in engines:
            assert e.current_version() == 1
            for r, shard in enumerate(e.engine_shards()):
                bad = [k for k in want if not torch.equal(
                    shard[k], engine_shard(k, want[k], 2, r, ARCH.kv_heads))]
                assert not bad, (r, bad)
        # per bucket and engine: its head, its handles and the acknowledgement, under 2 kB
        # whatever the bucket's size (a plan's buckets are hundreds of MB)
        calls = sum(got["calls"] for _, got in outs)
        assert 0 < drive.control_bytes < 2048 * calls
        assert drive.reclaimed == 0  # every bucket acknowledged by every TP rank
        assert {p: set(ipc.segments(p)) for p in pids} == before
    finally:
        for e in engines:
            e.close()


def test_each_tp_rank_takes_its_handle_from_the_trainer_rank_on_its_device(
        model_dir: Path) -> None:
    """One tp 2 engine on a two-device bundle with a trainer rank on each device (each can
    build every bucket): TP rank t maps the handle trainer rank t exported, as NeMo-RL's and
    verl's colocated refresh hands each vLLM worker the stream of the policy rank on its GPU;
    each sender frees its buckets on the engine's acknowledgement of its own handles, and the
    engine ends with exactly the trainer's weights in every TP rank's cut."""
    want = _moved(model_dir, 13)
    cfg = config(model_dir, engines=EngineGroup(tp=2, colocated=True))
    engine = _Remote(cfg)

    def member(role: str, rank: int, handle: Any) -> Member:
        bundle: Any = SimpleNamespace(index=0, pool="gpu", node=0, devices=[6, 7])
        return Member(role, rank, "train", bundle, 0, handle=handle)
    try:
        actors = [member("actor", r, _Beside(dict(want), ARCH.kv_heads)) for r in range(2)]
        target = member("rollout", 0, engine)
        drive = GroupRefresh(_InOrder())  # type: ignore[arg-type]
        [(err, got)] = drive.run(path_key(4096, True), actors, actors[:1], [target], 1, 4096)
        assert err is None, err
        assert got["src"] == "actor0,actor1" and got["senders"] == 1
        assert got["bytes"] == _nbytes(want) and drive.reclaimed == 0
        for r, shard in enumerate(engine.engine_shards()):
            bad = [k for k in want if not torch.equal(
                shard[k], engine_shard(k, want[k], 2, r, ARCH.kv_heads))]
            assert not bad, (r, bad)
        assert all(a.handle._handover is None for a in actors)  # released
    finally:
        engine.close()


def test_a_receiver_takes_every_handle_of_its_tp_ranks(model_dir: Path) -> None:
    """The acknowledgement names the handles the engine consumed (one per TP rank), which is
    what lets the sender free a bucket while the refresh goes on."""
    state = {"w": torch.arange(3000.0)}
    ho = ipc.HandOver("r", Stream(state, 4096), torch.device("cpu"))
    engine = Rollout(config(model_dir, engines=EngineGroup(tp=2, colocated=True)))
    engine._own = {"w": torch.zeros(3000)}  # a one-tensor engine: what the stream carries
    engine._shards = [{"w": torch.zeros(3000)} for _ in range(2)]
    acks = []
    for k in range(ho.stream.count):
        ex = ho.export(k, 4)  # two engines of tp 2: this one is the second
        acks.append(engine.handover_receive(ho.stream.head(k), 5, 1, "r", [(0, 2), (0, 3)], ex))
        ho.acked(k, acks[-1]["receivers"])
        assert set(ho.live) == set(range(k + 1))  # the first engine's handles still out
    assert [a["receivers"] for a in acks] == [{ho.ident: [2, 3]}] * ho.stream.count
    assert acks[-1]["done"] and engine.version == 5
    assert torch.equal(engine._shards[1]["w"], state["w"])  # 1-D: every rank holds it whole
    assert ho.reclaim() == ho.stream.count


def _held_bytes(tr: Any) -> tuple[int, int, int]:
    """(bytes of the tensors this rank holds outside its model and optimizer: any copy of the
    weights it kept, of its parameters' local shards, of the whole model's parameters)."""
    from torch.distributed.tensor import DTensor
    local = sum(p.to_local().nbytes if isinstance(p, DTensor) else p.nbytes
                for p in tr.model.parameters())
    whole = sum(p.numel() * p.element_size() for p in tr.model.parameters())

    def walk(x: Any) -> int:
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, dict):
            return sum(walk(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return sum(walk(v) for v in x)
        return 0
    kept = sum(walk(v) for k, v in vars(tr).items() if k not in ("model", "opt", "pipe"))
    return kept, local, whole


def _step_then_hand_over(rank: int, tr: Any, cfg: RunConfig, size: int, q_out: Any) -> None:
    """One training step, what the rank holds, then a hand-over on which every rank exports
    (each beside an engine): the buckets it exported, against the gathered full weights', and
    the most bytes of whole tensors it held at once while exporting."""
    s, adv = batch(1)
    tr.train(partition(s, adv, None, cfg.trainer, cfg.mini_batches, cfg.accumulate)[rank])
    held = _held_bytes(tr)
    gathers = tr.handover_gathers()
    lay = tr.handover_prepare("r", size, 0, "cpu").layout()
    got, acks = [], []
    for k in range(lay.count):  # the engine takes each bucket; its ack rides the next export
        got.append(ipc.rebuild(tr.handover_export("r", k, 1, *acks).handles[0]).clone())
        acks = [{"bucket": k, "receivers": {0: [0]}}]
    peak = tr._handover.stream.source.peak
    left = tr.handover_release("r", *acks)
    want = Stream(full_state(tr.model), size)  # a collective: every rank gathers
    same = lay.count == want.count and all(torch.equal(g, want.bucket(k).data)
                                           for k, g in enumerate(got))
    big = max(e.nbytes for e in want.entries)
    q_out.put((rank, held, gathers, same, left, lay.count, peak, big))


def test_no_rank_keeps_the_full_weights_between_steps(model_dir: Path) -> None:
    """dp 2 trainer under a colocated engine, after a step: every rank holds its parameters'
    shard and nothing more (no full copy on rank 0 either); each bucket a rank hands over is
    gathered from the shards as it is exported, every rank taking part, equals the full
    weights' bucket byte for byte, and while exporting a rank holds at most the whole tensors
    one bucket overlaps."""
    from gloo_world import run_world

    from executors.sharding import Layout
    cfg = config(model_dir, engines=EngineGroup(tp=2, colocated=True), trainer=Layout(2, 1, 1))
    q_out = SPAWN.Queue()
    run_world(_step_then_hand_over, cfg, cfg, 4096, q_out)
    out = sorted((q_out.get(timeout=5) for _ in range(2)), key=lambda x: x[0])
    for rank, (kept, local, whole), gathers, same, left, count, peak, big in out:
        assert gathers and same and left == 0 and count > 1, rank
        assert local < whole  # FSDP's shard: about half
        assert kept == 0, (rank, kept, local, whole)
        assert 0 < peak <= 4096 + 2 * big and peak < whole, (rank, peak, big, whole)


@pytest.mark.slow  # a whole run on Ray (~2 min on 2 cores); the tests above run the protocol fast
@pytest.mark.ray
def test_a_colocated_run_on_ray_hands_each_engine_its_weights(tmp_path: Path) -> None:
    """Two steps of the whole loop on Ray, the rollout planned in the actor's slot (dp 2 each):
    every refresh is a hand-over (no group), each engine's from the trainer rank in its bundle,
    the whole model in 64 kB buckets, and what Ray carried is a bounded size per bucket."""
    from exec_util import GRPO_LAYOUT, hand_plan  # lazy: the plan helpers load the planner

    from executors.model import load_policy
    from executors.precision import wire_state
    from executors.run import execute
    from placer.cost.calibration import calibration_from_dict
    from placer.cost.sharding import Parallel
    plan = hand_plan({**GRPO_LAYOUT, "rollout": ("gpu", Parallel(dp=2), "train")})
    plan = plan.model_copy(update={"calibration": calibration_from_dict(
        {"default": {"sync_bucket_gb": 64e-6}})})
    r = execute(plan, 2, tmp_path / "out")
    assert r.ledger_ok and [s.versions for s in r.stats][-1] == [1]
    syncs = [e for e in r.trace.events if e.name == "weight sync"]
    assert syncs and all(e.args["backend"] == "shm" for e in syncs)
    # a planned job trains in BF16, so its refresh carries BF16 (`executors.precision`)
    total = _nbytes(wire_state(load_policy(str(tmp_path / "out" / "model-v0")).state_dict(),
                               torch.bfloat16))
    assert all(e.args["bytes"] == total and e.args["calls"] > 1 for e in syncs)
    assert {e.args["src"] for e in syncs} == {"actor0", "actor1"}  # the rank beside each
    assert all(e.args["control_bytes"] < 2048 * 2 * e.args["calls"] for e in syncs)
    # the driver's waits: the first refresh asks the senders' plan and manifests, the next one
    # only the survey, the buckets (their preparation issued with them) and the release
    trips = [e.args["round_trips"] for e in r.trace.events if e.cat == "stage"
             and e.name == "sync" and e.args.get("round_trips") is not None]
    assert trips[-1] == 3 and trips[0] > trips[-1], trips


def test_no_executor_code_compares_a_protocols_name() -> None:
    """The protocol an engine names is looked up in `syncgroup.PROTOCOLS` and asked what to do
    (`forms_group`, `form`, `send`, `calls`); no module compares a protocol's name."""
    import ast

    names = set(PROTOCOLS) | {"BUCKETS", "PER_TENSOR", "IPC"}
    found = []
    for f in sorted((Path(__file__).resolve().parents[1] / "executors").glob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Compare):
                parts = [n.left, *n.comparators]
                if any(isinstance(p, ast.Constant) and p.value in names
                       or isinstance(p, ast.Name) and p.id in names for p in parts):
                    found.append(f"{f.name}:{n.lineno}")
    assert found == []
