"""ECMP on the switch graph: per-hop fluid splits, hashed single paths, and exact bundle merging."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.config import SimConfig
from orchestrl.sim.network.ecmp import HOP_COST, EcmpGraph, Sink
from orchestrl.sim.network.maxmin import check_max_min, incidence_matrix


def _graph(edges):
    t, h, m = (np.array(x) for x in zip(*edges))
    n = len(edges)
    return EcmpGraph(int(max(t.max(), h.max())) + 1, t, h, m.astype(float), np.full(n, HOP_COST), np.full(n, 1e-6),
                     np.arange(n))


def test_fluid_ecmp_splits_per_hop_in_proportion_to_parallel_links():
    # 0 -> 1 over two links and 0 -> 2 over one; both reach 3. Then 1 -> 3 and 2 -> 3.
    g = _graph([(0, 1, 2), (0, 2, 1), (1, 3, 1), (2, 3, 1)])
    block = g.route(np.array([0]), Sink((3,), (0,), (-1,), (0.0,)))
    frac = dict(zip(block.bundle.tolist(), block.frac.tolist()))
    assert frac == pytest.approx({0: 2 / 3, 1: 1 / 3, 2: 2 / 3, 3: 1 / 3})
    assert block.hops[0] == pytest.approx(2.0)


def test_split_is_per_hop_not_per_path():
    # From 0: one next hop toward 3 via 1 (which fans out to two paths) and one via 2 (a single path).
    # Per-hop ECMP sends 1/2 via 1 and 1/2 via 2, not 2/3 via 1 as an even split over paths would.
    g = _graph([(0, 1, 1), (0, 2, 1), (1, 4, 1), (1, 5, 1), (4, 3, 1), (5, 3, 1), (2, 6, 1), (6, 3, 1)])
    block = g.route(np.array([0]), Sink((3,), (0,), (-1,), (0.0,)))
    frac = dict(zip(block.bundle.tolist(), block.frac.tolist()))
    assert frac[0] == pytest.approx(0.5) and frac[2] == pytest.approx(0.25) and frac[6] == pytest.approx(0.5)


def test_hashed_paths_take_one_link_per_hop_and_spread_over_links():
    g = _graph([(0, 1, 1), (0, 2, 1), (1, 3, 1), (2, 3, 1)])
    (rows, bundles), exits, lat, hops, reach = g.hashed_paths(np.zeros(400, np.int64), np.arange(400),
                                                              Sink((3,), (0,), (-1,), (0.0,)))
    assert reach.all() and np.all(hops == 2) and np.all(np.bincount(rows) == 2)
    first = bundles[np.isin(bundles, [0, 1])]
    share = np.mean(first == 0)
    assert 0.4 < share < 0.6  # a hash, not always the same link


def test_exits_with_extra_cost_are_used_only_when_no_cheaper_path_exists():
    g = _graph([(0, 1, 1), (1, 2, 1)])  # 0 -> 2 takes two hops; exiting at 0 costs 1.5 hops
    sink = Sink((2, 0), (0, 3), (-1, 5), (0.0, 0.0))
    block = g.route(np.array([0, 1]), sink)
    assert block.exit_frac[0].tolist() == [0.0, 1.0]  # label 5 (exit at 0 itself): cheaper than 2 hops
    assert block.exit_frac[1].tolist() == [1.0, 0.0]  # from 1 the direct hop wins


@pytest.mark.parametrize("name,gpus,radix", [("ft-os", 384, 64), ("ft", 128, 8), ("ft-os", 96, 8),
                                             ("topoopt", 128, 64), ("mixnet", 128, 64)])
def test_merging_equivalent_links_changes_no_rate(name, gpus, radix):
    rng = np.random.default_rng(3)
    src = rng.integers(0, gpus, 3000)
    dst = rng.integers(0, gpus, 3000)
    keep = src // 8 != dst // 8
    src, dst = src[keep], dst[keep]
    rates = []
    for merge in (True, False):
        st = build_fabric(name, gpus, SimConfig(switch_radix=radix, merge_bundles=merge)).state()
        inc = st.incidence(src, dst)
        rates.append(inc.problem().solve(st.capacity_bps).rate_bps)
        if merge:
            merged_bundles = st.n_switch
        else:
            assert st.n_switch >= merged_bundles
    assert np.allclose(rates[0], rates[1], rtol=1e-9)


def test_fat_tree_rates_are_max_min_fair_on_the_full_incidence():
    st = build_fabric("ft-os", 192).state()
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 192, 400), rng.integers(0, 192, 400)
    keep = src != dst
    inc = st.incidence(src[keep], dst[keep])
    p = inc.problem()
    rate = p.solve(st.capacity_bps).rate_bps
    assert check_max_min(incidence_matrix(p).toarray().T, st.capacity_bps, rate) == []


def test_hash_routing_collides_where_fluid_ecmp_does_not():
    # A shift permutation on an oversubscribed Clos: fluid ECMP spreads each flow over every spine;
    # per-flow hashing puts several flows on one uplink, so some flows get less than their fair share.
    gpus = 768
    src = np.arange(gpus)
    dst = (src + 48) % gpus  # every flow leaves its leaf
    fluid = build_fabric("ft-os", gpus).state()
    hashed = build_fabric("ft-os", gpus, SimConfig(ecmp="hash")).state()
    r_fluid = fluid.incidence(src, dst).problem().solve(fluid.capacity_bps).rate_bps
    r_hash = hashed.incidence(src, dst).problem().solve(hashed.capacity_bps).rate_bps
    assert np.allclose(r_fluid, 200e9 / 3)  # 48 NICs share 16 uplinks
    assert r_hash.min() < r_fluid.min() * 0.9  # equal flows: the slowest sets the completion time
