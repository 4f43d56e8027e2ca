"""A timed probe of the trainers' collectives: the per-call costs the cost model prices each kind
of call at (`coll_base_s` and its kin), measured on the group the training runs on, as the
training framework calls it.

Right after the trainers' process group forms (`executors.training.Training.setup`), every rank
times `REPS` rounds of four kinds of call on small messages, so that the time is the calls'
latency, not bytes:

  all_reduce  a plain all-reduce of a 1 KiB buffer (the clip norm, any other plain call), which
              fits `coll_base_s`;
  fsdp_unit   the forward and backward of one small linear layer under FSDP2 (`fully_shard`
              over the group, as `executors.sharding.shard` wraps each decoder layer): two calls
              a round, the parameter all-gather and the gradient reduce-scatter, each with the
              framework's own work around it (copy-in, copy-out, hooks: what a training step
              pays per FSDP unit), which fits `fsdp_call_s`;
  gather      a whole-tensor gather of a sharded tensor to host memory (`DTensor.full_tensor`),
              what the weight sync and a checkpoint call once per tensor: a plain all-gather (one
              ring step where an all-reduce takes two), which fits `gather_call_s`;
  tp_pair     the forward and backward of a column- then row-parallel linear pair under
              DTensor TP (`parallelize_module`, as `executors.sharding.layer_tp_plan` splits
              each decoder layer's attention and MLP): two all-reduces a round with DTensor's
              own work around them, which fits `tp_call_s`.

Each kind becomes `BLOCKS` `collective` trace events per rank (args: collective, ranks, bytes,
calls), which `placer calibrate` prices with `placer.cost.collectives` and fits the per-call costs
from (placer/calibrate/fit_events.py, group "collective"): `coll_base_s` from the all-reduce, each other
kind its own. Without the probe the calls' latency on a slow transport (gloo over loopback,
~0.3-3 ms a call against NCCL's 6.6 us) lands in the train fit's `train_overhead_s`, which a
world of one then pays too.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# rounds per kind: a mean over scheduling noise, ~0.5 s in all over gloo on two cores, where
# blocks of ten rounds of one kind measured 1.0 and 1.5 ms a call back to back
REPS = 40
# timed blocks per kind, one event each: a fit needs 3 events of a kind (`placer.calibrate.fit`), and two
# ranks with one block each would give two
BLOCKS = 4
ELEMENTS = 256  # float32 elements of the all-reduce's buffer (1 KiB): a latency-bound message
UNIT = 16  # the FSDP unit: a UNIT x UNIT linear layer (1 KiB of weights)
KINDS = ("all_reduce", "fsdp_unit", "gather", "tp_pair")


def _fsdp_round(world: int, dev: torch.device) -> tuple[Callable[[], None], int]:
    """One forward + backward of an FSDP2-wrapped linear layer; its gathered bytes."""
    from torch.distributed.device_mesh import init_device_mesh  # lazy: distributed only
    from torch.distributed.fsdp import fully_shard
    layer = nn.Linear(UNIT, UNIT, bias=False).to(dev)
    fully_shard(layer, mesh=init_device_mesh(dev.type, (world,)))
    x = torch.ones(1, UNIT, device=dev)

    def round_() -> None:
        layer(x).sum().backward()
    return round_, UNIT * UNIT * 4


def _tp_round(world: int, dev: torch.device) -> tuple[Callable[[], None], int]:
    """One forward + backward of a column-parallel then a row-parallel linear layer over the
    group, as `executors.sharding.layer_tp_plan` splits a decoder layer's projections (DTensor
    `parallelize_module`): the row-parallel output's all-reduce forward and the column-parallel
    input gradient's backward, two calls a round; their message's bytes."""
    from torch.distributed.device_mesh import init_device_mesh  # lazy: distributed only
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    pair = nn.Sequential(nn.Linear(UNIT, UNIT * world, bias=False),
                         nn.Linear(UNIT * world, UNIT, bias=False)).to(dev)
    parallelize_module(pair, init_device_mesh(dev.type, (world,)),
                       {"0": ColwiseParallel(), "1": RowwiseParallel()})
    x = torch.ones(1, UNIT, device=dev, requires_grad=True)

    def round_() -> None:
        pair(x).sum().backward()
    return round_, UNIT * 4


def _gather_round(world: int, dev: torch.device) -> tuple[Callable[[], None], int]:
    """One whole-tensor gather of a sharded 1 KiB tensor to host memory: what the weight sync's
    and a checkpoint's gathers call once per tensor (`DTensor.full_tensor`,
    executors/sharding.py `full_state`, executors/shardckpt.py `full_optim`); its bytes."""
    from torch.distributed.device_mesh import init_device_mesh  # lazy: distributed only
    from torch.distributed.tensor import Shard, distribute_tensor
    t = distribute_tensor(torch.zeros(ELEMENTS * world, device=dev),
                          init_device_mesh(dev.type, (world,)), [Shard(0)])

    def round_() -> None:
        t.full_tensor().cpu()
    return round_, ELEMENTS * world * 4


def probe(world: int, reps: int = REPS) -> list[dict[str, Any]]:
    """Per kind and block, {collective, ranks, bytes, calls, t0, dur}: `reps` rounds over
    the default group (every rank calls this, in the same order). `bytes` is the message the
    cost model prices (`placer.cost.collectives`): the summed buffer, or the gathered unit."""
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    x = torch.zeros(ELEMENTS, device=dev)
    fsdp, unit_bytes = _fsdp_round(world, dev)
    kinds: dict[str, tuple[Callable[[], Any], int, int]] = {  # fn, bytes, calls per round
        "all_reduce": (lambda: dist.all_reduce(x), x.numel() * x.element_size(), 1),
        "fsdp_unit": (fsdp, unit_bytes, 2), "gather": (*_gather_round(world, dev), 1),
        "tp_pair": (*_tp_round(world, dev), 2)}
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for kind in KINDS:
            fn, nbytes, per_round = kinds[kind]
            fn()  # the first round of a kind sets up its buffers: not timed
            for n in _blocks(reps):
                dist.barrier()  # every rank starts the timed rounds together
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.time()
                for _ in range(n):
                    fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                out.append({"collective": kind, "ranks": world, "bytes": nbytes,
                            "calls": n * per_round, "t0": t0, "dur": time.time() - t0})
    return out


def _blocks(reps: int) -> list[int]:
    """`reps` rounds cut into `BLOCKS` timed blocks (as even as they go, none empty)."""
    k = max(min(BLOCKS, reps), 1)
    return [reps // k + (1 if i < reps % k else 0) for i in range(k)]
