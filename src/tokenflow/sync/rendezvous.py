"""Where process groups meet: a TCP store whose server listens on one address only.

``torch.distributed.TCPStore``'s server listens on every interface of the machine, so any host
that can reach the port could join a group or write its keys. Here rank 0 binds the listening
socket itself, on the address the group was given (loopback for a run on one machine; the
node's own address under Ray), and hands it to the store. Gloo's own connections follow the same
address (``GLOO_SOCKET_IFNAME=lo`` on loopback, unless the user set an interface).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket

import torch.distributed as dist


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tcp_store(host: str, port: int, world_size: int, *, is_master: bool, timeout_s: float) -> dist.TCPStore:
    """A store at ``host:port``; the master's server listens on ``host`` alone."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if is_loopback(host):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if not is_master:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout, wait_for_workers=False)
    sock = socket.create_server((host, port))
    # The store owns the descriptor from here on (it closes it when it goes).
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=sock.detach())


def all_gather_bytes(payload: bytes, group=None) -> list[bytes]:
    """Every rank's ``payload``, as bytes moved in tensors: unlike ``all_gather_object``, nothing
    another rank sent is ever unpickled."""
    import torch

    world = dist.get_world_size(group)
    size = torch.tensor([len(payload)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    if payload:
        mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    parts = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return [bytes(p[:int(s.item())].numpy()) for p, s in zip(parts, sizes)]
