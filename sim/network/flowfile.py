"""Flow files: ``{"flows": [{"src": gpu, "dst": gpu, "bytes": int, "start_s": float}]}``, checked field by field."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.network.events import FlowResult, FlowSet

__all__ = ["load_flows", "flows_from_document", "flows_to_document", "result_document", "MAX_START_S",
           "MAX_FLOW_BYTES"]

_KEYS = {"src", "dst", "bytes", "start_s"}


def load_flows(path: str | os.PathLike[str], gpus: int) -> FlowSet:
    """Return the flows of a JSON flow file, refusing bad input with a :class:`ConfigError`.

    Raises
    ------
    ConfigError
        Naming the file and the field (``flows[3].dst``) of the first bad value.

    Notes
    -----
    O(F) for F flows.
    """
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise ConfigError(source, "<file>", "file does not exist", "a path to a JSON flow file") from None
    except OSError as exc:
        raise ConfigError(source, "<file>", f"cannot be read: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(source, "<file>", f"is not valid JSON: {exc}",
                          '{"flows": [{"src": 0, "dst": 8, "bytes": 1000000, "start_s": 0.0}]}') from None
    return flows_from_document(doc, source, gpus)


def flows_from_document(doc: Any, source: str, gpus: int) -> FlowSet:
    """Return the flows of an already-parsed flow document (see :func:`load_flows`)."""
    if not isinstance(doc, dict):
        raise ConfigError(source, "<top level>", f"expected an object, got {type(doc).__name__}", '{"flows": [...]}')
    unknown = set(doc) - {"flows"}
    if unknown:
        raise ConfigError(source, sorted(unknown)[0], "unknown field", "flows")
    rows = doc.get("flows")
    if not isinstance(rows, list):
        raise ConfigError(source, "flows", f"expected a list, got {type(rows).__name__}",
                          'a list of {"src", "dst", "bytes", "start_s"}')
    n = len(rows)
    src = np.zeros(n, np.int64)
    dst = np.zeros(n, np.int64)
    size = np.zeros(n)
    start = np.zeros(n)
    for i, row in enumerate(rows):
        where = f"flows[{i}]"
        if not isinstance(row, dict):
            raise ConfigError(source, where, f"expected an object, got {type(row).__name__}",
                              '{"src": gpu, "dst": gpu, "bytes": int, "start_s": float}')
        if row.keys() != _KEYS:
            missing, extra = _KEYS - row.keys(), row.keys() - _KEYS
            if extra:
                raise ConfigError(source, f"{where}.{sorted(extra)[0]}", "unknown field", ", ".join(sorted(_KEYS)))
            raise ConfigError(source, f"{where}.{sorted(missing)[0]}", "is missing", "src, dst, bytes, start_s")
        for key, out, kind in (("src", src, "gpu"), ("dst", dst, "gpu"), ("bytes", size, "bytes"),
                               ("start_s", start, "time")):
            v = row[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
                raise ConfigError(source, f"{where}.{key}", f"expected a number, got {v!r}", _ALLOWED[kind](gpus))
            if kind == "gpu" and (not isinstance(v, int) or not 0 <= v < gpus):
                raise ConfigError(source, f"{where}.{key}", f"GPU {v!r} is not in the {gpus}-GPU fabric",
                                  _ALLOWED[kind](gpus))
            if kind == "bytes" and (v < 0 or (isinstance(v, float) and not v.is_integer())):
                raise ConfigError(source, f"{where}.{key}", f"{v!r} is not a whole number of bytes >= 0",
                                  _ALLOWED[kind](gpus))
            if kind == "time" and not 0 <= v <= MAX_START_S:
                raise ConfigError(source, f"{where}.{key}", f"{v!r} is outside 0..{MAX_START_S:g} s", _ALLOWED[kind](gpus))
            if kind == "bytes" and v > MAX_FLOW_BYTES:
                raise ConfigError(source, f"{where}.{key}", f"{v!r} bytes is over {MAX_FLOW_BYTES:.0e}",
                                  _ALLOWED[kind](gpus))
            out[i] = v
        if src[i] == dst[i]:
            raise ConfigError(source, f"{where}.dst", f"equals src ({src[i]})", "a GPU other than src")
    return FlowSet(src, dst, size, start)


#: A start time past a day, or a flow past a petabyte, is a unit slip, not a case: beyond these the
#: float arithmetic of the event loop (1e300 s + a transfer time) loses the transfer altogether.
MAX_START_S = 86400.0
MAX_FLOW_BYTES = 1e15

_ALLOWED = {
    "gpu": lambda g: f"an integer GPU index 0..{g - 1} (GPU g is NIC g % 8 of server g // 8)",
    "bytes": lambda g: f"an integer number of bytes from 0 to {MAX_FLOW_BYTES:.0e}",
    "time": lambda g: f"a start time in seconds from 0 to {MAX_START_S:g} (one day)",
}


def flows_to_document(flows: FlowSet) -> dict[str, object]:
    """Return a flow document for ``flows`` (inverse of :func:`flows_from_document`)."""
    return {"flows": [{"src": int(a), "dst": int(b), "bytes": int(v), "start_s": float(t)}
                      for a, b, v, t in zip(flows.src, flows.dst, flows.size_bytes, flows.start_s)]}


def result_document(fabric: str, gpus: int, flows: FlowSet, result: FlowResult) -> dict[str, object]:
    """Return the ``orchestrl sim net --json`` document (``finish_s`` is null for a flow that never ends)."""
    fin = [None if not math.isfinite(x) else float(x) for x in result.finish_s.tolist()]
    return {
        "fabric": fabric,
        "gpus": gpus,
        "flows": [{"src": int(a), "dst": int(b), "bytes": int(v), "start_s": float(t), "finish_s": f}
                  for a, b, v, t, f in zip(flows.src, flows.dst, flows.size_bytes, flows.start_s, fin)],
        "makespan_s": result.makespan_s if math.isfinite(result.makespan_s) else None,
        "solve_s": result.solve_s,
        "events": result.events,
    }
