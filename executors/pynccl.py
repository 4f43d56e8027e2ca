"""A weight-sync channel on vLLM's own NCCL machinery (`executors.syncgroup.PyNccl`).

vLLM's RLHF example forms the trainer-to-workers group outside torch.distributed's global
state: a `StatelessProcessGroup` (a store, a rank and a world size) over which a
`PyNcclCommunicator` exchanges NCCL's unique id, then broadcasts on a CUDA stream (vLLM @
081b8e32, examples/offline_inference/rlhf_utils.py `stateless_init_process_group`,
`WorkerExtension.update_weight`). verl and OpenRLHF form their vLLM weight-update groups the
same way. Here every member of a channel does so, the trainer's senders too, on the channel's
own store (the group's host serves it, `executors.syncgroup.Peer`), and the channel answers
`syncgroup._bcast` as a torch process group would. vLLM is imported only when a channel forms.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class NcclChannel:
    """A channel formed on vLLM's communicator, answering `_bcast` as a torch process group
    does: each broadcast is issued on the current CUDA stream (vLLM's example passes
    `torch.cuda.current_stream()`), so the buffer is ready for whatever that stream runs next;
    the work's `wait` has nothing left to wait for."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def broadcast(self, bufs: list[torch.Tensor], opts: Any) -> NcclChannel:
        self.comm.broadcast(bufs[0], src=opts.rootRank, stream=torch.cuda.current_stream())
        return self

    def wait(self) -> bool:
        return True


def pynccl_channel(store: dist.Store, rank: int, world: int) -> NcclChannel:
    """One channel on vLLM's stateless group and NCCL communicator (vLLM's
    `StatelessProcessGroup`, a dataclass of rank, world size, store and the listening socket
    it keeps alive, built here on the channel's own store, which the group's host serves;
    `PyNcclCommunicator(group, device=)` exchanges NCCL's unique id over it). RuntimeError
    when the communicator comes up disabled (vLLM before 0.6.5 left it off until
    `change_state`)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator  # lazy: GPU
    from vllm.distributed.utils import StatelessProcessGroup
    group = StatelessProcessGroup(rank=rank, world_size=world, store=store, socket=None)
    comm = PyNcclCommunicator(group, device=torch.device("cuda", torch.cuda.current_device()))
    if comm.disabled:
        raise RuntimeError("weight sync: vLLM's NCCL communicator came up disabled")
    return NcclChannel(comm)
