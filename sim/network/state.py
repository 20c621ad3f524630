"""A fabric at one moment: capacities of every bundle and the routes of flows, with route classes cached.

Design note
-----------
Bundles are numbered in two blocks. The *base* block is the same in every state of a fabric: per GPU
its NVLink out and in ports and, for fabrics whose NICs hang off a switch, its NIC up and down links.
The *switch* block holds the bundles of the routing graph (:class:`sim.network.ecmp.EcmpGraph`),
which change with failures and, for RFabric, with every circuit plan.

Flows between servers are routed in two parts: their own bundles (NIC, NVLink) and the shared
profile of their *route class* -- the (source node, sink) pair of the routing graph -- computed once
per class and state. Before profiles are computed, switch links that every (source, sink) route
loads in proportion to their capacity are merged into one bundle: they saturate together whatever
the traffic, so max-min rates are unchanged, and a symmetric Clos then needs a handful of bundles per
route instead of one per link (see :func:`merged_bundles`).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from orchestrl.sim.network.config import SimConfig
from orchestrl.sim.network.ecmp import EcmpGraph, RouteBlock, Sink
from orchestrl.sim.network.maxmin import MaxMinProblem

__all__ = ["Incidence", "SwitchGraph", "NetState", "merged_bundles", "BASE_KINDS"]

#: Bundle kinds of the base block, in block order.
BASE_KINDS = ("nvlink-out", "nvlink-in", "nic-up", "nic-down")


@dataclass(frozen=True)
class Incidence:
    """How a set of flows loads the bundles of one state: own entries plus a shared class profile."""

    own: sp.csr_matrix  # (F, L)
    cls: np.ndarray  # (F,) route class, -1 for none
    prof: sp.csr_matrix  # (K, L)
    latency_s: np.ndarray  # (F,) path latency (propagation, serialisation, switches)
    routable: np.ndarray  # (F,) False where no path exists in this state

    def problem(self) -> MaxMinProblem:
        return MaxMinProblem(self.own, self.cls, self.prof)


@dataclass(frozen=True)
class SwitchGraph:
    """Switch-level edges of a state before merging (one row per edge)."""

    n_nodes: int
    tail: np.ndarray
    head: np.ndarray
    mult: np.ndarray  # parallel links; 0 = failed
    cost: np.ndarray
    lat_s: np.ndarray
    mergeable: np.ndarray  # False for links a caller must look up by identity (NIC links)
    labels: list[str]  # one per edge, for reports


def merged_bundles(graph: SwitchGraph, sources: np.ndarray, sinks: list[Sink], link_bps: float,
                   seed: int = 7) -> np.ndarray:
    """Return a bundle id per edge such that edges sharing an id are loaded alike by every route.

    Two edges may share a bundle iff, for every (source, sink) route, the fraction of traffic each
    carries divided by its capacity is the same: then their utilisation is equal for any traffic
    mix, and one bundle with the summed capacity is an exact stand-in. The test uses random
    projections: for each sink, all sources inject independent random amounts at once and each
    edge's load per unit capacity is accumulated over three such projections; edges whose three
    sums agree to 1e-9 are equivalent with probability one. Parallel links are already one edge.

    Notes
    -----
    O(S * depth * E) for S sinks: three propagations per sink instead of one per route.
    """
    n_edges = len(graph.tail)
    if n_edges == 0:
        return np.zeros(0, np.int64)
    g = EcmpGraph(graph.n_nodes, graph.tail, graph.head, graph.mult, graph.cost, graph.lat_s, np.arange(n_edges))
    rng = np.random.default_rng(seed)
    sig = np.zeros((n_edges, 3))
    cap = np.maximum(graph.mult, 1e-300) * link_bps
    for sink in sinks:
        dist, e, split, _, _ = g._dag(sink)
        if not len(e):
            continue
        n = graph.n_nodes
        step = sp.csr_matrix((split, (g.head[e], g.tail[e])), shape=(n, n))
        cur = np.zeros((n, 3))
        ok = sources[np.isfinite(dist[sources])]
        cur[ok] = rng.random((len(ok), 3)) + 0.5
        total = cur.copy()
        for _ in range(n):
            cur = step @ cur
            if not cur.any():
                break
            total += cur
        sig[g.bundle[e]] += split[:, None] * total[g.tail[e]] / cap[g.bundle[e], None]
    keep = np.ones(n_edges, bool) if graph.mergeable is None else graph.mergeable
    scale = np.abs(sig).max() or 1.0
    key = np.round(sig / scale * 1e9).astype(np.int64)
    ids = np.full(n_edges, -1, dtype=np.int64)
    _, inv = np.unique(key[keep], axis=0, return_inverse=True)
    ids[keep] = inv.ravel()
    ids[~keep] = inv.max(initial=-1) + 1 + np.arange(int((~keep).sum()))
    return ids


def _lookup(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, row_of: np.ndarray, n_cols: int):
    """Return ``f(i, b)``: the entry (row ``row_of[i]``, column ``b``) of a CSR matrix, vectorised.

    Notes
    -----
    O(nnz) once (row-major keys are sorted by construction), O(log nnz) per query.
    """
    built: list[tuple[np.ndarray, np.ndarray]] = []

    def on_bundle(i: np.ndarray, b: np.ndarray) -> np.ndarray:
        if not built:  # most fabrics never ask: build the sorted keys on first use
            rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
            k = rows * np.int64(n_cols) + indices
            order = np.argsort(k, kind="stable")
            built.append((k[order], np.asarray(data)[order]))
        keys, vals = built[0]
        q = row_of[i] * np.int64(n_cols) + b
        pos = np.minimum(np.searchsorted(keys, q), max(len(keys) - 1, 0))
        hit = (keys[pos] == q) if len(keys) else np.zeros(len(q), bool)
        return np.where(hit, vals[pos] if len(keys) else 0.0, 0.0)
    return on_bundle


class NetState(ABC):
    """Capacities and routes of a fabric in one state (failures, circuits); routes cached per class.

    Subclasses (one per fabric family) say where a flow enters and leaves the routing graph and
    which of its own bundles it loads: :meth:`_endpoints` and :meth:`_own`.
    """

    def __init__(self, fabric, graph: SwitchGraph, sinks_for_merge: list[Sink] | None,
                 merge_sources: np.ndarray | None, failures=None, tag: str = "") -> None:
        self.fabric = fabric
        self.config: SimConfig = fabric.config
        self.failures = failures
        g = fabric.gpus
        self.n_base = 4 * g
        live = graph.mult > 0
        if self.config.merge_bundles and self.config.ecmp == "fluid" and sinks_for_merge is not None:
            ids = merged_bundles(graph, merge_sources, sinks_for_merge, self.config.link_bps)
        else:
            ids = np.arange(len(graph.tail))
        ids = np.where(live, ids, -1)
        uniq, inv = np.unique(ids[live], return_inverse=True)
        bundle_of_edge = np.full(len(graph.tail), -1, dtype=np.int64)
        bundle_of_edge[live] = self.n_base + inv.ravel()
        self.edge_bundle = bundle_of_edge
        self.n_switch = len(uniq)
        self.n_bundles = self.n_base + self.n_switch
        cap = np.zeros(self.n_bundles)
        cap[:2 * g] = self.config.nvlink_bps
        cap[2 * g:4 * g] = self.config.link_bps if fabric.nic_attached else 0.0
        if fabric.nic_attached and failures is not None:
            dead = np.asarray(sorted(failures.nics), dtype=np.int64)
            cap[2 * g + dead] = 0.0
            cap[3 * g + dead] = 0.0
        np.add.at(cap, bundle_of_edge[live], graph.mult[live] * self.config.link_bps)
        self.capacity_bps = cap
        self.switch_graph = graph
        self.graph = EcmpGraph(graph.n_nodes, graph.tail[live], graph.head[live], graph.mult[live],
                               graph.cost[live], graph.lat_s[live], bundle_of_edge[live])
        self._labels = graph.labels
        self._class_key: dict[tuple[int, object], int] = {}
        self._blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (ptr, bundle, frac) per block
        self._exit: list[np.ndarray] = []
        self._lat: list[np.ndarray] = []
        self._reach: list[np.ndarray] = []
        self._n_classes = 0
        self._prof: sp.csr_matrix | None = None
        self._exit_arr: np.ndarray | None = None
        self.signature = hashlib.sha256(
            (fabric.signature + "|" + tag).encode()).hexdigest()[:16]

    # ---------------------------------------------------------------- hooks
    @abstractmethod
    def _endpoints(self, src: np.ndarray, dst: np.ndarray):
        """Return (source node, sink key, {sink key: Sink}, context for _own) for cross-server flows."""

    @abstractmethod
    def _own(self, src: np.ndarray, dst: np.ndarray, ctx, exit_dist: np.ndarray, on_bundle):
        """Return (rows, bundles, fractions, extra latency per flow) of the flows' own bundles.

        ``exit_dist[i, r]`` is the fraction of flow ``i`` that leaves the routing graph onto rail
        ``r`` of the destination server (column ``R``: onto the flow's own NIC); ``on_bundle(i, b)``
        returns the fraction of flows ``i`` routed over bundles ``b`` (vectorised).
        """

    # ---------------------------------------------------------------- classes
    def _classes(self, nodes: np.ndarray, keys: np.ndarray, sinks: dict) -> np.ndarray:
        """Return the route class of each (source node, sink key), routing the new ones.

        Notes
        -----
        O(F log F) to find the distinct pairs; routing only for pairs not seen before in this state.
        """
        nodes = np.asarray(nodes, dtype=np.int64)
        keys = np.asarray(keys, dtype=np.int64)
        width = int(keys.max()) + 1 if len(keys) else 1
        uniq, inv = np.unique(nodes * width + keys, return_inverse=True)
        pairs = list(zip((uniq // width).tolist(), (uniq % width).tolist()))
        missing: dict[int, list[int]] = {}
        for p in pairs:
            if p not in self._class_key:
                missing.setdefault(p[1], []).append(p[0])
        for key, srcs in missing.items():
            srcs = sorted(set(srcs))
            if self.config.ecmp == "hash":  # hashed flows keep no class profile; only reachability
                block = None
            else:
                block = self.graph.route(np.asarray(srcs), sinks[key])
            self._add_block(key, srcs, block, sinks[key])
        ids = np.fromiter((self._class_key[p] for p in pairs), dtype=np.int64, count=len(pairs))
        return ids[inv.ravel()]

    def _add_block(self, key, srcs: list[int], block: RouteBlock | None, sink: Sink) -> None:
        k0 = self._n_classes
        for j, s in enumerate(srcs):
            self._class_key[(s, key)] = k0 + j
        self._n_classes += len(srcs)
        n_rails = self.fabric.gpus_per_server + 1  # column R: the flow's own NIC
        ex = np.zeros((len(srcs), n_rails))
        if block is None:
            dist = self.graph.distances(sink)
            self._blocks.append((np.zeros(len(srcs) + 1, np.int64), np.zeros(0, np.int64), np.zeros(0)))
            self._lat.append(np.zeros(len(srcs)))
            self._reach.append(np.isfinite(dist[np.asarray(srcs)]))
        else:
            self._blocks.append((block.indptr, block.bundle, block.frac))
            cols = np.where(block.exit_labels < 0, n_rails - 1, block.exit_labels)
            ex[:, cols] = block.exit_frac
            self._lat.append(block.latency_s)
            self._reach.append(block.reachable)
        self._exit.append(ex)
        self._prof = None

    def profiles(self) -> sp.csr_matrix:
        """Return the profile of every class routed so far, (classes x bundles)."""
        if self._prof is None or self._prof.shape[0] != self._n_classes:
            ptrs, bs, fs, base = [np.zeros(1, np.int64)], [], [], 0
            for ptr, b, f in self._blocks:
                ptrs.append(ptr[1:] + base)
                bs.append(b)
                fs.append(f)
                base += len(b)
            self._prof = sp.csr_matrix((np.concatenate(fs) if fs else np.zeros(0),
                                        np.concatenate(bs) if bs else np.zeros(0, np.int64),
                                        np.concatenate(ptrs)), shape=(self._n_classes, self.n_bundles))
            self._exit_arr = np.concatenate(self._exit) if self._exit else np.zeros((0, self.fabric.gpus_per_server + 1))
            self._lat_arr = np.concatenate(self._lat) if self._lat else np.zeros(0)
            self._reach_arr = np.concatenate(self._reach) if self._reach else np.zeros(0, bool)
        return self._prof

    def class_exit(self) -> np.ndarray:
        self.profiles()
        return self._exit_arr

    # ---------------------------------------------------------------- flows
    def incidence(self, src: np.ndarray, dst: np.ndarray, keys: np.ndarray | None = None) -> Incidence:
        """Return how flows ``src[i] -> dst[i]`` (GPU indices) load this state's bundles.

        ``keys`` identify flows for hash routing (default: their index).

        Notes
        -----
        O(F log F) plus routing of new classes (:meth:`EcmpGraph.route`).
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        f = len(src)
        gps = self.fabric.gpus_per_server
        g = self.fabric.gpus
        if f and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= g):
            bad = int(next(x for x in np.concatenate([src, dst]) if not 0 <= x < g))
            raise IndexError(f"GPU {bad} is outside the {g}-GPU fabric {self.fabric.name!r}")
        local = (src // gps == dst // gps) & (self.config.intra_server == "nvlink")
        cross = np.flatnonzero(~local)
        cls = np.full(f, -1, dtype=np.int64)
        latency = np.zeros(f)
        rows, cols, vals = [], [], []
        li = np.flatnonzero(local)
        rows += [li, li]
        cols += [src[li], g + dst[li]]
        vals += [np.ones(len(li)), np.ones(len(li))]
        latency[li] = self.config.nvlink_latency_s
        routable = np.ones(f, bool)
        if len(cross):
            nodes, skeys, sinks, ctx = self._endpoints(src[cross], dst[cross])
            c = self._classes(nodes, skeys, sinks)
            prof = self.profiles()
            n_cols = gps + 1
            if self.config.ecmp == "fluid":
                cls[cross] = c
                exit_dist = self._exit_arr[c]
                latency[cross] = self._lat_arr[c]
                routable[cross] = self._reach_arr[c]
                on_bundle = _lookup(prof.indptr, prof.indices, prof.data, c, self.n_bundles)
            else:
                hr, hb, hx, hl, ok = self._hashed(nodes, skeys, sinks,
                                                  cross if keys is None else np.asarray(keys)[cross])
                rows.append(cross[hr])
                cols.append(hb)
                vals.append(np.ones(len(hr)))
                exit_dist = np.zeros((len(cross), n_cols))
                exit_dist[np.arange(len(cross)), np.where(hx < 0, n_cols - 1, hx)] = 1.0
                exit_dist[~ok] = 0.0
                latency[cross] = hl
                routable[cross] = ok
                order = np.lexsort((hb, hr))
                ptr = np.concatenate([[0], np.cumsum(np.bincount(hr, minlength=len(cross)))])
                on_bundle = _lookup(ptr, hb[order], np.ones(len(hb)), np.arange(len(cross)), self.n_bundles)
            r, b, v, extra = self._own(src[cross], dst[cross], ctx, exit_dist, on_bundle)
            rows.append(cross[r])
            cols.append(b)
            vals.append(v)
            latency[cross] += extra
        else:
            prof = self.profiles()
        own = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                            shape=(f, self.n_bundles))
        own.sum_duplicates()
        if self.config.ecmp == "hash":
            prof = sp.csr_matrix((0, self.n_bundles))
        return Incidence(own, cls, prof, latency, routable)

    def _hashed(self, nodes, skeys, sinks, keys):
        n = len(nodes)
        rows, bundles, lat = [], [], np.zeros(n)
        ok = np.ones(n, bool)
        ex = np.full(n, -1, dtype=np.int64)
        order = np.argsort(np.asarray(skeys), kind="stable")
        sk = np.asarray(skeys)[order]
        starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
        for a, b in zip(starts, np.r_[starts[1:], len(sk)]):
            idx = order[a:b]
            (hr, hb), hx, hl, _, reach = self.graph.hashed_paths(nodes[idx], keys[idx], sinks[sk[a]],
                                                                  self.config.hash_seed)
            rows.append(idx[hr])
            bundles.append(hb)
            lat[idx] = hl
            ok[idx] = reach
            ex[idx] = hx
        return (np.concatenate(rows) if rows else np.zeros(0, np.int64),
                np.concatenate(bundles) if bundles else np.zeros(0, np.int64), ex, lat, ok)

    def bundle_label(self, b: int) -> str:
        """Return a readable name of bundle ``b`` (e.g. ``nic-up gpu17`` or a switch link)."""
        g = self.fabric.gpus
        if b < self.n_base:
            return f"{BASE_KINDS[b // g]} gpu{b % g}"
        edges = np.flatnonzero(self.edge_bundle == b)
        names = [self._labels[e] for e in edges[:3]]
        more = f" (+{len(edges) - 3} links alike)" if len(edges) > 3 else ""
        return ", ".join(names) + more
