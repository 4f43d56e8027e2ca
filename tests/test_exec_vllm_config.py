"""The vllm backend's engine settings come from the plan and the job, and a missing log-prob is
an error (CPU-only: vLLM itself is exercised by tests/test_exec_vllm.py on a GPU machine, which
scripts/gpu_check.sh runs). Importing the backend never imports vLLM."""
from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from exec_util import GRPO_LAYOUT, hand_plan
from test_exec_syncgroup import _together

from executors.roles import run_config
from executors.runplan import resolve_plan
from executors.vllm_rollout import WeightSync, behaviour_logprobs, engine_args
from placer.cost.sharding import Parallel


def test_engine_args_follow_the_plan_and_the_job() -> None:
    layout = {**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")}
    plan = hand_plan(layout)
    cfg = run_config(resolve_plan(plan), model_dir="/m")
    r = plan.roles["rollout"]
    args = engine_args(cfg, rank=1)
    assert args["tensor_parallel_size"] == 2 == r.tp
    assert args["distributed_executor_backend"] == "mp"
    assert args["max_model_len"] == plan.resolved().job.max_context + 1 == 12 + 8 + 1
    frac = r.memory_gb / plan.resolved().device_of(r.pool).memory_gb
    assert args["gpu_memory_utilization"] == pytest.approx(min(max(frac, 0.05), 0.95))
    assert args["seed"] == cfg.seed + 1 and args["model"] == "/m"


def test_missing_log_probs_are_an_error_not_zeros() -> None:
    step = {5: SimpleNamespace(logprob=-0.5), 9: SimpleNamespace(logprob=-2.0)}
    assert behaviour_logprobs("s0", [5, 9], [step, step]) == [-0.5, -2.0]
    with pytest.raises(RuntimeError, match="vllm returned 0 log-probs for 2 tokens of sample s0"):
        behaviour_logprobs("s0", [5, 9], None)
    with pytest.raises(RuntimeError, match=r"no log-prob for token 1 \(7\) of sample s1"):
        behaviour_logprobs("s1", [5, 7], [step, step])


def test_importing_the_backend_does_not_import_vllm() -> None:
    code = "import sys, executors.vllm_rollout; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_colocated_engine_starts_with_sleep_mode() -> None:
    colocated = {**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")}  # the actor's
    assert engine_args(run_config(resolve_plan(hand_plan(colocated)), model_dir="/m"),
                       0)["enable_sleep_mode"] is True
    apart = engine_args(run_config(resolve_plan(hand_plan(GRPO_LAYOUT)), model_dir="/m"), 0)
    assert "enable_sleep_mode" not in apart  # its own LPU slot: never sleeps


class FakeLLM:
    """The `vllm.LLM` methods the backend calls, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        def call(*args, **kw):
            self.calls.append((name, args, kw))
        return call


def _fake_rollout(colocated: bool):
    from executors.runplan import EngineGroup
    from executors.vllm_rollout import VllmRollout
    plan = hand_plan({**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")})
    cfg = run_config(resolve_plan(plan), model_dir="/m")
    cfg = cfg.for_engines(EngineGroup(tp=2, colocated=colocated))
    r = VllmRollout.__new__(VllmRollout)  # the engine without vLLM: a recording LLM
    super(VllmRollout, r).__init__(cfg, 0)
    r.llm = FakeLLM()
    return r


def test_every_refresh_drops_the_prefix_cache() -> None:
    """After the last tensor of a refresh (whole state, buckets, or the weight-sync group) the
    engine resets its prefix cache: KV from the old weights is never reused."""
    import torch
    r = _fake_rollout(colocated=False)
    r.load_weights({"w": torch.ones(2)}, 1)
    assert [c[0] for c in r.llm.calls] == ["collective_rpc", "reset_prefix_cache"]
    r.llm.calls.clear()
    for name in ("a", "b"):  # the group's tensors, each as it completes
        r._load_shard(0, name, torch.ones(3))
    assert r.llm.calls == []  # held for one load
    r._refreshed()
    assert [c[0] for c in r.llm.calls] == ["collective_rpc", "reset_prefix_cache"]
    assert [n for n, _ in r.llm.calls[0][2]["args"][0]] == ["a", "b"]
    assert not r.sleep_engine() and r.llm.calls[-1][0] == "reset_prefix_cache"  # not colocated


def test_a_colocated_engine_sleeps_for_training_and_wakes_once() -> None:
    r = _fake_rollout(colocated=True)
    assert r.sleep_engine() and not r.sleep_engine()
    assert r.wake_engine() and not r.wake_engine()
    assert [(c[0], c[2]) for c in r.llm.calls] == [("sleep", {"level": 1}), ("wake_up", {})]


# ------------------------------------------------------- the weight-sync group into the workers
class _Model:
    """What `model.load_weights` of a vLLM model receives, by name (whole tensors)."""

    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        self.loaded.update({k: v.clone() for k, v in weights})
        return {k for k, _ in weights}


class _Worker(WeightSync):
    """`WeightSync` as vLLM mixes it into a GPU worker: the worker's model and its rank (vLLM's
    world group, which this process does not have)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.model_runner = SimpleNamespace(model=_Model())

    def _tp_rank(self) -> int:
        return self.rank


class WorkerLLM(FakeLLM):
    """`LLM.collective_rpc` as vLLM runs it: the method on every worker at once, their results
    in rank order; the arguments are kept to check that no tensor travels in them."""

    def __init__(self, tp: int) -> None:
        super().__init__()
        self.workers = [_Worker(r) for r in range(tp)]

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(("collective_rpc", (method, *args), {}))
        return _together([lambda w=w: getattr(w, method)(*args) for w in self.workers])


def _tensors_in(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return 1
    if isinstance(obj, (list, tuple)):
        return sum(_tensors_in(o) for o in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(_tensors_in(getattr(obj, f)) for f in obj.__dataclass_fields__)
    return 0


@pytest.mark.parametrize("size", [0, 4096], ids=["whole", "buckets"])
def test_the_workers_receive_from_the_group_and_rpc_carries_no_weights(size: int) -> None:
    """A trainer sender and a tp 2 vLLM engine (its two workers in threads, as vLLM runs them):
    each worker joins the gloo group and loads every tensor whole and exactly; collective_rpc
    carries only the spec and the manifests; then the prefix cache is reset."""
    from test_exec_syncgroup import _Sender

    from executors.syncgroup import PYNCCL, GroupSpec
    g = torch.Generator().manual_seed(3)
    want = {f"layers.{i}.w": torch.randn(8, 6, generator=g) for i in range(5)}
    want["embed"] = torch.randn(32, 6, generator=g).to(torch.bfloat16)
    sender = _Sender(want, kv_heads=2)
    r = _fake_rollout(colocated=False)
    r.llm = WorkerLLM(2)
    # its own GPUs: the group's buckets, on vLLM's communicator under NCCL, gloo here
    assert r.sync_member() == ("cuda", 2, os.getpid(), PYNCCL)
    addr, port = sender.sync_host()
    spec = GroupSpec("g1", 0, addr, port, 1, (2,), "gloo", timeout_s=30, protocol=PYNCCL)
    _together([lambda: sender.sync_join(spec, 0), lambda: r.sync_join(spec, 0)])
    manifests = sender.sync_prepare("g1", size, 0)
    sent, got = _together([lambda: sender.sync_send("g1"),
                           lambda: r.sync_receive("g1", manifests, 1)])
    assert got["done"] and r.version == 1
    full = sum(v.numel() * v.element_size() for v in want.values())
    assert sent["bytes"] == got["bytes"] == full  # each TP worker takes the whole tensors
    for w in r.llm.workers:
        m = w.model_runner.model
        assert set(m.loaded) == set(want)
        assert all(torch.equal(m.loaded[k], v) and m.loaded[k].dtype == v.dtype
                   for k, v in want.items())
    rpcs = [c[1] for c in r.llm.calls if c[0] == "collective_rpc"]
    assert [a[0] for a in rpcs] == ["init_weight_update_group", "receive_weights"]
    assert sum(_tensors_in(a) for a in rpcs) == 0  # control messages only
    assert r.llm.calls[-1][0] == "reset_prefix_cache"


def test_a_colocated_engine_is_handed_each_bucket_as_shared_memory() -> None:
    """Colocated, the engine names the hand-over (CUDA IPC on its GPUs): per bucket one
    `collective_rpc("receive_handover")` with the handles and the bucket's head, each worker
    maps its own handle, the one the trainer rank on its device exported (here the two
    senders' bytes differ, so a worker that mapped the other's handle shows), loads what the
    bucket completes whole and exactly, and acknowledges its handle; the prefix cache is
    dropped once, after the last bucket."""
    from executors import ipc
    from executors.reshard import Stream
    from executors.syncgroup import IPC
    g = torch.Generator().manual_seed(5)
    want = {f"layers.{i}.w": torch.randn(8, 6, generator=g) for i in range(5)}
    want["embed"] = torch.randn(32, 6, generator=g).to(torch.bfloat16)
    r = _fake_rollout(colocated=True)
    r.llm = WorkerLLM(2)
    assert r.sync_member() == ("cuda", 2, os.getpid(), IPC)
    # each worker's handle from the trainer rank on its device: two senders, one handle each
    per_rank = [want, {k: v + 1 for k, v in want.items()}]
    hos = [ipc.HandOver("h1", Stream(st, 100), torch.device("cpu"), ident=i)
           for i, st in zip((4, 5), per_rank)]
    for k in range(hos[0].stream.count):
        ack = r.handover_receive(hos[0].stream.head(k), 3, 1, "h1", [(0, 0), (1, 0)],
                                 *[ho.export(k, 1) for ho in hos])
        assert ack["receivers"] == {4: [0], 5: [0]} and ack["bucket"] == k
        for ho in hos:
            ho.acked(k, ack["receivers"])
            assert not ho.live  # its worker mapped its handle: the bucket is freed
    assert ack["done"] and r.version == 3
    for w, mine in zip(r.llm.workers, per_rank):
        m = w.model_runner.model
        assert set(m.loaded) == set(mine)
        assert all(torch.equal(m.loaded[k], v) and m.loaded[k].dtype == v.dtype
                   for k, v in mine.items())
    rpcs = [c[1] for c in r.llm.calls if c[0] == "collective_rpc"]
    assert {a[0] for a in rpcs} == {"receive_handover"} and len(rpcs) == hos[0].stream.count
    assert sum(_tensors_in(a) for a in rpcs) == 0  # handles and heads: control messages
    assert [c[0] for c in r.llm.calls].count("reset_prefix_cache") == 1
    assert r.llm.calls[-1][0] == "reset_prefix_cache"


def test_sending_side_resharding_is_refused_for_vllm() -> None:
    from executors.syncgroup import GroupSpec
    r = _fake_rollout(colocated=False)
    assert r.sync_member()[:2] == ("cuda", 2)
    with pytest.raises(RuntimeError, match="vllm backend loads whole tensors"):
        r.sync_join(GroupSpec("g", 0, "127.0.0.1", 1, 1, (2,), "gloo", send_shards=True), 0)


# ---------------------------------------------------------------------- the API contract
# `vllm.LLM`'s methods and their parameters, read from vLLM's source at the pinned commit
# (github.com/vllm-project/vllm, vllm/entrypoints/llm.py, 0012cf691b7e69423244d2b1405f4b6832156e19:
# `reset_prefix_cache(self, device=None)`, `sleep(self, level=1)`, `wake_up(self, tags=None)`,
# `collective_rpc(self, method, timeout=None, args=(), kwargs=None)`, `generate(self, prompts,
# sampling_params=None, *, use_tqdm=True, lora_request=None, ...)`). vLLM is not installed here
# (the gpu extra): this table is the recorded source, and tests/test_exec_vllm.py runs the
# calls against the real engine on a GPU machine.
VLLM_COMMIT = "0012cf691b7e69423244d2b1405f4b6832156e19"
LLM_METHODS = {
    "generate": {"prompts", "sampling_params", "use_tqdm", "lora_request",
                 "prompt_adapter_request", "guided_options_request"},
    "collective_rpc": {"method", "timeout", "args", "kwargs"},
    "reset_prefix_cache": {"device"},
    "sleep": {"level"},
    "wake_up": {"tags"},
}


def llm_calls() -> list[tuple[str, set[str]]]:
    """Every `self.llm.METHOD(kw=...)` call in the backend's source: (method, keywords)."""
    import ast
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "executors" / "vllm_rollout.py"
    out = []
    for n in ast.walk(ast.parse(src.read_text())):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "llm"):
            out.append((n.func.attr, {k.arg for k in n.keywords if k.arg}))
    return out


def test_every_llm_call_names_a_method_of_the_pinned_vllm() -> None:
    calls = llm_calls()
    assert {c[0] for c in calls} == {"generate", "collective_rpc", "reset_prefix_cache", "sleep",
                                     "wake_up"}
    bad = [(m, kw - LLM_METHODS.get(m, set())) for m, kw in calls
           if m not in LLM_METHODS or kw - LLM_METHODS[m]]
    assert bad == [], f"calls vLLM {VLLM_COMMIT[:10]}'s LLM does not take: {bad}"


# The worker side: what `WeightSync`, mixed into vLLM's GPU worker, reads of vLLM, recorded from
# vLLM's source (github.com/vllm-project/vllm; vLLM's files are stored at different commits):
#   examples/offline_inference/rlhf_utils.py @ 081b8e32277e01f1f759601c714f808b5e9676b2: the
#     pattern (`WorkerExtension.init_weight_update_group` takes `get_world_group().rank` from
#     `vllm.distributed.parallel_state`; `update_weight` broadcasts from rank 0, then
#     `self.model_runner.model.load_weights(weights=[(name, weight)])`)
#   vllm/distributed/parallel_state.py @ 0c175ae9295b575078961a68c4d3a2a838dce5ef:
#     `def get_world_group() -> GroupCoordinator`, whose `rank` is the worker's global rank
#   vllm/config/parallel.py @ 840e7972c6ab74061696e81e17d8a74db2aefd7e: `worker_extension_cls:
#     str`, "dynamically inherited by the worker class ... for use in collective_rpc calls"
WORKER_READS = {("vllm.distributed.parallel_state", "get_world_group"), ("self", "model_runner"),
                ("model", "load_weights")}


def _worker_ast():
    import ast
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "executors" / "vllm_rollout.py"
    return ast.parse(src.read_text())


def test_every_worker_method_rpc_names_exists_and_takes_no_tensors() -> None:
    """The methods `collective_rpc` names are `WeightSync`'s (a regression guard on our own
    names: vLLM resolves them on the worker, which inherits the extension); the group path
    names only control-message methods, the one-process path `update_weights`."""
    import ast
    tree = _worker_ast()
    named = {n.args[0].value for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "collective_rpc" and isinstance(n.args[0], ast.Constant)}
    assert named == {"init_weight_update_group", "receive_weights", "update_weights",
                     "receive_handover"}
    assert all(callable(getattr(WeightSync, m, None)) for m in named)


def test_the_worker_extension_reads_only_recorded_vllm_names() -> None:
    """Every vLLM import and worker attribute `WeightSync` uses is in the recorded table."""
    import ast
    cls = next(n for n in ast.walk(_worker_ast())
               if isinstance(n, ast.ClassDef) and n.name == "WeightSync")
    used = {(n.module, a.name) for n in ast.walk(cls) if isinstance(n, ast.ImportFrom)
            and (n.module or "").startswith("vllm") for a in n.names}
    used |= {(n.value.id, n.attr) for n in ast.walk(cls) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id in ("self", "model")
             and n.attr in ("model_runner", "load_weights", "device", "rank")}
    assert used == WORKER_READS, used ^ WORKER_READS
    loads = [n for n in ast.walk(cls) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "load_weights"]
    assert loads and all({k.arg for k in n.keywords} == {"weights"} for n in loads)


# ------------------------------------------------- the NCCL channel on vLLM's stateless group
# What `executors.pynccl` (`pynccl_channel`, `NcclChannel`) calls of vLLM, recorded from vLLM's source
# (github.com/vllm-project/vllm; its files are stored at different commits):
#   vllm/distributed/utils.py @ 5a6541db9bfa77756459722f69e8c89a0b47a14d: `@dataclass class
#     StatelessProcessGroup` with fields rank, world_size, store, socket,
#     data_expiration_seconds (and counters with defaults), `broadcast_obj(obj, src)`
#   vllm/distributed/device_communicators/pynccl.py @ 9a4b60a4c91d972116c01e818048ab8868542d62:
#     `PyNcclCommunicator.__init__(self, group: ProcessGroup | StatelessProcessGroup, device,
#     library_path=None)`, its `disabled` flag (that version sets it True after init; 0.6.5+
#     leaves it False)
#   examples/offline_inference/rlhf_utils.py @ 081b8e32277e01f1f759601c714f808b5e9676b2:
#     `PyNcclCommunicator(pg, device=device)` on a `StatelessProcessGroup`, then
#     `broadcast(weight, src=0, stream=torch.cuda.current_stream())` on trainer and workers
VLLM_NCCL = {
    ("vllm.distributed.utils", "StatelessProcessGroup"): {
        "rank", "world_size", "store", "socket", "data_expiration_seconds"},
    ("vllm.distributed.device_communicators.pynccl", "PyNcclCommunicator"): {
        "group", "device", "library_path"},
}
COMM_METHODS = {"broadcast": {"tensor", "src", "stream"}}
COMM_READS = {"disabled"}


def nccl_problems(src: str) -> list[str]:
    """What `pynccl_channel` and `NcclChannel` in `src` name that the recorded vLLM lacks."""
    import ast
    tree = ast.parse(src)
    fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)
           and n.name in ("pynccl_channel", "NcclChannel")]
    imported = {a.asname or a.name: (n.module or "", a.name) for f in fns for n in ast.walk(f)
                if isinstance(n, ast.ImportFrom) for a in n.names}
    out = [f"vLLM has no {m}.{c}" for m, c in imported.values() if (m, c) not in VLLM_NCCL]
    for f in fns:
        for n in ast.walk(f):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) \
                    and n.func.id in imported and imported[n.func.id] in VLLM_NCCL:
                takes = VLLM_NCCL[imported[n.func.id]]
                out += [f"{n.func.id} takes no {k.arg}" for k in n.keywords if k.arg not in takes]
                if len(n.args) > 1:
                    out.append(f"{n.func.id}: more than one positional argument")
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name | ast.Attribute) \
                    and (getattr(n.value, "id", None) or getattr(n.value, "attr", None)) == "comm":
                call = next((c for c in ast.walk(f) if isinstance(c, ast.Call) and c.func is n),
                            None)
                if call is None and n.attr not in COMM_READS:
                    out.append(f"PyNcclCommunicator has no attribute {n.attr}")
                if call is not None:
                    if n.attr not in COMM_METHODS:
                        out.append(f"PyNcclCommunicator has no method {n.attr}")
                    else:
                        out += [f"PyNcclCommunicator.{n.attr} takes no {k.arg}"
                                for k in call.keywords if k.arg not in COMM_METHODS[n.attr]]
    return out


def test_the_nccl_channel_calls_only_what_the_pinned_vllm_defines() -> None:
    from pathlib import Path

    from executors import pynccl
    src = Path(pynccl.__file__).read_text()
    assert nccl_problems(src) == []
    # the reader sees every call: both classes built, the broadcast, the flag read
    for name in ("StatelessProcessGroup(rank=rank, world_size=world, store=store, socket=None)",
                 "PyNcclCommunicator(group, device=", "self.comm.broadcast(bufs[0], src=",
                 "comm.disabled"):
        assert name in src, name


def test_the_nccl_contract_fails_on_a_wrong_name() -> None:
    bad = '''
def pynccl_channel(store, rank, world):
    from vllm.distributed.utils import StatelessProcessGroup
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator, NcclComm
    g = StatelessProcessGroup(rank=rank, world=world, store=store, socket=None)
    comm = PyNcclCommunicator(g, dev=0)
    comm.enabled
    return comm

class NcclChannel:
    def broadcast(self, bufs, opts):
        self.comm.broadcast(bufs[0], root=0)
        self.comm.bcast(bufs[0])
'''
    assert nccl_problems(bad) == [
        "vLLM has no vllm.distributed.device_communicators.pynccl.NcclComm",
        "StatelessProcessGroup takes no world", "PyNcclCommunicator takes no dev",
        "PyNcclCommunicator has no attribute enabled",
        "PyNcclCommunicator.broadcast takes no root",
        "PyNcclCommunicator has no method bcast"]


def test_an_nccl_channel_is_built_on_the_channels_store_and_broadcasts_on_the_stream(
        monkeypatch) -> None:
    """`pynccl_channel` with vLLM's two classes stood in for (vLLM is the gpu extra): the
    stateless group is the channel's store, rank and world, the communicator is on this
    process's device, a disabled one is refused; `_bcast` on the channel is vLLM's broadcast
    from the group's root on the current stream."""
    import sys
    import types

    from executors import pynccl as pn
    from executors import syncgroup as sg
    made: list[tuple[str, dict]] = []

    class Group:
        def __init__(self, **kw):
            made.append(("group", kw))

    class Comm:
        disabled = False

        def __init__(self, group, device):
            made.append(("comm", {"group": group, "device": device}))

        def broadcast(self, tensor, src, stream=None):
            made.append(("broadcast", {"tensor": tensor, "src": src, "stream": stream}))
    utils = types.ModuleType("vllm.distributed.utils")
    utils.StatelessProcessGroup = Group  # type: ignore[attr-defined]
    pynccl = types.ModuleType("vllm.distributed.device_communicators.pynccl")
    pynccl.PyNcclCommunicator = Comm  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.distributed.utils", utils)
    monkeypatch.setitem(sys.modules, "vllm.distributed.device_communicators.pynccl", pynccl)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: "stream")
    store = torch.distributed.HashStore()
    ch = pn.pynccl_channel(store, 2, 5)
    assert made[0] == ("group", {"rank": 2, "world_size": 5, "store": store, "socket": None})
    assert made[1][1]["device"] == torch.device("cuda", 3)
    buf = torch.zeros(4, dtype=torch.uint8)
    sg._bcast(ch, buf).wait()
    assert made[2] == ("broadcast", {"tensor": buf, "src": 0, "stream": "stream"})
    Comm.disabled = True
    with pytest.raises(RuntimeError, match="came up disabled"):
        pn.pynccl_channel(store, 2, 5)
