"""The control proxy's HTTP API: FastAPI routes over :class:`agents.service.core.ControlService`.

Design note
-----------
Routes only translate; the service decides. Every route is declared once, with its role, its
request model and its response model (:mod:`agents.http.models`), and the OpenAPI document at
``/openapi.json`` is generated from them (narrowed to the fabric: GPU indices, device names and
port numbers the topology has).

In front of FastAPI sits :class:`Gate`, a plain ASGI middleware that does what must happen
*before* a body is read: match the route, authenticate the bearer token and check the route's role
(``none``, ``operator``, ``any`` = operator or a job, ``job`` = the path's job), refuse a chunked
or oversized body from its headers (413 without reading it), read the body under a deadline (408
for a client that stalls), and refuse a body that is not a JSON object, is nested deeper than
:data:`MAX_JSON_DEPTH` or uses ``NaN``/``Infinity`` (400) before any parser recurses into it. An
unauthenticated client therefore never makes the proxy buffer a body.

Refusals are ``{"error", "reason", "field"}`` with 400 (not a JSON object), 401 (no or unknown
token), 403 (wrong role, another job, GPUs outside the placement), 404, 405, 408, 409, 413, 422
(a field is invalid, and named: ``events[3].t_s``), 503 (a device did not answer, named) or 507
(the state file refused a write); a 500 would be a bug.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import typing
from typing import Any, Callable, Optional

from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from agents.http import models as m
from agents.service.checks import BadRequest, Forbidden, ServiceError, Unauthorized
from agents.service.jobs import JOB_ID_PATTERN
from agents.service.metrics import CONTENT_TYPE
from fabric.config import json_without_duplicates

__all__ = ["create_app", "Gate", "MAX_BODY_BYTES", "MAX_JSON_DEPTH", "API_VERSION", "ERROR_NAMES"]

log = logging.getLogger(__name__)
API_VERSION = "2.0.0"
MAX_BODY_BYTES = 4 << 20  # an event batch of 10,000 events is about 1.3 MB
MAX_JSON_DEPTH = 32  # an intent nests 5 deep; nothing the API takes needs more
ERROR_NAMES = {400: "bad-request", 401: "unauthorized", 403: "forbidden", 404: "not-found", 405: "method-not-allowed",
               408: "request-timeout", 409: "conflict", 413: "too-large", 422: "unprocessable",
               500: "internal", 503: "device-unavailable", 507: "storage-unavailable"}
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = bytes.maketrans(b"", b"")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_CONSTANT = re.compile(rb"NaN|-?Infinity")


def _error_body(status: int, reason: str, field: str | None = None) -> dict[str, Any]:
    return {"error": ERROR_NAMES.get(status, "error"), "reason": reason, "field": field}


def _error(status: int, reason: str, field: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
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
            return _error(401, "missing bearer token; send 'Authorization: Bearer <token>'")
        if scheme.lower() != "bearer" or not token.strip():
            return _error(401, "the Authorization header must be 'Bearer <token>'")
        who = self.service.registry.authenticate(token.strip())
        if who is None:
            return _error(401, "unknown token; use the operator token or the token returned when the job was registered")
        method, path = scope["method"], scope["path"]
        if role == "operator" and who.role != "operator":
            return _error(403, f"{method} {path} needs the operator token; a job token may only act for its own job")
        job = path_params.get("job")
        if role == "job" and who.role != "operator" and who.job != job:
            return _error(403, f"this token belongs to job {who.job!r}, not {job!r}; a job may only act for itself")
        scope.setdefault("state", {})["principal"] = who
        return None

    async def _read_body(self, scope: dict, receive: Callable, optional: bool) -> tuple[Optional[Response], Callable]:
        headers = dict(scope["headers"])
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            return _error(400, "chunked bodies are not accepted; send Content-Length", "body",
                          {"Connection": "close"}), receive
        raw = headers.get(b"content-length")
        try:
            declared = int(raw) if raw is not None else 0
        except ValueError:
            return _error(400, f"Content-Length {raw!r} is not a number", "body", {"Connection": "close"}), receive
        if declared < 0 or declared > self.max_body_bytes:
            return _error(413, f"body of {declared} bytes; the proxy accepts at most {self.max_body_bytes} bytes",
                          "body", {"Connection": "close"}), receive
        chunks, size = [], 0
        deadline = time.monotonic() + self.body_timeout_s
        more = declared > 0
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                return _error(408, f"the body did not arrive within {self.body_timeout_s:g} s", "body",
                              {"Connection": "close"}), receive
            if message["type"] == "http.disconnect":
                return Response(status_code=400), receive  # nobody is listening any more
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return _error(413, f"body larger than {self.max_body_bytes} bytes", "body",
                              {"Connection": "close"}), receive
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            check_json_body(body, optional=optional)
        except BadRequest as exc:
            return _error(400, exc.reason, exc.field), receive
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return None, replay


# ---------------------------------------------------------------------------------------------- errors
def _field_of(loc: tuple) -> str | None:
    """``("body", "events", 3, "t_s")`` -> ``"events[3].t_s"``; ``("query", "limit")`` -> ``"limit"``."""
    out = ""
    for part in loc[1:]:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _model_at(model: Any, path: tuple) -> Any:
    """The pydantic model a body path points into (for the names of its fields), or None."""
    def models_in(tp: Any) -> list[Any]:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return [tp]
        return [x for arg in typing.get_args(tp) for x in models_in(arg)]

    for step in path:
        if isinstance(step, int):
            continue
        field = model.model_fields.get(step) if model is not None else None
        found = models_in(field.annotation) if field is not None else []
        model = found[0] if found else None
    return model


def _validation_response(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = next((e for e in errors if e.get("type") != "missing"), errors[0]) if errors else {}
    loc = tuple(first.get("loc", ("body",)))
    kind = first.get("type", "")
    if loc and loc[0] == "body" and (len(loc) == 1 or kind == "json_invalid"):
        if kind == "json_invalid":
            return _error(400, f"body is not valid JSON ({first.get('msg')}); send a JSON object", "body")
        return _error(400, "body must be a JSON object" + ("" if kind == "missing" else f" ({first.get('msg')})"),
                      "body")
    field = _field_of(loc) or "body"
    if kind == "extra_forbidden":
        route = request.scope.get("route")
        body_model = getattr(getattr(route, "body_field", None), "type_", None)
        model = _model_at(body_model, loc[1:-1]) if body_model is not None else None
        allowed = f" (allowed: {', '.join(model.model_fields)})" if model is not None else ""
        return _error(422, f"field '{field}' is not a known field{allowed}", field)
    if kind == "missing":
        return _error(422, f"field '{field}' is required", field)
    given = first.get("input")
    shown = repr(given) if len(repr(given)) <= 80 else repr(given)[:77] + "..."
    return _error(422, f"field '{field}': {first.get('msg')}, got {shown}", field)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(request, exc)

    @app.exception_handler(ServiceError)
    async def refused(request: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status, exc.reason, exc.field)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            return _error(404, f"no route {request.url.path}; see /openapi.json for the API", None, headers)
        if exc.status_code == 405:  # every method of every route on this path, not only the first route's
            methods = {mth for r in request.app.routes if hasattr(r, "methods") and r.methods
                       and r.matches(request.scope)[0] is not Match.NONE for mth in r.methods}
            allow = ", ".join(sorted(methods)) or headers.get("Allow", "")
            headers["Allow"] = allow
            return _error(405, f"{request.method} is not allowed on {request.url.path}; use {allow}", None, headers)
        return _error(exc.status_code, str(exc.detail), None, headers)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, f"internal error ({type(exc).__name__}: {exc}); this is a bug, please report it")


# ---------------------------------------------------------------------------------------------- routes
_COMMON = (400, 401, 403, 408, 413, 422, 503, 507)
_WHY = {400: "The body is not a JSON object (or nests too deep).", 401: "No bearer token, or an unknown one.",
        403: "The token may not do this (operator only, another job, GPUs outside the placement).",
        404: "No such job.", 408: "The body did not arrive in time.", 409: "A placement clashes, or changed.",
        413: "The body is larger than the proxy accepts.", 422: "A field is invalid; `field` names it.",
        503: "A device did not answer or cannot apply the change; `reason` names it.",
        507: "The state file refused a write (disk full, read-only); nothing changed."}


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": m.Error, "description": _WHY[c]} for c in codes}


JobPath = typing.Annotated[str, Path(pattern=JOB_ID_PATTERN, description="Job id.")]
JobQuery = typing.Annotated[Optional[str], Query(pattern=JOB_ID_PATTERN, description="Only this job.")]
Limit = typing.Annotated[int, Query(ge=1, le=1000, description="Most rows to return.")]


def _role(role: str, optional_body: bool = False) -> Callable[[Callable], Callable]:
    def mark(fn: Callable) -> Callable:
        fn.role = role  # type: ignore[attr-defined]
        fn.optional_body = optional_body  # type: ignore[attr-defined]
        return fn
    return mark


def _scope(request: Request, job: str | None) -> str | None:
    who = request.state.principal
    if who.role == "job":
        if job not in (None, who.job):
            raise Forbidden(f"this token belongs to job {who.job!r}; it may not read job {job!r}", "job")
        return who.job
    return job


def create_app(service: Any, *, max_body_bytes: int = MAX_BODY_BYTES, body_timeout_s: float = 30.0) -> Gate:
    """Return the proxy's ASGI application for ``service`` (a :class:`Gate` around the FastAPI app).

    The FastAPI app itself is ``create_app(...).app``; its ``openapi()`` is the document served at
    ``/openapi.json``.
    """
    app = FastAPI(title="orchestrl OCS control proxy", version=API_VERSION, docs_url=None, redoc_url=None,
                  default_response_class=FiniteJSONResponse,
                  description="Jobs announce intents and report collective boundaries; the proxy plans OCS circuits "
                              "and commits them in safe windows (OrchestrRL §5), audits the devices and repairs drift.")
    _install_error_handlers(app)
    metrics = service.metrics
    metrics.counter("orchestrl_http_requests_total", "HTTP requests by route and status.", ["route", "code"])
    metrics.histogram("orchestrl_http_request_seconds", "HTTP request handling time.", ["route"])
    public = {"security": []}

    @app.get("/healthz", response_model=m.Health, openapi_extra=public, operation_id="health",
             responses={503: {"model": m.Health, "description": "Degraded: `reasons` names each device or store "
                                                                 "problem."}})
    @_role("none")
    def health() -> Any:
        """Health of the proxy, its devices and its state file; no token needed (200 ok, 503 degraded)."""
        doc = service.health()
        return FiniteJSONResponse(jsonable_encoder(doc), status_code=200 if doc["status"] == "ok" else 503)

    @app.get("/metrics", operation_id="metrics", responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text format."},
        **_responses(401, 403)})
    @_role("operator")
    def prometheus() -> Response:
        """Prometheus metrics (operator)."""
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/whoami", response_model=m.WhoAmI, operation_id="whoami", responses=_responses(401))
    @_role("any")
    def whoami(request: Request) -> Any:
        """Who the token belongs to."""
        who = request.state.principal
        return {"role": who.role, "job": who.job}

    @app.post("/v1/jobs", status_code=201, response_model=m.JobToken, operation_id="registerJob",
              responses=_responses(*_COMMON, 409))
    @_role("operator")
    def register_job(body: m.JobRegistration) -> Any:
        """Register a job with its placement (operator); returns the job's token (or rotates it)."""
        info, token = service.register_job(body.job, body.gpus)
        return {**info, "token": token}

    @app.get("/v1/jobs", response_model=m.JobList, operation_id="listJobs", responses=_responses(401, 403))
    @_role("operator")
    def list_jobs() -> Any:
        """List jobs (operator)."""
        return {"jobs": [service.job_doc(j.id) for j in service.registry.jobs()]}

    @app.get("/v1/jobs/{job}", response_model=m.Job, operation_id="getJob", responses=_responses(401, 403, 404, 422))
    @_role("job")
    def get_job(job: JobPath) -> Any:
        """One job (operator or the job itself)."""
        return service.job_doc(job)

    @app.delete("/v1/jobs/{job}", response_model=m.JobRemoval, operation_id="removeJob",
                responses=_responses(401, 403, 404, 422, 503, 507))
    @_role("operator")
    def remove_job(job: JobPath) -> Any:
        """Remove a job (operator): its token stops working and its circuits are freed in the next safe window."""
        return service.remove_job(job)

    @app.post("/v1/jobs/{job}/intents", response_model=m.Decision, operation_id="announceIntent",
              responses=_responses(*_COMMON, 404))
    @_role("job")
    def announce_intent(job: JobPath, body: m.Intent) -> Any:
        """Announce the intent of the job's next communication period."""
        return service.announce_intent(job, body.model_dump(exclude_unset=True)).to_json()

    @app.post("/v1/jobs/{job}/events", response_model=m.EventResult, operation_id="reportEvents",
              responses=_responses(*_COMMON, 404))
    @_role("job")
    def report_events(job: JobPath, body: m.EventBatch) -> Any:
        """Report a batch of collective boundary events; decisions of plans whose window opened come back."""
        return service.report_events(job, [e.model_dump(exclude_none=True) for e in body.events])

    @app.get("/v1/plan", response_model=m.Plans, operation_id="getPlan", responses=_responses(401, 403, 404, 422))
    @_role("any")
    def plan(request: Request, job: JobQuery = None) -> Any:
        """Active plans (a job token sees its own)."""
        return service.plan_doc(_scope(request, job))

    @app.get("/v1/decisions", response_model=m.Decisions, operation_id="getDecisions",
             responses=_responses(401, 403, 404, 422))
    @_role("any")
    def decisions(request: Request, job: JobQuery = None,
                  limit: Limit = 100) -> Any:
        """Decision log, newest first (a job token sees its own)."""
        return {"decisions": service.decisions(_scope(request, job), limit)}

    @app.post("/v1/ports/mask", response_model=m.MaskResult, operation_id="maskPorts", responses=_responses(*_COMMON))
    @_role("operator")
    def mask_ports(body: m.MaskRequest) -> Any:
        """Mask failed or reserved ports and re-plan the jobs using them (operator)."""
        return service.mask_ports([p.model_dump() for p in body.ports], body.replan)

    @app.post("/v1/ports/unmask", response_model=m.UnmaskResult, operation_id="unmaskPorts",
              responses=_responses(*_COMMON))
    @_role("operator")
    def unmask_ports(body: m.UnmaskRequest) -> Any:
        """Return repaired ports to planning (operator); a port the device still reports failed stays masked."""
        return service.unmask_ports([p.model_dump() for p in body.ports], body.replan)

    @app.post("/v1/reconcile", response_model=m.ReconcileResult, operation_id="reconcile",
              responses=_responses(*_COMMON))
    @_role("operator", optional_body=True)
    def reconcile(body: typing.Annotated[Optional[m.ReconcileRequest], Body()] = None) -> Any:
        """Bring every device to the journal now (operator); ``dry_run`` only reports the diff."""
        return service.reconcile_now(dry_run=bool(body and body.dry_run))

    @app.get("/v1/topology", response_model=m.Topology, operation_id="getTopology", responses=_responses(401, 403))
    @_role("operator")
    def topology() -> Any:
        """Fabric, devices, masked ports and job placements (operator)."""
        return service.topology_doc()

    for route in app.routes:  # the gate needs to know which routes take a body
        route.body_field_present = getattr(route, "body_field", None) is not None  # type: ignore[attr-defined]
    app.openapi = lambda: _openapi(app, service)  # type: ignore[method-assign]
    return Gate(app, service, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s)


def _openapi(app: FastAPI, service: Any) -> dict[str, Any]:
    """The generated document, with bearer security and GPU/device/port ranges narrowed to the fabric."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    doc.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    doc["security"] = [{"bearer": []}]
    schemas = doc["components"].get("schemas", {})
    topo = service.controller.topology
    gpus = schemas.get("JobRegistration", {}).get("properties", {}).get("gpus", {})
    for option in gpus.get("anyOf", []):
        if option.get("type") == "array":
            option["items"]["maximum"] = topo.gpu_count - 1
        elif option.get("type") == "integer":
            option["maximum"] = topo.gpu_count - 1
    for name in ("PortRef", "_PortOnly"):
        props = schemas.get(name, {}).get("properties", {})
        if props:
            props["device"]["enum"] = sorted(topo.devices)
            props["port"]["maximum"] = min(d.radix_ports for d in topo.devices.values())
    app.openapi_schema = doc
    return doc
