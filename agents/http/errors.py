"""How the proxy answers a refused request: ``{"error", "reason", "field"}``, the field as a path (``events[3].t_s``).

pydantic's validation errors, the service's refusals (:class:`agents.service.checks.ServiceError`,
each with its status), 404/405 from routing (405 lists every method of the path in ``Allow``) and
any other exception (500, logged: a bug) all become the same error body.
"""

from __future__ import annotations

import logging
import typing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from orchestrl.agents.http.gate import error_response
from orchestrl.agents.service.checks import ServiceError

__all__ = ["install_error_handlers"]

log = logging.getLogger(__name__)


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
            return error_response(400, f"body is not valid JSON ({first.get('msg')}); send a JSON object", "body")
        return error_response(400, "body must be a JSON object" + ("" if kind == "missing" else f" ({first.get('msg')})"),
                      "body")
    field = _field_of(loc) or "body"
    if kind == "extra_forbidden":
        route = request.scope.get("route")
        body_model = getattr(getattr(route, "body_field", None), "type_", None)
        model = _model_at(body_model, loc[1:-1]) if body_model is not None else None
        allowed = f" (allowed: {', '.join(model.model_fields)})" if model is not None else ""
        return error_response(422, f"field '{field}' is not a known field{allowed}", field)
    if kind == "missing":
        return error_response(422, f"field '{field}' is required", field)
    given = first.get("input")
    shown = repr(given) if len(repr(given)) <= 80 else repr(given)[:77] + "..."
    return error_response(422, f"field '{field}': {first.get('msg')}, got {shown}", field)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(request, exc)

    @app.exception_handler(ServiceError)
    async def refused(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc.status, exc.reason, exc.field)

    @app.exception_handler(StarletteHTTPException)
    async def httperror_response(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            return error_response(404, f"no route {request.url.path}; see /openapi.json for the API", None, headers)
        if exc.status_code == 405:  # every method of every route on this path, not only the first route's
            methods = {mth for r in request.app.routes if hasattr(r, "methods") and r.methods
                       and r.matches(request.scope)[0] is not Match.NONE for mth in r.methods}
            allow = ", ".join(sorted(methods)) or headers.get("Allow", "")
            headers["Allow"] = allow
            return error_response(405, f"{request.method} is not allowed on {request.url.path}; use {allow}", None, headers)
        return error_response(exc.status_code, str(exc.detail), None, headers)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, f"internal error ({type(exc).__name__}: {exc}); this is a bug, please report it")
