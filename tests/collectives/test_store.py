"""The coordination store rank 0 hosts: IPv4 clients arrive as IPv4 addresses; a taken port is named.

Why it matters (collectives/store.py): torch's store server looks up the name of each new client on its
only thread. On a dual-stack IPv6 listener a client on 127.0.0.1 arrives as ``::ffff:127.0.0.1``, which
``/etc/hosts`` does not list, so the lookup goes to DNS; where DNS drops reverse queries, the store stops
answering for 5 s per new client (measured in this project's CI: a rank declared the store lost).
"""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest

pytest.importorskip("torch", reason="the store is torch's TCPStore (the comms extra)")

import torch.distributed as dist

from orchestrl.collectives.emulation.runner import free_port
from orchestrl.collectives.store import tcp_store


def _listeners(port: int) -> dict[str, int]:
    """How many listening sockets /proc/net/tcp and /proc/net/tcp6 show on ``port``."""
    out = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/net/{table}").read().splitlines()[1:]
        except OSError:
            pytest.skip(f"/proc/net/{table} is not readable here")
        out[table] = sum(1 for line in lines
                         if int(line.split()[1].rsplit(":", 1)[1], 16) == port and line.split()[3] == "0A")
    return out


def test_rank_0_listens_on_ipv4_for_an_ipv4_host_and_clients_are_served():
    port = free_port()
    server = tcp_store("127.0.0.1", port, is_master=True, timeout_s=10)
    assert _listeners(port) == {"tcp": 1, "tcp6": 0}
    client = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=10), wait_for_workers=False)
    client.set("k", "v")
    assert server.get("k") == b"v"


def test_a_taken_port_is_named_with_the_fix():
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(OSError, match=rf"cannot host the coordination store on port {port}.*pick a free port"):
            tcp_store("127.0.0.1", port, is_master=True, timeout_s=5)
    finally:
        holder.close()


def test_rank_0_may_let_the_kernel_pick_the_port_and_clients_reach_it_there():
    server = tcp_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    assert server.port != 0
    assert _listeners(server.port) == {"tcp": 1, "tcp6": 0}
    client = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=10),
                           wait_for_workers=False)
    client.set("k", "v")
    assert server.get("k") == b"v"
