"""The gate in front of the proxy's routes: role and token, body size, time and shape, before anything reads a body.

Design note
-----------
FastAPI reads (and parses) a request's body before any dependency runs, so a token checked in a
dependency is checked after an unauthenticated client made the proxy buffer its body. :class:`Gate`
is a plain ASGI middleware that runs first: it matches the route, authenticates the bearer token
and checks the route's role (``none``, ``operator``, ``any`` = operator or a job, ``job`` = the
path's job), refuses a chunked or oversized body from its headers (413, unread), reads the body
under a deadline (408 for a client that stalls), and refuses a body that is not one JSON object,
nests deeper than :data:`MAX_JSON_DEPTH`, uses ``NaN``/``Infinity`` or gives a key twice (400),
before any recursive parser sees it. Only then does FastAPI get the request (the body replayed).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from typing import Any, Callable, Optional

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.routing import Match

from orchestrl.agents.service.checks import BadRequest
from orchestrl.fabric.config import json_without_duplicates

__all__ = ["Gate", "FiniteJSONResponse", "check_json_body", "error_response", "MAX_BODY_BYTES", "MAX_JSON_DEPTH",
           "ERROR_NAMES"]

MAX_BODY_BYTES = 4 << 20  # an event batch of 10,000 events is about 1.3 MB
MAX_JSON_DEPTH = 32  # an intent nests 5 deep; nothing the API takes needs more
ERROR_NAMES = {400: "bad-request", 401: "unauthorized", 403: "forbidden", 404: "not-found", 405: "method-not-allowed",
               408: "request-timeout", 409: "conflict", 413: "too-large", 422: "unprocessable",
               500: "internal", 503: "device-unavailable", 507: "storage-unavailable"}
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_CONSTANT = re.compile(rb"NaN|-?Infinity")


def _error_body(status: int, reason: str, field: str | None = None) -> dict[str, Any]:
    return {"error": ERROR_NAMES.get(status, "error"), "reason": reason, "field": field}


def error_response(status: int, reason: str, field: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    hdrs = dict(headers or {})
    if status == 401:
        hdrs["WWW-Authenticate"] = 'Bearer realm="orchestrl"'
    return JSONResponse(_error_body(status, reason, field), status_code=status, headers=hdrs)


def _finite(doc: Any) -> Any:
    """Replace non-finite floats by None (JSON has no Infinity)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc


class FiniteJSONResponse(JSONResponse):
    """JSON without ``Infinity``: an unknown slack (``inf`` inside the service) is written as ``null``."""

    def render(self, content: Any) -> bytes:
        try:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()
        except ValueError:
            return json.dumps(_finite(content), separators=(",", ":")).encode()


def check_json_body(body: bytes, *, optional: bool = False) -> None:
    """Refuse (400, field ``body``) anything but one JSON object, nested at most :data:`MAX_JSON_DEPTH` deep, each key once.

    The nesting is measured on the bytes with strings blanked out, before a recursive parser sees
    them; so 2,000 nested arrays cost one linear scan, not a ``RecursionError``.

    Raises
    ------
    BadRequest
        Naming what is wrong with the body.

    Notes
    -----
    O(n) in the body's length (two regular-expression passes in C and a scan of its brackets).
    """
    if not body.strip():
        if optional:
            return
        raise BadRequest("the body is empty; send a JSON object", "body")
    skeleton = _STRINGS.sub(b'""', body)
    if _CONSTANT.search(skeleton):
        raise BadRequest("body is not valid JSON (NaN and Infinity are not JSON numbers); send a JSON object", "body")
    depth = deepest = 0
    for c in skeleton.translate(None, _NOT_BRACKETS):
        depth += 1 if c in (91, 123) else -1
        deepest = max(deepest, depth)
    if deepest > MAX_JSON_DEPTH:
        raise BadRequest(f"body nests {deepest} levels deep; the API takes at most {MAX_JSON_DEPTH}", "body")
    try:
        doc = json.loads(body, object_pairs_hook=json_without_duplicates)  # a key given twice would keep the last
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"body is not valid JSON ({exc}); send a JSON object", "body") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"body must be a JSON object, got {type(doc).__name__}", "body")


# ---------------------------------------------------------------------------------------------- gate
class Gate:
    """ASGI middleware: route, role and token checks and a bounded, checked body, before FastAPI reads anything.

    Parameters
    ----------
    app : ASGI app
        The FastAPI application.
    service : ControlService
        Authenticates tokens (its registry) and counts requests (its metrics).
    max_body_bytes : int
        Larger bodies are refused from their ``Content-Length`` (413) without being read.
    body_timeout_s : float
        A body not received within this time is refused (408) and the connection closed.
    """

    def __init__(self, app: Any, service: Any, *, max_body_bytes: int = MAX_BODY_BYTES,
                 body_timeout_s: float = 30.0) -> None:
        self.app, self.service = app, service
        self.max_body_bytes, self.body_timeout_s = max_body_bytes, body_timeout_s
        self._routes: list[tuple[Any, str, bool]] | None = None  # (starlette route, role, body optional)

    def routes(self) -> list[tuple[Any, str, bool]]:
        if self._routes is None:
            fastapi = self.app
            while not isinstance(fastapi, FastAPI):  # under other middleware (none today)
                fastapi = fastapi.app
            self._routes = [(r, getattr(r.endpoint, "role", "none"), getattr(r.endpoint, "optional_body", False))
                            for r in fastapi.routes if hasattr(r, "endpoint")]
        return self._routes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        # when the request reached the application: the service counts the wait from here (its thread hand-off
        # and the other jobs' decisions ahead of it) as gone from the safe window the request asks in
        scope.setdefault("state", {})["arrived"] = time.monotonic()
        status = {"code": 500}
        route_name = "unmatched"

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            found = None
            for route, role, optional in self.routes():
                match, child = route.matches(scope)
                if match is Match.FULL:
                    found = (route, role, optional, child)
                    break
            if found is None:  # 404 or 405: FastAPI answers (through the handlers below)
                return await self.app(scope, receive, counting_send)
            route, role, optional, child = found
            route_name = route.name
            scope["route_name"] = route_name
            refusal = self._authorize(scope, role, child.get("path_params", {}))
            if refusal is None and scope["method"] in ("POST", "PUT", "PATCH", "DELETE") and route.body_field_present:
                refusal, receive = await self._read_body(scope, receive, optional)
            if refusal is not None:
                return await refusal(scope, receive, counting_send)
            await self.app(scope, receive, counting_send)
        finally:
            metrics = self.service.metrics
            metrics.inc("orchestrl_http_requests_total", route=route_name, code=str(status["code"]))
            metrics.observe("orchestrl_http_request_seconds", time.perf_counter() - started, route=route_name)

    def _authorize(self, scope: dict, role: str, path_params: dict) -> Optional[Response]:
        if role == "none":
            return None
        header = ""
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        scheme, _, token = header.partition(" ")
        if not header:
            return error_response(401, "missing bearer token; send 'Authorization: Bearer <token>'")
        if scheme.lower() != "bearer" or not token.strip():
            return error_response(401, "the Authorization header must be 'Bearer <token>'")
        who = self.service.registry.authenticate(token.strip())
        if who is None:
            return error_response(401, "unknown token; use the operator token or the token returned when the job was registered")
        method, path = scope["method"], scope["path"]
        if role == "operator" and who.role != "operator":
            return error_response(403, f"{method} {path} needs the operator token; a job token may only act for its own job")
        job = path_params.get("job")
        if who.events_only and scope.get("route_name") != "report_events":
            return error_response(401, f"job {who.job!r} was removed (DELETE /v1/jobs/{who.job}): its token may only "
                                       "report events (POST /v1/jobs/{job}/events) until its circuits are freed")
        if role == "job" and who.role != "operator" and who.job != job:
            return error_response(403, f"this token belongs to job {who.job!r}, not {job!r}; a job may only act for itself")
        scope.setdefault("state", {})["principal"] = who
        return None

    async def _read_body(self, scope: dict, receive: Callable, optional: bool) -> tuple[Optional[Response], Callable]:
        headers = dict(scope["headers"])
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            return error_response(400, "chunked bodies are not accepted; send Content-Length", "body",
                          {"Connection": "close"}), receive
        raw = headers.get(b"content-length")
        try:
            declared = int(raw) if raw is not None else 0
        except ValueError:
            return error_response(400, f"Content-Length {raw!r} is not a number", "body", {"Connection": "close"}), receive
        if declared < 0 or declared > self.max_body_bytes:
            return error_response(413, f"body of {declared} bytes; the proxy accepts at most {self.max_body_bytes} bytes",
                          "body", {"Connection": "close"}), receive
        chunks, size = [], 0
        deadline = time.monotonic() + self.body_timeout_s
        more = declared > 0
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                return error_response(408, f"the body did not arrive within {self.body_timeout_s:g} s", "body",
                              {"Connection": "close"}), receive
            if message["type"] == "http.disconnect":
                return Response(status_code=400), receive  # nobody is listening any more
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return error_response(413, f"body larger than {self.max_body_bytes} bytes", "body",
                              {"Connection": "close"}), receive
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            check_json_body(body, optional=optional)
        except BadRequest as exc:
            return error_response(400, exc.reason, exc.field), receive
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return None, replay
