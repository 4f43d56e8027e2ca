"""The weight-sync paths only a GPU runs (scripts/gpu_check.sh; skipped elsewhere):

  sglang  (in SGLang's environment, one GPU) the whole-tensor CUDA IPC hand-over
          (`ipc.HandOver(tensors=True)`, protocol `ipc-tensors`): a trainer's buckets exported
          as one handle per tensor, the device named by UUID, opened in another process by
          SGLang's own code exactly as a TP rank opens its payload (`LocalSerializedTensor`,
          `_unwrap_tensor` after `monkey_patch_torch_reductions`), every tensor equal to the
          sender's and every bucket released;
  nccl    (in vLLM's environment, two GPUs) a bucketed refresh over one channel formed on vLLM's
          `StatelessProcessGroup` and `PyNcclCommunicator` (protocol `pynccl`), the sender on
          GPU 0 and the receiver on GPU 1, each tensor arriving exactly.
"""
from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu]


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _state(device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    out = {f"layers.{i}.w": torch.randn(24, 16, generator=g) for i in range(4)}
    out["embed"] = torch.randn(40, 16, generator=g).to(torch.bfloat16)
    out["norm"] = torch.randn(16, generator=g)
    return {k: v.to(device) for k, v in out.items()}


SGLANG_RANK = r"""
import pickle, sys, torch
from sglang.srt.model_executor.model_runner_components.weight_updater import (
    LocalSerializedTensor, _unwrap_tensor)
from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
monkey_patch_torch_reductions()  # as SGLang's TP rank does before it deserializes
named = pickle.loads(sys.stdin.buffer.read())
out = {n: _unwrap_tensor(LocalSerializedTensor(values=v), tp_rank=0,
                         device=torch.device("cuda", 0)).cpu() for n, v in named}
torch.save(out, sys.argv[1])
"""


@pytest.mark.skipif(_gpus() < 1 or importlib.util.find_spec("sglang") is None,
                    reason="needs a CUDA GPU and sglang (the sglang extra)")
def test_sglang_opens_the_whole_tensor_cuda_ipc_hand_over(tmp_path: Path) -> None:
    from executors import ipc
    from executors.reshard import Stream
    want = _state("cuda")
    ho = ipc.HandOver("g", Stream(want, 4096), torch.device("cuda", 0), tensors=True, ident=3)
    named = []
    for k in range(ho.stream.count):  # every bucket out at once: one process opens them all
        named += [(n, [h]) for n, h in ho.export(k, 1).handles[0]]
    assert ho.stream.count > 1 and len(named) == len(want)
    out = tmp_path / "got.pt"
    subprocess.run([sys.executable, "-c", SGLANG_RANK, str(out)], input=pickle.dumps(named),
                   check=True, timeout=300)
    got = torch.load(out)
    assert set(got) == set(want)
    assert all(torch.equal(got[k], v.cpu()) and got[k].dtype == v.dtype for k, v in want.items())
    for k in range(ho.stream.count):
        ho.acked(k, {3: [0]})
    assert not ho.live and ho.reclaim() == 0


def _nccl_side(role: str, q_addr, q_out) -> None:
    from executors.syncgroup import (
        PYNCCL,
        GroupSpec,
        Sending,
        join_engine,
        join_sender,
        listen,
        receive,
    )
    torch.cuda.set_device(0 if role == "sender" else 1)
    want = _state("cpu")
    if role == "sender":
        host = listen()
        addr, port = host.getsockname()[:2]
        q_addr.put((addr, port))
        spec = GroupSpec("n", 0, addr, port, 1, (1,), "nccl", timeout_s=120, protocol=PYNCCL)
        peer = join_sender(spec, 0, host)
        sending = Sending(peer, 0, want, 2048, None)
        q_addr.put(sending.manifests())
        q_out.put(("sender", sending.send()["bytes"]))
        return
    addr, port = q_addr.get(timeout=120)
    spec = GroupSpec("n", 0, addr, port, 1, (1,), "nccl", timeout_s=120, protocol=PYNCCL)
    peer = join_engine(spec, 0)
    manifests = q_addr.get(timeout=120)
    got: dict[str, torch.Tensor] = {}
    receive(peer, manifests, 1, None, lambda t, n, x: got.__setitem__(n, x.cpu()))
    same = set(got) == set(want) and all(torch.equal(got[k], v) for k, v in want.items())
    q_out.put(("engine", same))


@pytest.mark.skipif(_gpus() < 2 or importlib.util.find_spec("vllm") is None,
                    reason="needs two CUDA GPUs and vllm (the gpu extra)")
def test_a_refresh_over_vllms_stateless_nccl_channel() -> None:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    q_addr, q_out = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_nccl_side, args=(r, q_addr, q_out)) for r in ("sender",
                                                                            "engine")]
    for p in procs:
        p.start()
    out = dict(q_out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    want = sum(v.numel() * v.element_size() for v in _state("cpu").values())
    assert out == {"sender": want, "engine": True}
