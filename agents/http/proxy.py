"""The control service over HTTP (stdlib server, JSON, bearer tokens).

Design note
-----------
The handler only translates: it reads a bounded body, authenticates the bearer token, checks the
role the route needs, parses JSON and calls :class:`agents.service.core.ControlService`. Refusals are
JSON ``{"error", "reason", "field"}`` with 400 (not a JSON object), 401 (no or unknown token), 403
(wrong role, another job, GPUs outside the placement), 404, 405, 409, 413 or 422 (a field is
invalid, and named); a 500 would be a bug. ``/healthz`` and ``/openapi.json`` need no token; the
job routes accept the operator token or that job's token; everything else is operator-only.
The API is described in :mod:`agents.http.openapi`.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from agents.http.openapi import openapi_document
from agents.service.core import ControlService
from agents.service.checks import BadRequest, Forbidden, ServiceError, Unauthorized, Unprocessable

__all__ = ["ProxyServer", "make_server", "open_service", "MAX_BODY_BYTES"]

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 << 20  # an event batch of 10,000 events is about 1.3 MB
_ERROR_NAMES = {400: "bad-request", 401: "unauthorized", 403: "forbidden", 404: "not-found",
                405: "method-not-allowed", 409: "conflict", 413: "too-large", 422: "unprocessable", 500: "internal"}
_JOB = r"(?P<job>[^/]+)"
# (method, path regex, handler name, role): role "none", "operator", "any" (operator or a job), "job" (path's job)
_ROUTES = [
    ("GET", r"/healthz", "health", "none"), ("GET", r"/openapi\.json", "openapi", "none"),
    ("GET", r"/metrics", "metrics", "operator"), ("GET", r"/v1/whoami", "whoami", "any"),
    ("POST", r"/v1/jobs", "register", "operator"), ("GET", r"/v1/jobs", "list_jobs", "operator"),
    ("GET", rf"/v1/jobs/{_JOB}", "get_job", "job"),
    ("POST", rf"/v1/jobs/{_JOB}/intents", "intent", "job"), ("POST", rf"/v1/jobs/{_JOB}/events", "events", "job"),
    ("GET", r"/v1/plan", "plan", "any"), ("GET", r"/v1/decisions", "decisions", "any"),
    ("POST", r"/v1/ports/mask", "mask", "operator"), ("GET", r"/v1/topology", "topology", "operator"),
]
_COMPILED = [(m, re.compile(p + r"/?"), h, r) for m, p, h, r in _ROUTES]


def _finite(doc: Any) -> Any:
    """Replace non-finite floats by None (JSON has no Infinity)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a client may take to send a request: a stalled client cannot hold a thread forever
    server: "ProxyServer"

    def log_message(self, fmt: str, *args: Any) -> None:  # access log at debug level, not stderr
        log.debug("%s %s", self.address_string(), fmt % args)

    # -- plumbing ------------------------------------------------------------------------------
    def _send(self, status: int, doc: Any, content_type: str = "application/json") -> None:
        if content_type == "application/json":
            try:
                body = json.dumps(doc, allow_nan=False).encode()
            except ValueError:
                body = json.dumps(_finite(doc)).encode()
        else:
            body = str(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type + ("; charset=utf-8" if content_type != "application/json" else ""))
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="orchestrl"')
        if status == 405:
            self.send_header("Allow", getattr(self, "_allow", "GET, POST"))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, reason: str, field: str | None = None) -> None:
        self._send(status, {"error": _ERROR_NAMES.get(status, "error"), "reason": reason, "field": field})

    def _read_body(self) -> bytes | None:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise BadRequest("chunked bodies are not accepted; send Content-Length", "body")
        try:
            n = int(length) if length is not None else 0
        except ValueError:
            self.close_connection = True
            raise BadRequest(f"Content-Length {length!r} is not a number", "body") from None
        if n < 0 or n > MAX_BODY_BYTES:
            self.close_connection = True
            raise _TooLarge(f"body of {n} bytes; the proxy accepts at most {MAX_BODY_BYTES} bytes", "body")
        return self.rfile.read(n) if n else b""

    def _principal(self):
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise Unauthorized("missing bearer token; send 'Authorization: Bearer <token>'")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        who = self.server.service.registry.authenticate(token.strip())
        if who is None:
            raise Unauthorized("unknown token; use the operator token or the token returned when the job was registered")
        return who

    def _dispatch(self, method: str) -> None:
        started = time.perf_counter()
        route, status = "unmatched", 500
        try:
            parts = urlsplit(self.path)
            path, query = parts.path, parse_qs(parts.query, keep_blank_values=True)
            body = self._read_body()
            match = next(((h, r, m) for mm, rx, h, r in _COMPILED if (m := rx.fullmatch(path)) and mm == method), None)
            if match is None:
                allowed = sorted({mm for mm, rx, _, _ in _COMPILED if rx.fullmatch(path)})
                if allowed:
                    status = 405
                    self._allow = ", ".join(allowed)
                    return self._error(405, f"{method} is not allowed on {path}; use {self._allow}")
                status = 404
                return self._error(404, f"no route {path}; see /openapi.json for the API")
            handler, role, m = match
            route = handler
            job = unquote(m.groupdict()["job"]) if "job" in m.groupdict() else None
            who = None if role == "none" else self._principal()
            if role == "operator" and who.role != "operator":
                raise Forbidden(f"{method} {path} needs the operator token; a job token may only act for its own job")
            if role == "job" and who.role != "operator" and who.job != job:
                raise Forbidden(f"this token belongs to job {who.job!r}, not {job!r}; a job may only act for itself")
            status, doc, ctype = getattr(self, "_h_" + handler)(who, job, query, body)
            self._send(status, doc, ctype)
        except ServiceError as exc:
            status = exc.status
            self._error(exc.status, exc.reason, exc.field)
        except Exception as exc:  # noqa: BLE001 - a bug: answer 500 and keep serving
            status = 500
            log.exception("%s %s failed", method, self.path)
            self._error(500, f"internal error ({type(exc).__name__}: {exc}); this is a bug, please report it")
        finally:
            svc = self.server.service
            svc.metrics.inc("orchestrl_http_requests_total", route=route, code=str(status))
            svc.metrics.observe("orchestrl_http_request_seconds", time.perf_counter() - started, route=route)

    def __getattr__(self, name: str) -> Any:
        # BaseHTTPRequestHandler answers 501 to a method without a do_<METHOD>; every method is
        # routed instead, so an unsupported one gets 405 with an Allow header (RFC 9110 15.5.6).
        if name.startswith("do_") and name[3:].isalpha():
            return lambda: self._dispatch(name[3:])
        raise AttributeError(name)

    # -- helpers -------------------------------------------------------------------------------
    @staticmethod
    def _json_body(body: bytes) -> dict[str, Any]:
        try:
            doc = json.loads(body or b"null", parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"body is not valid JSON ({exc}); send a JSON object", "body") from None
        if not isinstance(doc, dict):
            raise BadRequest(f"body must be a JSON object, got {type(doc).__name__}", "body")
        return doc

    @staticmethod
    def _scope(who, query: dict[str, list[str]]) -> str | None:
        wanted = query.get("job", [None])[-1]
        if who.role == "job":
            if wanted not in (None, who.job):
                raise Forbidden(f"this token belongs to job {who.job!r}; it may not read job {wanted!r}", "job")
            return who.job
        return wanted

    # -- handlers: each returns (status, document, content type) -------------------------------
    def _h_health(self, who, job, query, body):
        return 200, self.server.service.health(), "application/json"

    def _h_openapi(self, who, job, query, body):
        return 200, self.server.openapi, "application/json"

    def _h_metrics(self, who, job, query, body):
        return 200, self.server.service.metrics.render(), "text/plain; version=0.0.4"

    def _h_whoami(self, who, job, query, body):
        return 200, {"role": who.role, "job": who.job}, "application/json"

    def _h_register(self, who, job, query, body):
        doc = self._json_body(body)
        unknown = sorted(set(doc) - {"job", "gpus"})
        if unknown:
            raise Unprocessable(unknown[0], "is not a known field (allowed: job, gpus)")
        for key in ("job", "gpus"):
            if key not in doc:
                raise Unprocessable(key, "is required")
        info, token = self.server.service.register_job(doc["job"], doc["gpus"])
        return 201, {**info, "token": token}, "application/json"

    def _h_list_jobs(self, who, job, query, body):
        svc = self.server.service
        return 200, {"jobs": [svc.job_doc(j.id) for j in svc.registry.jobs()]}, "application/json"

    def _h_get_job(self, who, job, query, body):
        return 200, self.server.service.job_doc(job), "application/json"

    def _h_intent(self, who, job, query, body):
        return 200, self.server.service.announce_intent(job, self._json_body(body)).to_json(), "application/json"

    def _h_events(self, who, job, query, body):
        doc = self._json_body(body)
        unknown = sorted(set(doc) - {"events"})
        if unknown:
            raise Unprocessable(unknown[0], "is not a known field (allowed: events)")
        if "events" not in doc:
            raise Unprocessable("events", "is required")
        return 200, self.server.service.report_events(job, doc["events"]), "application/json"

    def _h_plan(self, who, job, query, body):
        return 200, self.server.service.plan_doc(self._scope(who, query)), "application/json"

    def _h_decisions(self, who, job, query, body):
        raw = query.get("limit", ["100"])[-1]
        if not raw.isdigit() or not 1 <= int(raw) <= 1000:
            raise Unprocessable("limit", f"expected an integer 1..1000, got {raw!r}")
        rows = self.server.service.decisions(self._scope(who, query), int(raw))
        return 200, {"decisions": rows}, "application/json"

    def _h_mask(self, who, job, query, body):
        doc = self._json_body(body)
        unknown = sorted(set(doc) - {"ports", "replan"})
        if unknown:
            raise Unprocessable(unknown[0], "is not a known field (allowed: ports, replan)")
        replan = doc.get("replan", True)
        if not isinstance(replan, bool):
            raise Unprocessable("replan", f"expected true or false, got {replan!r}")
        return 200, self.server.service.mask_ports(doc.get("ports"), replan), "application/json"

    def _h_topology(self, who, job, query, body):
        return 200, self.server.service.topology_doc(), "application/json"


class _TooLarge(ServiceError):
    status = 413


class ProxyServer(ThreadingHTTPServer):
    """A threading HTTP server bound to one :class:`ControlService`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], service: ControlService) -> None:
        self.service = service
        self.openapi = openapi_document(service.controller.topology)
        service.metrics.counter("orchestrl_http_requests_total", "HTTP requests by route and status.", ["route", "code"])
        service.metrics.histogram("orchestrl_http_request_seconds", "HTTP request handling time.", ["route"])
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def make_server(service: ControlService, host: str = "127.0.0.1", port: int = 8700) -> ProxyServer:
    """Return a server for ``service`` listening on ``host:port`` (port 0: any free port); not started."""
    return ProxyServer((host, port), service)


def open_service(topology_path: str, devices_path: str, state_path: str, operator_tokens: list[str],
                 gate_min_observations: int | None = None) -> ControlService:
    """Build a service from files: the topology, one TL1 driver per device, the state file."""
    from agents.service.jobs import JobRegistry
    from fabric.ocs.devices import load_devices, open_device
    from fabric.safe_window import GateConfig
    from fabric.runtime.store import FabricStore
    from fabric.topology import load_topology

    topology = load_topology(topology_path)
    configs = load_devices(devices_path, topology)
    store = FabricStore(state_path)
    registry = JobRegistry(topology, operator_tokens, state_path)
    gate = GateConfig(min_observations=gate_min_observations) if gate_min_observations else None
    drivers = {name: open_device(cfg) for name, cfg in configs.items() if name in topology.devices}
    return ControlService(topology, drivers, store, registry, gate_config=gate,
                          switch_delay_s={n: c.switch_delay_s for n, c in configs.items()})
