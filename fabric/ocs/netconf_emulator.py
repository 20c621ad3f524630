"""An emulated optical switch serving NETCONF over SSH with the Polatis optical-switch YANG (a :mod:`.device_core` front-end).

Design note
-----------
SSH is asyncssh's (key exchange, host key, password authentication, the ``netconf`` subsystem);
messages are framed as RFC 6242 has it (``]]>]]>`` until both hellos name base:1.1, then chunked)
and parsed with lxml, so any NETCONF client (ncclient, netconf-console, ONOS) can drive it. The
data follows the Polatis optical-switch module as ONOS's Polatis driver reads and writes it
(``drivers/polatis/netconf``: PolatisFlowRuleProgrammable, PolatisNetconfUtility,
PolatisDeviceDescription), namespace ``http://www.polatis.com/yang/optical-switch``:

* ``cross-connects/pair`` (key ``ingress``, leaf ``egress``): configuration; ``edit-config`` with
  ``operation="merge"`` / ``"create"`` adds, ``"delete"`` / ``"remove"`` removes;
* ``port-config/port`` (``port-id``, ``status`` ``ENABLED``/``DISABLED``, ``label``): configuration;
  ``DISABLED`` closes the port's shutter (force-blocked);
* ``product-information`` (``manufacturer``, ``model-name``, ``serial-number``,
  ``software-version``) and ``opm-power/port`` (``port-id``, ``power`` in dBm): state, ``get`` only.

Capabilities advertised: base 1.0 and 1.1, ``:candidate``, ``:confirmed-commit:1.1``,
``:rollback-on-error`` and the module (revision 2017-08-04, so ONOS's "pair" keyword applies). One
``edit-config`` is one bulk on the device core (one switching delay; removals before additions;
a refusal rolls the whole edit back), answered with ``rpc-error`` whose ``error-app-tag`` carries
the OCS code (``SAAL``, ``SNVS``, ``SWFA``, ``SROF``, ``IIAC``, ``SABT``). A confirmed commit not
confirmed within its timeout is rolled back, as RFC 6241 section 8.4 requires.
"""

from __future__ import annotations

import asyncio
import logging
import re
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from lxml import etree

from orchestrl.fabric.ocs.device_core import DeviceCore
from orchestrl.fabric.ocs.model import PortState

__all__ = ["NetconfEmulator", "NS_OPTICAL", "NS_BASE", "CAPABILITIES"]

log = logging.getLogger(__name__)

NS_BASE = "urn:ietf:params:xml:ns:netconf:base:1.0"
NS_OPTICAL = "http://www.polatis.com/yang/optical-switch"
CAPABILITIES = (
    "urn:ietf:params:netconf:base:1.0", "urn:ietf:params:netconf:base:1.1",
    "urn:ietf:params:netconf:capability:candidate:1.0", "urn:ietf:params:netconf:capability:confirmed-commit:1.1",
    "urn:ietf:params:netconf:capability:rollback-on-error:1.0",
    f"{NS_OPTICAL}?module=optical-switch&revision=2017-08-04",
)
_EOM = b"]]>]]>"
_CHUNK = re.compile(rb"\n#(\d+)\n")
_TAG = {"SAAL": "in-use", "SNVS": "resource-denied", "SWFA": "operation-failed", "SROF": "operation-failed",
        "IIAC": "invalid-value", "IDNV": "invalid-value", "SABT": "partial-operation"}


def _q(tag: str, ns: str = NS_OPTICAL) -> str:
    return f"{{{ns}}}{tag}"


class RpcError(Exception):
    """A refusal sent back as ``<rpc-error>``."""

    def __init__(self, tag: str, message: str, app_tag: str = "", path: str = "", kind: str = "application") -> None:
        super().__init__(message)
        self.tag, self.message, self.app_tag, self.path, self.kind = tag, message, app_tag, path, kind


@dataclass
class _Config:
    """A configuration datastore: the cross-connect table and the disabled (shutter closed) ports."""

    pairs: dict[int, int]
    disabled: set[int]

    def copy(self) -> "_Config":
        return _Config(dict(self.pairs), set(self.disabled))


class NetconfEmulator:
    """NETCONF/SSH front-end of a :class:`DeviceCore` (``start`` returns the bound address)."""

    def __init__(self, core: DeviceCore) -> None:
        self.core = core
        self.host, self.port = core.config.host, core.config.port
        self._server: Any = None
        self._key: Any = None
        self._sessions: set[Any] = set()
        self._session_id = 0
        self._candidate: _Config | None = None  # None: equal to running
        self._confirm: tuple[asyncio.Task, _Config] | None = None  # pending confirmed commit: timer, running before
        self._lock_owner: int | None = None
        core.frontends.append(self)

    async def start(self) -> tuple[str, int]:
        import asyncssh

        from orchestrl.fabric.ocs.ssh_server import password_server, server_key

        self._key = self._key or server_key()
        self._server = await asyncssh.create_server(
            password_server(self.core.config.user, self.core.config.password), self.host, self.port,
            server_host_keys=[self._key], process_factory=self._process, encoding=None)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]
        return self.host, self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for proc in list(self._sessions):
            with suppress(Exception):  # a session already gone
                proc.exit(0)
        self._sessions.clear()
        self._candidate, self._lock_owner = None, None

    # -- framing ---------------------------------------------------------------------------
    async def _process(self, process: Any) -> None:
        if process.subsystem != "netconf":
            process.stderr.write(b"this switch serves the netconf subsystem only\n")
            process.exit(1)
            return
        self._sessions.add(process)
        self._session_id += 1
        sid = self._session_id
        caps = "".join(f"<capability>{c.replace('&', '&amp;')}</capability>" for c in CAPABILITIES)
        process.stdout.write(f'<?xml version="1.0" encoding="UTF-8"?><hello xmlns="{NS_BASE}"><capabilities>{caps}'
                             f"</capabilities><session-id>{sid}</session-id></hello>".encode() + _EOM)
        buf, chunked = b"", False
        try:
            while True:
                data = await process.stdin.read(65536)
                if not data:
                    break
                buf += data
                while True:
                    msg, buf = self._next_message(buf, chunked)
                    if msg is None:
                        break
                    root = etree.fromstring(msg)
                    if etree.QName(root).localname == "hello":
                        peer = {c.text for c in root.iter(f"{{{NS_BASE}}}capability")}
                        chunked = "urn:ietf:params:netconf:base:1.1" in peer
                        continue
                    reply, close = await self._rpc(root, sid)
                    if reply is not None:
                        if not await self.core.reply_allowed():
                            log.info("dropping a NETCONF reply (fault injection)")
                        else:
                            self._send(process, reply, chunked)
                    if close:
                        process.exit(0)
                        return
        except (etree.XMLSyntaxError, ValueError) as exc:
            log.info("NETCONF session %d: malformed message (%s); closing it", sid, exc)
        except Exception as exc:  # noqa: BLE001 - the channel went away mid-read: the session just ends
            log.debug("NETCONF session %d ended: %s", sid, exc)
        finally:
            self._sessions.discard(process)
            if self._lock_owner == sid:
                self._lock_owner = None
            with suppress(Exception):
                process.exit(0)

    @staticmethod
    def _next_message(buf: bytes, chunked: bool) -> tuple[bytes | None, bytes]:
        """One complete message off ``buf`` (RFC 6242: end-of-message marker, or chunks ending ``\\n##\\n``)."""
        if not chunked:
            end = buf.find(_EOM)
            return (None, buf) if end < 0 else (buf[:end], buf[end + len(_EOM):])
        parts, pos = [], 0
        while True:
            if buf[pos:pos + 4] == b"\n##\n":
                return b"".join(parts), buf[pos + 4:]
            m = _CHUNK.match(buf, pos)
            if m is None:
                if len(buf) - pos > 16 and not buf[pos:].startswith(b"\n#"):
                    raise ValueError("bad chunk header")
                return None, buf
            size, start = int(m.group(1)), m.end()
            if len(buf) < start + size:
                return None, buf
            parts.append(buf[start:start + size])
            pos = start + size

    @staticmethod
    def _send(process: Any, xml: bytes, chunked: bool) -> None:
        process.stdout.write(b"\n#%d\n" % len(xml) + xml + b"\n##\n" if chunked else xml + _EOM)

    # -- RPCs -----------------------------------------------------------------------------------
    async def _rpc(self, rpc: Any, sid: int) -> tuple[bytes | None, bool]:
        attrs = " ".join(f'{k}="{v}"' for k, v in rpc.attrib.items())
        head = f'<rpc-reply xmlns="{NS_BASE}" {attrs}>'
        op = next(iter(rpc), None)
        name = etree.QName(op).localname if op is not None else ""
        self.core.counters["commands"] += 1
        try:
            handler = getattr(self, f"_op_{name.replace('-', '_')}", None)
            if handler is None:
                raise RpcError("operation-not-supported", f"operation {name!r} is not supported", kind="protocol")
            body = await handler(op, sid)
        except RpcError as err:
            info = f"<error-app-tag>{err.app_tag}</error-app-tag>" if err.app_tag else ""
            path = f"<error-path>{err.path}</error-path>" if err.path else ""
            body = (f"<rpc-error><error-type>{err.kind}</error-type><error-tag>{err.tag}</error-tag>"
                    f"<error-severity>error</error-severity>{info}{path}"
                    f'<error-message xml:lang="en">{_escape(err.message)}</error-message></rpc-error>')
        return (head + body + "</rpc-reply>").encode(), name in ("close-session", "kill-session")

    def _running(self) -> _Config:
        s = self.core.state
        return _Config(s.cross_connects(), {p for p, st in s.port_status().items() if st.state is PortState.FORCE_BLOCKED})

    def _datastore(self, op: Any, field: str) -> str:
        el = op.find(f"{{{NS_BASE}}}{field}")
        store = etree.QName(el[0]).localname if el is not None and len(el) else "running"
        if store not in ("running", "candidate"):
            raise RpcError("invalid-value", f"datastore {store!r} is not served; use running or candidate", kind="protocol")
        return store

    async def _op_get(self, op: Any, sid: int) -> str:
        return self._data(self._running(), state=True, flt=op.find(f"{{{NS_BASE}}}filter"))

    async def _op_get_config(self, op: Any, sid: int) -> str:
        store = self._datastore(op, "source")
        cfg = (self._candidate or self._running()) if store == "candidate" else self._running()
        return self._data(cfg, state=False, flt=op.find(f"{{{NS_BASE}}}filter"))

    def _data(self, cfg: _Config, state: bool, flt: Any) -> str:
        wanted = {etree.QName(el).localname for el in flt} if flt is not None and len(flt) else None
        parts = []
        if wanted is None or "cross-connects" in wanted:
            pairs = "".join(f"<pair><ingress>{i}</ingress><egress>{e}</egress></pair>" for i, e in sorted(cfg.pairs.items()))
            parts.append(f'<cross-connects xmlns="{NS_OPTICAL}">{pairs}</cross-connects>')
        if wanted is None or "port-config" in wanted:
            ports = "".join(f"<port><port-id>{p}</port-id><status>{'DISABLED' if p in cfg.disabled else 'ENABLED'}"
                            f"</status><label/></port>" for p in range(1, 2 * self.core.n + 1))
            parts.append(f'<port-config xmlns="{NS_OPTICAL}">{ports}</port-config>')
        if state and (wanted is None or "product-information" in wanted):
            c = self.core.config
            parts.append(f'<product-information xmlns="{NS_OPTICAL}"><manufacturer>orchestrl</manufacturer>'
                         f"<model-name>EMU-{self.core.n}x{self.core.n}-{c.profile}</model-name>"
                         f"<serial-number>{_escape(c.serial_number)}</serial-number>"
                         f"<software-version>1.0</software-version></product-information>")
        if state and (wanted is None or "opm-power" in wanted):
            ports = "".join(f"<port><port-id>{p}</port-id><power>{self.core.power_dbm(p):.2f}</power></port>"
                            for p in range(1, 2 * self.core.n + 1))
            parts.append(f'<opm-power xmlns="{NS_OPTICAL}">{ports}</opm-power>')
        return f"<data>{''.join(parts)}</data>"

    async def _op_edit_config(self, op: Any, sid: int) -> str:
        store = self._datastore(op, "target")
        self._check_lock(sid, store)
        config = op.find(f"{{{NS_BASE}}}config")
        if config is None:
            raise RpcError("missing-element", "edit-config needs a <config>", kind="protocol")
        default_op = (op.findtext(f"{{{NS_BASE}}}default-operation") or "merge").strip()
        removals, merges, creates, enable, disable = self._edits(config, default_op)
        if store == "candidate":
            cand = (self._candidate or self._running()).copy()
            for i in removals:  # a removal of an absent pair is no error on the candidate (replace semantics)
                cand.pairs.pop(i, None)
            for i, e in {**merges, **creates}.items():
                cand.pairs[i] = e
            cand.disabled = (cand.disabled | disable) - enable
            self._candidate = cand
            return "<ok/>"
        await self._apply(removals, {**merges, **creates}, set(creates), enable, disable)
        return "<ok/>"

    def _edits(self, config: Any, default_op: str) -> tuple[list[int], dict[int, int], dict[int, int], set[int], set[int]]:
        """The edit's removals (ingress ports), merges and creates (ingress -> egress), and port enables/disables."""
        removals: list[int] = []
        merges: dict[int, int] = {}
        creates: dict[int, int] = {}
        enable: set[int] = set()
        disable: set[int] = set()
        opattr = f"{{{NS_BASE}}}operation"
        for top in config:
            top_op = top.get(opattr, default_op)
            name = etree.QName(top).localname
            if name == "cross-connects":
                for pair in top:
                    if etree.QName(pair).localname not in ("pair", "pairs"):
                        continue
                    how = pair.get(opattr, top_op)
                    ingress = _int(pair.findtext(_q("ingress")), "ingress")
                    if how in ("delete", "remove"):
                        if how == "delete" and ingress not in self.core.state.cross_connects():
                            raise RpcError("data-missing", f"no cross-connect on ingress {ingress} to delete",
                                           path=f"/cross-connects/pair[ingress='{ingress}']")
                        removals.append(ingress)
                        continue
                    egress = _int(pair.findtext(_q("egress")), "egress")
                    (creates if how == "create" else merges)[ingress] = egress
                if top_op in ("delete", "remove", "replace") and not len(top):
                    removals.extend(self.core.state.cross_connects())
            elif name == "port-config":
                for port in top:
                    p = _int(port.findtext(_q("port-id")), "port-id")
                    status = (port.findtext(_q("status")) or "").strip().upper()
                    if status == "DISABLED":
                        disable.add(p)
                    elif status == "ENABLED":
                        enable.add(p)
            else:
                raise RpcError("unknown-element", f"element {name!r} is not in the optical-switch module",
                               path=f"/{name}")
        return removals, merges, creates, enable, disable

    async def _apply(self, removals: list[int], adds: dict[int, int], creates: set[int], enable: set[int],
                     disable: set[int]) -> None:
        """One edit on the running datastore: removals, then the additions as one bulk; a refusal undoes it all."""
        state = self.core.state
        table = state.cross_connects()
        for i in creates:
            if i in table and i not in removals:
                raise RpcError("data-exists", f"ingress {i} already has a cross-connect",
                               path=f"/cross-connects/pair[ingress='{i}']")
        # merge keeps an identical pair and re-patches an ingress that goes elsewhere (YANG merge on key ingress)
        adds = {i: e for i, e in adds.items() if table.get(i) != e or i in removals}
        repatch = [i for i in adds if i in table and i not in removals]
        gone_ports = removals + repatch
        bad, removed = self.core.remove(gone_ports)
        if bad is not None:
            raise RpcError(_TAG.get(bad.status, "operation-failed"), bad.message, bad.status,
                           f"/cross-connects/pair[ingress='{bad.ingress}']")
        done = await self.core.apply(list(adds.items())) if adds else None
        if done is not None and (done.refusal is not None or done.aborted):
            if done.refusal is not None:  # nothing of the bulk was applied: put the removed ones back
                state.connect_atomic(removed)
                r = done.refusal
                raise RpcError(_TAG.get(r.status, "operation-failed"), r.message, r.status,
                               f"/cross-connects/pair[ingress='{r.ingress}']")
            raise RpcError("partial-operation", f"applied {done.applied} of {len(done.pairs)} pairs, then aborted",
                           "SABT")
        self.core.set_blocked(sorted(disable), True)
        self.core.set_blocked(sorted(enable), False)

    def _check_lock(self, sid: int, store: str) -> None:
        if self._lock_owner is not None and self._lock_owner != sid:
            raise RpcError("lock-denied", f"the {store} datastore is locked by session {self._lock_owner}",
                           kind="protocol")

    async def _op_lock(self, op: Any, sid: int) -> str:
        self._check_lock(sid, self._datastore(op, "target"))
        self._lock_owner = sid
        return "<ok/>"

    async def _op_unlock(self, op: Any, sid: int) -> str:
        self._lock_owner = None if self._lock_owner == sid else self._lock_owner
        return "<ok/>"

    async def _op_discard_changes(self, op: Any, sid: int) -> str:
        self._candidate = None
        return "<ok/>"

    async def _op_commit(self, op: Any, sid: int) -> str:
        """Commit the candidate; ``<confirmed/>`` starts a rollback timer that a plain commit (the confirm) stops."""
        confirmed = op.find(f"{{{NS_BASE}}}confirmed") is not None
        timeout_s = float(op.findtext(f"{{{NS_BASE}}}confirm-timeout") or 600)
        before = self._running()
        if self._candidate is not None:
            cand, run = self._candidate, before
            removals = [i for i, e in run.pairs.items() if cand.pairs.get(i) != e]
            adds = {i: e for i, e in cand.pairs.items() if run.pairs.get(i) != e}
            await self._apply(removals, adds, set(), run.disabled - cand.disabled, cand.disabled - run.disabled)
            self._candidate = None
        if self._confirm is not None and not confirmed:  # the confirming commit
            self._confirm[0].cancel()
            self._confirm = None
        elif confirmed:
            if self._confirm is not None:
                self._confirm[0].cancel()
                before = self._confirm[1]
            self._confirm = (asyncio.get_running_loop().create_task(self._roll_back(before, timeout_s)), before)
        return "<ok/>"

    async def _op_cancel_commit(self, op: Any, sid: int) -> str:
        if self._confirm is None:
            raise RpcError("invalid-value", "no confirmed commit is pending", kind="protocol")
        task, before = self._confirm
        task.cancel()
        self._confirm = None
        await self._restore(before)
        return "<ok/>"

    async def _roll_back(self, before: _Config, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)
        self._confirm = None
        log.info("confirmed commit not confirmed within %g s: rolled back", timeout_s)
        await self._restore(before)

    async def _restore(self, cfg: _Config) -> None:
        run = self._running()
        removals = [i for i, e in run.pairs.items() if cfg.pairs.get(i) != e]
        adds = {i: e for i, e in cfg.pairs.items() if run.pairs.get(i) != e}
        with suppress(RpcError):
            await self._apply(removals, adds, set(), run.disabled - cfg.disabled, cfg.disabled - run.disabled)

    async def _op_close_session(self, op: Any, sid: int) -> str:
        return "<ok/>"

    async def _op_kill_session(self, op: Any, sid: int) -> str:
        return "<ok/>"


def _int(text: str | None, field: str) -> int:
    try:
        return int((text or "").strip())
    except ValueError:
        raise RpcError("invalid-value", f"{field} {text!r} is not a port number", "IDNV") from None


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
