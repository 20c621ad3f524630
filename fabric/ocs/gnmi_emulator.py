"""An emulated SONiC OCS switch serving its OCS tables over gNMI (gRPC), a front-end of :mod:`.device_core`.

Design note
-----------
SONiC's OCS design (sonic-net/SONiC ``doc/ocs/ocs_hld.md``) keeps the configuration in CONFIG_DB
tables ``OCS_CROSS_CONNECT`` (key ``<i>A-<j>B``, fields ``a_side``, ``b_side``) and ``OCS_PORT``
(key ``<i>A``/``<i>B``, fields ``label``, ``state`` = ``normal``/``force_blocked``), and the
operational view in STATE_DB (``OCS_PORT`` ``status`` = ``tuned``/``tuning``/``blocked``/``failed``,
``target_simplex_port_id``; ``OCS_CROSS_CONNECT`` with ``a_side_status``/``b_side_status``); gNMI
is its northbound interface, with one SetRequest committed as one batch (redis MULTI/EXEC in
sonic-gnmi). This target serves those tables the way sonic-gnmi serves DB paths: the prefix (or
path) ``target`` names the DB (``CONFIG_DB``, ``STATE_DB``), the path elements are
``<table>[/<key>[/<field>]]``, values are JSON (``json_ietf_val``), and a ``/`` in a key is not
allowed. Chassis identity is STATE_DB ``CHASSIS_INFO/chassis 1`` (``serial``, ``model``).

A SetRequest is one transaction on the device core, in the gNMI specification's order (deletes,
then replaces, then updates): its removals, then its additions as one bulk (one switching delay); a
refusal undoes the whole request and answers ``FAILED_PRECONDITION`` (``ABORTED`` for a bulk the
partial-bulk fault cut short) with the OCS code in brackets, ``[SAAL] port 3 ...``. Credentials are
the ``username``/``password`` metadata that gNMI clients send (pygnmi, gnmic).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import grpc

from orchestrl.fabric.ocs.device_core import DeviceCore
from orchestrl.fabric.ocs.model import PortState
from orchestrl.fabric.ocs.sonic import parse_port, port_name, xc_id

__all__ = ["GnmiEmulator"]

log = logging.getLogger(__name__)


def _stubs() -> tuple[Any, Any]:
    from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc  # the gNMI 0.8 protobufs as pygnmi ships them

    return gnmi_pb2, gnmi_pb2_grpc


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class GnmiEmulator:
    """gNMI front-end of a :class:`DeviceCore` on a grpc.aio server (``start`` returns the bound address)."""

    def __init__(self, core: DeviceCore) -> None:
        self.core = core
        self.host, self.port = core.config.host, core.config.port
        self._server: Any = None
        core.frontends.append(self)

    async def start(self) -> tuple[str, int]:
        pb, pb_grpc = _stubs()
        servicer = _Servicer(self.core, pb)
        self._server = grpc.aio.server()
        pb_grpc.add_gNMIServicer_to_server(servicer, self._server)
        port = self._server.add_insecure_port(f"{self.host}:{self.port}")
        if port == 0:
            raise OSError(f"cannot bind {self.host}:{self.port}")
        await self._server.start()
        self.port = port
        return self.host, port

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(0)  # every call in flight is cancelled: clients see UNAVAILABLE
            self._server = None


class _Servicer:
    """The gNMI service: Capabilities, Get and Set over the OCS tables (Subscribe is not served)."""

    async def Subscribe(self, request_iterator: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Subscribe is not served by this emulator; use Get")

    def __init__(self, core: DeviceCore, pb: Any) -> None:
        self.core, self.pb = core, pb

    # -- helpers --------------------------------------------------------------------------------
    async def _guard(self, context: Any) -> None:
        md = dict(context.invocation_metadata())
        c = self.core.config
        if md.get("username") != c.user or md.get("password") != c.password:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "username or password is wrong")
        self.core.counters["commands"] += 1

    async def _reply(self, context: Any, message: Any) -> Any:
        if not await self.core.reply_allowed():  # a lost reply: the client's deadline ends the call
            log.info("dropping a gNMI reply (fault injection)")
            await asyncio.Event().wait()
        return message

    def _where(self, prefix: Any, path: Any) -> tuple[str, list[str]]:
        """The DB and the ``[table, key, field]`` names a (prefix, path) pair points at."""
        elems = [e.name for e in (prefix.elem if prefix is not None else [])] + [e.name for e in path.elem]
        target = path.target or (prefix.target if prefix is not None else "")
        if elems and elems[0] in ("CONFIG_DB", "STATE_DB"):
            target, elems = elems[0], elems[1:]
        if elems and elems[0] == "localhost":  # sonic-db:CONFIG_DB/localhost/... as sonic-gnmi writes it
            elems = elems[1:]
        if target not in ("CONFIG_DB", "STATE_DB"):
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"target {target!r} is not served; use CONFIG_DB or STATE_DB")
        return target, elems

    # -- the tables -----------------------------------------------------------------------------
    def _table(self, db: str, table: str) -> dict[str, dict[str, str]]:
        s, n = self.core.state, self.core.n
        xcs = s.cross_connects()
        if table == "OCS_CROSS_CONNECT":
            rows = {}
            for i, e in xcs.items():
                a, b = port_name(i, n), port_name(e, n)
                row = {"a_side": a, "b_side": b}
                if db == "STATE_DB":
                    row.update(a_side_status=self._status(i), b_side_status=self._status(e))
                rows[xc_id(i, e, n)] = row
            return rows
        if table == "OCS_PORT":
            peer = {**xcs, **{e: i for i, e in xcs.items()}}
            rows = {}
            for p in range(1, 2 * n + 1):
                if db == "CONFIG_DB":
                    blocked = s.state(p) is PortState.FORCE_BLOCKED
                    rows[port_name(p, n)] = {"label": "", "state": "force_blocked" if blocked else "normal"}
                else:
                    row = {"status": self._status(p), "connector_type": "LC UPC", "connector_pin": "2" if p <= n else "1"}
                    if p in peer:
                        row["target_simplex_port_id"] = port_name(peer[p], n)
                    rows[port_name(p, n)] = row
            return rows
        if table == "CHASSIS_INFO" and db == "STATE_DB":
            c = self.core.config
            return {"chassis 1": {"serial": c.serial_number, "model": f"EMU-{n}x{n}-{c.profile}"}}
        if table == "DEVICE_METADATA" and db == "CONFIG_DB":
            return {"localhost": {"switch_type": "ocs", "hostname": self.core.config.sid}}
        raise _Refused(grpc.StatusCode.NOT_FOUND, f"table {table!r} is not in {db}")

    def _status(self, port: int) -> str:
        """STATE_DB OCS_PORT status: failed, tuning, tuned (light through a cross-connect) or blocked."""
        st = self.core.state.state(port)
        if st is PortState.FAILED:
            return "failed"
        if st is PortState.TUNING:
            return "tuning"
        if st is PortState.FORCE_BLOCKED or self.core.state.peer(port) is None:
            return "blocked"
        return "tuned"

    # -- RPCs -----------------------------------------------------------------------------------
    async def Capabilities(self, request: Any, context: Any) -> Any:
        await self._guard(context)
        pb = self.pb
        return pb.CapabilityResponse(
            supported_models=[pb.ModelData(name="sonic-ocs", organization="SONiC", version="2026-04-20"),
                              pb.ModelData(name="sonic-ocs-states", organization="SONiC", version="2026-04-20")],
            supported_encodings=[pb.Encoding.Value("JSON_IETF"), pb.Encoding.Value("JSON")], gNMI_version="0.8.0")

    async def Get(self, request: Any, context: Any) -> Any:
        await self._guard(context)
        pb = self.pb
        notifications = []
        try:
            for path in request.path:
                db, (table, *rest) = self._where(request.prefix, path)
                rows = self._table(db, table)
                value: Any = rows
                if rest:
                    if rest[0] not in rows:
                        raise _Refused(grpc.StatusCode.NOT_FOUND, f"{db}/{table}/{rest[0]} does not exist")
                    value = rows[rest[0]]
                    if len(rest) > 1:
                        value = value.get(rest[1], "")
                update = pb.Update(path=path, val=pb.TypedValue(json_ietf_val=json.dumps(value).encode()))
                notifications.append(pb.Notification(prefix=request.prefix, update=[update]))
        except _Refused as r:
            await context.abort(r.code, r.message)
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a path names no table; use <table>[/<key>]")
        return await self._reply(context, pb.GetResponse(notification=notifications))

    async def Set(self, request: Any, context: Any) -> Any:
        await self._guard(context)
        pb = self.pb
        n = self.core.n
        try:
            removals, adds, block, release, results = [], {}, [], [], []
            for path in request.delete:
                db, elems = self._where(request.prefix, path)
                self._config_only(db)
                if elems[:1] == ["OCS_CROSS_CONNECT"]:
                    table = self.core.state.cross_connects()
                    ids = [elems[1]] if len(elems) > 1 else [xc_id(i, e, n) for i, e in table.items()]
                    for key in ids:
                        i, _ = self._xc(key, {})
                        if i in table:
                            removals.append(i)
                results.append(pb.UpdateResult(path=path, op=pb.UpdateResult.DELETE))
            for op, updates in ((pb.UpdateResult.REPLACE, request.replace), (pb.UpdateResult.UPDATE, request.update)):
                for upd in updates:
                    db, elems = self._where(request.prefix, upd.path)
                    self._config_only(db)
                    value = json.loads(upd.val.json_ietf_val or upd.val.json_val or b"{}")
                    rows = {elems[1]: value} if len(elems) > 1 else value
                    if elems[:1] == ["OCS_CROSS_CONNECT"]:
                        if op == pb.UpdateResult.REPLACE and len(elems) == 1:  # the whole table replaced
                            removals.extend(self.core.state.cross_connects())
                        for key, row in rows.items():
                            i, e = self._xc(key, row)
                            adds[i] = e
                    elif elems[:1] == ["OCS_PORT"]:
                        for key, row in rows.items():
                            state = str(row.get("state", "normal"))
                            if state not in ("normal", "force_blocked"):
                                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                                               f"[IDNV] OCS_PORT/{key} state {state!r}: use normal or force_blocked")
                            (block if state == "force_blocked" else release).append(parse_port(key, n))
                    else:
                        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"table {elems[:1]} cannot be set; use "
                                                                         "OCS_CROSS_CONNECT or OCS_PORT")
                    results.append(pb.UpdateResult(path=upd.path, op=op))
            await self._apply(removals, adds)
            self.core.set_blocked(block, True)
            self.core.set_blocked(release, False)
        except _Refused as r:
            await context.abort(r.code, r.message)
        except (ValueError, KeyError, TypeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"[IDNV] {exc}")
        return await self._reply(context, pb.SetResponse(prefix=request.prefix, response=results))

    @staticmethod
    def _config_only(db: str) -> None:
        if db != "CONFIG_DB":
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{db} is read-only; set CONFIG_DB")

    def _xc(self, key: str, row: dict) -> tuple[int, int]:
        """``(ingress, egress)`` of cross-connect ``<i>A-<j>B`` (its row's a_side/b_side must agree)."""
        n = self.core.n
        a, sep, b = key.partition("-")
        if not sep:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"[IDNV] cross-connect id {key!r} is not <i>A-<j>B")
        i, e = parse_port(a, n), parse_port(b, n)
        if i > n or e <= n:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"[IIAC] {key}: a cross-connect joins an A port to a B port")
        if (row.get("a_side", a), row.get("b_side", b)) != (a, b):
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"[IDNV] {key}: a_side/b_side {row} disagree with the id")
        return i, e

    async def _apply(self, removals: list[int], adds: dict[int, int]) -> None:
        """Removals, then the additions as one bulk; a refusal restores what the request removed."""
        table = self.core.state.cross_connects()
        adds = {i: e for i, e in adds.items() if table.get(i) != e or i in removals}
        bad, removed = self.core.remove(list(dict.fromkeys(removals)))
        if bad is not None:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, f"[{bad.status}] {bad.message}")
        if not adds:
            return
        done = await self.core.apply(list(adds.items()))
        if done.refusal is not None:
            self.core.state.connect_atomic(removed)
            r = done.refusal
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, f"[{r.status}] port {r.port}: {r.message}")
        if done.aborted:
            raise _Refused(grpc.StatusCode.ABORTED, f"[SABT] applied {done.applied} of {len(done.pairs)} "
                                                    "cross-connects, then aborted")
