"""The sglang backend without a GPU: its engine settings come from the plan and the job, a
missing log-prob is an error, a refresh is one weight-update session of in-place updates, and
every name it hands SGLang exists in SGLang 0.5.23 (the API contract, read from the installed
package's source with `ast`: importing sglang needs its CUDA dependencies, so the Makefile
installs it without them, like verl and OpenRLHF for the export tests). The engine itself runs
in tests/test_exec_sglang.py on a GPU machine (scripts/gpu_check.sh)."""
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
from frameworks import package_dir

from executors import sglang_rollout as sr
from executors.backends import BACKENDS, backend_of, rollout_class
from executors.model import build_policy, save_model_dir
from executors.reshard import Stream
from executors.roles import run_config
from executors.run import check_layouts, execute
from executors.runplan import Layout, resolve_plan
from executors.syncgroup import PER_TENSOR
from placer.base.errors import SpecError
from placer.cost.sharding import Parallel

BACKEND_SRC = Path(sr.__file__)


def test_engine_kwargs_follow_the_plan_and_the_job() -> None:
    layout = {**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")}
    plan = hand_plan(layout)
    cfg = run_config(resolve_plan(plan), model_dir="/m")
    r = plan.roles["rollout"]
    kw = sr.engine_kwargs(cfg, rank=1)
    assert kw["tp_size"] == 2 == r.tp
    assert kw["context_length"] == plan.resolved().job.max_context + 1 == 12 + 8 + 1
    frac = r.memory_gb / plan.resolved().device_of(r.pool).memory_gb
    assert kw["mem_fraction_static"] == pytest.approx(min(max(frac, 0.05), 0.95))
    assert kw["random_seed"] == cfg.seed + 1 and kw["model_path"] == "/m"
    assert kw["skip_tokenizer_init"] is True
    assert kw["attention_backend"] == "triton"  # tiny-llama's head dim is 16
    big = type(cfg)(**{**cfg.__dict__, "arch": {**cfg.arch, "hidden": 1024, "heads": 8}})
    assert "attention_backend" not in sr.engine_kwargs(big, 0)  # head dim 128: SGLang's choice


def test_the_backend_is_chosen_from_the_registry() -> None:
    assert set(BACKENDS) == {"torch", "vllm", "sglang"}
    with pytest.raises(SpecError, match=r"--backend: unknown backend 'sgl' \(expected one of "
                                        r"torch, vllm, sglang\)"):
        backend_of("sgl")
    run = resolve_plan(hand_plan({**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")}))
    check_layouts(run, backend_of("sglang"))  # 4 heads, 2 KV heads over tp 2
    check_layouts(run, backend_of("torch"))  # the torch engine holds its TP shards too
    torch_engine = backend_of("torch").layout_problem
    assert "torch rollout backend runs no pipeline-parallel engine" in str(
        torch_engine(Layout(1, 1, 2), run.job.policy))
    assert "needs tp to divide the model's 4 query heads" in str(
        torch_engine(Layout(1, 3, 1), run.job.policy))
    sglang = backend_of("sglang").layout_problem
    arch = run.job.policy
    assert "runs no pipeline-parallel engine" in str(sglang(Layout(1, 1, 2), arch))
    assert "SGLang needs tp to divide the model's 4 query heads" in str(
        sglang(Layout(1, 3, 1), arch))


def test_importing_the_backend_does_not_import_sglang() -> None:
    code = ("import sys; from executors.backends import rollout_class; "
            "c = rollout_class('sglang'); print(c.__name__, 'sglang' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["SglangRollout", "False"]
    assert rollout_class("torch").__name__ == "Rollout"


# --------------------------------------------------------------------------- output parsing
def _out(tokens: list[int], lps: list[Any] | None, **meta: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"finish_reason": {"type": "stop"}, **meta}
    if lps is not None:
        m["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(lps, tokens)]
    return {"output_ids": tokens, "meta_info": m}


def test_log_probs_are_taken_from_the_output_and_missing_ones_refused() -> None:
    assert sr.sample_logprobs("s0", _out([5, 9], [-0.5, -2.0])) == ([5, 9], [-0.5, -2.0])
    with pytest.raises(RuntimeError, match="sglang returned 0 log-probs for 2 tokens of sample s0"):
        sr.sample_logprobs("s0", _out([5, 9], None))
    with pytest.raises(RuntimeError, match="1 log-probs for 2 tokens"):
        sr.sample_logprobs("s0", {"output_ids": [5, 9],
                                  "meta_info": {"output_token_logprobs": [(-0.5, 5, None)]}})
    with pytest.raises(RuntimeError, match=r"no log-prob for token 1 \(9\) of sample s1"):
        sr.sample_logprobs("s1", _out([5, 9], [-0.5, None]))
    other = {"output_ids": [5, 9], "meta_info": {"output_token_logprobs": [(-0.5, 5, None),
                                                                          (-1.0, 7, None)]}}
    with pytest.raises(RuntimeError, match=r"no log-prob for token 1 \(9\)"):
        sr.sample_logprobs("s1", other)  # a log-prob of another token is not this one's
    with pytest.raises(RuntimeError, match="sglang aborted sample s2: out of memory"):
        sr.sample_logprobs("s2", _out([], [], finish_reason={"type": "abort",
                                                            "message": "out of memory"}))


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
        rollout, sglang_root, monkeypatch) -> None:
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


def test_a_group_refresh_reaches_sglangs_own_receiver_in_one_session(rollout, sglang_root,
                                                                     tmp_path) -> None:
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


# ---------------------------------------------------------------------- the API contract
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"class {name} not found"
    return found[0]


def _fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def server_args_fields(root: Path) -> set[str]:
    """ServerArgs' fields: `server_args.py` assembles them (`msgspec.defstruct`) from the
    namespace classes listed in `_INPUT_NAMESPACES`, each imported from `arg_groups.fields`."""
    tree = _tree(root / "srt" / "server_args.py")
    where = {a.asname or a.name: n.module for n in tree.body if isinstance(n, ast.ImportFrom)
             for a in n.names}
    spaces = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES"
                          for t in n.targets))
    assert isinstance(spaces, ast.List)
    out = _fields(_class(tree, "ServerArgs"))
    for elt in spaces.elts:
        assert isinstance(elt, ast.Name)
        module = where[elt.id]
        assert module is not None and module.startswith("sglang.")
        path = root.parent / (module.replace(".", "/") + ".py")
        out |= _fields(_class(_tree(path), elt.id))
    return out


def engine_methods(root: Path) -> dict[str, set[str]]:
    """Engine's methods and the parameters each takes (its own and its base classes')."""
    tree = _tree(root / "srt" / "entrypoints" / "engine.py")
    out: dict[str, set[str]] = {}
    for f in _class(tree, "Engine").body:
        if isinstance(f, ast.FunctionDef):
            a = f.args
            out[f.name] = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} - {"self"}
    return out


def backend_engine_calls(src: Path) -> list[tuple[str, set[str]]]:
    """Every `self.engine.METHOD(kw=...)` call in the backend's source: (method, keywords)."""
    out = []
    for n in ast.walk(_tree(src)):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "engine"):
            out.append((n.func.attr, {k.arg for k in n.keywords if k.arg}))
    return out


def backend_sampling_keys(src: Path) -> set[str]:
    """The keys of the sampling-parameter dicts `sampling_params` builds."""
    fn = next(n for n in ast.walk(_tree(src))
              if isinstance(n, ast.FunctionDef) and n.name == "sampling_params")
    return {k.value for d in ast.walk(fn) if isinstance(d, ast.Dict) for k in d.keys
            if isinstance(k, ast.Constant)}


def contract_problems(root: Path, kwargs: set[str], calls: list[tuple[str, set[str]]],
                      sampling: set[str]) -> list[str]:
    """What the backend names that SGLang's source lacks (empty: the contract holds)."""
    fields, methods = server_args_fields(root), engine_methods(root)
    sp = _fields(_class(_tree(root / "srt" / "sampling" / "sampling_params.py"),
                        "SamplingParams"))
    out = [f"Engine(**kw): {k} is not a ServerArgs field" for k in sorted(kwargs - fields)]
    for name, kws in calls:
        if name not in methods:
            out.append(f"Engine has no method {name}")
        else:
            out += [f"Engine.{name} takes no {k}" for k in sorted(kws - methods[name])]
    out += [f"SamplingParams has no {k}" for k in sorted(sampling - sp)]
    return out


@pytest.fixture(scope="module")
def sglang_root() -> Path:
    root = package_dir("sglang")
    version = next(root.parent.glob("sglang-*.dist-info")).name
    assert version == "sglang-0.5.23.dist-info", f"the contract is SGLang 0.5.23's ({version})"
    return root


def test_every_name_the_backend_hands_sglang_exists(sglang_root: Path) -> None:
    plan = hand_plan({**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")})
    kwargs = set(sr.engine_kwargs(run_config(resolve_plan(plan), model_dir="/m"), 0))
    calls = backend_engine_calls(BACKEND_SRC)
    used = {c[0] for c in calls}
    assert {"generate", "update_weights_from_tensor", "begin_weight_update",
            "end_weight_update", "flush_cache", "release_memory_occupation",
            "resume_memory_occupation", "init_weights_update_group",
            "update_weights_from_distributed",
            "destroy_weights_update_group"} <= used  # the reader sees the calls
    # the rollout shares the actor's slot: colocated, it releases its memory while training
    assert {"tp_size", "context_length", "mem_fraction_static", "random_seed",
            "enable_memory_saver"} <= kwargs
    sampling = backend_sampling_keys(BACKEND_SRC)
    assert "sampling_seed" in sampling
    assert contract_problems(sglang_root, kwargs, calls, sampling) == []
    # the output keys the parser reads are the ones the tokenizer manager writes
    tm = (sglang_root / "srt" / "managers" / "tokenizer_manager.py").read_text()
    assert 'meta_info["output_token_logprobs"] = ' in tm and '"output_ids": ' in tm
    assert (sglang_root / "srt" / "entrypoints" / "engine.py").is_file()  # start_engine's import


def test_the_contract_fails_on_a_wrong_name(sglang_root: Path) -> None:
    """vLLM's spelling of the TP size, a parameter SGLang does not take, an absent method and
    an unknown sampling key are each reported."""
    calls = [("update_weights_from_tensor", {"named_tensors", "flush"}), ("sleep", set())]
    assert contract_problems(sglang_root, {"tp_size", "tensor_parallel_size"}, calls,
                             {"max_new_tokens", "seed"}) == [
        "Engine(**kw): tensor_parallel_size is not a ServerArgs field",
        "Engine.update_weights_from_tensor takes no flush",
        "Engine has no method sleep",
        "SamplingParams has no seed"]


def test_the_gpu_hand_over_names_what_sglang_defines(sglang_root: Path) -> None:
    """The CUDA-IPC hand-over's contract with SGLang 0.5.23's source: the payload class
    `local_serialized` imports is where it says, a dataclass of `values` that SGLang's
    unpickler admits; `update_weights_from_tensor`'s default load unwraps it for the TP rank;
    the device argument the sender rewrites to a UUID is the one SGLang's patched rebuild maps
    back (`ipc.DEVICE_ARG`)."""
    from executors import ipc
    fn = next(n for n in ast.walk(_tree(BACKEND_SRC))
              if isinstance(n, ast.FunctionDef) and n.name == "local_serialized")
    [imp] = [n for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)]
    module, name = imp.module or "", imp.names[0].name
    path = sglang_root.parent / (module.replace(".", "/") + ".py")
    cls = _class(_tree(path), name)
    assert [ast.unparse(a.target) for a in cls.body if isinstance(a, ast.AnnAssign)] == [
        "values"]
    common = (sglang_root / "srt" / "utils" / "common.py").read_text()
    assert f'"{module}",\n            "{name}",' in common  # SafeUnpickler.ALLOWED_GLOBALS
    updater = path.read_text()
    assert "isinstance(tensor, LocalSerializedTensor)" in updater
    assert "tensor = tensor.get(tp_rank)" in updater
    patch = (sglang_root / "srt" / "utils" / "patch_torch.py").read_text()
    assert f"_REDUCE_TENSOR_ARG_DEVICE_INDEX = {ipc.DEVICE_ARG}" in patch
    assert "def _device_from_maybe_uuid" in patch and "get_device_properties(device).uuid" in patch
