"""A world of trainer processes on gloo, for the executor's distributed tests: one spawned
process per rank of `cfg.trainer`, joined into one process group the way the executor joins
them (rank 0 opens the rendezvous, the others take its address), then running the test's body.

  run_world(body, cfg, *args)   spawn the ranks; each runs body(rank, trainer, *args); every
                                one must exit 0
`SPAWN` is the multiprocessing context the ranks start in (queues handed to them come from it):
a fork server that imports torch and the trainer once per test session, so each rank forks with
them loaded instead of importing them again (~3 s of CPU per rank, and a world has up to four
ranks on the machine's few cores). The server imports modules and runs nothing, so unlike a
fork of the test process, which has run torch, a rank inherits no torch threads or locks.
"""
from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

import torch

from executors.roles import RunConfig
from executors.trainer import Trainer

SPAWN = mp.get_context("forkserver")
# What the ranks import, most of it lazily when the first model loads (transformers' modeling,
# which pulls in torch._dynamo) or is sharded; a module missing here a rank imports itself.
SPAWN.set_forkserver_preload([
    "torch", "torch.distributed.fsdp", "torch.distributed.tensor.parallel", "safetensors.torch",
    "transformers.modeling_utils", "transformers.models.llama.modeling_llama",
    "transformers.models.qwen3_moe.modeling_qwen3_moe", "executors.trainer", "executors.training",
    "executors.checkpoints", "gloo_world"])
JOIN_TIMEOUT_S = 300


def _joined(rank: int, cfg: RunConfig, q_addr: Any, body: Callable[..., None],
            args: tuple[Any, ...], make: Callable[..., Any], world: int) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's few cores
    tr = make(cfg, rank, world)
    if rank == 0:
        addr = tr.rendezvous()
        for _ in range(world - 1):
            q_addr.put(addr)
    else:
        addr = q_addr.get(timeout=120)
    tr.init_group(*addr)
    body(rank, tr, *args)


def run_world(body: Callable[..., None], cfg: RunConfig, *args: Any,
              make: Callable[..., Any] = Trainer, world: int | None = None) -> None:
    """Run body(rank, trainer, *args) on every rank of `cfg.trainer`'s world (`body` must be
    a module-level function: the spawned processes import it); `make` (a worker class taking
    (cfg, rank, world), the trainer by default) and `world` for another role's group."""
    q_addr = SPAWN.Queue()
    world = cfg.trainer.world if world is None else world
    procs = [SPAWN.Process(target=_joined, args=(r, cfg, q_addr, body, args, make, world))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=JOIN_TIMEOUT_S)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
