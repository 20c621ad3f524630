"""Template cache keyed by intent signature (Phase 1 of OrchestrRL §5.3).

The first iteration of a recurring communication period selects a template and an allocation
procedure and stores them under the intent's signature; later iterations reuse the entry and only
re-run the (cheap) demand-driven allocation with the current participants and volumes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from orchestrl.fabric.templates.base import Template
from orchestrl.fabric.templates.stages import TEMPLATES

__all__ = ["CacheEntry", "TemplateCache", "select_template"]


def select_template(stage: str, override: str | None = None) -> Template:
    """Return the template for a stage (or the explicit override an intent names)."""
    name = override or stage
    try:
        return TEMPLATES[name]
    except KeyError:
        raise KeyError(f"no topology template named {name!r} (known: {', '.join(TEMPLATES)})") from None


@dataclass(frozen=True)
class CacheEntry:
    """What Phase 1 remembers about one recurring period: template plus allocation procedure."""

    signature: str
    template: str
    method: str  # allocator method: greedy | uniform | optimal
    bipartite_tiebreak: bool
    stage: str
    period: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "CacheEntry":
        return cls(**doc)


class TemplateCache:
    """In-memory cache of :class:`CacheEntry` with hit/miss counters (persisted by fabric.runtime.store)."""

    def __init__(self, entries: Iterable[CacheEntry] = ()) -> None:
        self._entries = {e.signature: e for e in entries}
        self.hits = 0
        self.misses = 0

    def get_or_create(self, signature: str, stage: str, period: str, template_override: str | None,
                      method: str) -> tuple[CacheEntry, bool]:
        """Return ``(entry, hit)``; on a miss, select the template and store a new entry."""
        entry = self._entries.get(signature)
        if entry is not None:
            self.hits += 1
            return entry, True
        tpl = select_template(stage, template_override)
        entry = CacheEntry(signature, tpl.name, method, tpl.core_policy == "bipartite", stage, period)
        self._entries[signature] = entry
        self.misses += 1
        return entry, False

    def peek(self, signature: str) -> CacheEntry | None:
        """Return the entry of ``signature`` (None when absent) without counting a hit or a miss."""
        return self._entries.get(signature)

    def put(self, entry: CacheEntry) -> None:
        """Add (or replace) an entry without touching the counters, e.g. when restoring from disk."""
        self._entries[entry.signature] = entry

    def entries(self) -> list[CacheEntry]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, signature: str) -> bool:
        return signature in self._entries
