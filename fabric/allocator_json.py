"""The JSON contract of ``orchestrl fabric allocate`` (Appendix D.1 as a document).

Re-exported by :mod:`fabric.allocator`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from orchestrl.fabric.allocation import Allocation, AllocationProblem
from orchestrl.fabric.errors import ConfigError

__all__ = ["problem_from_json", "allocation_to_json"]

_TOP_KEYS = ("link_bps", "endpoints", "demand", "eligible", "bipartite_tiebreak")
_DEMAND_KEYS = ("src", "dst", "bytes")


def _is_number(x: Any) -> bool:
    """True for a finite int or float; bools are refused although Python counts them as ints."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _endpoint_ref(x: Any, names: Mapping[str, int], source: str, field: str) -> str:
    """Check that ``x`` names a declared endpoint and return it."""
    if not isinstance(x, str) or x not in names:
        raise ConfigError(source, field, f"{x!r} is not a declared endpoint", "keys of endpoints")
    return x


def problem_from_json(doc: dict, source: str = "<input>") -> AllocationProblem:
    """Return the :class:`AllocationProblem` described by a parsed JSON document.

    Parameters
    ----------
    doc : dict
        ``{"link_bps": float, "endpoints": {name: ports}, "demand": [{"src", "dst", "bytes"}],
        "eligible": [[a, b], ...] (optional, default: every demanded pair),
        "bipartite_tiebreak": bool (optional)}``.
    source : str
        Name of the input used in error messages (the file path for the CLI).

    Raises
    ------
    ConfigError
        Naming ``source`` and the field path (``demand[3].bytes``, ``endpoints.tor7``) for a
        missing or unknown key, a non-numeric, negative or non-finite number, ``link_bps <= 0``,
        a demand with ``src == dst`` or an undeclared endpoint, a repeated ``(src, dst)`` demand,
        or an eligible entry that is not two distinct declared endpoints.

    Notes
    -----
    O(V + D + E) for the document's endpoints, demands and eligible entries.

    Examples
    --------
    >>> p = problem_from_json({"link_bps": 1e9, "endpoints": {"a": 1, "b": 2},
    ...                        "demand": [{"src": "a", "dst": "b", "bytes": 5e8}]})
    >>> p.demand
    {('a', 'b'): 500000000.0}
    """
    if not isinstance(doc, dict):
        raise ConfigError(source, "(document)", f"is a {type(doc).__name__}", "a JSON object")
    for key in doc:
        if key not in _TOP_KEYS:
            raise ConfigError(source, str(key), "unknown key", ", ".join(_TOP_KEYS))
    for key in ("link_bps", "endpoints", "demand"):
        if key not in doc:
            raise ConfigError(source, key, "missing", "required key")
    link_bps = doc["link_bps"]
    if not _is_number(link_bps) or link_bps <= 0:
        raise ConfigError(source, "link_bps", f"got {link_bps!r}", "a finite number > 0")

    endpoints = doc["endpoints"]
    if not isinstance(endpoints, dict):
        raise ConfigError(source, "endpoints", "not an object", "{name: allocatable_ports}")
    for name, deg in endpoints.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(source, "endpoints", f"name {name!r}", "non-empty strings")
        if not isinstance(deg, int) or isinstance(deg, bool) or deg < 0:
            raise ConfigError(source, f"endpoints.{name}", f"got {deg!r}", "an integer >= 0")

    if not isinstance(doc["demand"], list):
        raise ConfigError(source, "demand", "not a list", '[{"src", "dst", "bytes"}, ...]')
    demand: dict[tuple[str, str], float] = {}
    first_seen: dict[tuple[str, str], int] = {}
    for n, entry in enumerate(doc["demand"]):
        at = f"demand[{n}]"
        if not isinstance(entry, dict):
            raise ConfigError(source, at, "not an object", '{"src", "dst", "bytes"}')
        for key in entry:
            if key not in _DEMAND_KEYS:
                raise ConfigError(source, f"{at}.{key}", "unknown key", ", ".join(_DEMAND_KEYS))
        for key in _DEMAND_KEYS:
            if key not in entry:
                raise ConfigError(source, f"{at}.{key}", "missing", "required key")
        src = _endpoint_ref(entry["src"], endpoints, source, f"{at}.src")
        dst = _endpoint_ref(entry["dst"], endpoints, source, f"{at}.dst")
        if src == dst:
            raise ConfigError(source, f"{at}.dst", f"equals src {src!r}", "a different endpoint")
        nbytes = entry["bytes"]
        if not _is_number(nbytes) or nbytes < 0:
            raise ConfigError(source, f"{at}.bytes", f"got {nbytes!r}", "a finite number >= 0")
        if (src, dst) in first_seen:
            raise ConfigError(
                source, at, f"repeats ({src!r} -> {dst!r}) of demand[{first_seen[(src, dst)]}]",
                "one entry per (src, dst); sum their bytes",
            )
        first_seen[(src, dst)] = n
        demand[(src, dst)] = float(nbytes)

    eligible = None
    if doc.get("eligible") is not None:
        if not isinstance(doc["eligible"], list):
            raise ConfigError(source, "eligible", "not a list", "[[a, b], ...] or omit the key")
        pairs = set()
        for n, entry in enumerate(doc["eligible"]):
            at = f"eligible[{n}]"
            if not isinstance(entry, list) or len(entry) != 2:
                raise ConfigError(source, at, f"got {entry!r}", "a list [a, b] of 2 endpoints")
            a = _endpoint_ref(entry[0], endpoints, source, f"{at}[0]")
            b = _endpoint_ref(entry[1], endpoints, source, f"{at}[1]")
            if a == b:
                raise ConfigError(source, at, f"names {a!r} twice", "two distinct endpoints")
            pairs.add(frozenset((a, b)))
        eligible = frozenset(pairs)

    tiebreak = doc.get("bipartite_tiebreak", False)
    if not isinstance(tiebreak, bool):
        raise ConfigError(source, "bipartite_tiebreak", f"got {tiebreak!r}", "true or false")
    return AllocationProblem(
        link_bps=float(link_bps),
        ports=dict(endpoints),
        demand=demand,
        eligible=eligible,
        bipartite_tiebreak=tiebreak,
    )


def allocation_to_json(alloc: Allocation) -> dict:
    """Return the JSON-ready document of an allocation (the CLI's output contract).

    Lists are sorted by ``(a, b)``.  An unserved pair's infinite time is written as ``null``
    (JSON has no infinity); those pairs are also listed under ``"unserved"``.

    Notes
    -----
    O(P log P) for P reported pairs.

    Examples
    --------
    >>> alloc = Allocation("greedy", {("a", "b"): 1}, {("a", "b"): 0.5, ("a", "c"): math.inf},
    ...                    0.5, (("a", "c"),))
    >>> allocation_to_json(alloc)["pair_time_s"]
    [{'a': 'a', 'b': 'b', 'time_s': 0.5}, {'a': 'a', 'b': 'c', 'time_s': None}]
    """
    return {
        "method": alloc.method,
        "circuits": [{"a": a, "b": b, "count": c} for (a, b), c in sorted(alloc.circuits.items())],
        "pair_time_s": [
            {"a": a, "b": b, "time_s": t if math.isfinite(t) else None}
            for (a, b), t in sorted(alloc.pair_time_s.items())
        ],
        "max_pair_time_s": alloc.max_pair_time_s,
        "unserved": [[a, b] for a, b in sorted(alloc.unserved)],
    }
