"""Collectives -> directed GPU -> GPU bytes, as numpy pair arrays (the first half of fabric.traffic).

:mod:`fabric.traffic` folds these pairs onto ToRs and PoDs; the per-primitive models are tabled in
its docstring. Kept apart so the simulator and the planner can build pairs without the aggregation.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from orchestrl.fabric.intent import Collective, Intent
from orchestrl.fabric.topology import Topology

__all__ = [
    "PairArrays",
    "collective_pair_arrays",
    "intent_pair_arrays",
    "tree_all_reduce_pair_arrays",
    "rank_pair_bytes",
    "transfer_pair_bytes",
    "weight_sync_transfers",
    "demand_of_intent",
]

# (src GPU, dst GPU, bytes) as parallel arrays; src != dst, bytes > 0 once summed.
_Pairs = tuple[np.ndarray, np.ndarray, np.ndarray]
#: Public name of the same triple: ``(src, dst, bytes)`` arrays, one entry per directed GPU pair.
PairArrays = _Pairs

_RING_FACTOR = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0}

def rank_pair_bytes(collective: Collective, topology: Topology | None = None) -> dict[tuple[int, int], float]:
    """Return the directed GPU -> GPU bytes of one collective, pairs summed.

    Parameters
    ----------
    collective : Collective
        The collective; ``bytes_per_rank`` is interpreted per primitive (see the module table).
    topology : Topology, optional
        Needed only by weight-sync without explicit ``transfers`` (its stand-in schedule is per
        destination PoD).

    Returns
    -------
    dict of (int, int) -> float
        Bytes from ``src`` to ``dst``; same-server pairs included, self pairs and zero bytes left out.

    Raises
    ------
    ValueError
        For a weight-sync collective without ``transfers`` when ``topology`` is None.

    Notes
    -----
    O(P log P) for P generated pairs: ``sum(n)`` for rings and p2p, ``sum(n^2)`` for all-to-all,
    ``|src| * |dst|`` for m2n.

    Examples
    --------
    >>> rank_pair_bytes(Collective("all-reduce", groups=((0, 1, 2),), bytes_per_rank=3.0))
    {(0, 1): 4.0, (1, 2): 4.0, (2, 0): 4.0}
    """
    return _to_dict(_collective_pairs(collective, topology))


def collective_pair_arrays(collective: Collective, topology: Topology | None = None) -> PairArrays:
    """Return the directed GPU -> GPU bytes of one collective as ``(src, dst, bytes)`` arrays.

    The same pairs as :func:`rank_pair_bytes`, without building a dict: what the network simulator
    turns into flows. Pairs are summed and sorted by ``(src, dst)``; same-server pairs are kept.

    Notes
    -----
    O(P log P) for P generated pairs.

    Examples
    --------
    >>> src, dst, vol = collective_pair_arrays(Collective("all-to-all", groups=((0, 1, 2),), bytes_per_rank=3.0))
    >>> src.tolist(), dst.tolist(), vol.tolist()
    ([0, 0, 1, 1, 2, 2], [1, 2, 0, 2, 0, 1], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    """
    return _collective_pairs(collective, topology)


def intent_pair_arrays(intent: Intent, topology: Topology | None = None) -> PairArrays:
    """Return the directed GPU -> GPU bytes of a whole intent as ``(src, dst, bytes)`` arrays.

    Notes
    -----
    O(P log P) for P pairs over all collectives.
    """
    return _intent_pairs(intent, topology)


def tree_all_reduce_pair_arrays(groups: Sequence[Sequence[int]], bytes_per_rank: float) -> PairArrays:
    """Return the GPU -> GPU bytes of NCCL's double-binary-tree all-reduce in each group.

    Each of two binary trees carries half of the buffer: children send their half up (reduce) and
    parents send it back down (broadcast), so every tree edge carries ``S / 2`` in each direction.
    Tree one is NCCL's ``ncclGetBtree`` over the group's ranks; tree two mirrors it (even group
    size) or shifts it by one (odd), so a rank that is a leaf in one tree is interior in the other.

    Notes
    -----
    O(sum of group sizes).

    Examples
    --------
    >>> src, dst, vol = tree_all_reduce_pair_arrays([(10, 11, 12, 13)], 8.0)
    >>> sorted(zip(src.tolist(), dst.tolist(), vol.tolist()))[:3]
    [(10, 11, 4.0), (10, 12, 4.0), (11, 10, 4.0)]
    """
    chunks: list[_Pairs] = []
    for grp in groups:
        members = np.asarray(grp, dtype=np.int64)
        n = len(members)
        if n < 2:
            continue
        for second in (False, True):
            child, parent = [], []
            for r in range(n):
                up = _btree_parent(n, r)
                if up < 0:
                    continue
                if second:  # mirror for even sizes, shift for odd sizes, as ncclGetDtree
                    r2, up2 = ((n - 1 - r, n - 1 - up) if n % 2 == 0 else ((r + 1) % n, (up + 1) % n))
                    r, up = r2, up2
                child.append(r)
                parent.append(up)
            c, p = members[child], members[parent]
            half = bytes_per_rank / 2.0
            chunks.append(_flat(c, p, half))  # reduce: child -> parent
            chunks.append(_flat(p, c, half))  # broadcast: parent -> child
    if not chunks:
        return _empty()
    return _sum_pairs(*(np.concatenate([ch[i] for ch in chunks]) for i in range(3)))


def _btree_parent(n: int, rank: int) -> int:
    """Parent of ``rank`` in NCCL's binary tree over ``n`` ranks (``ncclGetBtree``); -1 for the root."""
    if rank == 0:
        return -1
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= n else up


def transfer_pair_bytes(transfers: Iterable[tuple[int, int, float]]) -> dict[tuple[int, int], float]:
    """Return rank-pair bytes for an explicit ``(src, dst, bytes)`` schedule, pairs summed.

    This is the seam where a real schedule (the collectives planner's weight-sync waves and trees)
    replaces a stand-in model; pass it as ``Collective(..., transfers=...)`` to do that in an intent.

    Notes
    -----
    O(T log T) for T transfers.

    Examples
    --------
    >>> transfer_pair_bytes([(0, 9, 1.0), (0, 9, 2.0), (3, 3, 5.0)])
    {(0, 9): 3.0}
    """
    return _to_dict(_sum_pairs(*_transfer_arrays(transfers)))


def weight_sync_transfers(train_gpus: Sequence[int], gen_gpus: Sequence[int], weight_bytes: float,
                          topology: Topology) -> list[tuple[int, int, float]]:
    """Return the stand-in weight-sync schedule: shard-scatter, one copy per gen PoD, then fan-out.

    The model (``weight_bytes``, what every gen GPU must end up with) is split into equal shards,
    one per train GPU. For each destination PoD, train GPU ``i`` sends its shard to seed
    ``gen_in_pod[i mod len(gen_in_pod)]`` -- so exactly one copy of the model crosses into each PoD
    (Phase A) -- and the seeds spread it to every other gen GPU of the PoD (Phase B) along their
    rail and then over NVLink, so Phase B puts demand on OCS-Agg only for GPUs whose server holds
    no copy. The collectives planner's budgeted waves and per-shard trees (Appendix E) replace
    this through :func:`transfer_pair_bytes`; the stand-in only needs to put demand on the right
    ToRs and PoD pairs.

    Notes
    -----
    O(|train| * P + seeds * |gen in PoD|) transfers for P gen PoDs.

    Examples
    --------
    >>> from orchestrl.fabric.topology import FabricSpec, Topology
    >>> topo = Topology(FabricSpec(name="t", link_bps=1e11, pods=2, servers_per_pod=1,
    ...                            boundary_ports_per_pod=2, core_devices=1))
    >>> weight_sync_transfers([0, 1], [8, 9], 10.0, topo)
    [(0, 8, 5.0), (1, 9, 5.0), (8, 9, 5.0), (9, 8, 5.0)]
    """
    src, dst, vol = _weight_sync_arrays(tuple(train_gpus), tuple(gen_gpus), float(weight_bytes), topology)
    return [(int(a), int(b), float(v)) for a, b, v in zip(src, dst, vol)]


def demand_of_intent(intent: Intent, topology: Topology | None = None) -> dict[tuple[int, int], float]:
    """Return the directed GPU -> GPU bytes of a whole intent, summed over its collectives.

    Notes
    -----
    O(P log P) for P pairs over all collectives.

    Examples
    --------
    >>> i = Intent("train", "j", "fwd", (Collective("p2p", ((0, 8),), 1.0), Collective("p2p", ((0, 8),), 2.0)))
    >>> demand_of_intent(i)
    {(0, 8): 3.0, (8, 0): 3.0}
    """
    return _to_dict(_intent_pairs(intent, topology))



# -- helpers ---------------------------------------------------------------------------------



def _intent_pairs(intent: Intent, topology: Topology | None) -> _Pairs:
    parts = [_collective_pairs(c, topology) for c in intent.collectives]
    return _sum_pairs(*(np.concatenate([p[i] for p in parts]) for i in range(3)))


def _collective_pairs(c: Collective, topology: Topology | None) -> _Pairs:
    s = c.bytes_per_rank
    p = c.primitive
    chunks: list[_Pairs] = []
    if p in _RING_FACTOR:
        for n, grid in _groups_by_size(c.groups):
            if n > 1:
                share = _RING_FACTOR[p] * (n - 1) / n * s
                chunks.append(_flat(grid, np.roll(grid, -1, axis=1), share))
    elif p == "all-to-all":
        for n, grid in _groups_by_size(c.groups):
            i, j = np.nonzero(~np.eye(n, dtype=bool))  # every ordered pair of distinct members
            chunks.append(_flat(grid[:, i], grid[:, j], s / n))
    elif p == "p2p":
        for n, grid in _groups_by_size(c.groups):
            if n > 1:
                chunks.append(_flat(grid[:, :-1], grid[:, 1:], s))  # forward activations
                chunks.append(_flat(grid[:, 1:], grid[:, :-1], s))  # backward gradients
    elif p == "m2n":
        a = np.asarray(c.src_gpus, dtype=np.int64)
        f = np.asarray(c.dst_gpus, dtype=np.int64)
        share = s / len(f)
        chunks.append(_flat(np.repeat(a, len(f)), np.tile(f, len(a)), share))  # dispatch to FFN ranks
        chunks.append(_flat(np.tile(f, len(a)), np.repeat(a, len(f)), share))  # results back
    elif p == "response-stream":
        g = np.asarray(c.src_gpus, dtype=np.int64)
        t = np.asarray(c.dst_gpus, dtype=np.int64)
        chunks.append(_flat(g, t[np.arange(len(g)) % len(t)], s))
    elif c.transfers:
        chunks.append(_transfer_arrays(c.transfers))
    else:  # weight-sync stand-in
        if topology is None:
            raise ValueError("weight-sync without explicit transfers needs the topology (to find gen PoDs)")
        chunks.append(_weight_sync_arrays(c.src_gpus, c.dst_gpus, s, topology))
    if not chunks:
        return _empty()
    return _sum_pairs(*(np.concatenate([ch[i] for ch in chunks]) for i in range(3)))


def _weight_sync_arrays(train: tuple[int, ...], gen: tuple[int, ...], weight_bytes: float,
                        topology: Topology) -> _Pairs:
    if not train or not gen:
        return _empty()
    shard = weight_bytes / len(train)
    train_arr = np.asarray(train, dtype=np.int64)
    gen_pod: dict[int, list[int]] = {}
    for g in gen:
        gen_pod.setdefault(topology.pod_of_gpu(g), []).append(g)
    chunks: list[_Pairs] = []
    for pod in sorted(gen_pod):
        members = np.asarray(gen_pod[pod], dtype=np.int64)
        seeds = members[np.arange(len(train)) % len(members)]
        chunks.append(_flat(train_arr, seeds, shard))  # Phase A: one model copy into this PoD
        got = np.bincount(np.arange(len(train)) % len(members), minlength=len(members)) * shard
        chunks.extend(_rail_fanout(members, got, topology))
    return _sum_pairs(*(np.concatenate([ch[i] for ch in chunks]) for i in range(3)))


def _rail_fanout(members: np.ndarray, got: np.ndarray, topology: Topology) -> list[_Pairs]:
    """Phase B of the stand-in: spread each seed's shards to every other gen GPU of its PoD.

    Rail-aligned, as NCCL's PXN does on rail-optimised fabrics: a seed sends along its rail (same
    ToR, so EPS), then every GPU holding the shard hands it to its server-mates over NVLink. Only a
    GPU with no holder in its server gets it straight from the seed across ToRs (OCS-Agg demand).
    Every member ends with each shard exactly once.
    """
    tor_ids = {t: i for i, t in enumerate(sorted({topology.tor_of_gpu(int(g)) for g in members}))}
    tor = np.asarray([tor_ids[topology.tor_of_gpu(int(g))] for g in members], dtype=np.int64)
    server = np.asarray([topology.server_of_gpu(int(g)) for g in members], dtype=np.int64)
    out: list[_Pairs] = []
    for i in np.flatnonzero(got > 0):
        seed, vol = members[i], got[i]
        holders = np.flatnonzero(tor == tor[i])  # the seed and its rail peers
        peers = holders[holders != i]
        out.append((np.full(len(peers), seed), members[peers], np.full(len(peers), vol)))
        holder_of_server = dict(zip(server[holders].tolist(), holders.tolist()))
        rest = np.flatnonzero(tor != tor[i])
        relay = np.asarray([holder_of_server.get(int(server[j]), i) for j in rest], dtype=np.int64)
        out.append((members[relay], members[rest], np.full(len(rest), vol)))
    return out


def _transfer_arrays(transfers: Iterable[tuple[int, int, float]]) -> _Pairs:
    rows = list(transfers)
    return (np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
            np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows)),
            np.fromiter((r[2] for r in rows), dtype=np.float64, count=len(rows)))


def _groups_by_size(groups: Sequence[Sequence[int]]) -> list[tuple[int, np.ndarray]]:
    """Stack equal-sized groups into (count, n) arrays so each size is one vector operation."""
    by_size: dict[int, list[Sequence[int]]] = {}
    for g in groups:
        by_size.setdefault(len(g), []).append(g)
    return [(n, np.asarray(gs, dtype=np.int64).reshape(len(gs), n)) for n, gs in sorted(by_size.items())]


def _flat(src: np.ndarray, dst: np.ndarray, share: float | np.ndarray) -> _Pairs:
    src = np.ravel(src).astype(np.int64, copy=False)
    dst = np.ravel(dst).astype(np.int64, copy=False)
    return src, dst, np.broadcast_to(np.asarray(share, dtype=np.float64), src.shape).copy()


def _empty() -> _Pairs:
    return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)


def _sum_pairs(src: np.ndarray, dst: np.ndarray, vol: np.ndarray) -> _Pairs:
    """Merge duplicate (src, dst) pairs; drop self pairs and zero bytes."""
    keep = (src != dst) & (vol > 0)
    src, dst, vol = src[keep], dst[keep], vol[keep]
    if not len(src):
        return _empty()
    if src.min() < 0 or dst.min() < 0:
        raise IndexError(f"negative GPU index {int(min(src.min(), dst.min()))}")
    width = int(max(src.max(), dst.max())) + 1
    keys, inverse = np.unique(src * width + dst, return_inverse=True)
    return keys // width, keys % width, np.bincount(inverse.ravel(), weights=vol, minlength=len(keys))


def _to_dict(pairs: _Pairs) -> dict[tuple[int, int], float]:
    src, dst, vol = pairs
    return {(a, b): v for a, b, v in zip(src.tolist(), dst.tolist(), vol.tolist())}


@dataclass(frozen=True)
class _GpuArrays:
    server: np.ndarray  # GPU -> server index
    pod: np.ndarray  # GPU -> PoD
    tor: np.ndarray  # GPU -> index into tor_ids
    tor_ids: tuple[str, ...]
    tor_pod: np.ndarray  # ToR index -> PoD


_GPU_ARRAYS: "weakref.WeakKeyDictionary[Topology, _GpuArrays]" = weakref.WeakKeyDictionary()


def _gpu_arrays(topology: Topology) -> _GpuArrays:
    cached = _GPU_ARRAYS.get(topology)
    if cached is None:
        tor_ids = tuple(topology.tors)
        index = {t: i for i, t in enumerate(tor_ids)}
        gpus = range(topology.gpu_count)
        cached = _GpuArrays(
            server=np.fromiter((topology.server_of_gpu(g) for g in gpus), np.int64, topology.gpu_count),
            pod=np.fromiter((topology.pod_of_gpu(g) for g in gpus), np.int64, topology.gpu_count),
            tor=np.fromiter((index[topology.tor_of_gpu(g)] for g in gpus), np.int64, topology.gpu_count),
            tor_ids=tor_ids,
            tor_pod=np.fromiter((topology.tors[t].pod for t in tor_ids), np.int64, len(tor_ids)),
        )
        _GPU_ARRAYS[topology] = cached
    return cached
