"""Serve an ASGI app (the proxy, the phase runtime's permit server) with uvicorn: bounded, timed out, optionally TLS.

Design note
-----------
One server for both HTTP services of orchestrl. The listening socket is bound here, before uvicorn
starts, so that port 0 gives a known port at once and a port in use is a clear error rather than
a log line. Connections are bounded three ways, since asyncio holds no thread per connection but a
client can still hold a slot:

* at most ``max_connections`` at once (uvicorn's ``limit_concurrency``: beyond it, 503);
* a connection that has not sent a complete request head within ``head_timeout_s`` of opening, or
  of its previous response, is closed (uvicorn alone waits forever for a first request and for
  headers sent a byte at a time); an idle kept-alive connection is closed after ``idle_timeout_s``;
* a body must arrive within the app's own deadline (:class:`agents.http.app.Gate`).

TLS is uvicorn's: a certificate and key (``tls_cert``, ``tls_key``) and, for client certificates,
the CA to check them against (``tls_ca``). Every accepted socket has ``TCP_NODELAY``, so a response
on a kept-alive connection is not held back by Nagle's algorithm waiting for the client's delayed
ACK: a response is two writes (headers, body), and without it the second waited ~40 ms, which is
what the stdlib server paid on every kept-alive request.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HttpServer", "bind_socket"]

log = logging.getLogger(__name__)


def bind_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """Return a listening TCP socket on ``host:port`` (port 0: a free one).

    Raises
    ------
    OSError
        When the address is in use or cannot be bound (the caller names the option at fault).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and accepted
    # sockets inherit the listener's; with proto 0 every response on a kept-alive connection waited ~40 ms
    # (its headers and body are two writes: Nagle's algorithm held the second until the client's delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class ConnectionLimits:
    """Open connections per listener and per client address, shared by every connection of one server.

    uvicorn's own ``limit_concurrency`` counts every connection of every client together, so 300 half-sent
    request heads from one address took every slot and health answered 503 for everyone (issue 28.5).
    Here a client address may hold at most ``per_client`` connections, and each listener (the main one,
    and the operator's ``--admin-listen`` one) has its own total, so one address, or many on the main
    listener, never starves the other listener.

    Priority on a full listener: a new connection takes the slot of the connection that has waited longest
    for a request head (half-sent heads, idle kept-alive connections), which is closed. A client that sends
    its request at once (a health probe, an operator, a job) is then always served, even on the main
    listener while many addresses hold it full of stalled heads; only when every slot is a request in
    progress is a new connection refused (503). Apache's event MPM and nginx close idle and slow
    connections first under the same pressure; this is the same rule for request heads.
    """

    def __init__(self, per_listener: dict[int, int], per_client: int) -> None:
        self.per_listener, self.per_client = per_listener, per_client
        self.by_listener: dict[int, int] = {}
        self.by_client: dict[str, int] = {}
        self.waiting: dict[int, dict[int, Any]] = {}  # listener -> connections awaiting a head, oldest first
        self.refused = 0  # connections closed at once for being over a limit
        self.evicted = 0  # stalled connections closed to admit a new one

    def admit(self, listener: int, client: str) -> str | None:
        """Count a new connection in, or return why it is refused (nothing counted).

        The per-client cap is checked first, so one address cannot evict others' connections by flooding.
        """
        if self.by_client.get(client, 0) >= self.per_client:
            self.refused += 1
            return f"more than {self.per_client} connections from {client}"
        cap = self.per_listener.get(listener)
        if cap is not None and self.by_listener.get(listener, 0) >= cap:
            stalled = self.waiting.get(listener)
            if not stalled:
                self.refused += 1
                return f"more than {cap} connections on this listener, each with a request in progress"
            self.evicted += 1
            next(iter(stalled.values())).evict()  # the oldest wait; its slot is released at once
        self.by_listener[listener] = self.by_listener.get(listener, 0) + 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        return None

    def release(self, listener: int, client: str) -> None:
        self.by_listener[listener] -= 1
        self.by_client[client] -= 1
        if not self.by_client[client]:
            del self.by_client[client]


_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"


def _guarded_protocol(head_timeout_s: float, limits: ConnectionLimits | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol, with a deadline for each request head and per-listener/per-client limits."""

    class GuardedH11(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _counted: tuple[int, str] | None = None

        _evicted = False

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_expired)
            if limits is not None and self._counted is not None:  # a candidate for eviction, oldest first
                limits.waiting.setdefault(self._counted[0], {})[id(self)] = self

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            if limits is not None and self._counted is not None:
                limits.waiting.get(self._counted[0], {}).pop(id(self), None)

        def evict(self) -> None:
            """Close this stalled connection now and free its slot for a new one (ConnectionLimits.admit)."""
            self._disarm()
            if self._counted is not None:
                limits.release(*self._counted)  # type: ignore[union-attr]
                self._counted = None
            self._evicted = True
            self.transport.close()

        def _head_expired(self) -> None:
            self._head_timer = None
            waiting = self.cycle is None or self.cycle.response_complete  # no request being served
            if waiting and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            if limits is not None:
                local = (transport.get_extra_info("sockname") or ("", 0))[1]
                client = str((transport.get_extra_info("peername") or ("?",))[0])
                refused = limits.admit(local, client)
                if refused is not None:  # answered and closed before uvicorn counts or parses anything
                    log.debug("refusing a connection: %s", refused)
                    transport.write(_BUSY)
                    transport.close()
                    self.transport = transport
                    return
                self._counted = (local, client)
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # a head arrived: the app's own deadlines take over

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._evicted:  # its slot was released when it was evicted; uvicorn still tracks it
                super().connection_lost(exc)
                return
            if self._counted is None and limits is not None:
                return  # refused in connection_made: uvicorn never saw it
            if self._counted is not None:
                limits.release(*self._counted)  # type: ignore[union-attr]
                self._counted = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if limits is not None and self._counted is None:
                return  # a refused or evicted connection: its bytes are dropped
            super().data_received(data)

    return GuardedH11


class HttpServer:
    """An ASGI app served by uvicorn on a socket bound at construction.

    Parameters
    ----------
    app : ASGI application
    host, port : str, int
        Address to listen on (port 0: any free port).
    tls_cert, tls_key, tls_ca : str, optional
        PEM files: certificate and key to serve HTTPS; a CA bundle to require client certificates.
    max_connections : int
        Connections (or requests in progress) beyond this get 503.
    head_timeout_s, idle_timeout_s : float
        Deadline for a request head; idle time of a kept-alive connection.

    Raises
    ------
    OSError
        When ``host:port`` cannot be bound.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, tls_cert: str | None = None,
                 tls_key: str | None = None, tls_ca: str | None = None, max_connections: int = 256,
                 head_timeout_s: float = 10.0, idle_timeout_s: float = 5.0, name: str = "orchestrl",
                 max_connections_per_client: int | None = None, admin: tuple[str, int] | None = None,
                 admin_max_connections: int = 64) -> None:
        self.sock = bind_socket(host, port)
        self.admin_sock = None
        if admin is not None:
            try:
                self.admin_sock = bind_socket(*admin)
            except OSError:
                self.sock.close()
                raise
        self.tls = tls_cert is not None
        self.limits = None
        if max_connections_per_client is not None or admin is not None:
            caps = {self.sock.getsockname()[1]: max_connections}
            if self.admin_sock is not None:
                caps[self.admin_sock.getsockname()[1]] = admin_max_connections
            self.limits = ConnectionLimits(caps, max_connections_per_client or max_connections)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off",
            http=_guarded_protocol(head_timeout_s, self.limits),
            # with our own limits, uvicorn's global one would again let one listener starve the other
            limit_concurrency=None if self.limits is not None else max_connections,
            timeout_keep_alive=max(1, int(idle_timeout_s)),
            timeout_graceful_shutdown=5, h11_max_incomplete_event_size=64 * 1024, server_header=False,
            ssl_certfile=tls_cert, ssl_keyfile=tls_key, ssl_ca_certs=tls_ca,
            ssl_cert_reqs=ssl.CERT_REQUIRED if tls_ca else ssl.CERT_NONE)
        self.server = uvicorn.Server(config)
        self.name = name
        self._thread: threading.Thread | None = None

    def _url(self, sock: socket.socket) -> str:
        host, port = sock.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    @property
    def url(self) -> str:
        return self._url(self.sock)

    @property
    def admin_url(self) -> str | None:
        """The operator listener's URL (same API, its own connection budget), if there is one."""
        return self._url(self.admin_sock) if self.admin_sock is not None else None

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (or SIGINT/SIGTERM when run on the main thread)."""
        socks = [self.sock] + ([self.admin_sock] if self.admin_sock is not None else [])
        try:
            self.server.run(sockets=socks)
        finally:
            for sock in socks:
                sock.close()

    def start(self) -> "HttpServer":
        """Serve on a daemon thread; return once it accepts requests."""
        self._thread = threading.Thread(target=self.serve_forever, name=f"{self.name}-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: the HTTP server did not start")
            time.sleep(0.005)
        return self

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop serving (open connections are closed) and wait for the serving thread, if any."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
