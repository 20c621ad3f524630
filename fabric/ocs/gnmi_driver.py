"""The gNMI adapter: a SONiC OCS switch driven through its OCS tables over gNMI (implements :class:`OcsAdapter`).

Design note
-----------
SONiC's OCS design makes gNMI the northbound interface to CONFIG_DB ``OCS_CROSS_CONNECT``
(``<i>A-<j>B`` -> ``a_side``, ``b_side``) and ``OCS_PORT`` (``state`` ``normal``/``force_blocked``),
with the operational view in STATE_DB (``OCS_PORT`` ``status`` ``tuned``/``tuning``/``blocked``/
``failed``, :mod:`fabric.ocs.gnmi_emulator` gives the sources). This adapter speaks gRPC with the
gNMI 0.8 protobufs pygnmi ships, on one channel per switch, with ``username``/``password`` metadata:

* the read-back is a Get of STATE_DB ``OCS_CROSS_CONNECT`` (what the switch holds, not only what
  was configured);
* a bulk is one SetRequest (updates of ``OCS_CROSS_CONNECT/<id>``, or deletes), which the gNMI
  specification makes one transaction and sonic-gnmi commits as one batch; a step's removal and
  addition are one SetRequest (:meth:`GnmiDriver.apply_step`);
* port state is one Get of CONFIG_DB ``OCS_PORT`` (``force_blocked``) and STATE_DB ``OCS_PORT``
  (``failed``); identity is STATE_DB ``CHASSIS_INFO/chassis 1`` ``serial``.

A refusal (``FAILED_PRECONDITION``/``ABORTED`` with ``[<code>]`` in its message) becomes the same
exception as over TL1; ``DEADLINE_EXCEEDED`` is :class:`OcsTimeout` and ``UNAVAILABLE`` is
:class:`OcsConnectionError` (the command may have been applied: read it back).
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, Iterable

import grpc

from orchestrl.fabric.ocs.adapter import Capabilities, bulk_connect, check_pairs, check_ports, ingress_ids
from orchestrl.fabric.ocs.errors import (OcsAuthError, OcsConnectionError, OcsProtocolError,
                                        OcsTimeout, denied_from_code)
from orchestrl.fabric.ocs.model import BulkResult, PortState, PortStatus, applied_status, normalize_mode
from orchestrl.fabric.ocs.sonic import parse_port, port_name, xc_id

__all__ = ["GnmiDriver"]

_CODE = re.compile(r"^\[([A-Z]{4})\]\s*(.*)$", re.S)
_PORTNUM = re.compile(r"port (\d+)")


class GnmiDriver:
    """Drive one SONiC OCS switch over gNMI.

    Parameters
    ----------
    host, port : str, int
        The switch's gNMI address (8080 by default on SONiC).
    name, user, password, timeout_s, ports, switch_delay_s, max_bulk
        As :class:`fabric.ocs.netconf_driver.NetconfDriver`.
    tls_ca : str, optional
        PEM file of the CA that signed the switch's gNMI certificate: TLS on; None: plaintext gRPC
        (only on a management network you trust, docs/ocs.md).
    """

    def __init__(self, host: str, port: int, *, name: str = "", user: str = "admin", password: str = "",
                 timeout_s: float = 5.0, ports: int | None = None, switch_delay_s: float = 0.0, max_bulk: int = 0,
                 tls_ca: str | None = None, **_: Any) -> None:
        from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc

        self._pb, self._pb_grpc = gnmi_pb2, gnmi_pb2_grpc
        self.host, self.port = host, int(port)
        self.name = name or f"{host}:{port}"
        self.user, self.password = user, password
        self.timeout_s, self.switch_delay_s = float(timeout_s), float(switch_delay_s)
        self.ports, self.max_bulk, self.tls_ca = ports, int(max_bulk), tls_ca
        self.deadline: float | None = None
        self.sessions = 0
        self._channel: Any = None
        self._stub: Any = None
        self._lock = threading.RLock()
        self._md = (("username", user), ("password", password))

    def __enter__(self) -> "GnmiDriver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GnmiDriver(name={self.name!r}, host={self.host!r}, port={self.port})"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities("gnmi", "grpc+tls" if self.tls_ca else "grpc", self.max_bulk or 1 << 20, atomic=True,
                            pipelined=False)

    # -- channel ---------------------------------------------------------------------------------
    def open(self) -> "GnmiDriver":
        with self._lock:
            if self._stub is None:
                target = f"{self.host}:{self.port}"
                if self.tls_ca:
                    with open(self.tls_ca, "rb") as f:
                        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
                    self._channel = grpc.secure_channel(target, creds)
                else:
                    self._channel = grpc.insecure_channel(target)
                self._stub = self._pb_grpc.gNMIStub(self._channel)
                self._call("Capabilities", self._pb.CapabilityRequest())  # log in: refused credentials show now
                self.sessions += 1
            if self.ports is None:
                rows = self._get_tables(("CONFIG_DB", "OCS_PORT"))[0]
                self.ports = len(rows) // 2
                if not self.ports:
                    raise OcsProtocolError(self.name, "Get", "CONFIG_DB OCS_PORT lists no ports; configure the ports")
            return self

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None

    def _wait_s(self, extra_s: float = 0.0) -> float:
        wait = self.timeout_s + extra_s
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise OcsTimeout(self.name, "rpc", "the caller's deadline passed before the command was sent; nothing "
                                                   "was sent")
            wait = min(wait, left)
        return wait

    def _call(self, method: str, request: Any, *, write: bool = False, extra_s: float = 0.0, ports: Iterable[int] = ()) -> Any:
        with self._lock:
            if self._stub is None:
                self.open()
            wait = self._wait_s(extra_s)
            try:
                return getattr(self._stub, method)(request, timeout=wait, metadata=self._md)
            except grpc.RpcError as exc:
                raise self._error(method, exc, wait, write, list(ports)) from None

    def _error(self, method: str, exc: Any, wait: float, write: bool, ports: list[int]) -> Exception:
        code, detail = exc.code(), exc.details() or ""
        maybe = "; the device may have applied the command: read it back" if write else ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return OcsTimeout(self.name, method, f"no reply within {wait:g} s{maybe}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return OcsAuthError(self.name, method, "PIUI", detail)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            self.close()  # a fresh channel next time (a restarted switch)
            return OcsConnectionError(self.name, "connect" if method == "Capabilities" else method,
                                      f"gNMI {code.name}: {detail}{maybe}")
        m = _CODE.match(detail)
        first = _PORTNUM.search(detail)  # the port the refusal is about comes first: "[SAAL] port 9: ..."
        named = [int(first.group(1))] if first else ports
        if m:
            return denied_from_code(self.name, method, m.group(1), m.group(2), named)
        return denied_from_code(self.name, method, "IDNV", f"gNMI {code.name}: {detail}", named)

    # -- paths ------------------------------------------------------------------------------------
    def _path(self, db: str, *elems: str) -> Any:
        pb = self._pb
        return pb.Path(target=db, elem=[pb.PathElem(name=e) for e in elems])

    def _get_tables(self, *where: tuple[str, str], attempt: int = 0) -> list[dict[str, dict[str, Any]]]:
        pb = self._pb
        req = pb.GetRequest(path=[self._path(db, table) for db, table in where], encoding=pb.Encoding.Value("JSON_IETF"))
        try:
            resp = self._call("Get", req)
        except (OcsTimeout, OcsConnectionError):
            if attempt:
                raise
            return self._get_tables(*where, attempt=1)  # a read is sent once more (a lost reply), as over TL1
        out = []
        for note in resp.notification:
            for upd in note.update:
                out.append(json.loads(upd.val.json_ietf_val or upd.val.json_val or b"{}"))
        if len(out) != len(where):
            raise OcsProtocolError(self.name, "Get", f"asked {len(where)} tables, got {len(out)} updates")
        return out

    def _size(self) -> int:
        if self.ports is None:
            self.open()
        assert self.ports is not None
        return self.ports

    # -- the device model -------------------------------------------------------------------------
    def cross_connects(self) -> dict[int, int]:
        """Read back what the switch holds: STATE_DB ``OCS_CROSS_CONNECT``."""
        n = self._size()
        rows = self._get_tables(("STATE_DB", "OCS_CROSS_CONNECT"))[0]
        try:
            return dict(sorted((parse_port(r["a_side"], n), parse_port(r["b_side"], n)) for r in rows.values()))
        except (KeyError, ValueError, TypeError) as exc:
            raise OcsProtocolError(self.name, "Get", f"OCS_CROSS_CONNECT row is not a_side/b_side ports ({exc})") from None

    def _set(self, removals: list[tuple[int, int]], additions: list[tuple[int, int]]) -> None:
        """One SetRequest: delete ``removals``, update ``additions`` (one transaction on the switch)."""
        pb, n = self._pb, self._size()
        req = pb.SetRequest(
            prefix=pb.Path(target="CONFIG_DB"),
            delete=[pb.Path(elem=[pb.PathElem(name="OCS_CROSS_CONNECT"), pb.PathElem(name=xc_id(i, e, n))])
                    for i, e in removals],
            update=[pb.Update(path=pb.Path(elem=[pb.PathElem(name="OCS_CROSS_CONNECT"), pb.PathElem(name=xc_id(i, e, n))]),
                              val=pb.TypedValue(json_ietf_val=json.dumps({"a_side": port_name(i, n),
                                                                          "b_side": port_name(e, n)}).encode()))
                    for i, e in additions])
        self._call("Set", req, write=True, extra_s=self.switch_delay_s if additions else 0.0,
                   ports=[p for pair in additions for p in pair])

    def connect(self, pairs: list[tuple[int, int]], *, mode: str = "stop") -> BulkResult:
        """Create ``(ingress, egress)`` cross-connects, one SetRequest per ``max_bulk`` pairs."""
        mode = normalize_mode(mode, self.name, "Set")
        pairs = check_pairs(pairs, self._size(), self.name, "Set")
        return bulk_connect(pairs, self.max_bulk, mode, lambda part: self._set([], part), self.cross_connects,
                            fatal=(OcsAuthError,))

    def disconnect(self, ports: list[int]) -> BulkResult:
        """Remove the cross-connects on ``ports`` (either side): read the table to name their ids, then one Set."""
        ports = check_ports(ports, self._size(), self.name, "Set")
        if not ports:
            return BulkResult([], "stop")
        table = self.cross_connects()
        pairs = [(i, table[i]) for i in ingress_ids(ports, table)]
        if pairs:
            self._set(pairs, [])
        return BulkResult([applied_status(*p) for p in pairs])

    def apply_step(self, removals: list[tuple[int, int]], additions: list[tuple[int, int]]) -> tuple[BulkResult, BulkResult]:
        """A commit step in one SetRequest: delete ``removals``, then create ``additions``, as one transaction."""
        n = self._size()
        removals = check_pairs(removals, n, self.name, "Set")
        additions = check_pairs(additions, n, self.name, "Set")
        if len(removals) + len(additions) > (self.max_bulk or 1 << 30):
            return (self.disconnect([i for i, _ in removals]) if removals else BulkResult(),
                    self.connect(additions) if additions else BulkResult())
        if removals or additions:
            self._set(removals, additions)
        return (BulkResult([applied_status(*p) for p in removals]),
                BulkResult([applied_status(*p) for p in additions]) if additions else BulkResult())

    def port_status(self, ports: Iterable[int] | None = None) -> dict[int, PortStatus]:
        """CONFIG_DB ``OCS_PORT`` state (``force_blocked``) and STATE_DB ``OCS_PORT`` status (``failed``), in one Get."""
        n = self._size()
        wanted = list(range(1, 2 * n + 1)) if ports is None else check_ports(ports, n, self.name, "Get")
        config, state = self._get_tables(("CONFIG_DB", "OCS_PORT"), ("STATE_DB", "OCS_PORT"))
        out = {}
        for p in wanted:
            name = port_name(p, n)
            if state.get(name, {}).get("status") == "failed":
                out[p] = PortStatus(p, PortState.FAILED, "status failed (STATE_DB OCS_PORT)")
            elif config.get(name, {}).get("state") == "force_blocked":
                out[p] = PortStatus(p, PortState.FORCE_BLOCKED, "state force_blocked (CONFIG_DB OCS_PORT)")
            elif state.get(name, {}).get("status") == "tuning":
                out[p] = PortStatus(p, PortState.TUNING)
            else:
                out[p] = PortStatus(p, PortState.NORMAL)
        return out

    def identity(self) -> str:
        """STATE_DB ``CHASSIS_INFO/chassis 1`` serial."""
        rows = self._get_tables(("STATE_DB", "CHASSIS_INFO"))[0]
        serial = str(rows.get("chassis 1", {}).get("serial", "")).strip()
        if not serial:
            raise OcsProtocolError(self.name, "Get", "STATE_DB CHASSIS_INFO has no serial for 'chassis 1'")
        return f"serial {serial}"

    def block(self, ports: list[int]) -> None:
        """Force-block ``ports``: CONFIG_DB ``OCS_PORT/<port>`` state ``force_blocked``."""
        self._port_state(ports, "force_blocked")

    def release(self, ports: list[int]) -> None:
        self._port_state(ports, "normal")

    def _port_state(self, ports: list[int], state: str) -> None:
        pb, n = self._pb, self._size()
        ports = check_ports(ports, n, self.name, "Set")
        req = pb.SetRequest(prefix=pb.Path(target="CONFIG_DB"), update=[
            pb.Update(path=pb.Path(elem=[pb.PathElem(name="OCS_PORT"), pb.PathElem(name=port_name(p, n))]),
                      val=pb.TypedValue(json_ietf_val=json.dumps({"state": state}).encode())) for p in ports])
        self._call("Set", req, write=True)
