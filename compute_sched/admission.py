"""Rollout admission and handoff policies around the generation engine.

* RolloutPipe (§3): *frontier-group dispatch* (FGD) admits only requests whose GRPO group is among
  the ``F_w`` lowest-order groups not yet serving-complete (Eq. 5-6); *complete-group pipelining*
  (CGP) makes a group trainable once all ``K`` responses and rewards are in (group materialisation:
  advantages ``(r - mean) / (std + eps)``, Eq. 1) and hands the FIFO's first ``U`` trainable groups
  to the trainer as one logical update. :class:`SerialHandoff` is the Slime baseline: nothing
  reaches the trainer before the whole rollout is done.
* RollArt (§5.3): the *asynchronous bound* aborts a trajectory once the policy has advanced more
  than ``bound`` versions past the one that started it; *redundant rollouts* launch more
  trajectories than needed and abort the rest when enough have finished.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.fabric.errors import ConfigError

__all__ = ["FifoAdmission", "FrontierAdmission", "TrainableGroup", "CompleteGroupHandoff", "SerialHandoff",
           "AsyncBound", "RedundantRollout"]


class FifoAdmission:
    """Default request-level FIFO: every submitted request is admitted at once."""

    def __init__(self) -> None:
        self._queue: list[GenerationRequest] = []
        self._group_of: dict[str, str] = {}

    def submit_group(self, group_id: str, requests: Sequence[GenerationRequest]) -> None:
        self._queue += list(requests)
        self._group_of.update({r.request_id: group_id for r in requests})

    def release(self) -> list[GenerationRequest]:
        out, self._queue = self._queue, []
        return out

    def on_finished(self, request_id: str) -> None:
        self._group_of.pop(request_id, None)


class FrontierAdmission:
    """FGD: admit a request iff its group is in the frontier of the ``F_w`` lowest-order open groups.

    >>> fgd = FrontierAdmission(frontier_width=1)
    >>> for g in ("g0", "g1"):
    ...     fgd.submit_group(g, [GenerationRequest(f"{g}-{i}", 10, 100, g) for i in range(2)])
    >>> [r.request_id for r in fgd.release()]
    ['g0-0', 'g0-1']
    >>> fgd.on_finished("g0-0"); fgd.on_finished("g0-1")
    >>> [r.request_id for r in fgd.release()], fgd.frontier
    (['g1-0', 'g1-1'], ['g1'])

    Notes
    -----
    O(log R) per group entering the frontier, O(1) per finished request.
    """

    def __init__(self, frontier_width: int) -> None:
        if frontier_width < 1:
            raise ConfigError("FrontierAdmission", "frontier_width", f"{frontier_width}", "an integer >= 1 (F_w)")
        self.width = frontier_width
        self._deferred: list[tuple[int, str]] = []  # (order, group) heap
        self._requests: dict[str, list[GenerationRequest]] = {}
        self._open: dict[str, int] = {}  # group -> responses still running
        self._frontier: list[str] = []
        self._group_of: dict[str, str] = {}
        self._order = 0

    def submit_group(self, group_id: str, requests: Sequence[GenerationRequest]) -> None:
        if not requests:
            raise ConfigError("FrontierAdmission", "requests", f"group {group_id!r} is empty", "K >= 1 requests")
        heapq.heappush(self._deferred, (self._order, group_id))
        self._order += 1
        self._requests[group_id] = list(requests)
        self._group_of.update({r.request_id: group_id for r in requests})

    @property
    def frontier(self) -> list[str]:
        return list(self._frontier)

    def release(self) -> list[GenerationRequest]:
        """Refill the frontier with the lowest-order deferred groups; return their requests to admit."""
        out: list[GenerationRequest] = []
        while len(self._frontier) < self.width and self._deferred:
            _, g = heapq.heappop(self._deferred)
            self._frontier.append(g)
            reqs = self._requests.pop(g)
            self._open[g] = len(reqs)
            out += reqs
        return out

    def on_finished(self, request_id: str) -> None:
        """Count a finished (or aborted) response; a serving-complete group leaves the frontier."""
        g = self._group_of.pop(request_id, None)
        if g is None or g not in self._open:
            return
        self._open[g] -= 1
        if self._open[g] == 0:
            del self._open[g]
            self._frontier.remove(g)


@dataclass(frozen=True)
class TrainableGroup:
    """A materialised GRPO group: every response with its reward and group-normalised advantage."""

    group_id: str
    response_ids: tuple[str, ...]
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]
    ready_s: float


class CompleteGroupHandoff:
    """CGP: groups enter the trainer FIFO as soon as they materialise; ``U`` of them form one update."""

    def __init__(self, k: int, u: int, eps_std: float = 1e-6) -> None:
        if k < 1 or u < 1:
            raise ConfigError("CompleteGroupHandoff", "k", f"K={k}, U={u}", "K >= 1 responses, U >= 1 groups")
        self.k, self.u, self.eps = k, u, eps_std
        self._partial: dict[str, list[tuple[str, float]]] = {}
        self._fifo: list[TrainableGroup] = []
        self.delivered = 0

    def on_response(self, group_id: str, response_id: str, reward: float, t_s: float) -> TrainableGroup | None:
        """Record one rewarded response; return the group if this completed (materialised) it."""
        got = self._partial.setdefault(group_id, [])
        got.append((response_id, float(reward)))
        if len(got) < self.k:
            return None
        del self._partial[group_id]
        rewards = [r for _, r in got]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        group = TrainableGroup(group_id, tuple(i for i, _ in got), tuple(rewards),
                               tuple((r - mean) / (std + self.eps) for r in rewards), t_s)
        self._fifo.append(group)
        return group

    def ready_batches(self, rollout_done: bool = False) -> list[list[TrainableGroup]]:
        """Pop every full ``U``-group batch from the FIFO head (in completion order)."""
        out = []
        while len(self._fifo) >= self.u:
            out.append(self._fifo[:self.u])
            self._fifo = self._fifo[self.u:]
        self.delivered += sum(len(b) for b in out)
        return out


class SerialHandoff(CompleteGroupHandoff):
    """Slime's barrier: complete groups are held until the rollout is done, then released together."""

    def ready_batches(self, rollout_done: bool = False) -> list[list[TrainableGroup]]:
        if not rollout_done:
            return []
        return super().ready_batches(rollout_done)


class AsyncBound:
    """RollArt's per-trajectory asynchronous bound on policy-version staleness.

    >>> ab = AsyncBound(bound=1)
    >>> ab.start("t1", version=3); ab.start("t2", version=4)
    >>> ab.on_new_version(5)
    ['t1']
    """

    def __init__(self, bound: int) -> None:
        if bound < 0:
            raise ConfigError("AsyncBound", "bound", f"{bound}", "an integer >= 0 (versions)")
        self.bound = bound
        self._started: dict[str, int] = {}

    def start(self, trajectory_id: str, version: int) -> None:
        self._started[trajectory_id] = version

    def finish(self, trajectory_id: str) -> None:
        self._started.pop(trajectory_id, None)

    def admissible(self, trajectory_id: str, current_version: int) -> bool:
        """Whether a finished trajectory may still enter the sample buffer."""
        v = self._started.get(trajectory_id)
        return v is not None and current_version - v <= self.bound

    def on_new_version(self, version: int) -> list[str]:
        """Return (and forget) the trajectories the new policy version makes too stale: abort them."""
        stale = sorted(t for t, v in self._started.items() if version - v > self.bound)
        for t in stale:
            del self._started[t]
        return stale


class RedundantRollout:
    """Launch ``ceil(target * (1 + redundancy))`` trajectories; abort the rest once ``target`` finished.

    >>> rr = RedundantRollout(target=2, redundancy=0.5)
    >>> ids = rr.launch(["a", "b", "c", "d"])
    >>> ids, rr.on_finished("b"), rr.on_finished("a")
    (['a', 'b', 'c'], [], ['c'])
    """

    def __init__(self, target: int, redundancy: float) -> None:
        if target < 1 or redundancy < 0:
            raise ConfigError("RedundantRollout", "target", f"target={target}, redundancy={redundancy}",
                              "target >= 1, redundancy >= 0")
        self.target, self.redundancy = target, redundancy
        self._outstanding: list[str] = []
        self.finished: list[str] = []

    @property
    def launch_count(self) -> int:
        return math.ceil(self.target * (1.0 + self.redundancy))

    def launch(self, candidates: Sequence[str]) -> list[str]:
        chosen = list(candidates)[:self.launch_count]
        self._outstanding = list(chosen)
        return chosen

    def on_finished(self, trajectory_id: str) -> list[str]:
        """Record a finished trajectory; return the outstanding ones to abort once the target is met."""
        if trajectory_id not in self._outstanding or len(self.finished) >= self.target:
            return []
        self._outstanding.remove(trajectory_id)
        self.finished.append(trajectory_id)
        if len(self.finished) < self.target:
            return []
        abort, self._outstanding = self._outstanding, []
        return abort
