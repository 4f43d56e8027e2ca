"""Joining a role's ranks into one torch.distributed process group (gloo on CPU, NCCL on GPU),
as the trainer's (`executors.trainer`) and a context-parallel critic's (`executors.critic`)
ranks do: rank 0 binds a listening socket on its node's address (`rendezvous`), which the
driver hands to every rank; each then opens the TCPStore on it and joins (`join_group`).

The store's socket is bound to this node's address only (127.0.0.1 in an embedded cluster, the
cluster interface with `--address`) and handed to the store: torch's TCPStore, given just a
port, listens on every interface, unauthenticated. gloo's pairs and NCCL's bootstrap listen on
the same interface. A rank that joins again (a peer was lost) leaves its old group first.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from executors.nodeaddr import _interface_of, _node_ip

TIMEOUT = timedelta(seconds=120)


class GroupMember:
    """A rank of a role's process group: `rank`, `world` and `role` come from the worker."""

    rank: int
    world: int
    role: str
    _store_socket: socket.socket | None = None  # rank 0: the store's, until `join_group`

    def rendezvous(self) -> tuple[str, int]:
        """Address and port of the process group's store, which this rank (0) hosts."""
        ip = _node_ip()
        s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
        s.bind((ip, 0))
        s.listen(128)
        self._store_socket = s
        return ip, s.getsockname()[1]

    def join_group(self, addr: str, port: int) -> None:
        """Join the role's group at the store `addr`:`port` (rank 0's `rendezvous`)."""
        if dist.is_initialized():  # re-forming the group after a peer was lost
            dist.destroy_process_group()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        ifname = _interface_of(_node_ip())
        if ifname:  # gloo's pairs and NCCL's bootstrap listen on this interface only
            os.environ["GLOO_SOCKET_IFNAME"] = ifname  # (loopback when embedded)
            os.environ["NCCL_SOCKET_IFNAME"] = ifname
        listen = self._store_socket if self.rank == 0 else None
        if self.rank == 0 and listen is None:  # without it the store would bind to every interface
            raise RuntimeError(f"{self.role} rank 0: init_group before rendezvous (no store socket)")
        # libuv is the TCPStore server that takes a listening socket made by the caller
        store = dist.TCPStore(addr, port, self.world, self.rank == 0, timeout=TIMEOUT,
                              master_listen_fd=listen.fileno() if listen else None,
                              use_libuv=True)
        if listen is not None:
            listen.detach()  # the store owns the descriptor now; never close it twice
            self._store_socket = None
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world,
                                timeout=TIMEOUT)
