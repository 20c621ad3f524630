"""The NETCONF adapter: a Polatis-YANG optical switch driven with ncclient (implements :class:`OcsAdapter`).

Design note
-----------
The XML is the one ONOS's Polatis driver sends and reads (``drivers/polatis/netconf``, see
docs/ocs.md): cross-connects are ``<cross-connects xmlns="http://www.polatis.com/yang/optical-switch">
<pair><ingress/><egress/></pair>`` edited with ``operation="merge"`` and removed with
``operation="remove"``, read back with ``get-config`` on ``running``; port state comes from
``port-config/port/status`` (``DISABLED``: force-blocked) and ``opm-power/port/power`` (an ingress
port at or below ``los_dbm`` has lost its signal); identity is ``product-information/serial-number``.

One bulk is one ``edit-config`` (with ``error-option rollback-on-error`` where advertised, so it is
applied whole or not at all). Where the switch advertises ``:candidate`` the edit goes to the
candidate datastore and a ``commit`` applies it; with ``:confirmed-commit`` the commit is confirmed
(``confirm-timeout``) and then confirmed by a second commit, so a controller that dies between the
two leaves the switch to roll itself back. A step's removal and addition are one ``edit-config``
(:meth:`NetconfDriver.apply_step`). Errors become the same exceptions as TL1's: the ``rpc-error``'s
``error-app-tag`` when it is an OCS code, else its ``error-tag`` (``in-use``: port in use, ...).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Iterable

from lxml import etree

from orchestrl.fabric.ocs.adapter import Capabilities, bulk_connect, check_pairs, check_ports, ingress_ids
from orchestrl.fabric.ocs.errors import (OcsConnectionError, OcsDenied, OcsError, OcsProtocolError,
                                        OcsTimeout, denied_from_code)
from orchestrl.fabric.ocs.model import BulkResult, PortState, PortStatus, applied_status, normalize_mode

__all__ = ["NetconfDriver", "NS_OPTICAL"]

log = logging.getLogger(__name__)
NS_OPTICAL = "http://www.polatis.com/yang/optical-switch"
_NSMAP = {"o": NS_OPTICAL}
_CANDIDATE = "urn:ietf:params:netconf:capability:candidate:1.0"
_CONFIRMED = "urn:ietf:params:netconf:capability:confirmed-commit:1.1"
_ROLLBACK = "urn:ietf:params:netconf:capability:rollback-on-error:1.0"
# ncclient's session thread checks its send queue between selects of TICK seconds (0.1 s by default,
# ncclient/transport/session.py), so an idle session holds every RPC up to 100 ms before sending it
# (measured here: 102 ms per get-config on loopback). 2 ms bounds that wait at a few hundred idle wake-ups
# a second per session, which a controller with a few dozen switches affords.
NCCLIENT_TICK_S = 0.002
_TAG_CODE = {"in-use": "SAAL", "resource-denied": "SNVS", "lock-denied": "SNVS", "invalid-value": "IIAC",
             "data-exists": "SAAL", "data-missing": "IDNV", "partial-operation": "SABT"}


class NetconfDriver:
    """Drive one optical switch over NETCONF/SSH with ncclient.

    Parameters
    ----------
    host, port : str, int
        The switch's NETCONF/SSH address (830 on most switches).
    name, user, password, timeout_s, ports, switch_delay_s
        As :class:`fabric.ocs.driver.Tl1Driver`.
    max_bulk : int
        Cross-connects per ``edit-config`` (0: no limit); larger bulks are split.
    datastore : str
        ``auto`` (candidate + commit where advertised, else running), ``running`` or ``candidate``.
    confirm_timeout_s : int
        ``confirm-timeout`` of a confirmed commit (used where ``:confirmed-commit`` is advertised);
        0 turns confirmed commits off.
    los_dbm : float
        Ingress power at or below which a port counts as failed (loss of signal).
    ssh_known_hosts : str, optional
        OpenSSH known_hosts file that pins the switch's host key (None: any key is accepted).
    """

    def __init__(self, host: str, port: int, *, name: str = "", user: str = "admin", password: str = "",
                 timeout_s: float = 5.0, ports: int | None = None, switch_delay_s: float = 0.0, max_bulk: int = 0,
                 datastore: str = "auto", confirm_timeout_s: int = 60, los_dbm: float = -40.0,
                 ssh_known_hosts: str | None = None, **_: Any) -> None:
        self.host, self.port = host, int(port)
        self.name = name or f"{host}:{port}"
        self.user, self.password = user, password
        self.timeout_s, self.switch_delay_s = float(timeout_s), float(switch_delay_s)
        self.ports = ports
        self.max_bulk = int(max_bulk)
        self.datastore, self.confirm_timeout_s = datastore, int(confirm_timeout_s)
        self.los_dbm, self.ssh_known_hosts = float(los_dbm), ssh_known_hosts
        self.deadline: float | None = None  # a caller's time.monotonic() that caps every wait
        self.sessions = 0
        self._m: Any = None
        self._caps: frozenset[str] = frozenset()
        self._lock = threading.RLock()

    def __enter__(self) -> "NetconfDriver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NetconfDriver(name={self.name!r}, host={self.host!r}, port={self.port})"

    # -- session ---------------------------------------------------------------------------
    def _wait_s(self, extra_s: float = 0.0) -> float:
        wait = self.timeout_s + extra_s
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise OcsTimeout(self.name, "rpc", "the caller's deadline passed before the command was sent; nothing "
                                                   "was sent")
            wait = min(wait, left)
        return wait

    def open(self) -> "NetconfDriver":
        with self._lock:
            if self._m is not None and self._m.connected:
                return self
            self._drop()
            import ncclient.transport.session as nc_session
            from ncclient import manager
            from ncclient.transport.errors import AuthenticationError

            nc_session.TICK = min(nc_session.TICK, NCCLIENT_TICK_S)

            try:
                self._m = manager.connect(host=self.host, port=self.port, username=self.user, password=self.password,
                                          hostkey_verify=self.ssh_known_hosts is not None,
                                          ssh_config=None, look_for_keys=False, allow_agent=False,
                                          timeout=self._wait_s(), device_params={"name": "default"},
                                          **({"known_hosts_file": self.ssh_known_hosts} if self.ssh_known_hosts else {}))
            except AuthenticationError as exc:
                raise OcsConnectionError(self.name, "connect", f"NETCONF/SSH login as {self.user!r} refused ({exc}); "
                                                               "check the credentials in the secrets file") from None
            except Exception as exc:  # noqa: BLE001 - ncclient raises socket, SSH and transport errors alike
                raise OcsConnectionError(self.name, "connect", f"cannot open NETCONF/SSH to {self.host}:{self.port} "
                                                               f"({type(exc).__name__}: {exc}); check the device is up "
                                                               "and its address in devices.yaml") from None
            self._caps = frozenset(self._m.server_capabilities)
            if self._use_candidate():  # an edit whose session died before its commit must not ride on ours
                try:
                    self._m.timeout = self._wait_s()
                    self._m.discard_changes()
                except Exception as exc:  # noqa: BLE001 - nothing to discard, or the switch refuses: go on
                    log.debug("%s: discard-changes at open: %s", self.name, exc)
            if not any(c.startswith(NS_OPTICAL) for c in self._caps):
                log.warning("%s: the switch does not advertise the Polatis optical-switch module", self.name)
            self.sessions += 1
            if self.ports is None:
                ports = self._get("<port-config xmlns='%s'/>" % NS_OPTICAL).findall(".//o:port-config/o:port", _NSMAP)
                self.ports = len(ports) // 2
                if not self.ports:
                    raise OcsProtocolError(self.name, "get", "port-config lists no ports; configure the device's ports")
            return self

    def close(self) -> None:
        with self._lock:
            if self._m is not None:
                try:
                    self._m.close_session()
                except Exception as exc:  # noqa: BLE001 - closing a dying session is not worth failing for
                    log.debug("%s: close-session failed: %s", self.name, exc)
            self._drop()

    def _drop(self) -> None:
        m, self._m = self._m, None
        if m is not None:
            with contextlib.suppress(Exception):  # the session is already gone: nothing left to close
                m._session.close()

    @property
    def capabilities(self) -> Capabilities:
        self.open()
        return Capabilities("netconf", "ssh", self.max_bulk or 1 << 20, atomic=_ROLLBACK in self._caps
                            or self._use_candidate(), pipelined=False, confirmed_commit=self._confirmed(),
                            candidate=self._use_candidate())

    def _use_candidate(self) -> bool:
        return self.datastore == "candidate" or (self.datastore == "auto" and _CANDIDATE in self._caps)

    def _confirmed(self) -> bool:
        return self._use_candidate() and self.confirm_timeout_s > 0 and _CONFIRMED in self._caps

    def _call(self, what: str, fn: Any, *args: Any, write: bool = False, extra_s: float = 0.0, **kwargs: Any) -> Any:
        """Run one ncclient RPC under the timeout; a lost session or reply becomes OcsConnectionError / OcsTimeout."""
        from ncclient.operations.errors import TimeoutExpiredError
        from ncclient.operations.rpc import RPCError
        from ncclient.transport.errors import TransportError

        with self._lock:
            self.open()
            self._m.timeout = self._wait_s(extra_s)
            try:
                return fn(self._m, *args, **kwargs)
            except RPCError as exc:
                raise self._denied(what, exc) from None
            except TimeoutExpiredError:
                self._drop()
                raise OcsTimeout(self.name, what, f"no reply within {self._m_timeout(extra_s):g} s"
                                 + ("; the device may have applied the command: read it back" if write else "")) from None
            except (TransportError, OSError, EOFError) as exc:
                self._drop()
                raise OcsConnectionError(self.name, what, f"session lost ({type(exc).__name__}: {exc})"
                                         + ("; the device may have applied the command: read it back" if write else "")
                                         ) from None

    def _m_timeout(self, extra_s: float) -> float:
        return self.timeout_s + extra_s

    def _read(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A read, sent once more on a fresh session when its reply is lost (as the TL1 driver does)."""
        try:
            return self._call(what, fn, *args, **kwargs)
        except (OcsTimeout, OcsConnectionError):
            return self._call(what, fn, *args, **kwargs)

    def _denied(self, what: str, exc: Any) -> OcsDenied:
        tag = getattr(exc, "tag", "") or ""
        app = ""
        xml = getattr(exc, "xml", None)
        path = ""
        if xml is not None:
            app = (xml.findtext(".//{*}error-app-tag") or "").strip()
            path = (xml.findtext(".//{*}error-path") or "").strip()
        code = app if len(app) == 4 and app.isupper() else _TAG_CODE.get(tag, "SROF" if tag == "operation-failed" else "IDNV")
        ports = [int(p) for p in __import__("re").findall(r"'(\d+)'", path)]
        message = getattr(exc, "message", None) or str(exc)
        return denied_from_code(self.name, what, code, f"{tag}: {message}".strip(": "), ports)

    def _get(self, *subtrees: str, config: bool = False) -> Any:
        """``get`` (or ``get-config`` on running) with one subtree filter holding ``subtrees``."""
        flt = list(subtrees)  # ncclient builds one <filter type="subtree"> holding every element of a list
        if config:
            reply = self._read("get-config", lambda m: m.get_config(source="running", filter=flt))
        else:
            reply = self._read("get", lambda m: m.get(filter=flt))
        return etree.fromstring(reply.xml.encode() if isinstance(reply.xml, str) else reply.xml)

    # -- the device model ------------------------------------------------------------------------
    def _size(self) -> int:
        if self.ports is None:
            self.open()
        assert self.ports is not None
        return self.ports

    def cross_connects(self) -> dict[int, int]:
        """Read back every cross-connect (``get-config`` of ``cross-connects`` on running)."""
        root = self._get(f"<cross-connects xmlns='{NS_OPTICAL}'/>", config=True)
        out = {}
        for pair in root.iterfind(".//o:cross-connects/o:pair", _NSMAP):
            try:
                out[int(pair.findtext("o:ingress", namespaces=_NSMAP))] = int(pair.findtext("o:egress", namespaces=_NSMAP))
            except (TypeError, ValueError):
                raise OcsProtocolError(self.name, "get-config", f"pair {etree.tostring(pair)[:120]!r} has no numeric "
                                                                "ingress and egress") from None
        return dict(sorted(out.items()))

    def _edit(self, what: str, removals: Iterable[int], additions: Iterable[tuple[int, int]]) -> None:
        """One ``edit-config``: remove the cross-connects on ``removals`` (ingress ports), then merge ``additions``."""
        items = [f"<pair xmlns:nc='urn:ietf:params:xml:ns:netconf:base:1.0' nc:operation='remove'><ingress>{i}"
                 f"</ingress></pair>" for i in removals]
        items += [f"<pair xmlns:nc='urn:ietf:params:xml:ns:netconf:base:1.0' nc:operation='merge'><ingress>{i}</ingress>"
                  f"<egress>{e}</egress></pair>" for i, e in additions]
        config = (f"<config xmlns='urn:ietf:params:xml:ns:netconf:base:1.0'><cross-connects xmlns='{NS_OPTICAL}'>"
                  + "".join(items) + "</cross-connects></config>")
        extra = self.switch_delay_s
        options = {"error_option": "rollback-on-error"} if _ROLLBACK in self._caps else {}
        if not self._use_candidate():
            self._call(what, lambda m: m.edit_config(config, target="running", **options), write=True, extra_s=extra)
            return
        try:
            self._call(what, lambda m: m.edit_config(config, target="candidate", **options), write=True)
            if self._confirmed():
                self._call(what, lambda m: m.commit(confirmed=True, timeout=str(self.confirm_timeout_s)), write=True,
                           extra_s=extra)
                self._call(what, lambda m: m.commit(), write=True)  # confirm: the switch keeps it
            else:
                self._call(what, lambda m: m.commit(), write=True, extra_s=extra)
        except OcsDenied:
            try:  # leave no refused edit in the shared candidate for the next commit
                self._call(what, lambda m: m.discard_changes())
            except OcsError as exc:
                log.warning("%s: discard-changes after a refused edit failed: %s", self.name, exc)
            raise

    def connect(self, pairs: list[tuple[int, int]], *, mode: str = "stop") -> BulkResult:
        """Create ``(ingress, egress)`` cross-connects, one ``edit-config`` per ``max_bulk`` pairs.

        ``mode="stop"``: a refusal raises its :class:`OcsDenied` subclass (the edit is rolled back).
        ``mode="continue"``: a refused pair gets its code and the rest are sent again.
        """
        mode = normalize_mode(mode, self.name, "edit-config")
        pairs = check_pairs(pairs, self._size(), self.name, "edit-config")
        return bulk_connect(pairs, self.max_bulk, mode, lambda part: self._edit("edit-config", (), part),
                            self.cross_connects)

    def disconnect(self, ports: list[int]) -> BulkResult:
        """Remove the cross-connects on ``ports`` (either side): the table is read to name them, then one ``edit-config``."""
        ports = check_ports(ports, self._size(), self.name, "edit-config")
        if not ports:
            return BulkResult([], "stop")
        table = self.cross_connects()
        gone = ingress_ids(ports, table)
        if gone:
            self._edit("edit-config", gone, ())
        return BulkResult([applied_status(i, table[i]) for i in gone])

    def apply_step(self, removals: list[tuple[int, int]], additions: list[tuple[int, int]]) -> tuple[BulkResult, BulkResult]:
        """A commit step in one ``edit-config``: remove ``removals``, then create ``additions``, applied whole."""
        n = self._size()
        removals = check_pairs(removals, n, self.name, "edit-config")
        additions = check_pairs(additions, n, self.name, "edit-config")
        if len(removals) + len(additions) > (self.max_bulk or 1 << 30):
            return self.disconnect([i for i, _ in removals]) if removals else BulkResult(), \
                self.connect(additions) if additions else BulkResult()
        if removals or additions:
            self._edit("edit-config", [i for i, _ in removals], additions)
        return (BulkResult([applied_status(*p) for p in removals]),
                BulkResult([applied_status(*p) for p in additions]) if additions else BulkResult())

    def port_status(self, ports: Iterable[int] | None = None) -> dict[int, PortStatus]:
        """Port states from ``port-config`` (``DISABLED``: force-blocked) and ``opm-power`` (ingress LOS: failed)."""
        n = self._size()
        wanted = list(range(1, 2 * n + 1)) if ports is None else check_ports(ports, n, self.name, "get")
        root = self._get(f"<port-config xmlns='{NS_OPTICAL}'/>", f"<opm-power xmlns='{NS_OPTICAL}'/>")
        disabled = {int(p.findtext("o:port-id", namespaces=_NSMAP)) for p in root.iterfind(".//o:port-config/o:port", _NSMAP)
                    if (p.findtext("o:status", namespaces=_NSMAP) or "").strip().upper() == "DISABLED"}
        dark = {}
        for p in root.iterfind(".//o:opm-power/o:port", _NSMAP):
            port, power = int(p.findtext("o:port-id", namespaces=_NSMAP)), float(p.findtext("o:power", namespaces=_NSMAP))
            if port <= n and power <= self.los_dbm:
                dark[port] = power
        return {p: PortStatus(p, PortState.FAILED, f"LOS ({dark[p]:.2f} dBm)") if p in dark else
                PortStatus(p, PortState.FORCE_BLOCKED, "port DISABLED") if p in disabled else PortStatus(p, PortState.NORMAL)
                for p in wanted}

    def identity(self) -> str:
        """The switch's ``product-information/serial-number``."""
        root = self._get(f"<product-information xmlns='{NS_OPTICAL}'/>")
        serial = (root.findtext(".//o:product-information/o:serial-number", namespaces=_NSMAP) or "").strip()
        if not serial:
            raise OcsProtocolError(self.name, "get", "product-information has no serial-number")
        return f"serial {serial}"

    def block(self, ports: list[int]) -> None:
        """Disable ``ports`` (close their shutters): ``port-config/port/status`` DISABLED."""
        self._ports_status(ports, "DISABLED")

    def release(self, ports: list[int]) -> None:
        self._ports_status(ports, "ENABLED")

    def _ports_status(self, ports: list[int], status: str) -> None:
        ports = check_ports(ports, self._size(), self.name, "edit-config")
        body = "".join(f"<port><port-id>{p}</port-id><status>{status}</status></port>" for p in ports)
        config = (f"<config xmlns='urn:ietf:params:xml:ns:netconf:base:1.0'><port-config xmlns='{NS_OPTICAL}'>{body}"
                  "</port-config></config>")
        self._call("edit-config", lambda m: m.edit_config(config, target="running"), write=True)
