"""Exceptions of the OCS device layer, and the TL1 error codes a device's DENY maps onto.

Every message names the device, the command and the port(s) involved, so an operator can act on
the message alone. A refusal by the device (a TL1 ``DENY``) is an :class:`OcsDenied` carrying the
standard TL1 error code (Telcordia GR-833 vocabulary); the subclass says what a caller usually
needs to know (busy: retry later; failed: mask the port; auth: fix the credentials).

TL1 error codes used by the driver and the emulator
---------------------------------------------------
======  =====================================  =============================================  ================
code    GR-833 meaning                         when the switch answers it                     exception
======  =====================================  =============================================  ================
PLNA    Privilege, Login Not Active            any command before a successful ``ACT-USER``   OcsAuthError
PIUI    Privilege, Illegal User Identity       ``ACT-USER`` with a wrong user or password     OcsAuthError
ICNV    Input, Command Not Valid               unknown verb                                   OcsCommandError
IISP    Input, Invalid Syntax or Punctuation   command that does not parse                    OcsCommandError
IIPG    Input, Invalid Parameter Grouping      ingress and egress lists of unequal length     OcsCommandError
IDNV    Input, Data Not Valid                  the same port twice in one command             OcsCommandError
IIAC    Input, Invalid Access identifier       port outside 1..2N, or on the wrong side       OcsInvalidPort
SAAL    Status, Already ALlocated              port already in a cross-connect                OcsPortInUse
SNVS    Status, Not in Valid State             port busy: its mirror is still moving          OcsPortBusy
SWFA    Status, Working unit FAiled            port failed (hardware)                         OcsPortFailed
SROF    Status, Requested Operation Failed     port force-blocked (shutter closed)            OcsPortBlocked
SABT    Status, ABorTed                        bulk command stopped after its first k pairs   OcsAborted
======  =====================================  =============================================  ================

Any other code becomes a plain :class:`OcsDenied`.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from orchestrl.fabric.errors import OrchestrlError

__all__ = [
    "OcsError", "OcsRequestError", "OcsConnectionError", "OcsTimeout", "OcsProtocolError", "OcsDenied",
    "OcsAuthError", "OcsCommandError", "OcsInvalidPort", "OcsPortInUse", "OcsPortBusy", "OcsPortFailed",
    "OcsPortBlocked", "OcsAborted", "DENY_CODES", "denied_from_code",
]


def _where(device: str, command: str, ports: Iterable[int]) -> str:
    ports = tuple(ports)
    parts = [f"OCS '{device or '?'}'"]
    if command:
        parts.append(f"command {command}")
    if ports:
        parts.append(("port " if len(ports) == 1 else "ports ") + "&".join(map(str, ports)))
    return ", ".join(parts)


class OcsError(OrchestrlError):
    """Base class of every error of the OCS device layer.

    Parameters
    ----------
    device : str
        Device name (or ``host:port`` when the device has no name yet).
    command : str
        The TL1 verb (or driver method) that failed; empty when not command-specific.
    problem : str
        What went wrong, in words, ending with the fix where there is one.
    ports : iterable of int, optional
        Device ports involved (TL1 numbering, ingress 1..N, egress N+1..2N).
    """

    def __init__(self, device: str, command: str, problem: str, ports: Iterable[int] = ()) -> None:
        self.device = device
        self.command = command
        self.problem = problem
        self.ports = tuple(ports)
        super().__init__(f"{_where(device, command, self.ports)}: {problem}")


class OcsRequestError(OcsError, ValueError):
    """The caller asked for something the device model cannot express; nothing was sent."""


class OcsConnectionError(OcsError):
    """The TCP session to the device could not be opened or was lost (after all retries)."""


class OcsTimeout(OcsError):
    """No reply to a command arrived within its timeout; the command may or may not have run."""


class OcsProtocolError(OcsError):
    """The device answered something that is not a well-formed TL1 response."""


class OcsDenied(OcsError):
    """The device refused a command (TL1 ``DENY``).

    Parameters
    ----------
    code : str
        The four-letter TL1 error code (table in the module docstring).
    message : str
        The device's own text (the ``/* ... */`` comment of the response).
    """

    def __init__(self, device: str, command: str, code: str, message: str, ports: Iterable[int] = ()) -> None:
        self.code = code
        self.message = message
        meaning = DENY_CODES.get(code, (OcsDenied, "unknown error code"))[1]
        hint = _HINTS.get(code, "")
        text = f"DENY {code} ({meaning})" + (f": {message}" if message else "") + (f"; {hint}" if hint else "")
        super().__init__(device, command, text, ports)


class OcsAuthError(OcsDenied):
    """Login refused, or a command sent without a login."""


class OcsCommandError(OcsDenied):
    """The device could not understand the command: a driver bug or an unsupported dialect."""


class OcsInvalidPort(OcsDenied):
    """A port number is outside the device or on the wrong side (ingress vs egress)."""


class OcsPortInUse(OcsDenied):
    """A port already carries a cross-connect; remove it first."""


class OcsPortBusy(OcsDenied):
    """A port is switching (state ``tuning``); retry after the switching delay."""


class OcsPortFailed(OcsDenied):
    """A port has failed; mask it in the topology and re-plan."""


class OcsPortBlocked(OcsDenied):
    """A port is force-blocked by an operator (shutter closed)."""


class OcsAborted(OcsDenied):
    """A bulk command was aborted part way; the device applied only some of its pairs.

    The driver reads the cross-connect table back after the refusal and fills ``applied`` (the
    requested ``(ingress, egress)`` pairs now present) and ``unapplied`` (the rest).
    """

    applied: tuple[tuple[int, int], ...] = ()
    unapplied: tuple[tuple[int, int], ...] = ()


DENY_CODES: Mapping[str, tuple[type[OcsDenied], str]] = {
    "PLNA": (OcsAuthError, "login not active"),
    "PIUI": (OcsAuthError, "illegal user identity"),
    "ICNV": (OcsCommandError, "command not valid"),
    "IISP": (OcsCommandError, "invalid syntax or punctuation"),
    "IIPG": (OcsCommandError, "invalid parameter grouping"),
    "IDNV": (OcsCommandError, "data not valid"),
    "IIAC": (OcsInvalidPort, "invalid access identifier"),
    "SAAL": (OcsPortInUse, "already allocated"),
    "SNVS": (OcsPortBusy, "not in valid state"),
    "SWFA": (OcsPortFailed, "working unit failed"),
    "SROF": (OcsPortBlocked, "requested operation failed"),
    "SABT": (OcsAborted, "aborted"),
}

_HINTS: Mapping[str, str] = {
    "PLNA": "log in with ACT-USER first",
    "PIUI": "check the user and password in the device configuration",
    "IIAC": "use ingress ports 1..N and egress ports N+1..2N of this device",
    "SAAL": "remove the existing cross-connect first",
    "SNVS": "retry after the switching delay",
    "SWFA": "mask the failed port and re-plan",
    "SROF": "release the port (RLS-PORT-SHUTTER) or plan around it",
    "SABT": "read the cross-connect table back to see which pairs were applied",
}


def denied_from_code(device: str, command: str, code: str, message: str, ports: Iterable[int] = ()) -> OcsDenied:
    """Return the most specific :class:`OcsDenied` subclass instance for a TL1 error ``code``.

    Examples
    --------
    >>> e = denied_from_code("agg0", "ENT-PATCH", "SNVS", "port 3: busy (TUNING)", [3])
    >>> type(e).__name__, e.code
    ('OcsPortBusy', 'SNVS')
    """
    cls = DENY_CODES.get(code, (OcsDenied, ""))[0]
    return cls(device, command, code, message, ports)
