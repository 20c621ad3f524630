"""What a trainer imports to tell the control proxy about its collectives: batched and never in the way.

Design note
-----------
A training step must never wait for the fabric's control plane, and must keep running when the
proxy is down. So every public call of :class:`HostAgent` only appends one small tuple to a
bounded in-memory queue under a lock (a few microseconds) and returns; a daemon thread drains the
queue and POSTs consecutive boundary events as one batch (``/v1/jobs/{job}/events``) and each
intent on its own (``/v1/jobs/{job}/intents``), in the order they were made, so the proxy sees an
intent after the boundaries that preceded it. When the queue is full the *oldest* item is dropped
(stale boundaries are worth least to the safe-window gate) and counted. When the proxy cannot be
reached, the batch in hand is dropped and counted, and the sender backs off exponentially; no
exception ever reaches the trainer. ``flush`` and ``close`` are the only calls that wait, only for
as long as they are told, and not at all while the proxy is known to be down.

Events carry the job's time, by default wall-clock time read off a monotonic clock anchored once
(so several hosts of one job land on one timeline, and a wall clock stepped by NTP does not move
them), and a sequence number (``seq``) of this agent (``source``): the proxy orders an agent's
events by that number, so a trainer clock that steps back is taken as a clock step rather than as
events "older than the previous" that the proxy would skip. Requests reuse one HTTP connection
(httpx), so each batch costs a request, not a TCP handshake.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import httpx

__all__ = ["HostAgent", "AgentStats"]

log = logging.getLogger(__name__)

_EVENT, _INTENT = "event", "intent"


@dataclass(frozen=True)
class AgentStats:
    """Counters of one agent, for the trainer's own logs."""

    queued: int  # items waiting to be sent
    sent_events: int  # boundary events the proxy accepted
    sent_intents: int  # intents the proxy answered
    dropped_full: int  # items dropped because the queue was full (oldest first)
    dropped_unsent: int  # items dropped because the proxy could not be reached or refused them
    errors: int  # failed requests
    last_error: str  # the most recent failure, in words ("" when none)


class HostAgent:
    """Report collective boundaries and intents of one job to the control proxy, asynchronously.

    Parameters
    ----------
    url : str
        Base URL of the proxy, e.g. ``"http://127.0.0.1:8700"``.
    token : str
        The job's bearer token (returned when the operator registered the job).
    job : str, optional
        The job id; when omitted the sender asks the proxy (``GET /v1/whoami``) before its first post.
    queue_size : int
        Items kept while waiting to be sent; beyond that the oldest are dropped.
    batch_size : int
        Most events sent in one request.
    flush_interval_s : float
        How long the sender waits for more events before posting a partial batch.
    timeout_s : float
        Timeout of one HTTP request (the sender's, never the trainer's).
    on_decision : callable, optional
        Called on the sender thread with each decision record the proxy returns: the answer to an
        intent, and the commits of deferred plans that a batch of events let through.

    Examples
    --------
    With no proxy listening, every call still returns at once and the losses are counted:

    >>> agent = HostAgent("http://127.0.0.1:9", "t", job="j", timeout_s=0.2)
    >>> agent.collective_start("tp0", "train", "all-reduce")
    >>> agent.collective_end("tp0", "train", "all-reduce")
    >>> agent.close(timeout_s=2.0)
    >>> s = agent.stats(); s.sent_events, s.dropped_unsent + s.dropped_full + s.queued
    (0, 2)
    """

    def __init__(self, url: str, token: str, *, job: str | None = None, queue_size: int = 10_000,
                 batch_size: int = 512, flush_interval_s: float = 0.02, timeout_s: float = 2.0,
                 on_decision: Callable[[dict], None] | None = None) -> None:
        if queue_size < 1 or batch_size < 1:
            raise ValueError(f"HostAgent: queue_size={queue_size} and batch_size={batch_size} must be >= 1")
        self.url = url.rstrip("/")
        self.job = job
        self.timeout_s = timeout_s
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.on_decision = on_decision
        self.decisions: deque[dict] = deque(maxlen=256)  # newest decision records the proxy returned
        self._http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 1.0)))
        self.source = f"{socket.gethostname()}:{os.getpid()}:{id(self) & 0xFFFF:04x}"  # whose seq numbers these are
        self._seq = itertools.count()
        self._anchor = (time.time(), time.monotonic())  # job time = wall clock at start + monotonic time since
        self._down = threading.Event()  # the last request failed: flush() does not wait for a proxy that is down
        self._queue: deque[tuple[str, Any]] = deque()
        self._queue_size = queue_size
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._counts = {"sent_events": 0, "sent_intents": 0, "dropped_full": 0, "dropped_unsent": 0, "errors": 0}
        self._last_error = ""
        self._backoff_s = 0.0
        self._thread = threading.Thread(target=self._run, name="orchestrl-host-agent", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ trainer-facing, non-blocking
    def now(self) -> float:
        """Job time in seconds: the wall clock at start plus monotonic time since (never steps back)."""
        return self._anchor[0] + (time.monotonic() - self._anchor[1])

    def collective_start(self, comm: str, stage: str, primitive: str, t_s: float | None = None) -> None:
        """Record that a collective ``primitive`` of ``stage`` started on communicator ``comm``."""
        self._put(_EVENT, {"kind": "start", "t_s": self.now() if t_s is None else t_s, "stage": stage,
                           "primitive": primitive, "communicator": comm})

    def collective_end(self, comm: str, stage: str, primitive: str, t_s: float | None = None) -> None:
        """Record that the oldest open ``primitive`` collective on communicator ``comm`` ended."""
        self._put(_EVENT, {"kind": "end", "t_s": self.now() if t_s is None else t_s, "stage": stage,
                           "primitive": primitive, "communicator": comm})

    def marker(self, kind: str, window_hint_s: float | None = None, t_s: float | None = None) -> None:
        """Record a stage marker: ``"deployment-boundary"`` (gen) or ``"weight-sync-begin"``."""
        ev: dict[str, Any] = {"kind": kind, "t_s": self.now() if t_s is None else t_s}
        if window_hint_s is not None:
            ev["window_hint_s"] = window_hint_s
        self._put(_EVENT, ev)

    def announce(self, intent: Mapping[str, Any], t_s: float | None = None) -> None:
        """Queue ``intent`` (the intent document of :mod:`fabric.intent`) for the next period."""
        doc = dict(intent)
        if t_s is not None:
            doc["t_s"] = t_s
        self._put(_INTENT, doc)

    def _put(self, kind: str, item: Any) -> None:
        with self._lock:
            if kind == _EVENT:
                item["seq"], item["source"] = next(self._seq), self.source
            if len(self._queue) >= self._queue_size:
                self._queue.popleft()
                self._counts["dropped_full"] += 1
            self._queue.append((kind, item))
            self._idle.clear()
            if kind == _INTENT or len(self._queue) >= self.batch_size:
                self._wake.set()

    # ------------------------------------------------------------------ waiting calls
    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued item was sent or dropped; return False on timeout or while the proxy is down.

        While the last request failed (the proxy is down or refused) it returns False at once: the
        sender keeps retrying in the background, but a trainer must not wait for it.
        """
        self._wake.set()
        if self._down.is_set():
            return self._idle.is_set()
        deadline = time.monotonic() + timeout_s
        while not self._idle.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._down.is_set():
                return self._idle.is_set()
            self._idle.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (for at most ``timeout_s``) and stop the sender thread."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._http.close()

    def stats(self) -> AgentStats:
        """Return the agent's counters."""
        with self._lock:
            return AgentStats(len(self._queue), **self._counts, last_error=self._last_error)

    def __enter__(self) -> "HostAgent":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ sender thread
    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._backoff_s and not self._closing:
                self._wake.wait(self._backoff_s)  # close() cuts the back-off short
                self._wake.clear()
            # each call sends one batch; keep going until the queue is drained or a send fails
            drained = False
            while not drained:
                drained = not self._send_some()
            with self._lock:
                if not self._queue:
                    self._idle.set()
                    if self._closing:
                        return
            if self._closing and self._backoff_s:  # proxy down while closing: do not linger
                with self._lock:
                    self._counts["dropped_unsent"] += len(self._queue)
                    self._queue.clear()
                    self._idle.set()
                return

    def _take(self) -> list[tuple[str, Any]]:
        """Pop one intent, or the leading run of events (at most ``batch_size``)."""
        with self._lock:
            if not self._queue:
                return []
            if self._queue[0][0] == _INTENT:
                return [self._queue.popleft()]
            out = []
            while self._queue and self._queue[0][0] == _EVENT and len(out) < self.batch_size:
                out.append(self._queue.popleft())
            return out

    def _send_some(self) -> bool:
        """Send one request's worth; return True when more may be sent right away."""
        items = self._take()
        if not items:
            return False
        try:
            if self.job is None:
                self.job = str(self._request("GET", "/v1/whoami", None)["job"])
            if items[0][0] == _INTENT:
                decisions = [self._request("POST", f"/v1/jobs/{self.job}/intents", items[0][1])]
                self._count("sent_intents", 1)
            else:
                answer = self._request("POST", f"/v1/jobs/{self.job}/events", {"events": [e for _, e in items]})
                self._count("sent_events", len(items))
                decisions = answer.get("decisions", []) if isinstance(answer, dict) else []
            for d in decisions:  # a deferred plan may be committed by the window a batch of events opened
                self.decisions.append(d)
                if self.on_decision is not None:
                    try:
                        self.on_decision(d)
                    except Exception:  # noqa: BLE001 - the caller's callback must not stop the sender
                        log.exception("HostAgent on_decision callback failed")
        except Exception as exc:  # noqa: BLE001 - the trainer must never see the agent fail
            with self._lock:
                self._counts["dropped_unsent"] += len(items)
                self._counts["errors"] += 1
                self._last_error = f"{type(exc).__name__}: {exc}"
            self._backoff_s = min(2.0, max(0.05, 2 * self._backoff_s))
            self._down.set()
            return False
        self._backoff_s = 0.0
        self._down.clear()
        return True

    def _count(self, key: str, n: int) -> None:
        with self._lock:
            self._counts[key] += n

    def _request(self, method: str, path: str, body: Any) -> Any:
        resp = self._http.request(method, path, json=body)
        if resp.status_code >= 400:
            raise RuntimeError(f"{method} {path} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else None
