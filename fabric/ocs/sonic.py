"""SONiC OCS port and cross-connect names, and the device port numbers they stand for.

SONiC names a simplex port by its number and side, ``<i>A`` (A side) and ``<i>B`` (B side), and a
cross-connect ``<i>A-<j>B`` (sonic-net/SONiC ``doc/ocs/ocs_hld.md``). A duplex circuit between
ports ``a`` and ``b`` is the two cross-connects ``{a}A-{b}B`` and ``{b}A-{a}B``
(sonic-mgmt ``ansible/library/ocs_cross_connect.py``), which is this project's full-duplex mapping
with ingress ``i`` = ``<i>A`` and egress ``N+j`` = ``<j>B`` (:mod:`fabric.ocs.model`).
"""

from __future__ import annotations

import re

__all__ = ["port_name", "parse_port", "xc_id"]

_PORT = re.compile(r"^(\d+)([AB])$")


def port_name(port: int, n: int) -> str:
    """The SONiC name of device port ``port`` of an ``n x n`` switch.

    Examples
    --------
    >>> port_name(3, 16), port_name(18, 16)
    ('3A', '2B')
    """
    return f"{port}A" if port <= n else f"{port - n}B"


def parse_port(name: str, n: int) -> int:
    """The device port of SONiC port ``name`` (``ValueError`` naming it when it is not ``<i>A``/``<i>B`` of the switch).

    Examples
    --------
    >>> parse_port("2B", 16)
    18
    """
    m = _PORT.match(str(name).strip())
    if not m or not 1 <= int(m.group(1)) <= n:
        raise ValueError(f"port {name!r} is not <i>A or <i>B with i in 1..{n}")
    i = int(m.group(1))
    return i if m.group(2) == "A" else n + i


def xc_id(ingress: int, egress: int, n: int) -> str:
    """The SONiC id ``<i>A-<j>B`` of cross-connect ``ingress -> egress``.

    Examples
    --------
    >>> xc_id(1, 18, 16)
    '1A-2B'
    """
    return f"{port_name(ingress, n)}-{port_name(egress, n)}"
