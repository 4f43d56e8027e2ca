"""This node's address and the network interface that carries it: what the trainers' group
and the weight-sync group bind their stores and their gloo / NCCL sockets to (127.0.0.1 in an
embedded cluster, the cluster interface with `--address`), never every interface."""
from __future__ import annotations

import fcntl
import socket
import struct


def _interface_of(ip: str) -> str | None:
    """The network interface whose (IPv4) address is `ip`, or None: gloo otherwise picks the
    interface of the host name's address, which may be a public one."""
    siocgifaddr = 0x8915  # Linux: an interface's IPv4 address
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on it
        if socket.inet_ntoa(packed[20:24]) == ip:
            return name
    return None


def _node_ip() -> str:
    try:
        import ray  # lazy: the one-process runtime uses these workers without Ray
        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - no Ray, or no node address: the loopback
        pass
    return "127.0.0.1"
