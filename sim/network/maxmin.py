"""Max-min fair rates by progressive filling over link bundles (the flow-level model of the simulator).

Design note
-----------
A flow ``f`` loads bundle ``l`` with ``A[l, f] * rate[f]``, where ``A[l, f]`` is the fraction of the
flow that crosses the bundle: 1 on a NIC, ``1/k`` on each of ``k`` equal-cost branches when ECMP is a
fluid split. The max-min fair rates on the polytope ``{r >= 0 : A r <= c}`` are found by progressive
filling: every unfrozen flow's rate grows at the same speed until some bundle saturates; the flows
crossing it are frozen at that level; repeat. The result is the unique max-min fair vector, and it is
characterised by a *bottleneck* per flow: a saturated bundle it crosses on which no other flow has a
higher rate (:func:`check_max_min` verifies exactly that).

``A`` is stored factored, because most flows share their middle: ``A = own + prof[cls]`` where
``own`` holds a flow's own bundles (NIC, NVLink) and ``prof`` the shared profile of its *route class*
(e.g. all flows from one leaf to another). A level then costs ``O(L)`` for ``L`` bundles, and freezing
touches each flow, class and incidence entry once, so a solve is ``O(nnz + levels * L)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["MaxMinProblem", "MaxMinResult", "reference_max_min", "check_max_min", "incidence_matrix"]

_REL_TIE = 1e-9  # bundles whose fill level is within this relative distance saturate together
_MIN_GROWTH = 1e-12  # growth below this is round-off left after subtracting frozen flows
_DENSE_MAX = 1 << 20  # flows x bundles entries up to which the event loop's solves use a dense matrix


@dataclass(frozen=True)
class MaxMinResult:
    """Rates of one solve and how many filling levels it took."""

    rate_bps: np.ndarray  # (F,) rate of every flow; 0 for inactive flows
    levels: int  # distinct bottleneck levels (rounds of progressive filling)
    bottleneck: np.ndarray  # (F,) index of the bundle that froze each active flow; -1 if inactive


def _gather(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (positions into ``indices``/``data`` of the given rows, row length per row)."""
    starts = indptr[rows]
    lens = indptr[rows + 1] - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64), lens
    offs = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(total)
    return offs, lens


class MaxMinProblem:
    """Flows x bundles incidence, prepared once for many solves (one per event of the event loop).

    Parameters
    ----------
    own : scipy.sparse matrix, shape (F, L)
        Per-flow fractions on the flow's own bundles.
    cls : ndarray of int, shape (F,)
        Route class of each flow, or -1 for none.
    prof : scipy.sparse matrix, shape (K, L)
        Fractions of each route class on shared bundles.

    Notes
    -----
    Preparation is O(nnz log nnz) (CSR/CSC conversions and a sort of flows by class).

    Examples
    --------
    Two flows share a 10 bps bundle; the second also crosses a 2 bps bundle:

    >>> own = sp.csr_matrix(np.array([[1.0, 0.0], [1.0, 1.0]]))
    >>> p = MaxMinProblem(own, np.array([-1, -1]), sp.csr_matrix((0, 2)))
    >>> p.solve(np.array([10.0, 2.0])).rate_bps.tolist()
    [8.0, 2.0]
    """

    def __init__(self, own: sp.spmatrix, cls: np.ndarray, prof: sp.spmatrix) -> None:
        self.own = sp.csr_matrix(own, dtype=np.float64)
        self.own.sum_duplicates()
        self.own_csc = self.own.tocsc()
        self.n_flows, self.n_bundles = self.own.shape
        self.cls = np.asarray(cls, dtype=np.int64)
        self.prof = sp.csr_matrix(prof, dtype=np.float64)
        if self.prof.shape[1] != self.n_bundles:
            self.prof = sp.csr_matrix((self.prof.data, self.prof.indices, self.prof.indptr),
                                      shape=(self.prof.shape[0], self.n_bundles))
        self.prof.sum_duplicates()
        self.prof_csc = self.prof.tocsc()
        self.n_classes = self.prof.shape[0]
        has = self.cls >= 0
        order = np.argsort(self.cls, kind="stable")
        self.class_flows = order[np.count_nonzero(~has):]  # flows sorted by class, classless left out
        counts = np.bincount(self.cls[has], minlength=self.n_classes)
        self.class_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._dense: np.ndarray | None = None  # own + prof[cls] as a dense array, made on first use

    def dense(self) -> np.ndarray | None:
        """The full (F, L) incidence as a dense array where it has at most ``_DENSE_MAX`` entries, else None."""
        if self._dense is None and self.n_flows * self.n_bundles <= _DENSE_MAX:
            self._dense = incidence_matrix(self).toarray()
        return self._dense

    def growth(self, active: np.ndarray) -> np.ndarray:
        """Return the load each bundle gains per unit of rate given to every active flow."""
        cnt = np.bincount(self.cls[active & (self.cls >= 0)], minlength=self.n_classes).astype(np.float64)
        return self.own.T @ active.astype(np.float64) + self.prof.T @ cnt

    def load(self, rate_bps: np.ndarray) -> np.ndarray:
        """Return each bundle's load (bps) when the flows run at ``rate_bps``: ``A @ rate``."""
        r = np.asarray(rate_bps, dtype=np.float64)
        if self._dense is not None:
            return r @ self._dense
        has = self.cls >= 0
        per_class = np.bincount(self.cls[has], weights=r[has], minlength=self.n_classes)
        return self.own.T @ r + self.prof.T @ per_class

    def solve(self, capacity_bps: np.ndarray, active: np.ndarray | None = None, *,
              bottleneck: bool = True) -> MaxMinResult:
        """Return the max-min fair rates of the active flows under ``capacity_bps``.

        ``bottleneck=False`` leaves ``MaxMinResult.bottleneck`` at -1: the event loop needs only the
        rates, and naming each flow's bottleneck is a fifth of a solve.

        Raises
        ------
        ValueError
            If an active flow crosses no bundle (its rate would be unbounded).

        Notes
        -----
        O(nnz + levels * L) for nnz incidence entries, L bundles and the number of distinct
        bottleneck levels.
        """
        n, L, K = self.n_flows, self.n_bundles, self.n_classes
        act = np.ones(n, bool) if active is None else np.array(active, dtype=bool, copy=True)
        rate = np.zeros(n)
        neck = np.full(n, -1, dtype=np.int64)
        if not act.any():
            return MaxMinResult(rate, 0, neck)
        if not bottleneck and self.dense() is not None:
            return self._solve_dense(np.asarray(capacity_bps, dtype=np.float64), act)
        cnt = np.bincount(self.cls[act & (self.cls >= 0)], minlength=K).astype(np.float64)
        g = self.own.T @ act.astype(np.float64) + self.prof.T @ cnt
        resid = np.asarray(capacity_bps, dtype=np.float64).copy()
        live_class = cnt > 0
        level, levels, left = 0.0, 0, int(act.sum())
        own_csc, prof_csc, own, prof = self.own_csc, self.prof_csc, self.own, self.prof
        live = np.flatnonzero(g > _MIN_GROWTH)  # bundles still gaining load; only ever shrinks
        slot = np.empty(n, dtype=np.int64)  # scratch for de-duplicating frozen flows
        while left:
            pos = live = live[g[live] > _MIN_GROWTH]
            if not len(pos):
                stuck = np.flatnonzero(act)[:5].tolist()
                raise ValueError(f"flows {stuck} cross no bundle with capacity, so their rate is unbounded")
            ratio = np.maximum(resid[pos], 0.0) / g[pos]
            t = float(ratio.min())
            sat = pos[ratio <= t * (1 + _REL_TIE) + 1e-300]
            level += t
            resid[pos] -= t * g[pos]
            levels += 1
            offs, _ = _gather(own_csc.indptr, sat)
            frz_own = own_csc.indices[offs]
            offs, _ = _gather(prof_csc.indptr, sat)
            ks = np.unique(prof_csc.indices[offs])
            ks = ks[live_class[ks]]
            offs, _ = _gather(self.class_ptr, ks)
            frz = np.concatenate([frz_own, self.class_flows[offs]])
            frz = frz[act[frz]]
            # drop duplicates (a flow frozen by its own bundle and its class's) in O(len): the last
            # position written for a flow is the one kept; np.unique would sort or hash 10^5 entries
            slot[frz] = np.arange(len(frz))
            frz = frz[slot[frz] == np.arange(len(frz))]
            if len(frz):
                rate[frz] = level
                # the first saturated bundle a frozen flow crosses is reported as its bottleneck
                act[frz] = False
                left -= len(frz)
                offs, _ = _gather(own.indptr, frz)
                g -= np.bincount(own.indices[offs], weights=own.data[offs], minlength=L)
                fc = self.cls[frz]
                dc = np.bincount(fc[fc >= 0], minlength=K)
                kk = np.flatnonzero(dc)
                if len(kk):
                    cnt[kk] -= dc[kk]
                    live_class[kk] = cnt[kk] > 0
                    offs, lens = _gather(prof.indptr, kk)
                    g -= np.bincount(prof.indices[offs], weights=prof.data[offs] * np.repeat(dc[kk], lens),
                                     minlength=L)
                if bottleneck:
                    neck[frz] = _first_hit(frz, sat, self)
            g[sat] = 0.0  # saturated for good: nothing active crosses it any more
            resid[sat] = 0.0
        return MaxMinResult(rate, levels, neck)

    def _solve_dense(self, capacity: np.ndarray, act: np.ndarray) -> MaxMinResult:
        """:meth:`solve` without bottlenecks on the dense incidence: the same filling, levels and ties.

        A small problem (the event loop's independent groups: thousands of flows on tens of bundles)
        spends its time in per-level overhead; whole-array steps take a fifth of the sparse path's.
        """
        a = self._dense
        rate = np.zeros(self.n_flows)
        left = int(act.sum())
        g = act.astype(np.float64) @ a
        resid = capacity.copy()
        live = np.flatnonzero(g > _MIN_GROWTH)
        level, levels = 0.0, 0
        while left:
            live = live[g[live] > _MIN_GROWTH]
            if not len(live):
                stuck = np.flatnonzero(act)[:5].tolist()
                raise ValueError(f"flows {stuck} cross no bundle with capacity, so their rate is unbounded")
            gl = g[live]
            ratio = np.maximum(resid[live], 0.0) / gl
            t = float(ratio.min())
            sat = live[ratio <= t * (1 + _REL_TIE) + 1e-300]
            level += t
            resid[live] -= t * gl
            levels += 1
            frz = np.flatnonzero(act & (a[:, sat] != 0).any(axis=1))
            if len(frz):
                rate[frz] = level
                act[frz] = False
                left -= len(frz)
                g -= a[frz].sum(axis=0)
            g[sat] = 0.0
            resid[sat] = 0.0
        return MaxMinResult(rate, levels, np.full(self.n_flows, -1, dtype=np.int64))


def _first_hit(frz: np.ndarray, sat: np.ndarray, prob: MaxMinProblem) -> np.ndarray:
    """For each frozen flow, one saturated bundle it crosses (own bundles first, then its class's).

    Class profiles are scanned once per class, not once per flow: a class may hold thousands of flows.
    """
    is_sat = np.zeros(prob.n_bundles, bool)
    is_sat[sat] = True
    out = np.full(len(frz), -1, dtype=np.int64)
    offs, lens = _gather(prob.own.indptr, frz)
    hit = is_sat[prob.own.indices[offs]]
    row = np.repeat(np.arange(len(frz)), lens)
    out[row[hit][::-1]] = prob.own.indices[offs][hit][::-1]  # reversed so the first hit wins
    need = np.flatnonzero(out < 0)
    if len(need):
        ks, inv = np.unique(prob.cls[frz[need]], return_inverse=True)
        offs, lens = _gather(prob.prof.indptr, ks)
        hit = is_sat[prob.prof.indices[offs]]
        row = np.repeat(np.arange(len(ks)), lens)
        per_class = np.full(len(ks), -1, dtype=np.int64)
        per_class[row[hit][::-1]] = prob.prof.indices[offs][hit][::-1]
        out[need] = per_class[inv.ravel()]
    return out


def incidence_matrix(prob: MaxMinProblem) -> sp.csr_matrix:
    """Return the full flows x bundles matrix ``own + prof[cls]`` (for checks and small cases)."""
    has = prob.cls >= 0
    rows = sp.csr_matrix((np.ones(int(has.sum())), (np.flatnonzero(has), prob.cls[has])),
                         shape=(prob.n_flows, prob.n_classes))
    return (prob.own + rows @ prob.prof).tocsr()


def reference_max_min(a: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Return max-min fair rates by the textbook loop over a dense bundles x flows matrix ``a``.

    Kept deliberately simple (no factoring, no batching): the tests compare the fast solver with it.

    Notes
    -----
    O(levels * L * F).

    Examples
    --------
    >>> reference_max_min(np.array([[1.0, 1.0], [0.0, 1.0]]), np.array([10.0, 2.0])).tolist()
    [8.0, 2.0]
    """
    a = np.asarray(a, dtype=np.float64)
    cap = np.asarray(capacity, dtype=np.float64)
    n = a.shape[1]
    rate = np.zeros(n)
    frozen = np.zeros(n, bool)
    while not frozen.all():
        load = a @ rate
        grow = a[:, ~frozen].sum(axis=1)
        live = grow > 1e-12
        if not live.any():
            raise ValueError("an unfrozen flow crosses no bundle")
        t = np.min((cap[live] - load[live]) / grow[live])
        rate[~frozen] += max(t, 0.0)
        slack = cap - a @ rate
        full = live & (slack <= 1e-9 * np.maximum(cap, 1.0))
        frozen |= (a[full] > 0).any(axis=0)
    return rate


def check_max_min(a: np.ndarray, capacity: np.ndarray, rate: np.ndarray, rel_tol: float = 1e-6) -> list[str]:
    """Return every violation of feasibility or max-min optimality (empty: the rates are max-min fair).

    Feasibility: no bundle carries more than its capacity. Optimality: every flow crosses a saturated
    bundle on which its rate is the largest of all flows crossing it (its bottleneck).

    Notes
    -----
    O(L * F) on the dense matrix.
    """
    a = np.asarray(a, dtype=np.float64)
    cap = np.asarray(capacity, dtype=np.float64)
    load = a @ rate
    out = [f"bundle {l} carries {load[l]:.6g} > capacity {cap[l]:.6g}"
           for l in np.flatnonzero(load > cap * (1 + rel_tol) + 1e-9)]
    full = load >= cap * (1 - rel_tol) - 1e-9
    for f in range(a.shape[1]):
        crossing = np.flatnonzero((a[:, f] > 0) & full)
        ok = any(rate[f] >= rate[a[l] > 0].max() * (1 - rel_tol) - 1e-9 for l in crossing)
        if not ok:
            out.append(f"flow {f} (rate {rate[f]:.6g}) has no bottleneck bundle")
    return out
