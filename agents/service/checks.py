"""Checks at the edge of the control service: request bodies, placements, and the errors they raise.

Every refusal is a :class:`ServiceError` whose ``status`` is the HTTP status the proxy answers
with and whose message names the field (``events[3].t_s``) or the foreign ToR/PoD, so a client can
fix its request from the message alone.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from orchestrl.fabric.errors import OrchestrlError
from orchestrl.fabric.intent import STAGES, Intent
from orchestrl.fabric.plan import CircuitPlan
from orchestrl.fabric.safe_window import EVENT_KINDS, CollectiveEvent, EventOrderError
from orchestrl.fabric.topology import PortRef, Topology

__all__ = ["ServiceError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "Unprocessable",
           "check_intent_inside", "plan_outside_placement", "foreign_ports", "reserved_ports", "parse_events",
           "parse_mask_ports", "format_gpus", "integral", "MAX_EVENTS_PER_BATCH", "MAX_JOB_ID_CHARS",
           "DeviceUnavailable", "StorageUnavailable"]

MAX_EVENTS_PER_BATCH = 10_000
MAX_JOB_ID_CHARS = 64  # a job id is one URL path segment (agents.service.jobs.JOB_ID_PATTERN)
_EVENT_FIELDS = ("kind", "t_s", "stage", "primitive", "communicator", "window_hint_s", "seq", "source")


class ServiceError(OrchestrlError):
    """A request the service refuses; ``status`` is the HTTP status, ``field`` the offending field."""

    status = 400

    def __init__(self, reason: str, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(reason)


class BadRequest(ServiceError):
    status = 400


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    status = 403


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class DeviceUnavailable(ServiceError):
    """A device did not answer or refused in a way no re-plan avoids (HTTP 503); ``reason`` names it."""

    status = 503


class StorageUnavailable(ServiceError):
    """The state file refused a write: disk full, read-only, I/O error (HTTP 507); nothing was changed."""

    status = 507


class Unprocessable(ServiceError):
    """The body parsed but a field is invalid (HTTP 422)."""

    status = 422

    def __init__(self, field: str, reason: str) -> None:
        named = f"field '{field}'" in reason or reason.startswith(field)
        super().__init__(reason if named else f"field '{field}': {reason}", field)


def format_gpus(gpus: Iterable[int]) -> str:
    """Return GPU indices as compact ranges.

    >>> format_gpus([5, 0, 1, 2, 7])
    '0-2,5,7'
    """
    xs = sorted(set(gpus))
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def check_intent_inside(intent: Intent, job: Any, topology: Topology, registry: Any) -> None:
    """Refuse (403) an intent that touches GPUs outside ``job``'s placement, naming ToRs and PoDs."""
    foreign = intent.members - job.placement.gpus
    if not foreign:
        return
    tors = sorted({topology.tor_of_gpu(g) for g in foreign} - job.placement.tors)
    pods = sorted({topology.pod_of_gpu(g) for g in foreign} - job.placement.pods)
    named = []
    for tor in tors[:8]:
        owner = registry.owner_of_tor(tor)
        named.append(f"ToR {tor}" + (f" (job {owner!r})" if owner else " (unassigned)"))
    if len(tors) > 8:
        named.append(f"... {len(tors) - 8} more ToRs")
    named += [f"PoD {p}" for p in pods]
    where = "; outside it: " + ", ".join(named) if named else ""
    raise Forbidden(f"job {job.id!r} may only announce intents on its own GPUs; this intent uses GPUs "
                    f"{format_gpus(foreign)} outside its placement{where}", "collectives")


def plan_outside_placement(plan: CircuitPlan, job: Any, topology: Topology) -> list[str]:
    """Return every circuit of ``plan`` that uses a port outside ``job``'s ToRs and PoDs, in words."""
    out = []
    owners, by_agg, by_core = topology.port_owner, topology.fibre_by_agg, topology.fibre_by_core
    pods, tors = job.placement.pods, job.placement.tors
    for c in plan.circuits:
        for ref in c.xc.ports():
            fibre = by_agg.get(ref) or by_core.get(ref)  # a boundary port belongs to its PoD, an uplink to its ToR
            if not ((fibre.pod in pods) if fibre is not None else owners.get(ref) in tors):
                owner = owners.get(ref)
                out.append(f"circuit {c.xc} uses port {ref} of {owner or 'no cable'}, outside job {job.id!r}'s "
                           f"placement (ToRs {', '.join(sorted(job.placement.tors)[:4])}..., PoDs "
                           f"{', '.join(map(str, sorted(job.placement.pods)))})")
    return out


def foreign_ports(plans: Mapping[str, CircuitPlan | None]) -> frozenset[PortRef]:
    """Return every port used by the given plans (other jobs' circuits)."""
    return frozenset(r for plan in plans.values() if plan is not None for c in plan.circuits for r in c.xc.ports())


def integral(value: Any) -> Any:
    """Return ``value`` as an int when it is an integral float (JSON ``3.0`` is the integer 3)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def reserved_ports(topology: Topology, pods: Iterable[int], others: Mapping[str, CircuitPlan | None]
                   ) -> frozenset[PortRef]:
    """Return the ports of ``others``' circuits that a job on ``pods`` could otherwise use.

    ToRs belong to one job, so another job can only hold such ports on the boundary fibres of a
    PoD both use; the (costly) masked topology is needed only when this is not empty.
    """
    reach = {r for pod in pods for f in topology.boundary.get(pod, ()) for r in (f.agg, f.core)}
    return foreign_ports(others) & reach if reach else frozenset()


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def parse_events(events: Any) -> list[CollectiveEvent]:
    """Return the boundary events of a request body's ``events`` list, all checked first.

    Raises
    ------
    Unprocessable
        Naming ``events`` or ``events[i].<field>`` when anything is malformed (nothing is applied).
    """
    if not isinstance(events, list):
        raise Unprocessable("events", f"expected a list of events, got {type(events).__name__}")
    if len(events) > MAX_EVENTS_PER_BATCH:
        raise Unprocessable("events", f"{len(events)} events in one batch; send at most {MAX_EVENTS_PER_BATCH}")
    out = []
    for i, ev in enumerate(events):
        where = f"events[{i}]"
        if not isinstance(ev, dict):
            raise Unprocessable(where, f"expected an object, got {type(ev).__name__}")
        unknown = sorted(set(ev) - set(_EVENT_FIELDS))
        if unknown:
            raise Unprocessable(f"{where}.{unknown[0]}", f"is not a known field (allowed: {', '.join(_EVENT_FIELDS)})")
        kind = ev.get("kind")
        if kind not in EVENT_KINDS:
            raise Unprocessable(f"{where}.kind", f"is {kind!r} (allowed: {', '.join(EVENT_KINDS)})")
        if not _number(ev.get("t_s")):
            raise Unprocessable(f"{where}.t_s", f"expected a finite number (job clock, seconds), got {ev.get('t_s')!r}")
        for key in ("stage", "primitive", "communicator"):
            if key in ev and not isinstance(ev[key], str):
                raise Unprocessable(f"{where}.{key}", f"expected a string, got {ev[key]!r}")
        if kind in ("start", "end"):
            if ev.get("stage") not in STAGES:
                raise Unprocessable(f"{where}.stage", f"is {ev.get('stage')!r} (allowed: {', '.join(STAGES)})")
            for key in ("primitive", "communicator"):
                if not ev.get(key):
                    raise Unprocessable(f"{where}.{key}", "is required for start/end events")
        seq = ev.get("seq")
        if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 0):
            raise Unprocessable(f"{where}.seq", f"expected the sender's sequence number (an integer >= 0), got {seq!r}")
        if ev.get("source") is not None and not isinstance(ev["source"], str):
            raise Unprocessable(f"{where}.source", f"expected a string naming the sender, got {ev['source']!r}")
        hint = ev.get("window_hint_s")
        if hint is not None and not (_number(hint) and hint >= 0):
            raise Unprocessable(f"{where}.window_hint_s", f"expected a number >= 0 or null, got {hint!r}")
        try:
            out.append(CollectiveEvent(kind, float(ev["t_s"]), ev.get("stage", ""), ev.get("primitive", ""),
                                       ev.get("communicator", ""), None if hint is None else float(hint)))
        except EventOrderError as exc:
            raise Unprocessable(where, str(exc)) from None
    return out


def parse_mask_ports(ports: Any, topology: Topology) -> list[tuple[str, int, str]]:
    """Return ``(device, port, reason)`` from a request's ``ports`` list, checked against ``topology``."""
    if not isinstance(ports, list) or not ports:
        raise Unprocessable("ports", "expected a non-empty list of {device, port, reason}")
    out = []
    for i, item in enumerate(ports):
        where = f"ports[{i}]"
        if not isinstance(item, dict):
            raise Unprocessable(where, f"expected an object, got {type(item).__name__}")
        unknown = sorted(set(item) - {"device", "port", "reason"})
        if unknown:
            raise Unprocessable(f"{where}.{unknown[0]}", "is not a known field (allowed: device, port, reason)")
        device, port, reason = item.get("device"), integral(item.get("port")), item.get("reason", "failed")
        if not isinstance(device, str) or device not in topology.devices:
            known = ", ".join(list(topology.devices)[:6])
            raise Unprocessable(f"{where}.device", f"unknown device {device!r} (e.g. {known})")
        radix = topology.devices[device].radix_ports
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= radix:
            raise Unprocessable(f"{where}.port", f"expected a duplex port 1..{radix} of {device}, got {port!r}")
        if reason not in ("failed", "reserved"):
            raise Unprocessable(f"{where}.reason", f"is {reason!r} (allowed: failed, reserved)")
        out.append((device, port, reason))
    return out
