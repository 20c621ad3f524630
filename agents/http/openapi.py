"""The OpenAPI 3 description of the control proxy's HTTP API (served at ``/openapi.json``).

It is written by hand, next to the handlers in :mod:`agents.http.proxy`, and is what clients and the
schemathesis fuzz test read: every operation lists every status it can answer.
"""

from __future__ import annotations

import json
from typing import Any

from agents.service.jobs import JOB_ID_PATTERN
from agents.service.checks import MAX_EVENTS_PER_BATCH
from fabric.intent import STAGES
from fabric.safe_window import EVENT_KINDS
from fabric.templates.stages import TEMPLATES

__all__ = ["openapi_document", "API_VERSION"]

API_VERSION = "1.0.0"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERR = _ref("Error")
_ERRORS = {
    "400": _json(_ERR, "The body is not a JSON object."),
    "401": _json(_ERR, "No bearer token, or an unknown one."),
    "403": _json(_ERR, "The token may not do this (operator only, another job, GPUs outside the placement)."),
    "404": _json(_ERR, "No such job."),
    "413": _json(_ERR, "The body is larger than the proxy accepts."),
    "422": _json(_ERR, "A field is invalid; `field` names it."),
}


def _errors(*codes: str) -> dict[str, Any]:
    return {c: _ERRORS[c] for c in codes}


_JOB_PARAM = {"name": "job", "in": "path", "required": True, "description": "Job id.",
              "schema": {"type": "string", "pattern": JOB_ID_PATTERN}}
_JOB_QUERY = {"name": "job", "in": "query", "required": False, "description": "Only this job (operator).",
              "schema": {"type": "string", "pattern": JOB_ID_PATTERN}}

_NUM = {"type": "number"}
_SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error", "reason"], "properties": {
        "error": {"type": "string", "description": "Short kind: unauthorized, forbidden, unprocessable, ..."},
        "reason": {"type": "string", "description": "What was wrong and how to fix it."},
        "field": {"type": ["string", "null"], "description": "The offending field, when one is at fault."}}},
    "JobRegistration": {"type": "object", "required": ["job", "gpus"], "additionalProperties": False, "properties": {
        "job": {"type": "string", "pattern": JOB_ID_PATTERN},
        "gpus": {"description": "GPU indices, or a string like \"0-31,64-95\".",
                 "oneOf": [{"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "integer", "minimum": 0}},
                           {"type": "string", "minLength": 1}, {"type": "integer", "minimum": 0}]}}},
    "Job": {"type": "object", "required": ["job", "gpus", "tors", "pods"], "properties": {
        "job": {"type": "string"}, "gpus": {"type": "integer"}, "tors": {"type": "array", "items": {"type": "string"}},
        "pods": {"type": "array", "items": {"type": "integer"}}, "registered_at": _NUM}},
    "JobToken": {"allOf": [_ref("Job"), {"type": "object", "required": ["token"], "properties": {
        "token": {"type": "string", "description": "The job's bearer token; shown once."}}}]},
    "Intent": {"type": "object", "required": ["stage", "collectives"], "description":
               "An intent document (fabric.intent): stage, optional Megatron layout, collectives.", "properties": {
                   "job": {"type": "string"}, "stage": {"type": "string", "enum": list(STAGES)},
                   "period": {"type": "string"}, "template": {"enum": [*TEMPLATES, None]},
                   "layout": {"type": "object"},
                   "collectives": {"type": "array", "minItems": 1, "items": {"type": "object"}},
                   "t_s": {**_NUM, "description": "Job clock of the announcement (default: last event)."}}},
    "Decision": {"type": "object", "required": ["plan_id", "job", "decision", "reason"], "properties": {
        "plan_id": {"type": "string"}, "job": {"type": "string"}, "stage": {"type": "string"},
        "period": {"type": "string"}, "template": {"type": "string"}, "cache_hit": {"type": "boolean"},
        "decision": {"type": "string", "enum": ["commit", "defer", "reject", "refused", "failed", "unchanged"]},
        "reason": {"type": "string"}, "circuits": {"type": "integer"}, "window_s": {"type": ["number", "null"]},
        "switch_delay_s": _NUM, "plan_s": _NUM, "device_s": _NUM, "removed": {"type": "integer"},
        "added": {"type": "integer"}, "devices": {"type": "array", "items": {"type": "string"}},
        "commit_id": {"type": ["integer", "null"]}, "steps": {"type": "integer"}, "attempt": {"type": "integer"},
        "t_s": _NUM, "at": _NUM}},
    "Event": {"type": "object", "required": ["kind", "t_s"], "additionalProperties": False,
              "allOf": [{"if": {"properties": {"kind": {"enum": ["start", "end"]}}},
                         "then": {"required": ["stage", "primitive", "communicator"]}},
                        {"if": {"properties": {"kind": {"const": "weight-sync-begin"}}},
                         "then": {"properties": {"stage": {"const": "weight-sync"}}}},
                        {"if": {"properties": {"kind": {"const": "deployment-boundary"}}},
                         "then": {"properties": {"stage": {"const": "gen"}}}}], "properties": {
        "kind": {"type": "string", "enum": list(EVENT_KINDS)}, "t_s": _NUM,
        "stage": {"type": "string", "enum": list(STAGES)}, "primitive": {"type": "string", "minLength": 1},
        "communicator": {"type": "string", "minLength": 1}, "window_hint_s": {"type": ["number", "null"], "minimum": 0}}},
    "EventBatch": {"type": "object", "required": ["events"], "additionalProperties": False, "properties": {
        "events": {"type": "array", "maxItems": MAX_EVENTS_PER_BATCH, "items": _ref("Event")}}},
    "EventResult": {"type": "object", "required": ["accepted", "rejected", "decisions"], "properties": {
        "accepted": {"type": "integer"},
        "rejected": {"type": "array", "items": {"type": "object", "properties": {
            "index": {"type": "integer"}, "reason": {"type": "string"}}}},
        "decisions": {"type": "array", "items": _ref("Decision")}}},
    "MaskRequest": {"type": "object", "required": ["ports"], "additionalProperties": False, "properties": {
        "ports": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["device", "port"], "additionalProperties": False, "properties": {
                "device": {"type": "string"}, "port": {"type": "integer", "minimum": 1},
                "reason": {"type": "string", "enum": ["failed", "reserved"]}}}},
        "replan": {"type": "boolean", "description": "Re-plan jobs whose circuits use a masked port (default true)."}}},
    "MaskResult": {"type": "object", "required": ["masked", "replanned"], "properties": {
        "masked": {"type": "array", "items": {"type": "object"}}, "newly_masked": {"type": "integer"},
        "replanned": {"type": "array", "items": _ref("Decision")}}},
    "Plans": {"type": "object", "required": ["fabric", "jobs"], "properties": {
        "fabric": {"type": "string"}, "jobs": {"type": "object", "additionalProperties": {
            "type": "object", "properties": {"circuits": {"type": "integer"}, "pending": {"type": ["string", "null"]},
                                             "plan": {"type": ["object", "null"]}}}}}},
}


def _for_topology(schemas: dict[str, Any], topology: Any) -> dict[str, Any]:
    """Narrow GPU indices, device names and port numbers to what ``topology`` has."""
    schemas = json.loads(json.dumps(schemas))  # deep copy
    gpus = schemas["JobRegistration"]["properties"]["gpus"]["oneOf"]
    gpus[0]["items"]["maximum"] = gpus[2]["maximum"] = topology.gpu_count - 1
    port = schemas["MaskRequest"]["properties"]["ports"]["items"]["properties"]
    port["device"]["enum"] = sorted(topology.devices)
    port["port"]["maximum"] = min(d.radix_ports for d in topology.devices.values())
    return schemas


def openapi_document(topology: Any = None) -> dict[str, Any]:
    """Return the OpenAPI 3.1 document of the proxy (a fresh dict each call).

    With ``topology`` (a :class:`fabric.topology.Topology`), GPU indices, device names and port
    numbers are narrowed to that fabric, so generated requests reach past the range checks.
    """
    op = _json
    paths = {
        "/healthz": {"get": {"summary": "Liveness; no token needed.", "security": [], "operationId": "health",
                             "responses": {"200": op({"type": "object"}, "The proxy is up.")}}},
        "/metrics": {"get": {"summary": "Prometheus metrics (operator).", "operationId": "metrics", "responses": {
            "200": {"description": "Text exposition format 0.0.4.", "content": {"text/plain": {"schema": {"type": "string"}}}},
            **_errors("401", "403")}}},
        "/v1/whoami": {"get": {"summary": "Who the token belongs to.", "operationId": "whoami", "responses": {
            "200": op({"type": "object", "properties": {"role": {"type": "string"}, "job": {"type": ["string", "null"]}}},
                      "The role and, for a job token, the job."), **_errors("401")}}},
        "/v1/jobs": {
            "post": {"summary": "Register a job with its placement (operator); returns the job's token.",
                     "operationId": "registerJob",
                     "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("JobRegistration")}}},
                     "responses": {"201": op(_ref("JobToken"), "Registered (or token rotated)."),
                                   "409": op(_ERR, "The placement clashes with another job's ToRs, or changed."),
                                   **_errors("400", "401", "403", "413", "422")}},
            "get": {"summary": "List jobs (operator).", "operationId": "listJobs", "responses": {
                "200": op({"type": "object", "properties": {"jobs": {"type": "array", "items": _ref("Job")}}}, "Jobs."),
                **_errors("401", "403")}}},
        "/v1/jobs/{job}": {"get": {"summary": "One job (operator or the job itself).", "operationId": "getJob",
                                   "parameters": [_JOB_PARAM], "responses": {
                                       "200": op(_ref("Job"), "The job."), **_errors("401", "403", "404")}}},
        "/v1/jobs/{job}/intents": {"post": {
            "summary": "Announce the intent of the job's next communication period.", "operationId": "announceIntent",
            "parameters": [_JOB_PARAM],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("Intent")}}},
            "responses": {"200": op(_ref("Decision"), "What was decided: committed, deferred, refused, ..."),
                          **_errors("400", "401", "403", "404", "413", "422")}}},
        "/v1/jobs/{job}/events": {"post": {
            "summary": "Report a batch of collective boundary events.", "operationId": "reportEvents",
            "parameters": [_JOB_PARAM],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("EventBatch")}}},
            "responses": {"200": op(_ref("EventResult"), "Events taken; decisions of plans whose window opened."),
                          **_errors("400", "401", "403", "404", "413", "422")}}},
        "/v1/plan": {"get": {"summary": "Active plans (a job token sees its own).", "operationId": "getPlan",
                             "parameters": [_JOB_QUERY], "responses": {
                                 "200": op(_ref("Plans"), "Plans by job."), **_errors("401", "403", "404")}}},
        "/v1/decisions": {"get": {
            "summary": "Decision log, newest first (a job token sees its own).", "operationId": "getDecisions",
            "parameters": [_JOB_QUERY, {"name": "limit", "in": "query", "required": False,
                                        "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
            "responses": {"200": op({"type": "object", "properties": {
                "decisions": {"type": "array", "items": _ref("Decision")}}}, "Decisions."),
                **_errors("401", "403", "404", "422")}}},
        "/v1/ports/mask": {"post": {
            "summary": "Mask failed or reserved ports and re-plan the jobs using them (operator).",
            "operationId": "maskPorts",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("MaskRequest")}}},
            "responses": {"200": op(_ref("MaskResult"), "Masked."), **_errors("400", "401", "403", "413", "422")}}},
        "/v1/topology": {"get": {"summary": "Fabric, devices, masked ports and job placements (operator).",
                                 "operationId": "getTopology", "responses": {
                                     "200": op({"type": "object"}, "The fabric."), **_errors("401", "403")}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "orchestrl OCS control proxy", "version": API_VERSION,
                 "description": "Jobs announce intents and report collective boundaries; the proxy plans OCS "
                                "circuits and commits them in safe windows (OrchestrRL §5)."},
        "paths": paths,
        "components": {"schemas": _for_topology(_SCHEMAS, topology) if topology is not None else _SCHEMAS,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
