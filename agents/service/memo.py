"""Memo tables of the control service: pure results it would otherwise recompute every RL iteration.

Design note
-----------
An RL job repeats the same few communication periods every iteration (train forward/backward,
gradient sync, weight sync, generation), so the control service sees the same intent documents
again and again, and the same pairs of plans follow each other. The steps of a commit that are
pure functions of such recurring inputs are remembered here:

* parsing an intent document (:func:`fabric.intent.intent_from_mapping`) depends only on the
  document and the topology: :class:`IntentMemo`, keyed by the document's canonical JSON text;
* Algorithm 2 (:func:`fabric.controller.materialize`) is deterministic in the intent, the fabric
  view the job may use (a :class:`~fabric.topology.Topology`, immutable, replaced on every mask or
  reservation change) and the cached template entry: :class:`PlanMemo`;
* the non-blocking order of a change and its intermediate plans
  (:func:`agents.service.ordered_commit.plan_change`) depend only on the two plans, and the placement check
  only on the plan and the job's placement: :class:`IdentityMemo`.

Inputs are matched by identity (``is``) and the memo holds a reference to each of them, so an id
is never reused while its entry lives. Each table keeps its newest ``size`` entries (LRU), so
memory stays bounded however many distinct inputs arrive. A look-up is one dictionary access.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Generic, Hashable, Mapping, TypeVar

from orchestrl.fabric.controller import MaterializeResult
from orchestrl.fabric.intent import Intent, intent_from_mapping
from orchestrl.fabric.topology import Topology

__all__ = ["MISS", "IdentityMemo", "IntentMemo", "PlanMemo"]

V = TypeVar("V")
MISS = object()  # what a look-up returns when nothing is remembered for those very objects


class IdentityMemo(Generic[V]):
    """Values computed from some objects, remembered by those objects' identity (newest ``size``, LRU).

    Examples
    --------
    >>> memo, a, b = IdentityMemo(), [1], [1]
    >>> memo.get((a,), lambda: "first"), memo.get((a,), lambda: "again"), memo.get((b,), lambda: "equal, not same")
    ('first', 'first', 'equal, not same')
    """

    def __init__(self, size: int = 256) -> None:
        if size < 1:
            raise ValueError(f"memo size must be at least 1, got {size}")
        self.size = size
        self._items: OrderedDict[Hashable, tuple[tuple, Any]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def lookup(self, objects: tuple, extra: Hashable = None) -> V | object:
        """Return the value remembered for ``objects`` (and the hashable ``extra``), else :data:`MISS`."""
        got = self._items.get((tuple(map(id, objects)), extra))
        if got is None or any(a is not b for a, b in zip(got[0], objects)):
            self.misses += 1
            return MISS
        self._items.move_to_end((tuple(map(id, objects)), extra))
        self.hits += 1
        return got[1]

    def put(self, objects: tuple, value: V, extra: Hashable = None) -> V:
        """Remember ``value`` for ``objects`` (and ``extra``); return it."""
        key = (tuple(map(id, objects)), extra)
        self._items[key] = (tuple(objects), value)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def get(self, objects: tuple, compute: Callable[[], V], extra: Hashable = None) -> V:
        """Return the value remembered for ``objects`` (and ``extra``), else ``compute()``'s, remembered."""
        got = self.lookup(objects, extra)
        return self.put(objects, compute(), extra) if got is MISS else got  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._items)


class IntentMemo:
    """Parsed intents by document: the same document on the same topology parses to the same :class:`Intent`.

    Examples
    --------
    >>> from orchestrl.fabric.topology import FabricSpec, Topology
    >>> topo = Topology(FabricSpec(name="t", link_bps=1e11, servers_per_pod=2))
    >>> memo = IntentMemo()
    >>> doc = {"job": "j", "stage": "train", "layout": {"tp": 8, "dp": 2, "gpus": "0-15"},
    ...        "collectives": [{"primitive": "all-reduce", "over": "dp", "bytes_per_rank": 1e6}]}
    >>> memo.parse(doc, "intent", topo) is memo.parse(dict(doc), "intent", topo)
    True
    """

    def __init__(self, size: int = 256) -> None:
        self._memo: IdentityMemo[Intent] = IdentityMemo(size)

    def parse(self, doc: Mapping[str, Any], source: str, topology: Topology) -> Intent:
        """Return :func:`fabric.intent.intent_from_mapping` of ``doc``, parsed once per distinct document.

        Raises what parsing raises (a refused document is not remembered).
        """
        try:  # canonical text: key order does not matter, 1 and 1.0 and "1" stay distinct
            text = json.dumps(doc, sort_keys=True, allow_nan=True)
        except (TypeError, ValueError):  # not plain JSON data (or mixed key types): parse without the memo
            return intent_from_mapping(doc, source, topology)
        return self._memo.get((topology,), lambda: intent_from_mapping(doc, source, topology), (text, source))


class PlanMemo:
    """Accepted Algorithm 2 results by (intent, fabric view, template entry)."""

    def __init__(self, size: int = 256) -> None:
        self._memo: IdentityMemo[MaterializeResult] = IdentityMemo(size)

    def materialize(self, intent: Intent, view: Topology, template: Callable[[], Hashable],
                    compute: Callable[[], MaterializeResult]) -> tuple[MaterializeResult, bool]:
        """Return ``(result, remembered)``: the remembered accepted result, or ``compute()``'s.

        ``template()`` names the template-cache entry the intent plans with (None before the first
        plan fills it). A refused result is not remembered (it carries the plan in force, which
        changes); a remembered one comes back marked a template-cache hit.
        """
        got = self._memo.lookup((intent, view), template())
        if got is not MISS:
            return replace(got, cache_hit=True), True  # type: ignore[type-var]
        result = compute()
        if result.accepted:
            self._memo.put((intent, view), result, template())
        return result, False
