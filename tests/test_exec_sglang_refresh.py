"""The sglang backend's weight refreshes and generation on a fake engine (no GPU): a refresh
is one weight-update session of in-place updates; a colocated engine is handed shared memory
in one session (on GPUs each TP rank's whole tensors, opened by SGLang's own
`_unwrap_tensor`); a group refresh reaches SGLang 0.5.23's own receiving code (run from the
installed package's source) in one session; a re-formed group destroys the path's old one; a
whole one-process run syncs through the engine. Engine settings, output parsing and the API
contract: tests/test_exec_sglang_config.py."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from exec_util import GRPO_LAYOUT, hand_plan

# the contract's output builder and its fixture: SGLang's installed source, at its pinned version
from test_exec_sglang_config import _out, sglang_root  # noqa: F401

from executors import sglang_rollout as sr
from executors.model import build_policy, save_model_dir
from executors.reshard import Stream
from executors.roles import run_config
from executors.run import execute
from executors.runplan import resolve_plan
from executors.syncgroup import PER_TENSOR


# ------------------------------------------------------------------- a rollout on a fake engine
class FakeEngine:
    """Records every call the backend makes; answers as SGLang's Engine does."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.calls = kwargs, []
        self.loaded: dict[str, torch.Tensor] = {}
        self.open = False

    def begin_weight_update(self) -> tuple[bool, str]:
        self.calls.append(("begin_weight_update", {}))
        ok, self.open = not self.open, True
        return ok, "Success" if ok else "a weight-update session is already open"

    def end_weight_update(self) -> tuple[bool, str]:
        self.calls.append(("end_weight_update", {}))
        ok, self.open = self.open, False
        return ok, "Success" if ok else "no weight-update session is open"

    def update_weights_from_tensor(self, **kw: Any) -> tuple[bool, str]:
        self.calls.append(("update_weights_from_tensor", kw))
        if not self.open:
            return False, "update_weights_from_tensor must run between begin and end"
        self.loaded.update({n: t.clone() for n, t in kw["named_tensors"]})
        return True, "Success"

    def init_weights_update_group(self, **kw: Any) -> tuple[bool, str]:
        self.calls.append(("init_weights_update_group", kw))
        return True, "Succeeded to initialize custom process group."

    def destroy_weights_update_group(self, **kw: Any) -> tuple[bool, str]:
        self.calls.append(("destroy_weights_update_group", kw))
        return True, "Succeeded to destroy custom process group."

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append(("release_memory_occupation", {}))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append(("resume_memory_occupation", {}))

    def flush_cache(self) -> Any:
        self.calls.append(("flush_cache", {}))
        return type("FlushCacheReqOutput", (), {"success": True, "message": ""})()

    def generate(self, **kw: Any) -> list[dict[str, Any]]:
        self.calls.append(("generate", kw))
        out = []
        for ids, sp in zip(kw["input_ids"], kw["sampling_params"]):
            toks = [(ids[-1] + k) % 60 + 3 for k in range(sp["max_new_tokens"])]
            out.append(_out(toks, [-0.1 * (k + 1) for k in range(len(toks))]))
        return out


@pytest.fixture
def rollout(tmp_path, monkeypatch):
    run = resolve_plan(hand_plan(GRPO_LAYOUT))
    arch = run.job.policy
    model = build_policy(arch, 0)
    save_model_dir(model, arch, tmp_path / "m")
    monkeypatch.setattr(sr, "start_engine", lambda kw: FakeEngine(**kw))
    cfg = run_config(run, model_dir=str(tmp_path / "m"))
    return sr.SglangRollout(cfg, 0), model.state_dict(), cfg


def test_a_refresh_is_one_session_of_in_place_updates(rollout) -> None:
    r, state, cfg = rollout
    eng = r.engine
    assert eng.kwargs == sr.engine_kwargs(cfg, 0)
    stream = Stream(state, bucket_bytes=40_000)  # several buckets, tensors straddling them
    assert stream.count > 2
    outs = [r.receive_bucket(stream.bucket(k), 3, 1, "v3.1") for k in range(stream.count)]
    assert [o["done"] for o in outs] == [False] * (stream.count - 1) + [True]
    assert sum(o["bytes"] for o in outs) == stream.nbytes and all(o["dur"] >= 0 for o in outs)
    names = [c[0] for c in eng.calls]
    assert names[0] == "begin_weight_update" and names[-2:] == ["end_weight_update", "flush_cache"]
    assert names.count("begin_weight_update") == 1 and names.count("flush_cache") == 1
    updates = [kw for n, kw in eng.calls if n == "update_weights_from_tensor"]
    assert all(kw["flush_cache"] is False and kw["load_format"] is None for kw in updates)
    assert set(eng.loaded) == set(state)  # whole tensors: each TP rank's loader cuts its shard
    assert all(torch.equal(eng.loaded[k], v) for k, v in state.items())
    assert r.current_version() == 3
    # A refresh broken off (its sender died) leaves a session open: the next one closes it.
    r.receive_bucket(stream.bucket(0), 4, 1, "v4.1")
    assert eng.open and r.current_version() == 3
    eng.calls.clear()
    for k in range(stream.count):
        r.receive_bucket(stream.bucket(k), 4, 1, "v4.2")
    assert [c[0] for c in eng.calls[:2]] == ["end_weight_update", "begin_weight_update"]
    assert not eng.open and r.current_version() == 4


def test_a_colocated_engine_is_handed_shared_memory_in_one_session(rollout, monkeypatch) -> None:
    """Colocated, the engine names the hand-over: each bucket is mapped in this process (one
    handle per TP rank, each consumed, so the sender frees it at once) and the tensors it
    completes go to `update_weights_from_tensor` inside one weight-update session; the cache
    is flushed once. The calls are the contract's (`test_every_name_the_backend_hands_sglang_
    exists`)."""
    from dataclasses import replace

    from executors import ipc
    from executors.syncgroup import IPC
    r, state, cfg = rollout
    r.cfg = replace(cfg, engines=replace(cfg.engines, colocated=True))
    monkeypatch.setattr(sr, "on_gpu", lambda: False)  # the CPU's path, on any machine
    assert r.sync_member() == ("cpu", cfg.engines.tp, os.getpid(), IPC)
    ho = ipc.HandOver("h", Stream(state, 40_000), torch.device("cpu"))
    picks = [(0, t) for t in range(cfg.engines.tp)]
    for k in range(ho.stream.count):
        ack = r.handover_receive(ho.stream.head(k), 3, 1, "h", picks, ho.export(k, len(picks)))
        ho.acked(k, ack["receivers"])
        assert not ho.live
    names = [c[0] for c in r.engine.calls]
    assert names[0] == "begin_weight_update" and names[-2:] == ["end_weight_update", "flush_cache"]
    assert set(names) == {"begin_weight_update", "update_weights_from_tensor",
                          "end_weight_update", "flush_cache"}
    assert all(torch.equal(r.engine.loaded[k], v) for k, v in state.items())
    assert ack["done"] and r.current_version() == 3


def sglang_defs(root: Path, defs: list[tuple[str, str]]) -> dict[str, Any]:
    """Top-level classes and functions of SGLang's own source (`defs`: (file under srt/, name)),
    executed in one namespace: sglang itself cannot be imported here (its CUDA dependencies)."""
    import io
    import pickle
    import textwrap
    from dataclasses import dataclass
    ns: dict[str, Any] = {"torch": torch, "io": io, "pickle": pickle, "dataclass": dataclass,
                          "List": list, "ForkingPickler": __import__(
                              "multiprocessing.reduction").reduction.ForkingPickler}
    for path, name in defs:
        text = (root / "srt" / path).read_text()
        node = next(n for n in ast.parse(text).body
                    if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name)
        exec(textwrap.dedent(ast.get_source_segment(text, node, padded=False) or ""), ns)
        if isinstance(node, ast.ClassDef) and node.decorator_list:  # @dataclass
            ns[name] = dataclass(ns[name])
    return ns


SGLANG_TENSOR_DEFS = [
    ("utils/common.py", "_safe_load_torch_storage"), ("utils/common.py", "SafeUnpickler"),
    ("utils/common.py", "MultiprocessingSerializer"),
    ("model_executor/model_runner_components/weight_updater.py", "LocalSerializedTensor"),
    ("model_executor/model_runner_components/weight_updater.py", "_unwrap_tensor")]


class TensorEngine(FakeEngine):
    """`FakeEngine` whose `update_weights_from_tensor` does what each SGLang TP rank does with
    its payload (`_unwrap_tensor`: a `LocalSerializedTensor` deserialized for its own rank by
    `MultiprocessingSerializer`, SGLang's `SafeUnpickler` allowing only its listed globals),
    from SGLang's own source; each TP rank's weights kept apart."""

    def __init__(self, ns: dict[str, Any], tp: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ns = ns
        self.ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]

    def update_weights_from_tensor(self, **kw: Any) -> tuple[bool, str]:
        self.calls.append(("update_weights_from_tensor", kw))
        if not self.open:
            return False, "update_weights_from_tensor must run between begin and end"
        for t, mine in enumerate(self.ranks):
            mine.update({n: self.ns["_unwrap_tensor"](v, tp_rank=t, device="cpu").clone()
                         for n, v in kw["named_tensors"]})
        return True, "Success"


def test_on_gpus_a_colocated_engine_hands_sglang_each_ranks_tensors_unopened(
        rollout, sglang_root, monkeypatch) -> None:  # noqa: F811 - the imported fixture
    """On GPUs a colocated engine names the whole-tensor hand-over (`IPC_TENSORS`): each bucket
    comes as the tensors it completes, one handle per tensor and TP rank from the trainer rank
    on that rank's device (here two senders whose bytes differ), and goes unopened to
    `update_weights_from_tensor` as SGLang's per-rank payloads (`LocalSerializedTensor`), one
    session, one flush. SGLang's own deserialization (its source) opens each rank's handle:
    every TP rank ends with exactly its own sender's tensors, and every handle was consumed.
    Run on the CPU (handles to shared memory): on a GPU the same handles are CUDA IPC, their
    device named by UUID (scripts/gpu_check.sh)."""
    from dataclasses import replace

    from executors import ipc
    from executors.syncgroup import IPC_TENSORS, PROTOCOLS
    ns = sglang_defs(sglang_root, SGLANG_TENSOR_DEFS)
    r, state, cfg = rollout
    r.cfg = replace(cfg, engines=replace(cfg.engines, colocated=True, tp=2))
    r.engine = TensorEngine(ns, 2)
    monkeypatch.setattr(sr, "on_gpu", lambda: True)
    monkeypatch.setattr(sr, "local_serialized", lambda values: ns["LocalSerializedTensor"](
        values=values))
    assert r.sync_member() == ("cuda", 2, os.getpid(), IPC_TENSORS)
    proto = PROTOCOLS[IPC_TENSORS]
    assert proto.tensors and not proto.forms_group and callable(getattr(r, proto.receive))
    per_rank = [state, {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}]
    hos = [ipc.HandOver("h", Stream(st, 40_000), torch.device("cpu"), tensors=True, ident=i)
           for i, st in enumerate(per_rank)]
    assert hos[0].stream.count > 2
    total = 0
    for k in range(hos[0].stream.count):
        ack = r.handover_receive_tensors(hos[0].stream.head(k), 3, 1, "h", [(0, 0), (1, 0)],
                                         *[ho.export(k, 1) for ho in hos])
        assert ack["receivers"] == {0: [0], 1: [0]}
        for ho in hos:
            ho.acked(k, ack["receivers"])
            assert not ho.live
        total += ack["bytes"]
    assert ack["done"] and r.current_version() == 3 and total == hos[0].stream.nbytes
    for mine, want in zip(r.engine.ranks, per_rank):
        assert set(mine) == set(want)
        assert all(torch.equal(mine[k], v) and mine[k].dtype == v.dtype for k, v in want.items())
    names = [c[0] for c in r.engine.calls]
    assert names[0] == "begin_weight_update" and names[-2:] == ["end_weight_update", "flush_cache"]
    assert names.count("begin_weight_update") == 1 and names.count("flush_cache") == 1
    updates = [kw for n, kw in r.engine.calls if n == "update_weights_from_tensor"]
    assert all(kw["load_format"] is None and kw["flush_cache"] is False for kw in updates)
    assert all(not isinstance(v, torch.Tensor) for kw in updates for _, v in kw["named_tensors"])


# SGLang's receiving side, run from the installed package's own source (sglang itself cannot be
# imported here: it needs its CUDA dependencies): `init_custom_process_group` joins the group as
# `WeightUpdater.init_weights_update_group` does, `receive_weights_from_distributed` receives as
# `update_weights_from_distributed` does; the tensors it got are saved for the test to compare.
SGLANG_SIDE = r"""
import ast, json, sys
from pathlib import Path
from types import SimpleNamespace
from typing import Optional
import torch
from packaging import version

root, out = Path(sys.argv[1]), sys.argv[2]
def source(path, name, cls=None):
    text = path.read_text()
    scope = ast.parse(text)
    if cls:
        scope = next(n for n in scope.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in scope.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return "from __future__ import annotations\n" + __import__("textwrap").dedent(
        ast.get_source_segment(text, fn))
ns = {"torch": torch, "Optional": Optional,
      "torch_release": version.parse(torch.__version__).release}
exec(source(root / "srt/utils/common.py", "init_custom_process_group"), ns)
exec(source(root / "srt/model_executor/model_runner_components/weight_updater.py",
            "receive_weights_from_distributed", "WeightUpdater"), ns)
kw = json.loads(sys.stdin.readline())
pg = ns["init_custom_process_group"](
    backend=kw["backend"], init_method=f"tcp://{kw['master_address']}:{kw['master_port']}",
    world_size=kw["world_size"], rank=kw["rank_offset"], group_name=kw["group_name"])
me = SimpleNamespace(_model_update_group={kw["group_name"]: pg}, device="cpu")
req = json.loads(sys.stdin.readline())
got = ns["receive_weights_from_distributed"](
    me, names=req["names"], dtypes=req["dtypes"], shapes=req["shapes"],
    group_name=req["group_name"], load_format=req["load_format"])
torch.save(dict(got), out)
sys.stdout.flush()
__import__("os")._exit(0)  # SGLang's scheduler keeps its group; skip the group's teardown at exit
"""


class GroupEngine(FakeEngine):
    """`FakeEngine` whose distributed weight update is SGLang's own code in a subprocess (one
    TP rank, as SGLang's scheduler runs it)."""

    def __init__(self, root: Path, out: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root, self.out, self.proc = root, out, None

    def init_weights_update_group(self, **kw: Any) -> tuple[bool, str]:
        import json
        self.calls.append(("init_weights_update_group", kw))
        self.proc = subprocess.Popen([sys.executable, "-c", SGLANG_SIDE, str(self.root),
                                      str(self.out)], stdin=subprocess.PIPE, text=True)
        self.proc.stdin.write(json.dumps(kw) + "\n")
        self.proc.stdin.flush()
        return True, "Succeeded to initialize custom process group."

    def update_weights_from_distributed(self, **kw: Any) -> tuple[bool, str]:
        import json
        self.calls.append(("update_weights_from_distributed", kw))
        if not self.open:
            return False, "update_weights_from_distributed must run between begin and end"
        self.proc.stdin.write(json.dumps({**kw, "load_format": kw.get("load_format")}) + "\n")
        self.proc.stdin.close()
        assert self.proc.wait(timeout=120) == 0
        self.loaded.update(torch.load(self.out))
        return True, "Succeeded to update parameter online."


class _Member:
    def __init__(self, role: str, rank: int, obj: Any) -> None:
        self.role, self.rank, self.obj = role, rank, obj


class _ThreadCalls:
    """The runtime's `call`/`results` over objects of this process, each call in its own
    thread (as Ray runs each member's call in its own process)."""

    kind = "threads"
    concurrent = True

    def call(self, m: _Member, method: str, *args: object) -> Any:
        return lambda: getattr(m.obj, method)(*args)

    def results(self, handles: list[Any]) -> list[Any]:
        import threading

        from executors.runtime import Outcome
        out: list[Any] = [None] * len(handles)

        def run(i: int) -> None:
            try:
                out[i] = Outcome(True, handles[i]())
            except Exception as e:  # noqa: BLE001 - the outcome carries it
                out[i] = Outcome(False, error=str(e))
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(handles))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        return out


def test_a_group_refresh_reaches_sglangs_own_receiver_in_one_session(
        rollout, sglang_root, tmp_path) -> None:  # noqa: F811 - the imported fixture
    """Over the weight-sync group the engine joins and receives itself: the driver
    (`GroupRefresh`) forms the group with SGLang's protocol, the engine calls
    `init_weights_update_group` and `update_weights_from_distributed` with names, dtypes and
    shapes only; SGLang's own join and receive code gets every tensor exactly from the sender,
    inside one weight-update session, then the cache is flushed; colocated, the engine releases
    and resumes its memory around training (once each)."""
    from dataclasses import replace

    from executors.syncgroup import GroupSender
    from executors.weights import GroupRefresh

    r, state, cfg = rollout
    state = {**state, "lm_head.weight": state["lm_head.weight"].to(torch.bfloat16)}
    r.engine = GroupEngine(sglang_root, tmp_path / "got.pt", **r.engine.kwargs)

    class Sender(GroupSender):
        def _sync_state(self, bucket_bytes: int) -> dict[str, torch.Tensor]:
            return state
    sender = Sender()
    # its own slot: its TP ranks on their GPUs (the CPU sender here makes the group gloo)
    assert r.sync_member() == ("cuda", 1, os.getpid(), PER_TENSOR)
    drive = GroupRefresh(_ThreadCalls())  # type: ignore[arg-type]
    members = [_Member("actor", 0, sender), _Member("rollout", 0, r)]
    spec = drive.group(40_000, members[:1], members[1:])
    assert (spec.protocol, spec.backend, spec.tps) == (PER_TENSOR, "gloo", (1,))
    [(err, got)] = drive.refresh(spec, members[:1], members[1:], 7, 40_000)
    assert err is None, err
    names = [c[0] for c in r.engine.calls]
    assert names == ["init_weights_update_group", "begin_weight_update",
                     "update_weights_from_distributed", "end_weight_update", "flush_cache"]
    init, upd = r.engine.calls[0][1], r.engine.calls[2][1]
    assert (init["rank_offset"], init["world_size"], init["backend"]) == (1, 2, "gloo")
    assert upd["group_name"] == init["group_name"] and upd["flush_cache"] is False
    assert upd["dtypes"][upd["names"].index("lm_head.weight")] == "bfloat16"
    assert r.current_version() == 7 and got["calls"] == len(state)  # one broadcast a tensor
    assert got["bytes"] == sum(v.numel() * v.element_size() for v in state.values())
    assert got["control_bytes"] < got["bytes"] / 10  # names, dtypes, shapes only
    assert set(r.engine.loaded) == set(state)
    assert all(torch.equal(r.engine.loaded[k], v) and r.engine.loaded[k].dtype == v.dtype
               for k, v in state.items())
    assert not r.sleep_engine()  # its own slot: never released
    r.cfg = replace(cfg, engines=replace(cfg.engines, colocated=True))
    r.engine.calls.clear()
    assert r.sleep_engine() and not r.sleep_engine() and r.wake_engine() and not r.wake_engine()
    assert [c[0] for c in r.engine.calls] == ["release_memory_occupation",
                                              "resume_memory_occupation"]


def test_a_reformed_group_destroys_the_paths_old_one(rollout) -> None:
    """When the driver forms a path's group anew (a member restarted, a refresh failed), the
    engine destroys the groups of that path's old spec before joining; another path's stay."""
    from executors.syncgroup import GroupSpec
    r, _, _ = rollout
    eng = r.engine
    old = GroupSpec("wsync1", 0, "127.0.0.1", 1, 2, (1,), "gloo", protocol=PER_TENSOR)
    other = GroupSpec("wsync2", 9, "127.0.0.1", 2, 1, (1,), "gloo", protocol=PER_TENSOR)
    new = GroupSpec("wsync3", 0, "127.0.0.1", 3, 2, (1,), "gloo", protocol=PER_TENSOR)
    for spec in (old, other, new):
        assert r.sync_join(spec, 0)
    names = [(n, kw["group_name"]) for n, kw in eng.calls]
    assert names == [("init_weights_update_group", "wsync1/s0/tall"),
                     ("init_weights_update_group", "wsync1/s1/tall"),
                     ("init_weights_update_group", "wsync2/s0/tall"),
                     ("destroy_weights_update_group", "wsync1/s0/tall"),
                     ("destroy_weights_update_group", "wsync1/s1/tall"),
                     ("init_weights_update_group", "wsync3/s0/tall"),
                     ("init_weights_update_group", "wsync3/s1/tall")]
    assert set(r._groups) == {"wsync2", "wsync3"}


def test_a_failed_update_is_an_error(rollout) -> None:
    r, state, _ = rollout
    r.engine.update_weights_from_tensor = lambda **kw: (False, "Failed to update parameter")
    with pytest.raises(RuntimeError, match="sglang update_weights_from_tensor failed: Failed"):
        r.load_weights(state, 1)


def test_generate_asks_for_log_probs_and_the_step_limits(rollout) -> None:
    r, _, cfg = rollout
    s, timing = r.generate(["a", "b"], ["g", "g"], [[1, 7, 8], [1, 9]], [11, 12], [3, 2])
    name, kw = r.engine.calls[-1]
    assert name == "generate" and kw["return_logprob"] is True
    assert kw["input_ids"] == [[1, 7, 8], [1, 9]]
    assert [p["max_new_tokens"] for p in kw["sampling_params"]] == [3, 2]
    assert [p["sampling_seed"] for p in kw["sampling_params"]] == [11, 12]
    assert all(p["stop_token_ids"] == [cfg.codec.eos] for p in kw["sampling_params"])
    assert [len(x) for x in s.responses] == [3, 2] and s.logprobs[1] == [-0.1, -0.2]
    assert timing["tokens"] == 5 and s.version == 0


def test_a_run_on_the_sglang_backend_syncs_through_the_engine(tmp_path, monkeypatch) -> None:
    """The executor (one process) with the backend's class and a fake engine: every step's
    refresh reaches the engine as one session, and the trace's weight-sync events carry its
    bytes as for every backend."""
    engines: list[FakeEngine] = []
    monkeypatch.setattr(sr, "start_engine", lambda kw: engines.append(FakeEngine(**kw))
                        or engines[-1])
    result = execute(hand_plan(GRPO_LAYOUT), 3, tmp_path / "out", backend="sglang", local=True)
    assert result.trace.metadata["backend"] == "sglang" and len(engines) == 1
    assert [s.versions for s in result.stats] == [[0], [1], [2]]
    names = [c[0] for c in engines[0].calls]
    # a refresh before each step's rollout (version 0's first): one session each
    assert names.count("begin_weight_update") == names.count("flush_cache") == 3
    sync = [e for e in result.trace.of("transfer") if e.args["policy_version"] > 0]
    assert len(sync) == 2 and all(e.args["bytes"] > 0 and e.dur_s > 0 for e in sync)
    loaded = sum(t.numel() * t.element_size() for t in engines[0].loaded.values())
    assert sync[-1].args["bytes"] == loaded  # every byte sent was loaded into the engine


