"""Where a group's nodes come from, and what a placement costs the fabric.

Design note
-----------
Without a topology a pool is unbounded and node ids are just counters. With a fabric topology
(:mod:`fabric.topology`) every server of that cluster is one node of the pool whose GPU type the
topology names, and nodes are taken PoD-aware: a request lands in the PoD that already hosts the
group (or, failing that, in the single PoD that fits it most tightly) and spills over as few PoDs
as possible. RollMux has no such rule; it matters here because a job spread over PoDs pays the
PoD boundary (OCS-Core circuits) on every weight synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.model import JobSpec, Node
from orchestrl.fabric.errors import OrchestrlError
from orchestrl.fabric.topology import Topology

__all__ = ["CapacityError", "NodeAllocator", "CrossPodTraffic", "cross_pod_traffic"]


class CapacityError(OrchestrlError):
    """A pool backed by a topology has no free server left for a request."""


class NodeAllocator:
    """Hands out and takes back nodes of the rollout and training pools.

    Parameters
    ----------
    config : GroupConfig
    topologies : mapping pool -> Topology, optional
        Fabric of the cluster that hosts a pool (``"rollout"`` and/or ``"train"``); nodes of that
        pool and of the topology's ``gpu_type`` are its servers. Other pools/types are unbounded.
    fabric_aware : bool
        Pick servers in as few PoDs as possible (default); ``False`` takes the lowest free server
        ids, the first-fit a fabric-blind scheduler would use.

    Examples
    --------
    >>> from orchestrl.fabric.topology import FabricSpec
    >>> topo = Topology(FabricSpec(name="r", link_bps=200e9, pods=2, servers_per_pod=4, gpu_type="H20",
    ...                            boundary_ports_per_pod=4, core_devices=1))
    >>> alloc = NodeAllocator(GroupConfig(), {"rollout": topo})
    >>> [n.pod for n in alloc.allocate("rollout", "H20", 3)]
    [0, 0, 0]
    >>> [n.pod for n in alloc.allocate("rollout", "H20", 2)]  # PoD 0 has one left: take PoD 1 whole
    [1, 1]
    """

    def __init__(self, config: GroupConfig, topologies: dict[str, Topology] | None = None,
                 fabric_aware: bool = True) -> None:
        self.config = config
        self.topologies = dict(topologies or {})
        self.fabric_aware = fabric_aware
        self._next_id = 0
        self._free: dict[str, dict[int, list[int]]] = {}  # pool -> pod -> free servers (sorted)
        for pool, topo in self.topologies.items():
            per = topo.spec.servers_per_pod
            self._free[pool] = {p: list(range(p * per, (p + 1) * per)) for p in topo.pods}

    def bounded(self, pool: str, gpu_type: str) -> bool:
        topo = self.topologies.get(pool)
        return topo is not None and topo.spec.gpu_type == gpu_type

    def free_servers(self, pool: str) -> int:
        return sum(len(v) for v in self._free.get(pool, {}).values())

    def preview(self, pool: str, gpu_type: str, count: int, near_pods: Sequence[int] = ()) -> list[int | None]:
        """Return the PoDs (None when unbounded) of the nodes :meth:`allocate` would hand out now."""
        if count <= 0:
            return []
        if not self.bounded(pool, gpu_type):
            return [None] * count
        return [pod for pod, _ in self._choose(pool, count, near_pods)]

    def allocate(self, pool: str, gpu_type: str, count: int, near_pods: Sequence[int] = ()) -> list[Node]:
        """Take ``count`` nodes for ``pool``; raises :class:`CapacityError` when a bounded pool is short."""
        out = []
        if self.bounded(pool, gpu_type):
            for pod, server in self._choose(pool, count, near_pods):
                self._free[pool][pod].remove(server)
                out.append(self._node(pool, gpu_type, pod, server))
        else:
            out = [self._node(pool, gpu_type, None, None) for _ in range(count)]
        return out

    def release(self, nodes: Iterable[Node]) -> None:
        """Return nodes to their pool (servers become free again)."""
        for node in nodes:
            if node.server is not None and self.bounded(node.pool, node.gpu_type):
                free = self._free[node.pool][node.pod]
                free.append(node.server)
                free.sort()

    def _node(self, pool: str, gpu_type: str, pod: int | None, server: int | None) -> Node:
        self._next_id += 1
        return Node(self._next_id, pool, gpu_type, pod, server)

    def _choose(self, pool: str, count: int, near_pods: Sequence[int]) -> list[tuple[int, int]]:
        free = self._free[pool]
        total = sum(len(v) for v in free.values())
        if count > total:
            raise CapacityError(f"{pool} pool: {count} node(s) requested but only {total} free servers remain in "
                                f"fabric {self.topologies[pool].name!r}; use a larger topology or fewer jobs")
        if not self.fabric_aware:
            servers = sorted(s for v in free.values() for s in v)[:count]
            per = self.topologies[pool].spec.servers_per_pod
            return [(s // per, s) for s in servers]
        near = [p for p in dict.fromkeys(near_pods) if p in free]
        fits = [p for p in near if len(free[p]) >= count]
        if not fits:  # tightest single PoD that holds the whole request keeps big holes for big requests
            fits = sorted((p for p in free if len(free[p]) >= count), key=lambda p: (len(free[p]), p))[:1]
        if fits:
            return [(fits[0], s) for s in free[fits[0]][:count]]
        order = near + sorted((p for p in free if p not in near), key=lambda p: (-len(free[p]), p))
        out: list[tuple[int, int]] = []
        for p in order:
            take = free[p][: count - len(out)]
            out.extend((p, s) for s in take)
            if len(out) == count:
                break
        return out


@dataclass(frozen=True)
class CrossPodTraffic:
    """PoD-boundary bytes one iteration of a job sends, by cause."""

    rollout_pods: int  # PoDs its rollout nodes span
    train_pods: int  # PoDs the training pool spans
    weight_sync_bytes: float  # one weight copy enters every extra rollout PoD (PoD-aware broadcast tree)
    gradient_bytes: float  # ring all-reduce over the training nodes crosses each spanned PoD boundary

    @property
    def total_bytes(self) -> float:
        return self.weight_sync_bytes + self.gradient_bytes


def cross_pod_traffic(job: JobSpec, roll_nodes: Sequence[Node], train_nodes: Sequence[Node]) -> CrossPodTraffic:
    """Return the cross-PoD bytes per iteration that pinning ``job`` to these nodes implies.

    Weight sync (RollMux §5.2) sends one copy across the cluster link and then broadcasts inside the
    rollout cluster; a PoD-aware tree sends one copy over the boundary into each further PoD. A ring
    all-reduce of the gradients over ``n`` training nodes moves ``2 (n-1)/n`` times the gradient bytes
    over every ring link, and a PoD-contiguous ring crosses the boundary once per spanned PoD.

    Examples
    --------
    >>> job = JobSpec("a", 100, 100, model_params=7e9)
    >>> t = cross_pod_traffic(job, [Node(1, "rollout", "H20", 0), Node(2, "rollout", "H20", 1)], [])
    >>> t.rollout_pods, t.weight_sync_bytes / 1e9
    (2, 14.0)
    """
    r_pods = len({n.pod for n in roll_nodes if n.pod is not None})
    t_pods = len({n.pod for n in train_nodes if n.pod is not None})
    sync = job.weight_bytes * max(0, r_pods - 1)
    n = len(train_nodes)
    grad = 2.0 * (n - 1) / n * job.weight_bytes * t_pods if t_pods > 1 else 0.0
    return CrossPodTraffic(r_pods, t_pods, sync, grad)
