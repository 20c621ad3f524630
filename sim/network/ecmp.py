"""Equal-cost multipath over a switch-level graph: per-hop fluid splits, or one hashed path per flow.

Design note
-----------
Every fabric is routed on a directed graph whose nodes are the places that forward packets (EPS
leaves and spines, rail ToRs joined by optical circuits, or servers that forward for each other) and
whose edges are *bundles* of parallel links (``mult`` links of one line rate each). A route goes from
a source node to a *sink*: one or more exit nodes, each with an extra exit cost (RFabric may land a
flow on another rail's ToR of the destination rack and finish over NVLink at a price).

ECMP as a switch does it: the distance to the sink is computed once per sink (Dijkstra over integer
costs, so "equal cost" is exact), and at every node the traffic is split over the out-links that lie
on a shortest path, in proportion to how many parallel links each has -- a *per-hop* split, like
hardware ECMP, not an even split over whole paths. A flow's fractional use of every bundle follows
by propagating a unit of traffic down that shortest-path DAG. With ``hash`` routing each flow
instead follows one path, picked hop by hop by a hash of the flow and the node over the individual
links.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

__all__ = ["HOP_COST", "Sink", "RouteBlock", "EcmpGraph"]

#: Cost of one network hop. Integer costs keep "equal cost" exact; exits may add a fraction of a hop.
HOP_COST = 2


@dataclass(frozen=True)
class Sink:
    """Where routes end: exit nodes with an extra cost and a caller's label (e.g. the landing rail)."""

    nodes: tuple[int, ...]
    extra_cost: tuple[int, ...]  # in HOP_COST units; 0 for the preferred exit
    exit_id: tuple[int, ...]  # label reported in RouteBlock.exit_frac columns
    exit_lat_s: tuple[float, ...]  # latency added when leaving through this exit


@dataclass(frozen=True)
class RouteBlock:
    """Fluid routes from several sources to one sink.

    ``indptr``/``bundle``/``frac`` form a CSR matrix (sources x bundles) of the fraction of a unit of
    traffic that crosses each bundle; ``exit_frac[i, j]`` is the fraction leaving at exit label
    ``exit_labels[j]``; ``reachable`` is False where the sink cannot be reached.
    """

    indptr: np.ndarray
    bundle: np.ndarray
    frac: np.ndarray
    exit_labels: np.ndarray
    exit_frac: np.ndarray
    latency_s: np.ndarray
    hops: np.ndarray  # expected number of edges crossed
    reachable: np.ndarray


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a fast, well-spread hash of uint64 values."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class EcmpGraph:
    """A directed multigraph of bundles that routes traffic by per-hop ECMP.

    Parameters
    ----------
    n_nodes : int
    tail, head : ndarray of int, shape (E,)
        Edge ends; several edges may join the same pair (hash routing keeps links apart).
    mult : ndarray of float, shape (E,)
        Parallel links in the edge: its ECMP weight. Edges with ``mult <= 0`` are ignored (failed).
    cost : ndarray of int, shape (E,)
        Routing cost of the edge (``HOP_COST`` per hop).
    lat_s : ndarray of float, shape (E,)
        Latency of crossing the edge (links plus the switch at its head).
    bundle : ndarray of int, shape (E,)
        Bundle (capacity constraint) each edge belongs to; parallel or equivalent edges may share one.

    Notes
    -----
    Distances cost one Dijkstra per sink, O(E + N log N); routes from ``k`` sources cost
    O(depth * E * k) for a DAG of the given depth.
    """

    def __init__(self, n_nodes: int, tail: np.ndarray, head: np.ndarray, mult: np.ndarray, cost: np.ndarray,
                 lat_s: np.ndarray, bundle: np.ndarray) -> None:
        keep = np.asarray(mult, dtype=np.float64) > 0
        self.n_nodes = int(n_nodes)
        self.tail = np.asarray(tail, dtype=np.int64)[keep]
        self.head = np.asarray(head, dtype=np.int64)[keep]
        self.mult = np.asarray(mult, dtype=np.float64)[keep]
        self.cost = np.asarray(cost, dtype=np.int64)[keep]
        self.lat_s = np.asarray(lat_s, dtype=np.float64)[keep]
        self.bundle = np.asarray(bundle, dtype=np.int64)[keep]
        # One entry per node pair for Dijkstra (a CSR matrix would *sum* duplicate entries).
        key = self.tail * (self.n_nodes + 1) + self.head
        order = np.argsort(key, kind="stable")
        uniq, starts = np.unique(key[order], return_index=True)
        self._pair_tail = uniq // (self.n_nodes + 1)
        self._pair_head = uniq % (self.n_nodes + 1)
        self._pair_cost = np.minimum.reduceat(self.cost[order], starts) if len(key) else self.cost
        self._dist_cache: dict[Sink, np.ndarray] = {}
        # Switch-level bundles are few next to the per-GPU ones (NIC, NVLink): routes aggregate edges onto
        # these compact ids, so the per-source bundle vectors stay small at 8,192 GPUs.
        self._bundle_ids, self._bundle_compact = np.unique(self.bundle, return_inverse=True)

    @property
    def n_edges(self) -> int:
        return len(self.tail)

    def distances(self, sink: Sink) -> np.ndarray:
        """Return every node's cost to leave through ``sink`` (inf where it cannot), cached per sink."""
        got = self._dist_cache.get(sink)
        if got is not None:
            return got
        n = self.n_nodes
        virtual = n  # edges reversed, plus a virtual node feeding the exits
        rows = np.concatenate([self._pair_head, np.full(len(sink.nodes), virtual)])
        cols = np.concatenate([self._pair_tail, np.asarray(sink.nodes, dtype=np.int64)])
        vals = np.concatenate([self._pair_cost, 1 + np.asarray(sink.extra_cost, dtype=np.int64)]).astype(np.float64)
        rev = sp.csr_matrix((vals, (rows, cols)), shape=(n + 1, n + 1))
        dist = dijkstra(rev, directed=True, indices=virtual)[:n]
        if len(self._dist_cache) > 4096:
            self._dist_cache.clear()
        self._dist_cache[sink] = dist
        return dist

    def _dag(self, sink: Sink):
        dist = self.distances(sink)
        dt, dh = dist[self.tail], dist[self.head]
        tight = np.isfinite(dt) & np.isfinite(dh) & (dt == self.cost + dh)
        ex_nodes = np.asarray(sink.nodes, dtype=np.int64)
        ex_ok = dist[ex_nodes] == 1 + np.asarray(sink.extra_cost, dtype=np.float64)
        wsum = (np.bincount(self.tail[tight], weights=self.mult[tight], minlength=self.n_nodes)
                + np.bincount(ex_nodes[ex_ok], minlength=self.n_nodes))
        e = np.flatnonzero(tight)
        split = self.mult[e] / wsum[self.tail[e]]
        ex = np.flatnonzero(ex_ok)
        ex_split = 1.0 / wsum[ex_nodes[ex]]
        return dist, e, split, ex, ex_split

    def route(self, sources: np.ndarray, sink: Sink, chunk: int = 128) -> RouteBlock:
        """Return the fluid ECMP routes from each node in ``sources`` to ``sink``.

        Notes
        -----
        O(depth * E * k) for k sources, processed ``chunk`` sources at a time to bound memory; the
        per-source work after propagation is on node-level weights (nodes x k, not edges x k).
        """
        sources = np.asarray(sources, dtype=np.int64)
        dist, e, split, ex, ex_split = self._dag(sink)
        n = self.n_nodes
        step = sp.csr_matrix((split, (self.head[e], self.tail[e])), shape=(n, n))
        ex_nodes = np.asarray(sink.nodes, dtype=np.int64)[ex]
        labels_all = np.asarray(sink.exit_id, dtype=np.int64)
        labels = np.unique(labels_all)
        ex_col = np.searchsorted(labels, labels_all[ex])
        ex_lat = np.asarray(sink.exit_lat_s, dtype=np.float64)[ex]
        # Everything a source needs is linear in ``total`` (its traffic through each node), so fold the
        # edges into node-level weights once per sink instead of expanding an edges x sources array:
        # bundle load = sum over DAG edges out of v of split * total[v], likewise latency and hop count.
        tails = self.tail[e]
        on_node = sp.csr_matrix((split, (self._bundle_compact[e], tails)), shape=(len(self._bundle_ids), n))
        lat_w = np.bincount(tails, weights=split * self.lat_s[e], minlength=n)
        hop_w = np.bincount(tails, weights=split, minlength=n)
        parts_ptr, parts_b, parts_f = [np.zeros(1, np.int64)], [], []
        exit_frac = np.zeros((len(sources), len(labels)))
        latency = np.zeros(len(sources))
        hops = np.zeros(len(sources))
        for lo in range(0, len(sources), chunk):
            src = sources[lo:lo + chunk]
            k = len(src)
            cur = np.zeros((n, k))
            cur[src, np.arange(k)] = 1.0
            total = cur.copy()
            for _ in range(n):
                cur = step @ cur
                if not cur.any():
                    break
                total += cur
            on_bundle = np.ascontiguousarray((on_node @ total).T)  # k x (switch-level bundles)
            cols, rows = np.nonzero(on_bundle)
            parts_b.append(self._bundle_ids[rows])
            parts_f.append(on_bundle[cols, rows])
            parts_ptr.append(parts_ptr[-1][-1] + np.cumsum(np.bincount(cols, minlength=k)))
            xf = ex_split[:, None] * total[ex_nodes]  # exits x k
            for j in range(len(ex)):  # exits are few (a rack's ToRs at most)
                exit_frac[lo:lo + k, ex_col[j]] += xf[j]
            latency[lo:lo + k] = lat_w @ total + ex_lat @ xf
            hops[lo:lo + k] = hop_w @ total
        reachable = np.isfinite(dist[sources])
        return RouteBlock(np.concatenate(parts_ptr), np.concatenate(parts_b) if parts_b else np.zeros(0, np.int64),
                          np.concatenate(parts_f) if parts_f else np.zeros(0), labels, exit_frac, latency, hops,
                          reachable)

    def hashed_paths(self, sources: np.ndarray, flow_keys: np.ndarray, sink: Sink, seed: int = 0
                     ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Return one ECMP path per flow (hash of flow key and node picks each hop).

        Returns ``(flow_idx_per_hop, bundle_per_hop)`` concatenated over hops as a list
        ``[flow_rows, bundles]``, then each flow's exit label, latency, hop count and reachability.

        Notes
        -----
        O(depth * F) vectorised over the F flows of the sink.
        """
        sources = np.asarray(sources, dtype=np.int64)
        keys = np.asarray(flow_keys, dtype=np.uint64)
        dist, e, split, ex, _ = self._dag(sink)
        n = self.n_nodes
        ex_nodes = np.asarray(sink.nodes, dtype=np.int64)[ex]
        ex_labels = np.asarray(sink.exit_id, dtype=np.int64)[ex]
        ex_lat = np.asarray(sink.exit_lat_s, dtype=np.float64)[ex]
        # Out-options per node: DAG edges (weighted by parallel links) then exits, in CSR order.
        opt_node = np.concatenate([self.tail[e], ex_nodes])
        opt_w = np.concatenate([self.mult[e], np.ones(len(ex))])
        opt_ref = np.concatenate([e, -1 - np.arange(len(ex))])  # >= 0: edge id, < 0: exit index
        order = np.argsort(opt_node, kind="stable")
        opt_node, opt_w, opt_ref = opt_node[order], opt_w[order], opt_ref[order]
        ptr = np.concatenate([[0], np.cumsum(np.bincount(opt_node, minlength=n))])
        cumw = np.cumsum(opt_w)
        f = len(sources)
        node = sources.copy()
        live = np.isfinite(dist[node])
        reach = live.copy()
        exit_label = np.full(f, -1, dtype=np.int64)
        latency = np.zeros(f)
        hops = np.zeros(f)
        rows, bundles = [], []
        idx = np.arange(f)
        salt = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        for _ in range(n + 1):
            if not live.any():
                break
            i = idx[live]
            v = node[i]
            lo, hi = ptr[v], ptr[v + 1]
            base = np.where(lo > 0, cumw[np.maximum(lo - 1, 0)], 0.0)
            width = cumw[hi - 1] - base
            h = _mix(keys[i] ^ salt ^ (v.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)))
            pick = base + (h % np.uint64(1 << 53)).astype(np.float64) / float(1 << 53) * width
            j = np.minimum(np.searchsorted(cumw, pick, side="right"), hi - 1)
            ref = opt_ref[j]
            is_edge = ref >= 0
            ie = i[is_edge]
            rows.append(ie)
            bundles.append(self.bundle[ref[is_edge]])
            latency[ie] += self.lat_s[ref[is_edge]]
            hops[ie] += 1
            node[ie] = self.head[ref[is_edge]]
            ix = i[~is_edge]
            xi = -1 - ref[~is_edge]
            exit_label[ix] = ex_labels[xi]
            latency[ix] += ex_lat[xi]
            live[ix] = False
        cat = (np.concatenate(rows) if rows else np.zeros(0, np.int64),
               np.concatenate(bundles) if bundles else np.zeros(0, np.int64))
        return [cat[0], cat[1]], exit_label, latency, hops, reach
