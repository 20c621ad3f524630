"""The control proxy's HTTP API: FastAPI routes over :class:`agents.service.core.ControlService`.

Design note
-----------
Routes only translate; the service decides. Every route is declared once, with its role, its
request model and its response model (:mod:`agents.http.models`), and the OpenAPI document at
``/openapi.json`` is generated from them (narrowed to the fabric: GPU indices, device names and
port numbers the topology has).

In front of FastAPI sits :class:`agents.http.gate.Gate`, which does what must happen *before* a
body is read (role and token, size, deadline, shape), so an unauthenticated client never makes
the proxy buffer a body; refusals are written by :mod:`agents.http.errors`.

Refusals are ``{"error", "reason", "field"}`` with 400 (not a JSON object), 401 (no or unknown
token), 403 (wrong role, another job, GPUs outside the placement), 404, 405, 408, 409, 413, 422
(a field is invalid, and named: ``events[3].t_s``), 503 (a device did not answer, named) or 507
(the state file refused a write); a 500 would be a bug.
"""

from __future__ import annotations

import typing
from typing import Any, Callable, Optional

from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response

from orchestrl.agents.http import models as m
from orchestrl.agents.http.errors import install_error_handlers
from orchestrl.agents.http.gate import MAX_BODY_BYTES, FiniteJSONResponse, Gate
from orchestrl.agents.service.checks import Forbidden
from orchestrl.agents.service.jobs import JOB_ID_PATTERN
from orchestrl.agents.service.metrics import CONTENT_TYPE

__all__ = ["create_app", "API_VERSION"]

API_VERSION = "2.0.0"

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
    install_error_handlers(app)
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
    def announce_intent(request: Request, job: JobPath, body: m.Intent) -> Any:
        """Announce the intent of the job's next communication period."""
        return service.announce_intent(job, body.model_dump(exclude_unset=True),
                                       arrived=getattr(request.state, "arrived", None)).to_json()

    @app.post("/v1/jobs/{job}/events", response_model=m.EventResult, operation_id="reportEvents",
              responses=_responses(*_COMMON, 404))
    @_role("job")
    def report_events(request: Request, job: JobPath, body: m.EventBatch) -> Any:
        """Report a batch of collective boundary events; decisions of plans whose window opened come back."""
        return service.report_events(job, [e.model_dump(exclude_none=True) for e in body.events],
                                     arrived=getattr(request.state, "arrived", None))

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

    @app.post("/v1/adopted/release", response_model=m.ReleaseResult, operation_id="releaseAdopted",
              responses=_responses(*_COMMON))
    @_role("operator", optional_body=True)
    def release_adopted(body: typing.Annotated[Optional[m.ReleaseRequest], Body()] = None) -> Any:
        """Release the circuits adopted at start-up that no job explains (operator); a dry run unless told."""
        return service.release_adopted(dry_run=True if body is None else body.dry_run)

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
