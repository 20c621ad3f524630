"""Collectives -> rank-pair bytes -> ToR-level and PoD-level demand (AggregateDemand, Algorithm 2).

Design note
-----------
The pair half lives in :mod:`fabric.traffic_pairs` (re-exported here).
Demand is built in two steps. :func:`rank_pair_bytes` expands one collective into directed
GPU -> GPU bytes under a fixed algorithm per primitive (ring all-reduce, pairwise all-to-all, ...);
:func:`aggregate_demand` then folds GPU pairs onto the fabric with a ToR-centric view (Appendix D.1):

* both GPUs in one server: NVLink, no network demand;
* both NICs on one ToR: switched by the always-on EPS ToR, no OCS demand;
* two ToRs of one PoD: ToR -> ToR demand on that PoD's OCS-Agg;
* two PoDs ``p -> q``: a *lift* ``ToR -> uplink_endpoint(p, q)`` in PoD ``p``, a *drop*
  ``uplink_endpoint(q, p) -> ToR'`` in PoD ``q``, and PoD ``p -> q`` demand on OCS-Core.

Pairs are kept as numpy arrays internally and summed with ``np.unique`` + ``np.bincount``, so the
cost is a few vector passes over the pairs rather than a Python loop per pair: a 2,048-GPU
all-to-all over 64-GPU groups (~130k pairs) aggregates in tens of milliseconds.

The per-primitive models (``S`` = ``bytes_per_rank``, ``n`` = group size) are NCCL's ring and
pairwise algorithms, with buffer sizes defined as in :class:`fabric.intent.Collective`:

==================  ========================================================  =================
primitive           who sends what                                            bytes per group
==================  ========================================================  =================
all-reduce          each rank ``2 (n-1)/n * S`` to its ring successor         ``2 (n-1) S``
all-gather          each rank ``(n-1)/n * S`` to its ring successor           ``(n-1) S``
reduce-scatter      each rank ``(n-1)/n * S`` to its ring successor           ``(n-1) S``
all-to-all          each rank ``S/n`` to every other member                   ``(n-1) S``
p2p                 stage ``i -> i+1`` and ``i+1 -> i``, ``S`` each           ``2 (n-1) S``
m2n                 each src ``S/m`` to each of ``m`` dst ranks, and back     ``2 |src| S``
weight-sync         shard-scatter stand-in, see :func:`weight_sync_transfers`  ``|gen| S``
response-stream     gen GPU ``i`` sends ``S`` to train GPU ``i mod |train|``  ``|gen| S``
==================  ========================================================  =================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from orchestrl.fabric.intent import Intent
from orchestrl.fabric.topology import Topology, tor_endpoint, uplink_endpoint
from orchestrl.fabric.traffic_pairs import (  # noqa: F401
    PairArrays,
    _collective_pairs,
    _gpu_arrays,
    _intent_pairs,
    _Pairs,
    _sum_pairs,
    _to_dict,
    collective_pair_arrays,
    demand_of_intent,
    intent_pair_arrays,
    rank_pair_bytes,
    transfer_pair_bytes,
    tree_all_reduce_pair_arrays,
    weight_sync_transfers,
)
from orchestrl.fabric.traffic_pairs import __all__ as _pairs_all

__all__ = [
    "AggregateDemand",
    *_pairs_all,  # the pair-array API, re-exported
    "aggregate_demand",
    "aggregate_pair_arrays",
    "aggregate_intent",
    "pod_flows_by_primitive",
]


@dataclass(frozen=True)
class AggregateDemand:
    """Demand at the two scopes the allocator solves (OrchestrRL §5.3 Phase 2, Appendix D.1).

    Attributes
    ----------
    tor_demand : dict of int -> dict of (str, str) -> float
        Per PoD (every PoD of the topology has an entry, possibly empty): directed bytes between
        that PoD's OCS-Agg endpoints -- ToR -> ToR, ToR -> ``uplink_endpoint(pod, peer)`` (lift)
        and ``uplink_endpoint(pod, peer)`` -> ToR (drop).
    pod_demand : dict of (int, int) -> float
        Directed PoD -> PoD bytes for OCS-Core.
    eps_bytes : float
        Bytes that create no OCS demand: both ends in one server (NVLink) or on one ToR (EPS).
    nvlink_bytes : float
        The part of ``eps_bytes`` whose ends share a server.
    total_bytes : float
        All rank-pair bytes aggregated.
    """

    tor_demand: dict[int, dict[tuple[str, str], float]]
    pod_demand: dict[tuple[int, int], float]
    eps_bytes: float  # reported so a caller can see how much traffic the OCS never carries
    nvlink_bytes: float
    total_bytes: float

    @property
    def inter_pod_bytes(self) -> float:
        """Bytes crossing a PoD boundary (sum of ``pod_demand``)."""
        return float(sum(self.pod_demand.values()))

    @property
    def intra_pod_ocs_bytes(self) -> float:
        """Bytes between two ToRs of one PoD (carried by OCS-Agg ToR -> ToR circuits)."""
        return self.total_bytes - self.eps_bytes - self.inter_pod_bytes

    def to_json(self) -> dict[str, object]:
        """Return a JSON-serialisable form (pair keys written ``"src->dst"``)."""
        return {
            "tor_demand": {str(p): {f"{u}->{v}": b for (u, v), b in d.items()} for p, d in self.tor_demand.items()},
            "pod_demand": {f"{p}->{q}": b for (p, q), b in self.pod_demand.items()},
            "eps_bytes": self.eps_bytes,
            "nvlink_bytes": self.nvlink_bytes,
            "total_bytes": self.total_bytes,
        }


# -- collectives -> rank pairs ---------------------------------------------------------------


# -- rank pairs -> ToR / PoD demand ----------------------------------------------------------


def aggregate_demand(pair_bytes: Mapping[tuple[int, int], float], topology: Topology) -> AggregateDemand:
    """Fold GPU -> GPU bytes onto the fabric (Algorithm 2, line 4: AGGREGATEDEMAND).

    Parameters
    ----------
    pair_bytes : mapping of (src GPU, dst GPU) -> bytes
        E.g. from :func:`demand_of_intent`.
    topology : Topology
        Gives each GPU's server, ToR and PoD.

    Returns
    -------
    AggregateDemand
        ToR-level demand per PoD (ToR -> ToR, lift, drop), PoD -> PoD demand, and the bytes that
        stayed on NVLink / EPS.

    Raises
    ------
    IndexError
        If a GPU is outside the topology.

    Notes
    -----
    O(P log P + G) for P pairs and G GPUs in the topology; vectorised with numpy.

    Examples
    --------
    >>> from orchestrl.fabric.topology import FabricSpec, Topology
    >>> topo = Topology(FabricSpec(name="t", link_bps=1e11, pods=2, servers_per_pod=2,
    ...                            boundary_ports_per_pod=4, core_devices=1))
    >>> agg = aggregate_demand({(0, 1): 5.0, (0, 8): 7.0, (0, 17): 2.0}, topo)
    >>> agg.nvlink_bytes, agg.eps_bytes, agg.pod_demand
    (5.0, 12.0, {(0, 1): 2.0})
    >>> agg.tor_demand[0], agg.tor_demand[1]
    ({('pod0/tor0', 'pod0/up:pod1'): 2.0}, {('pod1/up:pod0', 'pod1/tor1'): 2.0})
    """
    items = list(pair_bytes.items())
    src = np.fromiter((k[0] for k, _ in items), dtype=np.int64, count=len(items))
    dst = np.fromiter((k[1] for k, _ in items), dtype=np.int64, count=len(items))
    vol = np.fromiter((v for _, v in items), dtype=np.float64, count=len(items))
    return _aggregate(src, dst, vol, topology)


def aggregate_pair_arrays(src: np.ndarray, dst: np.ndarray, vol: np.ndarray, topology: Topology) -> AggregateDemand:
    """Return the aggregate demand of ``(src, dst, bytes)`` arrays (:func:`aggregate_demand` without a dict).

    Notes
    -----
    O(P log P + G) for P pairs and G GPUs.
    """
    return _aggregate(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                      np.asarray(vol, dtype=np.float64), topology)


def aggregate_intent(intent: Intent, topology: Topology) -> AggregateDemand:
    """Return the aggregate demand of an intent (:func:`demand_of_intent` + :func:`aggregate_demand`).

    Skips the intermediate dict, which matters at cluster scale.

    Notes
    -----
    O(P log P + G) for P pairs and G GPUs.
    """
    return _aggregate(*_intent_pairs(intent, topology), topology)


def pod_flows_by_primitive(intent: Intent, topology: Topology) -> dict[str, set[tuple[int, int]]]:
    """Return, per primitive, the directed PoD pairs ``(p, q)``, ``p != q``, that carry its bytes.

    This is membership, not volume: what a stage template instantiates its OCS-Core scope from.

    Notes
    -----
    O(P log P) for P pairs.

    Examples
    --------
    >>> from orchestrl.fabric.intent import Collective
    >>> from orchestrl.fabric.topology import FabricSpec, Topology
    >>> topo = Topology(FabricSpec(name="t", link_bps=1e11, pods=2, servers_per_pod=1,
    ...                            boundary_ports_per_pod=2, core_devices=1))
    >>> i = Intent("gen", "j", "g", (Collective("response-stream", src_gpus=(8, 9), dst_gpus=(0,),
    ...                                          bytes_per_rank=1.0),))
    >>> pod_flows_by_primitive(i, topo)
    {'response-stream': {(1, 0)}}
    """
    arrays = _gpu_arrays(topology)
    out: dict[str, set[tuple[int, int]]] = {}
    for c in intent.collectives:
        src, dst, _ = _collective_pairs(c, topology)
        _check_range(src, dst, topology)
        ps, pd = arrays.pod[src], arrays.pod[dst]
        cross = ps != pd
        flows = out.setdefault(c.primitive, set())
        keys = np.unique(ps[cross] * len(topology.pods) + pd[cross])
        flows.update((int(k // len(topology.pods)), int(k % len(topology.pods))) for k in keys)
    return out


def _check_range(src: np.ndarray, dst: np.ndarray, topology: Topology) -> None:
    if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= topology.gpu_count):
        bad = next(int(g) for g in np.concatenate([src, dst]) if not 0 <= g < topology.gpu_count)
        raise IndexError(f"GPU {bad} is outside fabric {topology.name!r} (0..{topology.gpu_count - 1})")


def _grouped_sum(keys: np.ndarray, vol: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inverse.ravel(), weights=vol, minlength=len(uniq))


def _aggregate(src: np.ndarray, dst: np.ndarray, vol: np.ndarray, topology: Topology) -> AggregateDemand:
    src, dst, vol = _sum_pairs(src, dst, vol)
    _check_range(src, dst, topology)
    a = _gpu_arrays(topology)
    n_pods = len(topology.pods)
    n_tors = len(a.tor_ids)
    same_server = a.server[src] == a.server[dst]
    ts, td = a.tor[src], a.tor[dst]
    ps, pd = a.pod[src], a.pod[dst]
    same_tor = (ts == td) & ~same_server
    intra = (ps == pd) & (ts != td) & ~same_server
    inter = ps != pd

    tor_demand: dict[int, dict[tuple[str, str], float]] = {p: {} for p in topology.pods}
    keys, sums = _grouped_sum(ts[intra] * n_tors + td[intra], vol[intra])
    for k, b in zip(keys.tolist(), sums.tolist()):
        u, v = divmod(k, n_tors)
        tor_demand[int(a.tor_pod[u])][(tor_endpoint(a.tor_ids[u]), tor_endpoint(a.tor_ids[v]))] = b
    # Lift: the sending ToR reaches its PoD's boundary ports toward the destination PoD.
    keys, sums = _grouped_sum(ts[inter] * n_pods + pd[inter], vol[inter])
    for k, b in zip(keys.tolist(), sums.tolist()):
        t, q = divmod(k, n_pods)
        p = int(a.tor_pod[t])
        tor_demand[p][(tor_endpoint(a.tor_ids[t]), uplink_endpoint(p, q))] = b
    # Drop: the receiving PoD's boundary ports from the source PoD reach the receiving ToR.
    keys, sums = _grouped_sum(td[inter] * n_pods + ps[inter], vol[inter])
    for k, b in zip(keys.tolist(), sums.tolist()):
        t, p = divmod(k, n_pods)
        q = int(a.tor_pod[t])
        tor_demand[q][(uplink_endpoint(q, p), tor_endpoint(a.tor_ids[t]))] = b
    keys, sums = _grouped_sum(ps[inter] * n_pods + pd[inter], vol[inter])
    pod_demand = {divmod(k, n_pods): b for k, b in zip(keys.tolist(), sums.tolist())}

    nvlink = float(vol[same_server].sum())
    return AggregateDemand(
        tor_demand=tor_demand,
        pod_demand={(int(p), int(q)): b for (p, q), b in pod_demand.items()},
        eps_bytes=nvlink + float(vol[same_tor].sum()),
        nvlink_bytes=nvlink,
        total_bytes=float(vol.sum()),
    )
