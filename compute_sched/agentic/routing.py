"""Hardware-affinity routing of the LLM proxy (RollArt §4.1, §5.1 ``hw_mapping``), as a pure policy.

A request carries its trajectory id and task tag. The router answers which worker serves it:

1. *environment affinity*: a trajectory's turns stay on the worker that served its last turn (its
   prefix is cached there) while that worker is alive and its pool is allowed for the tag;
2. *hardware affinity*: the tag's pools in priority order (``hw_mapping``: prefill-heavy tasks to
   compute-optimised GPUs, decode-heavy ones to bandwidth-optimised GPUs), falling back to the next
   pool when every worker of one is at its batch limit or dead; tags without a mapping use
   ``default``;
3. *least loaded* within the chosen pool (requests in flight).

O(log W) per request with per-pool heaps would be possible; pools here hold tens of workers, so a
linear scan of the first pool with room is cheaper in practice (the benchmark reports the p99).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from orchestrl.fabric.errors import ConfigError

__all__ = ["RoutedWorker", "HwMapping", "Router"]


class RoutedWorker(Protocol):
    name: str
    pool: str
    alive: bool
    max_batch: int | None

    @property
    def load(self) -> int: ...


@dataclass(frozen=True)
class HwMapping:
    """Task tag -> pools in priority order; ``default`` for tags it does not name."""

    tags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    default: tuple[str, ...] = ()

    def pools_for(self, tag: str) -> tuple[str, ...]:
        return tuple(self.tags.get(tag, self.default))


class Router:
    """Route requests to workers (see the module note); keeps each trajectory's last worker."""

    def __init__(self, workers: Sequence[RoutedWorker], mapping: HwMapping) -> None:
        self.by_pool: dict[str, list[RoutedWorker]] = {}
        for w in workers:
            self.by_pool.setdefault(w.pool, []).append(w)
        for tag, pools in [*mapping.tags.items(), ("default", mapping.default)]:
            for p in pools:
                if p not in self.by_pool:
                    raise ConfigError("hw_mapping", f"{tag}", f"names pool {p!r}, which has no workers",
                                      ", ".join(sorted(self.by_pool)))
        self.mapping = mapping
        self._sticky: dict[str, RoutedWorker] = {}
        self.fallbacks = 0
        self.affinity_hits = 0

    def route(self, trajectory_id: str, tag: str) -> RoutedWorker:
        """The worker for the next turn of ``trajectory_id``; raises when no pool of the tag has a live worker."""
        pools = self.mapping.pools_for(tag) or tuple(self.by_pool)
        w = self._sticky.get(trajectory_id)
        if w is not None and w.alive and w.pool in pools:
            self.affinity_hits += 1
            return w
        best = None
        for rank, pool in enumerate(pools):
            live = [x for x in self.by_pool[pool] if x.alive]
            room = [x for x in live if x.max_batch is None or x.load < x.max_batch]
            if room:
                best = min(room, key=lambda x: x.load)
                self.fallbacks += rank > 0
                break
            if best is None and live:
                best = min(live, key=lambda x: x.load)  # all full: queue on the least loaded of the first live pool
        if best is None:
            raise ConfigError("LLM proxy", "pools", f"no live worker in {', '.join(pools)} for tag {tag!r}",
                              "at least one live generation worker per pool a tag may use")
        self._sticky[trajectory_id] = best
        return best

    def forget(self, trajectory_id: str) -> None:
        """Drop a finished trajectory's affinity."""
        self._sticky.pop(trajectory_id, None)
