"""The coordination store every weight-sync rank talks to: a ``torch.distributed.TCPStore``, hosted by rank 0.

Design note
-----------
torch's TCPStore server (the libuv one, the default since torch 2.4) serves every client from one thread,
and for each *new* connection it formats the client's address with ``getnameinfo`` without
``NI_NUMERICHOST``: a reverse DNS lookup, made on that one thread. Where the resolver is slow or drops the
query, the whole store stops answering for the resolver's timeout (5 s with glibc's defaults) each time a
client connects, and every rank's store call waits with it. Measured on loopback on the development host,
where it also explains a CI failure (a rejoin test whose ranks, at ``timeout_s=4``, declared the store
lost): the server listens on a dual-stack IPv6 socket, so a client on 127.0.0.1 arrives as
``::ffff:127.0.0.1``, which ``/etc/hosts`` does not list, so the lookup goes to DNS (gdb showed the
``pt_tcpstore_uv`` thread in ``send_dg`` for ``1.0.0.127.in-addr.arpa``, poll timeout 5000 ms).

:func:`tcp_store` avoids the IPv6 detour: for an IPv4 host, rank 0 creates the listening socket itself as
an IPv4 socket and hands it to TCPStore (``master_listen_fd``), so clients arrive as plain IPv4 addresses
and ``/etc/hosts`` answers for them. For addresses no local file lists, the lookup still reaches DNS; on a
cluster without working reverse DNS, list the hosts in ``/etc/hosts`` (docs/collectives.md says so).
The weight-sync code also opens its store clients once per :class:`~orchestrl.collectives.WeightSync`, not
once per round, so a round does not add connections while it runs.
"""

from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta

import torch.distributed as dist

#: Pending connections the IPv4 listener queues (the kernel caps it at net.core.somaxconn).
BACKLOG = 4096


def _ipv4(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:  # a name: IPv4 if that is all it resolves to
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            return False  # TCPStore reports an unresolvable host itself, in its own words
        return bool(infos) and all(info[0] == socket.AF_INET for info in infos)


def tcp_store(host: str, port: int, *, is_master: bool, timeout_s: float, world_size: int | None = None,
              wait_for_workers: bool = False) -> dist.TCPStore:
    """A TCPStore client of ``host:port``; with ``is_master``, also its server (rank 0).

    With ``is_master`` and ``port=0`` the server listens on a port the kernel picks, which the returned
    store reports as ``.port``: the way to avoid a race for a port picked ahead of time (publish the
    port to the other ranks, e.g. through the launcher). Raises ``OSError`` naming ``host:port`` when
    rank 0 cannot listen there (the port is taken, most often).
    """
    timeout = timedelta(seconds=timeout_s)
    if not is_master or not _ipv4(host):
        return dist.TCPStore(host, port, world_size, is_master, timeout=timeout, wait_for_workers=wait_for_workers)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))  # every interface, as TCPStore's own listener
        sock.listen(BACKLOG)
        port = sock.getsockname()[1]  # the kernel's pick when port was 0
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"rank 0 cannot host the coordination store on port {port}: {exc.strerror}; "
                                 "pick a free port (or stop the process holding it)") from exc
    try:
        store = dist.TCPStore(host, port, world_size, True, timeout=timeout, wait_for_workers=wait_for_workers,
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor from here on
    return store
